"""Build the mid-training corpus and its SFT export on CPU, for training the base elsewhere (a GPU box).

    .venv/bin/python benchmarks/midtrain_corpus.py --lake runs/base_lake --pages 600 \
        --kinds synth/click synth/type synth/form synth/read synth/option synth/tabs

Prints the corpus run and the dataset (its export is <lake>/_datasets/midtrain-<id>/train.parquet, what
benchmarks/midtrain_small_gpu.sh trains on). Session 18: 6 kinds x 600 pages = 3,600 oracle episodes, 9,744 samples,
733 s + 11 min of export on the 2 shared cores.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    from configs.loading import load_config
    from flywheel import midtrain

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "flywheel8.yaml"))
    ap.add_argument("--lake", required=True)
    ap.add_argument("--pages", type=int, default=600, help="train pages (oracle episodes) per kind")
    ap.add_argument("--kinds", nargs="+", default=None, help="synth/<kind> ids (default: midtrain.tasks)")
    ap.add_argument("--seed-offset", type=int, default=0, help="first train seed (a second corpus on other pages)")
    a = ap.parse_args()
    over = {
        "lake.root": a.lake,
        "midtrain.enabled": True,
        "midtrain.episodes_per_task": a.pages,
        "midtrain.seed_offset": a.seed_offset,
    }
    if a.kinds:
        over["midtrain.tasks"] = a.kinds
    cfg = load_config(a.config, over)
    t0 = time.monotonic()
    corpus = midtrain.corpus(cfg, progress=sys.stderr.isatty())
    out = {"corpus": {k: v for k, v in corpus.items() if not isinstance(v, (list, dict))}}
    out["corpus_s"] = round(time.monotonic() - t0, 1)
    ds = midtrain.build_dataset(cfg, corpus["run_key"])
    out["dataset"] = {k: v for k, v in ds.items() if k != "source_counts"}
    out["total_s"] = round(time.monotonic() - t0, 1)
    print(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
