"""Benchmark (issue "The flywheel spins", part 1): what mid-training on synthetic pages teaches, and at what cost.

    .venv/bin/python benchmarks/midtrain_skills.py                                  # configs/local.yaml's midtrain
    .venv/bin/python benchmarks/midtrain_skills.py --lake runs/mt/lake --before     # + the start model's skills
    .venv/bin/python benchmarks/midtrain_skills.py --set midtrain.sft.max_steps=800 --set student.size=small ...
    .venv/bin/python benchmarks/midtrain_skills.py --only corpus                      # stop after the dataset

Runs the `midtrain` stage's steps one by one on a lake (each idempotent: a rerun reuses what is done) and times
them: the oracle corpus (synth/* pages in Chromium), its dataset, the base's training (optimizer steps are the
budget), and the skill report on held-out synthetic pages (eval seeds, greedy). With --before, the start model
(random init) takes the same held-out pages first. Per kind the verifier is the page's own: a click landed
inside the named element's box (synth/click, synth/tabs, synth/option) or the typed text matched exactly and
the named button was pressed (synth/type, synth/form, synth/read). Also per step, from the lake: the share of
click steps inside the box the oracle clicked and of type steps whose text equals the oracle's (same page, same
step index), which separates pointing from copying.

Prints JSON (and writes --json).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# per step: the student's action against the oracle's on the same page (task, seed) and step index
_STEP_SKILLS = """
WITH s AS (
  SELECT e.task_id, e.seed, st.step_idx, st.action, st.exec_error, e.policy_version, e.stage, e.run_key
  FROM steps st JOIN episodes e USING (episode_id)
  WHERE NOT st.is_final AND e.stage = 'midtrain-eval' AND e.run_key = ?
), o AS (
  SELECT e.task_id, e.seed, st.step_idx, st.action, st.ui_text
  FROM steps st JOIN episodes e USING (episode_id)
  WHERE NOT st.is_final AND e.stage = 'midtrain-eval' AND e.run_key = ?
)
SELECT s.task_id, s.action AS got, o.action AS want
FROM s JOIN o USING (task_id, seed, step_idx)
"""


def _inside(got: dict, want: dict, half: float) -> bool:
    return abs(float(got["x"]) - float(want["x"])) <= half and abs(float(got["y"]) - float(want["y"])) <= half


def step_skills(cfg: Any, student_key: str, oracle_key: str) -> dict[str, Any]:
    """Point and copy rates per kind: a student click within 6 px (screen) of the oracle's point at the same step
    (a proxy for inside the element; the page's own verifier decides success), a typed text equal to the oracle's."""
    from flywheel.specs import lake_for
    from storage.catalog import connect

    rows = connect(lake_for(cfg)).execute(_STEP_SKILLS, [student_key, oracle_key]).fetchall()
    out: dict[str, dict[str, list[int]]] = {}
    for task, got, want in rows:
        g, w = json.loads(got) if got else None, json.loads(want) if want else None
        if not w:
            continue
        k = out.setdefault(task, {"point": [0, 0], "copy": [0, 0]})
        if w.get("type") == "click":
            k["point"][1] += 1
            k["point"][0] += bool(g and g.get("type") == "click" and _inside(g, w, 6.0))
        elif w.get("type") == "type":
            k["copy"][1] += 1
            k["copy"][0] += bool(g and g.get("type") == "type" and g.get("text") == w.get("text"))
    return {t: {m: (round(a / b, 3) if b else None, b) for m, (a, b) in v.items()} for t, v in sorted(out.items())}


def oracle_eval(cfg: Any) -> str:
    """The oracle on the same held-out pages (the ceiling, and the reference actions for step_skills)."""
    from flywheel.midtrain import skill_report

    return skill_report(cfg, "scripted", progress=False)["run_key"]


def export_held_out(cfg: Any, oracle_key: str) -> Path:
    """The oracle's held-out episodes as an SFT export (benchmarks/step_accuracy.py reads it, e.g. on a GPU box)."""
    from flywheel.specs import lake_for
    from storage.catalog import connect
    from training.data import prompt_options
    from training.export import export_sft

    lake = lake_for(cfg)
    con = connect(lake)
    eps = con.execute(
        "SELECT episode_id, task_id, seed, instruction, policy, iteration FROM episodes "
        "WHERE run_key = ? AND success ORDER BY task_id, seed",
        [oracle_key],
    ).fetchall()
    cols = ("episode_id", "task_id", "seed", "instruction", "policy", "iteration")
    out = lake.root / "_datasets" / f"held-{oracle_key}" / "train.parquet"
    export_sft(con, [dict(zip(cols, e)) for e in eps], out, cfg.student.arch, prompt_options(cfg.student))
    return out


def skills(cfg: Any, model: str, oracle_key: str) -> dict[str, Any]:
    from flywheel.midtrain import skill_report

    t0 = time.monotonic()
    res = skill_report(cfg, model, progress=False)
    return {
        "model": model,
        "success": round(res["success_rate"], 4),
        "ci": [round(res["ci_low"], 4), round(res["ci_high"], 4)],
        "n": res["n_episodes"],
        "per_task": res["per_task"],
        "steps": step_skills(cfg, res["run_key"], oracle_key),
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    from configs.loading import load_config
    from flywheel import midtrain as mt
    from flywheel.specs import ensure_student, register_tasks

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--lake", default="runs/midtrain/lake")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--before", action="store_true", help="also the start model's skills on the same pages")
    ap.add_argument("--only", choices=["corpus", "train"], default=None, help="stop after this step")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    import yaml

    over = {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in a.sets)}
    cfg = load_config(ROOT / a.config, {"lake.root": a.lake, "midtrain.enabled": True, **over})
    if not cfg.midtrain.base:
        ensure_student(cfg)
    register_tasks(cfg)
    out: dict[str, Any] = {
        "benchmark": "midtrain_skills",
        "config": a.config,
        "overrides": a.sets,
        "lake": a.lake,
        "student": {"size": cfg.student.size, "model": cfg.student.model},
        "midtrain": cfg.midtrain.model_dump(mode="json"),
    }
    t0 = time.monotonic()
    cor = mt.corpus(cfg, progress=False)
    t1 = time.monotonic()
    ds = mt.build_dataset(cfg, cor["run_key"])
    t2 = time.monotonic()
    out["corpus"] = {
        "run_key": cor["run_key"],
        "episodes_ran": cor["ran"],
        "episodes": ds["n_episodes"],
        "samples": ds["n_steps"],
        "dataset_id": ds["dataset_id"],
        "corpus_s": round(t1 - t0, 1),
        "dataset_s": round(t2 - t1, 1),
    }
    oracle = oracle_eval(cfg) if cfg.midtrain.eval_seeds_per_task else None
    if oracle:
        out["held_out_export"] = str(export_held_out(cfg, oracle))
    if a.only != "corpus":
        if a.before and oracle:
            out["before"] = skills(cfg, cfg.midtrain.base or cfg.student.model, oracle)
        base = mt.train_base(cfg, ds["dataset_id"], progress=sys.stderr.isatty())
        out["base"] = base
        if a.only != "train" and oracle:
            out["after"] = skills(cfg, base["model_path"], oracle)
    text = json.dumps(out, indent=1, default=str)
    if a.json:
        Path(a.json).parent.mkdir(parents=True, exist_ok=True)
        Path(a.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
