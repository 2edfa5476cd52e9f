"""The learning bar: does the student get better? Teacher demos -> curate -> SFT -> held-out eval, on CPU.

    .venv/bin/python benchmarks/learning_bar.py [--config configs/local.yaml] [--workdir bench-out]
        [--set sft.max_minutes=6 ...] [--out docs/bench_learning_bar.json]

Runs flywheel.learning.learning_bar on the config's embedded default: a fresh random-init student, its
untrained baseline on held-out eval seeds, then bootstrap -> curate -> sft -> evaluate with the flywheel's
own stage functions. Prints JSON with per-task success before/after (95% CIs) and the wall time of each
phase. The bar: >= 60% overall held-out success within 15 minutes of wall time (bootstrap to evaluation).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument(
        "--workdir", default="bench-out", help="its learn-lake/, learn-checkpoints/ and student are replaced"
    )
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    ap.add_argument("--skip-baseline", action="store_true", help="skip evaluating the untrained model")
    ap.add_argument("--baseline-seeds", type=int, default=5, help="eval seeds per task for the untrained model")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args()

    import yaml

    from flywheel.learning import learning_bar

    overrides = {}
    for item in a.set:
        key, _, value = item.partition("=")
        overrides[key] = yaml.safe_load(value)
    t0 = time.time()
    out = learning_bar(
        a.config,
        Path(a.workdir),
        overrides,
        baseline=not a.skip_baseline,
        baseline_seeds=a.baseline_seeds,
        progress=not a.no_progress,
    )
    out["bar"] = {
        "success_rate": 0.6,
        "wall_s": 900,
        "met": out["after"]["success_rate"] >= 0.6 and out["wall_s_bootstrap_to_eval"] <= 900,
    }
    out.update(
        total_wall_s=round(time.time() - t0, 1),
        cpus=os.cpu_count(),
        load_avg_end=os.getloadavg(),
        date=time.strftime("%Y-%m-%d %H:%M"),
    )
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
