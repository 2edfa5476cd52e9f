"""Benchmark: a model's next-action accuracy on an SFT export, offline (no browser): greedy reply per sample vs
the sample's target, so it runs where the training runs (a GPU box without Chromium) and separates skills.

    .venv/bin/python benchmarks/step_accuracy.py --data <lake>/_datasets/<id>/train.parquet --model DIR [--model DIR2]
    .venv/bin/python benchmarks/step_accuracy.py --data held.parquet --model base --max-samples 300 --json out.json

Per sample, the prompt is the sample's own (teacher-forced history), and the reply is parsed into the action
schema like a rollout's. A click is right when it lands inside the smallest UI-text box (model space, the
prompt's `@ (x,y) [wxh]` lines) that holds the target point; a type is right when its text equals the target's
exactly; any other action when its type and arguments equal the target's. Reported per task and per target
action type ("point", "copy", "other"), with the parse-failure rate. Closed-loop success on real pages is
benchmarks/midtrain_skills.py; this is the per-step view of the same skills.
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


def judge(reply: str, target: str, prompt_text: str) -> tuple[str, bool, bool]:
    """(skill, parsed, right) of one reply against its target, both read in the model's own coordinates."""
    from agents.parsing import parse_response
    from training.data import box_at

    want = parse_response(target).action
    got = parse_response(reply).action
    if want is None:
        raise ValueError(f"target does not parse: {target[:200]!r}")
    kind = want.type.value
    skill = {"click": "point", "type": "copy"}.get(kind, "other")
    if got is None:
        return skill, False, False
    if got.type != want.type:
        return skill, True, False
    if kind == "click":
        box = box_at(prompt_text, want.x, want.y)  # the smallest UI-text box (model space) holding the target
        if box is None:  # no element box holds the target: within 10 units (1% of the screen)
            return skill, True, abs(got.x - want.x) <= 10 and abs(got.y - want.y) <= 10
        return skill, True, box.holds(got.x, got.y)
    if kind == "type":
        return skill, True, got.text == want.text
    return skill, True, got.model_dump() == want.model_dump()


def evaluate(
    model: str,
    rows: list[dict[str, Any]],
    batch: int,
    max_new_tokens: int,
    show: int = 0,
    rights: list[bool] | None = None,
    replies: list[str] | None = None,
) -> dict[str, Any]:
    """Greedy replies of `model` to `rows`, judged; `rights` and `replies`, when given, get each row's verdict and
    reply text in order."""
    from agents.backends.base import Sampling
    from agents.backends.hf import HFBackend
    from agents.prompts import Prompt

    be = HFBackend(model)
    t0 = time.monotonic()
    tally: dict[str, dict[str, list[int]]] = {}
    parse_fail = 0
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        prompts = [Prompt(r["messages"][:-1], [im["bytes"] for im in r["images"]]) for r in chunk]
        gens = be.generate(prompts, Sampling(temperature=0.0, max_new_tokens=max_new_tokens))
        for r, g in zip(chunk, gens):
            target = r["messages"][-1]["content"][0]["text"]
            text = "\n".join(c.get("text") or "" for m in r["messages"][:-1] for c in m["content"])
            skill, parsed, right = judge(g.text, target, text)
            if show > 0:
                show -= 1
                print(
                    f"--- {r['task_id']} [{skill}] right={right}\nwant: {target.splitlines()[-3:]}\ngot:  {g.text!r}",
                    file=sys.stderr,
                )
            parse_fail += not parsed
            if rights is not None:
                rights.append(right)
            if replies is not None:
                replies.append(g.text)
            for key in (r["task_id"], f"skill:{skill}", "all"):
                t = tally.setdefault(key, {"right": [0, 0]})
                t["right"][0] += right
                t["right"][1] += 1
    be.close()
    return {
        "model": model,
        "n": len(rows),
        "parse_fail_rate": round(parse_fail / max(len(rows), 1), 4),
        "accuracy": {k: round(v["right"][0] / v["right"][1], 4) for k, v in sorted(tally.items())},
        "counts": {k: v["right"][1] for k, v in sorted(tally.items())},
        "wall_s": round(time.monotonic() - t0, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="an SFT export (train.parquet)")
    ap.add_argument("--model", action="append", required=True)
    ap.add_argument("--max-samples", type=int, default=400)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--json", default=None)
    ap.add_argument("--show", type=int, default=0, help="print this many (target, reply) pairs to stderr")
    a = ap.parse_args()
    import pyarrow.parquet as pq

    rows = pq.read_table(a.data).to_pylist()
    step = max(1, len(rows) // a.max_samples)
    rows = rows[::step][: a.max_samples]  # spread over the file (it is ordered by task)
    out = {
        "benchmark": "step_accuracy",
        "data": a.data,
        "results": [evaluate(m, rows, a.batch, a.max_new_tokens, a.show) for m in a.model],
    }
    text = json.dumps(out, indent=1)
    if a.json:
        Path(a.json).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
