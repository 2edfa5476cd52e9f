"""Benchmark: which mix of teacher and student samples trains the best SFT, at equal steps, offline (issue 28).

    # here (Chromium): lake A = the teacher's demos + the student's rollouts, curated; lake B = teacher demos on
    # other train seeds, curated, as the held-out set
    .venv/bin/python benchmarks/mix_ablation.py --train A/_datasets/<id>/train.parquet \
        --held B/_datasets/<id>/train.parquet --base DIR --out abl.json \
        [--variants control,control_task,all,task,task_half,answer] [--seeds 0,1] [--steps 360] [--parallel 4]
    # the same, with mid-training rows replayed: `+rNN` puts NN% of the rows from --replay into a variant's mix
    ... --variants control_task,control_task+r50 --replay MIDTRAIN/train.parquet --synth-held HELD_SYNTH.parquet

Every variant trains the same base for the same optimizer steps (equal compute) on another mix of the same rows. A
mix is materialised by repeating rows, so the trainer's shuffle samples them by weight:

- control: the teacher's rows only (the experiment's equal-compute control); control_task: the same, each task
  the same total weight;
- all: teacher + student rows as curate exports them (the flywheel today);
- task: teacher + student, each task the same total weight;
- task_half: each task the same weight, half of it teacher and half student (all teacher where the student has
  no success);
- answer: task_half with the student's half spread evenly over the answers its successes reach (the final
  element of the Action line), so a bias of the student (always "Tab #1") is not taught back to it.
- `<variant>+rNN`: the variant's rows plus rows drawn from --replay (the mid-training corpus) so that they are NN% of
  the mix: replay against forgetting the base's skills while the SFT fits a few tasks' demos.

Held-out score: greedy replies to the held-out teacher demos, judged as in benchmarks/step_accuracy.py, per task;
`macro` is the mean over tasks and `episode` counts an episode right when every step is (the teacher-forced proxy
of success). --synth-held scores held-out mid-training pages the same way (what the SFT kept of the base's
skills). Runs anywhere `python -m training.sft` runs (the GPU box: no browser needed). Prints JSON.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

VARIANTS = ("control", "control_task", "all", "task", "task_half", "answer")
_COORD = re.compile(r"\s*@\s*\(-?\d+,-?\d+\)")


def _is_teacher(row: dict[str, Any]) -> bool:
    return row["policy"] != "student"


def answer_key(row: dict[str, Any]) -> str:
    """The answer a sample's target reaches: its Action line without coordinates (typed text folded)."""
    text = row["messages"][-1]["content"][0]["text"]
    line = next((ln for ln in text.splitlines() if ln.startswith("Action:")), text[-80:])
    return "type" if line.startswith("Action: Type") else _COORD.sub("", line)


def _fill(rows: list[dict], n: int, rng: random.Random) -> list[dict]:
    """`n` rows drawn from `rows` by whole copies, then a random remainder (weights without replacement noise)."""
    if not rows or n <= 0:
        return []
    out = rows * (n // len(rows))
    return out + rng.sample(rows, n % len(rows))


def _spread(rows: list[dict], n: int, rng: random.Random) -> list[dict]:
    """`n` rows with each answer getting the same share; an episode's answer is its last step's."""
    last: dict[str, dict] = {}
    for r in rows:
        if r["episode_id"] not in last or r["step_idx"] > last[r["episode_id"]]["step_idx"]:
            last[r["episode_id"]] = r
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[answer_key(last[r["episode_id"]])].append(r)
    keys = sorted(by)
    return [r for i, k in enumerate(keys) for r in _fill(by[k], n // len(keys) + (i < n % len(keys)), rng)]


def mix(rows: list[dict[str, Any]], variant: str, seed: int) -> list[dict[str, Any]]:
    """The rows of one variant (see the module docstring)."""
    rng = random.Random(seed)
    teacher = [r for r in rows if _is_teacher(r)]
    if variant == "control":
        return teacher
    if variant == "all":
        return list(rows)
    pool = teacher if variant == "control_task" else rows
    by_task: dict[str, list[dict]] = defaultdict(list)
    for r in pool:
        by_task[r["task_id"]].append(r)
    n = max(len(v) for v in by_task.values())
    out: list[dict] = []
    for _task, task_rows in sorted(by_task.items()):
        if variant in ("control_task", "task"):
            out += _fill(task_rows, n, rng)
            continue
        t = [r for r in task_rows if _is_teacher(r)]
        s = [r for r in task_rows if not _is_teacher(r)]
        if not s:
            out += _fill(t, n, rng)
            continue
        out += _fill(t, n // 2, rng)
        out += _spread(s, n - n // 2, rng) if variant == "answer" else _fill(s, n - n // 2, rng)
    rng.shuffle(out)
    return out


def split_variant(v: str) -> tuple[str, float]:
    """'control_task+r50' -> ('control_task', 0.5); a bare name replays nothing."""
    name, _, share = v.partition("+r")
    if name not in VARIANTS or (share and not (share.isdigit() and 0 < int(share) < 100)):
        raise ValueError(f"unknown variant {v!r}: one of {', '.join(VARIANTS)}, optionally +rNN with 0 < NN < 100")
    return name, int(share) / 100 if share else 0.0


def with_replay(rows: list[dict], replay: list[dict], share: float, seed: int, columns: list[str]) -> list[dict]:
    """`rows` plus rows of `replay` (shaped to `columns`) making up `share` of the result, shuffled."""
    if share <= 0:
        return rows
    if not replay:
        raise ValueError("a +rNN variant needs --replay rows")
    rng = random.Random(seed + 1)
    n = round(len(rows) * share / (1 - share))
    out = rows + [{c: r.get(c) for c in columns} for r in _fill(replay, n, rng)]
    rng.shuffle(out)
    return out


def score(held: list[dict[str, Any]], rights: list[bool]) -> dict[str, Any]:
    step: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    ep: dict[tuple[str, str], bool] = {}
    for r, ok in zip(held, rights):
        step[r["task_id"]][0] += ok
        step[r["task_id"]][1] += 1
        ep[(r["task_id"], r["episode_id"])] = ep.get((r["task_id"], r["episode_id"]), True) and ok
    episode: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for (task, _), ok in ep.items():
        episode[task][0] += ok
        episode[task][1] += 1
    per_step = {t: round(a / b, 4) for t, (a, b) in sorted(step.items())}
    per_ep = {t: round(a / b, 4) for t, (a, b) in sorted(episode.items())}
    return {
        "step": per_step,
        "episode": per_ep,
        "macro_step": round(sum(per_step.values()) / len(per_step), 4),
        "macro_episode": round(sum(per_ep.values()) / len(per_ep), 4),
    }


def job(a: argparse.Namespace, variant: str, seed: int) -> dict[str, Any]:
    """Train one variant (a subprocess: python -m training.sft) and score it on the held-out rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from step_accuracy import evaluate

    table = pq.read_table(a.train)
    name, share = split_variant(variant)
    rows = mix(table.to_pylist(), name, seed)
    teacher = sum(_is_teacher(r) for r in rows)
    student = len(rows) - teacher
    replay = pq.read_table(a.replay).to_pylist() if share else []
    rows = with_replay(rows, replay, share, seed, table.schema.names)
    work = Path(a.work) / f"{variant}-{seed}"
    work.mkdir(parents=True, exist_ok=True)
    data = work / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=table.schema), data)
    settings = {
        "method": "full",
        "lr": a.lr,
        "batch_size": a.batch,
        "max_steps": a.steps,
        "epochs": 10_000,
        "targets": a.targets,
        "save_every": 100_000,
        "seed": seed,
    }
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "training.sft", "--base", a.base, "--data", str(data), "--out", str(work / "model")]
    cmd += ["--settings", json.dumps(settings), "--no-progress"]
    with open(work / "sft.log", "w") as log:
        subprocess.run(cmd, check=True, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)
    train_s = time.monotonic() - t0
    held = pq.read_table(a.held).to_pylist()[: a.held_max]
    rights: list[bool] = []
    evaluate(str(work / "model"), held, a.eval_batch, a.max_new_tokens, rights=rights)
    synth: dict[str, Any] = {}
    if a.synth_held:
        synth_rows = pq.read_table(a.synth_held).to_pylist()
        synth_rights: list[bool] = []
        evaluate(str(work / "model"), synth_rows, a.eval_batch, a.max_new_tokens, rights=synth_rights)
        synth = {"synth": score(synth_rows, synth_rights)}
    return {
        "variant": variant,
        "seed": seed,
        "rows": len(rows),
        "student_share": round(student / max(len(rows), 1), 4),
        "replay_share": round(1 - (teacher + student) / max(len(rows), 1), 4),
        "train_s": round(train_s, 1),
        "final_loss": json.loads((work / "model" / "sft_result.json").read_text()).get("final_loss"),
        **score(held, rights),
        **synth,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", required=True, help="curate export: teacher + student rows (policy column)")
    ap.add_argument("--held", required=True, help="curate export of held-out teacher demos")
    ap.add_argument("--base", required=True, help="the model every variant starts from")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--steps", type=int, default=360)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--eval-batch", type=int, default=64)
    ap.add_argument("--targets", default="action", choices=("full", "action", "tool_call"), help="sft.targets")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="reply budget when scoring (full: the thought too)")
    ap.add_argument("--held-max", type=int, default=None, help="score only the first N held-out rows (a smoke run)")
    ap.add_argument("--replay", default=None, help="mid-training export whose rows +rNN variants mix in")
    ap.add_argument("--synth-held", default=None, help="held-out mid-training export, scored too (skills kept)")
    ap.add_argument("--parallel", type=int, default=1)
    ap.add_argument("--work", default="/tmp/mix_ablation")
    ap.add_argument("--out", default=None)
    ap.add_argument("--jsonl", default=None, help="append each job's result here as it ends")
    ap.add_argument("--job", default=None, help=argparse.SUPPRESS)  # variant:seed, run in a child process
    a = ap.parse_args()
    if a.job:
        variant, seed = a.job.split(":")
        print(json.dumps(job(a, variant, int(seed))))
        return
    for v in a.variants.split(","):
        try:
            if split_variant(v)[1] and not a.replay:
                ap.error(f"--variants: {v} replays mid-training rows: pass --replay")
        except ValueError as e:
            ap.error(f"--variants: {e}")
    jobs = [(v, int(s)) for s in a.seeds.split(",") for v in a.variants.split(",")]

    def child(vs: tuple[str, int]) -> dict[str, Any]:
        argv = [sys.executable, __file__, *sys.argv[1:], "--job", f"{vs[0]}:{vs[1]}"]
        r = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if r.returncode != 0:
            return {"variant": vs[0], "seed": vs[1], "error": r.stderr[-1500:]}
        res = json.loads(r.stdout.strip().splitlines()[-1])
        if a.jsonl:
            with open(a.jsonl, "a") as f:
                f.write(json.dumps(res) + "\n")
        print(json.dumps({k: res[k] for k in ("variant", "seed", "macro_step", "macro_episode")}), file=sys.stderr)
        return res

    with cf.ThreadPoolExecutor(a.parallel) as pool:
        runs = list(pool.map(child, jobs))
    summary: dict[str, Any] = {}
    for v in a.variants.split(","):
        ok = [r for r in runs if r["variant"] == v and "error" not in r]
        if ok:
            summary[v] = {
                k: round(sum(r[k] for r in ok) / len(ok), 4)
                for k in ("macro_step", "macro_episode", "student_share", "replay_share")
            }
            if all("synth" in r for r in ok):
                summary[v]["synth_macro_episode"] = round(sum(r["synth"]["macro_episode"] for r in ok) / len(ok), 4)
            summary[v]["episode"] = {t: round(sum(r["episode"][t] for r in ok) / len(ok), 4) for t in ok[0]["episode"]}
    out = {"benchmark": "mix_ablation", "settings": vars(a), "summary": summary, "runs": runs}
    text = json.dumps(out, indent=1)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
