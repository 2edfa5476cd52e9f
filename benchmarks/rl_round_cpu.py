"""Where a CPU RL round's update time goes, and what the round-speed changes save, side by side in one run.

    .venv/bin/python benchmarks/rl_round_cpu.py --lake LAKE --checkpoint _checkpoints/sft-it0-... \
        --run-key rl-it0-aaa [--rows 192] [--micro 16] [--repeats 2]

On one stored RL round (a rollout run key of stage rl), each phase the RL stage runs is timed both ways:
- load: the round's rows (training.rl_data.load_rl_rows, replay on) through the whole-table views, as before,
  vs only the round's and the replay candidates' run files (`lake=`), vs that plus a warm index of the stored
  successes (`index=`, what the stage's rounds after its first use); the rows must be equal;
- old log-probs: the no-grad scoring forward over the rows (rl.old_logp recompute; rollout skips it for the
  freshly sampled rows);
- forward + backward of the policy-gradient loss over `--rows` rows in micro-batches of `--micro`: in minibatch
  (random) order, as before, vs in length order (training.rl_encode.length_batches), with the pad fraction of each.
Timings are medians over `--repeats`, alternating the two ways. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks._rl_common import add_model_args, load_for_rl  # noqa: E402


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _compare_loads(a, lake, model) -> tuple[list[dict], dict[str, list[float]]]:
    """The round's rows through the whole-table views and through its run files, alternated: (rows, seconds)."""
    from agents.prompts import PromptOptions
    from storage.catalog import connect
    from training.models import model_arch
    from training.rl_data import load_rl_rows, stored_index

    def load(with_lake: bool, index=None):
        con = connect(lake)
        return load_rl_rows(
            con,
            [a.run_key],
            arch=model_arch(model),
            opts=PromptOptions(),
            targets=a.targets,
            replay=True,
            lake=lake if with_lake else None,
            index=index,
        )

    # the stage keeps one index of stored successes per run: built on its first round, then each later round
    # opens only the episode files added since (here: none), so the warm index is what rounds 1+ see
    index = stored_index(lake)
    build, _ = _timed(lambda: index.rows(connect(lake)))
    loads: dict[str, list[float]] = {
        "views": [],
        "run_files": [],
        "run_files_warm_index": [],
        "index_first_build": [build],
    }
    got = {}
    for _ in range(a.repeats):
        for name, flag, idx in (
            ("views", False, None),
            ("run_files", True, None),
            ("run_files_warm_index", True, index),
        ):
            dt, got[name] = _timed(lambda: load(flag, idx))
            loads[name].append(dt)
    if not got["views"] == got["run_files"] == got["run_files_warm_index"]:
        raise SystemExit("the loads returned different rows")
    return got["run_files"], loads


def _compare_steps(a, model, enc, encoded) -> tuple[dict[str, list[float]], list[float], dict[str, float], int]:
    """Forward+backward of `a.rows` rows in minibatch (random) vs length order, alternated, and the scoring pass:
    (seconds per order, scoring seconds, pad fraction per order, rows)."""
    import numpy as np
    import torch

    from training.rl_encode import length_batches, response_logprobs

    def score():
        with torch.no_grad():
            for idx in length_batches(range(len(encoded)), encoded, a.micro):
                batch, pos, mask = enc.pad([encoded[i] for i in idx], "cpu")
                response_logprobs(model, batch, pos, mask)

    def fwd_bwd(batches):
        model.zero_grad()
        for idx in batches:
            batch, pos, mask = enc.pad([encoded[i] for i in idx], "cpu")
            lp, _ = response_logprobs(model, batch, pos, mask)
            (lp * mask).sum().backward()

    n = min(a.rows, len(encoded))
    random_order = np.random.default_rng(0).permutation(len(encoded))[:n].tolist()
    ways = {
        "random": [random_order[k : k + a.micro] for k in range(0, n, a.micro)],
        "length": length_batches(random_order, encoded, a.micro),
    }
    lens = [e["input_ids"].shape[-1] for e in encoded]
    pads = {
        k: 1 - sum(lens[i] for b in v for i in b) / sum(max(lens[i] for i in b) * len(b) for b in v)
        for k, v in ways.items()
    }
    steps: dict[str, list[float]] = {"random": [], "length": []}
    scores = []
    for _ in range(a.repeats):
        scores.append(_timed(score)[0])
        for k in ("random", "length"):
            steps[k].append(_timed(lambda: fwd_bwd(ways[k]))[0])
    return steps, scores, pads, n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap)
    ap.add_argument("--run-key", required=True, help="a rollout run key of one RL round (episodes.run_key)")
    ap.add_argument("--rows", type=int, default=192, help="rows in the forward+backward comparison")
    ap.add_argument("--micro", type=int, default=16, help="rows per micro-batch")
    ap.add_argument("--repeats", type=int, default=2)
    a = ap.parse_args()

    import torch

    lake, model, proc, enc = load_for_rl(a)
    rows, loads = _compare_loads(a, lake, model)
    encoded = [enc.encode(r["messages"], r["images"], enc.response_ids(r)) for r in rows]
    steps, scores, pads, n = _compare_steps(a, model, enc, encoded)
    med = {
        k: statistics.median(v)
        for k, v in {
            **{f"load_{k}": v for k, v in loads.items()},
            **{f"fwd_bwd_{k}": v for k, v in steps.items()},
        }.items()
    }
    print(
        json.dumps(
            {
                "benchmark": "rl_round_cpu",
                "run_key": a.run_key,
                "rows": len(rows),
                "rows_fwd_bwd": n,
                "micro": a.micro,
                "threads": torch.get_num_threads(),
                "repeats": a.repeats,
                "seconds": {k: round(v, 2) for k, v in med.items()},
                "score_old_logp_s": round(statistics.median(scores), 2),
                "load_speedup": round(med["load_views"] / med["load_run_files"], 2),
                "load_index_speedup": round(med["load_run_files"] / med["load_run_files_warm_index"], 2),
                "pad_fraction": {k: round(v, 3) for k, v in pads.items()},
                "fwd_bwd_speedup": round(med["fwd_bwd_random"] / med["fwd_bwd_length"], 2),
                "date": time.strftime("%Y-%m-%d %H:%M"),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
