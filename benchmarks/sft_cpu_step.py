"""CPU: the SFT step's time under a few settings, side by side on one export (the main job's levers).

    .venv/bin/python benchmarks/sft_cpu_step.py --data EXPORT.parquet --model models/mini-qwen3vl [--steps 60]
        [--skip 30] [--repeats 2] [--variants plain,micro4_cache,micro4_cache_bf16]

Each variant is training.sft.train on the same samples and seed from the same start, for --steps steps with
configs/local.yaml's sft settings (lr, batch, targets) and the variant's how-to-train fields (`_bf16`: the forward
under torch.autocast in bfloat16, benchmarks/_bf16.py); the timed part is
the steps after --skip (the first epoch encodes every sample and fills the vision cache). Variants run in turn,
--repeats rounds (plain, micro, bf16, plain, micro, bf16, ...), so a box whose speed drifts hits them all alike.
Prints JSON: per variant the median seconds a step of every round and their median, the final loss, and the
ratio to the first variant. Nothing else may run on the box meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# name -> (TrainSettings fields, the forward under bf16 autocast)
VARIANTS = {
    "plain": ({}, False),
    "micro4_cache": ({"micro_batch": 4, "vision_cache": True}, False),
    "micro4_cache_bf16": ({"micro_batch": 4, "vision_cache": True}, True),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", required=True, help="an SFT export (train.parquet)")
    ap.add_argument("--model", default="models/mini-qwen3vl")
    ap.add_argument("--config", default="configs/local.yaml", help="the sft section's settings are used")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--skip", type=int, default=30, help="untimed first steps")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    a = ap.parse_args()
    if a.skip >= a.steps:
        raise SystemExit("--skip must be below --steps")
    import dataclasses

    import torch

    from configs.loading import load_config
    from training.sft import TrainSettings, train

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from _bf16 import patch_loss_autocast

    set_autocast = patch_loss_autocast()

    names = a.variants.split(",")
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
    base = TrainSettings.from_config(load_config(a.config).sft)
    base = dataclasses.replace(base, micro_batch=None, vision_cache=None)  # each variant says how it trains
    times: dict[str, list[float]] = {n: [] for n in names}
    losses: dict[str, float] = {}
    for _ in range(a.repeats):
        for name in names:
            fields, bf16 = VARIANTS[name]
            s = dataclasses.replace(
                base, max_steps=a.steps, max_minutes=None, record_step_times=True, save_every=10**6, **fields
            )
            set_autocast(torch.bfloat16 if bf16 else None)
            with tempfile.TemporaryDirectory() as tmp:
                m = train(a.model, a.data, Path(tmp) / "out", s, progress=False)
            times[name].append(statistics.median(m["step_times"][a.skip :]))
            losses[name] = m["final_loss"]
    first = statistics.median(times[names[0]])
    out = {
        "benchmark": "SFT step on this CPU, by setting",
        "threads": torch.get_num_threads(),
        "data": a.data,
        "steps": a.steps,
        "timed_after": a.skip,
        "variants": {
            n: {
                "s_per_step_rounds": [round(t, 3) for t in times[n]],
                "s_per_step": round(statistics.median(times[n]), 3),
                "vs_first": round(statistics.median(times[n]) / first, 3),
                "final_loss": losses[n],
            }
            for n in names
        },
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
