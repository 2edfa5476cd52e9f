"""The two data steps the GPU scripts share (benchmarks/midtrain_*_gpu.sh), as one CLI instead of inline Python.

    python benchmarks/gpu_corpus.py concat OUT.parquet A.parquet B.parquet:synth/click SP.parquet
    python benchmarks/gpu_corpus.py skills MODEL OUT.json HS=HS.parquet HSP=HSP.parquet [--max-rows N]

- concat: one SFT corpus from mid-training exports, keeping only the columns training reads (messages, images,
  step_idx, task_id). `FILE:TASK` keeps only that task's rows of FILE. Prints the rows per task.
- skills: the held-out synth proxy of a model (benchmarks/step_accuracy.evaluate, scored by mix_ablation.score:
  per-step click inside the box and per-episode exact), one entry per NAME=FILE, written as JSON and printed as one
  line of per-episode rates.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

COLUMNS = ("messages", "images", "step_idx", "task_id")


def concat(out: str, sources: list[str]) -> dict[str, int]:
    """Write the sources' training columns to `out`, one table; returns rows per task."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    tables = []
    for src in sources:
        path, _, task = src.partition(":")
        if not Path(path).is_file():
            raise SystemExit(f"gpu_corpus: no such export: {path}")
        t = pq.read_table(path)
        missing = [c for c in ("messages", "task_id") if c not in t.schema.names]
        if missing:
            raise SystemExit(f"gpu_corpus: {path} is not an SFT export (no {', '.join(missing)} column)")
        t = t.select([c for c in COLUMNS if c in t.schema.names])
        if task:
            t = t.filter(pc.equal(t.column("task_id"), task))
            if not t.num_rows:
                raise SystemExit(f"gpu_corpus: {path} has no rows of task {task}")
        tables.append(t)
    table = pa.concat_tables(tables, promote_options="default")
    pq.write_table(table, out)
    return dict(sorted(Counter(table.column("task_id").to_pylist()).items()))


def skills(model: str, out: str, held: list[str], max_rows: int | None = None) -> dict[str, float]:
    """Score `model` on each NAME=FILE held-out export; writes {NAME: score} to `out`, returns NAME -> episode rate."""
    import pyarrow.parquet as pq
    from mix_ablation import score
    from step_accuracy import evaluate

    result = {}
    for spec in held:
        name, sep, path = spec.partition("=")
        if not sep or not name:
            raise SystemExit(f"gpu_corpus: a held-out set is NAME=FILE, got {spec!r}")
        rows = pq.read_table(path).to_pylist()[:max_rows]
        rights: list[bool] = []
        evaluate(model, rows, 64, 128, rights=rights)
        result[name] = score(rows, rights)
    Path(out).write_text(json.dumps(result, indent=1))
    return {name: s["episode"] for name, s in result.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("concat", help="one SFT corpus from several exports")
    c.add_argument("out")
    c.add_argument("sources", nargs="+", help="FILE or FILE:TASK")
    s = sub.add_parser("skills", help="the held-out synth proxy of a model")
    s.add_argument("model")
    s.add_argument("out")
    s.add_argument("held", nargs="+", help="NAME=FILE")
    s.add_argument("--max-rows", type=int, default=None)
    a = ap.parse_args(argv)
    if a.cmd == "concat":
        print(json.dumps({"out": a.out, "rows": concat(a.out, a.sources)}))
    else:
        print(json.dumps({"model": a.model, "episode": skills(a.model, a.out, a.held, a.max_rows)}))


if __name__ == "__main__":
    main()
