"""Benchmark: the curate-style query through the project's API vs hand-written DuckDB, same files.

    .venv/bin/python benchmarks/lake_query.py [--rows 1000000] [--lake bench-out/lake] [--reps 5]

Builds (once; reused while its row count matches) a synthetic lake of `--rows` step rows with
realistic PNG screenshots (~7 KB each) spread over iterations x stages x parts (one transaction each, then
compacted), then times "steps of successful episodes, without screenshots, joined to episodes" fetched as Arrow:
  api:  flywheel.query.run_query(con, training.queries.curate_steps_sql()) on a connection from
        storage.catalog.connect(lake), opened once (its one-off cost is reported as api_connect_s)
  hand: duckdb.connect() + the same SQL over read_parquet([...]) of the lake's Parquet data files, by hand
side by side, alternating order, median of --reps. Prints JSON; target api <= 1 s and ratio <= 1.2.

    .venv/bin/python benchmarks/lake_query.py --s3 [--rows 1000000]

adds a third side in the same run: the same rows copied into a lake whose data lives on a local S3-compatible
server (moto in server mode, started here and ended by pid), and the same API query over it (DuckDB's httpfs).
Reported as s3_api_s and s3_vs_disk (target <= 2); the copy time as s3_upload_s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # test data: synthetic

from synthetic import png_pool  # noqa: E402

from benchmarks._moto import start_moto, stop  # noqa: E402
from flywheel.query import run_query  # noqa: E402
from storage.catalog import connect  # noqa: E402
from storage.inspect import lake_stats  # noqa: E402
from storage.lake import Lake, open_lake  # noqa: E402
from training.queries import curate_steps_sql  # noqa: E402

STEPS_PER_EPISODE = 5
TASKS = np.array(["click-test", "click-button", "focus-text", "enter-text", "click-tab", "click-link"])


def build_part(rng: np.random.Generator, n_eps: int, ep_offset: int, pngs: list[bytes], run_key: str):
    ids = np.char.add("ep-", np.arange(ep_offset, ep_offset + n_eps).astype(str))
    success = rng.random(n_eps) < 0.6
    episodes = pa.table(
        {
            "episode_id": ids,
            "task_id": TASKS[rng.integers(0, len(TASKS), n_eps)],
            "seed": np.arange(ep_offset, ep_offset + n_eps),
            "policy": np.where(rng.random(n_eps) < 0.5, "scripted", "student"),
            "task_reward": success.astype(float),
            "success": success,
            "n_steps": np.full(n_eps, STEPS_PER_EPISODE, np.int32),
            "status": np.where(rng.random(n_eps) < 0.98, "ok", "error"),
            "run_key": np.full(n_eps, run_key),
            "instruction": np.full(n_eps, "Click the button labelled OK."),
        }
    )
    n = n_eps * STEPS_PER_EPISODE
    xs, ys = rng.integers(0, 160, n), rng.integers(50, 210, n)
    action = np.char.add(
        np.char.add(np.char.add('{"action":"click","x":', xs.astype(str)), ',"y":'), np.char.add(ys.astype(str), "}")
    )
    shots = pa.array([pngs[i] for i in rng.integers(0, len(pngs), n)], pa.binary())
    steps = pa.table(
        {
            "episode_id": np.repeat(ids, STEPS_PER_EPISODE),
            "step_idx": np.tile(np.arange(STEPS_PER_EPISODE, dtype=np.int32), n_eps),
            "is_final": np.zeros(n, bool),
            "screenshot": shots,
            "screen_w": np.full(n, 160, np.int32),
            "screen_h": np.full(n, 210, np.int32),
            "ui_text": np.char.add('button "OK" @ (80,', ys.astype(str)),
            "thought": np.full(n, "The OK button is the target."),
            "action_desc": np.full(n, "Click OK"),
            "action": action,
            "parse_ok": rng.random(n) < 0.97,
            "fallback_parse": rng.random(n) < 0.01,
            "run_key": np.full(n, run_key),
        }
    )
    return episodes, steps


def build_lake(root: Path, rows: int, iterations: int, stages: list[str], files: int) -> dict:
    lake = open_lake(root)
    if lake_stats(lake)["steps"].rows == rows:
        return {"built": False}
    import shutil

    del lake
    shutil.rmtree(root)
    lake = open_lake(root)
    t0 = time.time()
    rng = np.random.default_rng(0)
    pngs = png_pool(64)
    parts = iterations * len(stages) * files
    eps_per_part = rows // STEPS_PER_EPISODE // parts
    offset = 0
    for it in range(iterations):
        for stage in stages:
            run_key = f"{stage}-it{it}"
            for f in range(files):
                e, s = build_part(rng, eps_per_part, offset, pngs, run_key)
                offset += eps_per_part
                lake.write_many([("episodes", e), ("steps", s)], iteration=it, stage=stage, run_key=run_key, part=f)
        print(f"built iteration {it + 1}/{iterations}", file=sys.stderr)
    lake.compact()
    return {"built": True, "build_s": round(time.time() - t0, 1)}


def hand_sql(root: Path, threshold: float = 1.0) -> str:
    lake = open_lake(root, create=False)

    def src(t):
        files = ", ".join(f"'{f.path}'" for f in lake.files(t))
        return f"read_parquet([{files}])"

    return (
        curate_steps_sql(threshold)
        .replace("FROM steps AS s", f"FROM {src('steps')} AS s")
        .replace("JOIN episodes AS e", f"JOIN {src('episodes')} AS e")
    )


def start_s3(root: Path) -> tuple[subprocess.Popen, Lake, dict]:
    """A moto S3 server on a free port, and the local lake's rows copied into a lake at s3://bench/lake."""
    proc, endpoint = start_moto("bench")
    t0 = time.time()
    src = open_lake(root, create=False)
    import tempfile

    # a fresh local cache: the catalog of an s3:// lake without lake.catalog lives there, and one left by an earlier
    # run would point at objects of that run's (gone) server
    dst = Lake("s3://bench/lake", endpoint=endpoint, cache_dir=tempfile.mkdtemp(prefix="bench-s3-"))
    for table in ("episodes", "steps"):
        sql = f"INSERT INTO {dst.ref(table)} SELECT * FROM {src.ref(table)}"
        dst.transaction(lambda cur, sql=sql: cur.execute(sql), "copy")
    dst.compact()
    return proc, dst, {"s3_upload_s": round(time.time() - t0, 1), "s3_files": len(dst.files())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000, help="step rows in the synthetic lake")
    ap.add_argument("--lake", type=Path, default=Path("bench-out/lake"), help="where to build it (reused if complete)")
    ap.add_argument("--iterations", type=int, default=10, help="iteration partitions")
    ap.add_argument("--files", type=int, default=10, help="files per (iteration, stage) partition")
    ap.add_argument("--reps", type=int, default=5, help="timed repetitions per side (median reported)")
    ap.add_argument("--s3", action="store_true", help="also time the API query over a local S3 server (moto)")
    a = ap.parse_args()
    root = a.lake.resolve()
    build = build_lake(root, a.rows, a.iterations, ["bootstrap", "rollouts"], a.files)
    stats = lake_stats(open_lake(root))

    t0 = time.perf_counter()
    api_con = connect(root)  # opened once, like any database handle
    connect_s = time.perf_counter() - t0

    def api():
        return run_query(api_con, curate_steps_sql()).num_rows

    def hand():
        con = duckdb.connect()
        return con.sql(hand_sql(root)).to_arrow_table().num_rows

    sides = {"api": api, "hand": hand}
    s3_info: dict = {}
    proc = None
    try:
        if a.s3:
            proc, s3_lake, s3_info = start_s3(root)
            t0 = time.perf_counter()
            s3_con = connect(s3_lake)
            s3_info["s3_connect_s"] = round(time.perf_counter() - t0, 3)
            sides["s3"] = lambda: run_query(s3_con, curate_steps_sql()).num_rows
        for fn in sides.values():
            fn()  # warm the OS page cache (and DuckDB's external file cache) for every side
        times: dict[str, list[float]] = {k: [] for k in sides}
        counts = {}
        for r in range(a.reps):
            for name, fn in sides.items() if r % 2 == 0 else reversed(sides.items()):
                t0 = time.perf_counter()
                counts[name] = fn()
                times[name].append(time.perf_counter() - t0)
    finally:
        if proc is not None:
            stop(proc)
    assert len(set(counts.values())) == 1, counts
    med = {k: statistics.median(v) for k, v in times.items()}
    if a.s3:
        s3_info.update(s3_api_s=round(med["s3"], 3), s3_vs_disk=round(med["s3"] / med["api"], 2))
    print(
        json.dumps(
            {
                "benchmark": "lake_curate_query",
                "step_rows": stats["steps"].rows,
                "episode_rows": stats["episodes"].rows,
                "steps_files": stats["steps"].files,
                "partitions": len(stats["steps"].partitions),
                "lake_gb": round((stats["steps"].bytes + stats["episodes"].bytes) / 2**30, 2),
                "result_rows": counts["api"],
                "api_s": round(med["api"], 3),
                "hand_duckdb_s": round(med["hand"], 3),
                "ratio": round(med["api"] / med["hand"], 3),
                "api_connect_s": round(connect_s, 3),
                "target": {"api_s": 1.0, "ratio": 1.2},
                "reps": a.reps,
                "duckdb": duckdb.__version__,
                **build,
                **s3_info,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
