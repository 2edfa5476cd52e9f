"""Benchmarks of the lakehouse (issue 30): a lake grown the way the flywheel grows it, and writers killed mid-commit.

    .venv/bin/python benchmarks/lakehouse.py grow [--episodes 20000 --procs 4 --lake bench-out/grown]
    .venv/bin/python benchmarks/lakehouse.py kill [--episodes 5000]
    .venv/bin/python benchmarks/lakehouse.py writes [--episodes 1000]

grow: `--procs` writer processes write `--episodes` synthetic episodes (3 steps with real PNG screenshots each), one
transaction per episode (an episode row and its steps, as a rollout worker writes them). Then, each in a fresh
process (extension loading and attaching included), median of --reps: opening the lake and counting its episodes
(`open_s`), building the viewer's index (`viewer_index_s`: viewer.data.ViewerData(...).index()), and the RL replay
lookup (`rl_replay_s`: training.rl_data.stored_index(lake).rows(con), the stored successes every RL round asks
for). Measured before and after `lake.compact()`. Target: <= 2 s each. The per-file lake took 36.6 s (viewer) and
73 s (RL lookup) at this size (docs/LOG.md, 2026-11-23).

kill: two writer processes with separate local caches (no shared folder) on one lake: data on a local S3 server
(moto), catalog in a real PostgreSQL (tests/pg_server.py). Each writes `--episodes` episodes under its own run
key; one is SIGKILLed partway (while it commits, most likely: it does little else), then rerun to the end.
Target: 0 lost and 0 duplicated rows, and the rerun completes the killed run.

writes: the cost of one episode's transaction as a lake grows, with the replace (DELETE + INSERT) and without it
(a new part, as rollout workers write), side by side in one process.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # test data (synthetic) and the PostgreSQL starter

from synthetic import png_pool, synthetic_episodes  # noqa: E402

from benchmarks._moto import start_moto, stop  # noqa: E402
from storage.catalog import connect  # noqa: E402
from storage.lake import Lake, open_lake  # noqa: E402


def _write(root: str, worker: int, start: int, n: int, steps: int, kw: dict | None = None) -> None:
    """One writer: episodes start..start+n-1, one transaction each, under run key w<worker>. Like a rollout run, it
    first reads the episodes its run key already has (a rerun after a kill), skips them, and writes the others as
    new parts (no replace: the rollout runner does the same for ids it knows are new)."""
    lake = Lake(root, **(kw or {}))
    pngs = png_pool(16)
    t0 = time.time()
    done = {r["episode_id"] for r in lake.rows("episodes", lake.where(0, "rollouts", f"w{worker}"), "episode_id")}
    for i in range(start, start + n):
        if (i - start) % 1000 == 999:
            print(f"writer {worker}: {i - start + 1}/{n} episodes, {time.time() - t0:.0f} s", file=sys.stderr)
        eps, st = synthetic_episodes(1, steps, seed=i, run_key=f"w{worker}", id_prefix=f"w{worker}-{i}", pngs=pngs)
        if eps[0]["episode_id"] in done:
            continue
        lake.write_many(
            [("steps", st), ("episodes", eps)],
            iteration=0,
            stage="rollouts",
            run_key=f"w{worker}",
            part=eps[0]["episode_id"],
            replace=False,
        )


def _measure(root: str) -> dict:
    """Timed in this (fresh) process: open + count, the viewer index, the RL replay lookup."""
    t0 = time.perf_counter()
    con = connect(root)
    n = con.execute("SELECT count(*) FROM episodes").fetchone()[0]
    open_s = time.perf_counter() - t0
    from viewer.data import ViewerData

    t0 = time.perf_counter()
    v = ViewerData(root)
    idx = v.index()
    viewer_s = time.perf_counter() - t0
    from training.rl_data import stored_index

    t0 = time.perf_counter()
    rows = stored_index(open_lake(root, create=False)).rows(connect(root))
    rl_s = time.perf_counter() - t0
    return {
        "episodes": n,
        "index_rows": idx["n"],
        "replay_rows": len(rows),
        "open_s": open_s,
        "viewer_index_s": viewer_s,
        "rl_replay_s": rl_s,
    }


def _measured(root: str, reps: int) -> dict:
    runs = []
    for _ in range(reps):
        r = subprocess.run(
            [sys.executable, __file__, "measure", "--lake", root], capture_output=True, text=True, timeout=600
        )
        if r.returncode != 0:
            raise SystemExit(r.stderr[-2000:])
        runs.append(json.loads(r.stdout))
    out = {k: runs[0][k] for k in ("episodes", "index_rows", "replay_rows")}
    for k in ("open_s", "viewer_index_s", "rl_replay_s"):
        vals = [x[k] for x in runs]
        out[k] = round(statistics.median(vals), 3)
        out[k + "_spread"] = [round(min(vals), 3), round(max(vals), 3)]
    return out


def grow(a) -> dict:
    root = str(Path(a.lake).resolve())
    shutil.rmtree(root, ignore_errors=True)
    Lake(root)
    per = a.episodes // a.procs
    ctx = mp.get_context("spawn")
    t0 = time.time()
    procs = [ctx.Process(target=_write, args=(root, w, w * per, per, 3)) for w in range(a.procs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode
    build_s = time.time() - t0
    lake = Lake(root)
    before = _measured(root, a.reps)
    files_before = len(lake.files())
    t0 = time.time()
    lake.compact()
    compact_s = time.time() - t0
    after = _measured(root, a.reps)
    size = sum(f.stat().st_size for f in Path(root).rglob("*") if f.is_file())
    return {
        "benchmark": "lakehouse_grow",
        "episodes": a.episodes,
        "writers": a.procs,
        "steps_per_episode": 3,
        "build_s": round(build_s, 1),
        "episodes_per_s": round(a.episodes / build_s, 1),
        "data_files_before": files_before,
        "data_files_after": len(lake.files()),
        "compact_s": round(compact_s, 1),
        "lake_mb": round(size / 2**20, 1),
        "before_compaction": before,
        "after_compaction": after,
        "target_s": 2.0,
        "reps": a.reps,
    }


def kill(a) -> dict:
    import pg_server

    why = pg_server.available()
    if why:
        raise SystemExit(why)
    scratch = Path(a.scratch).resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    moto, endpoint = start_moto("bench")
    try:
        with pg_server.PostgresServer() as pg:
            catalog = pg.database("killed")
            uri = "s3://bench/killed"
            kws = [{"endpoint": endpoint, "catalog": catalog, "cache_dir": str(scratch / f"m{w}")} for w in (0, 1)]
            Lake(uri, **kws[0])
            ctx = mp.get_context("spawn")
            t0 = time.time()
            procs = [ctx.Process(target=_write, args=(uri, w, 0, a.episodes, 2, kws[w])) for w in (0, 1)]
            for p in procs:
                p.start()
            lake = Lake(uri, **kws[0])
            while True:  # kill writer 1 once it has written about a third of its episodes
                n1 = lake.rows("episodes", "run_key = 'w1'", "count(*) AS n")[0]["n"]
                if n1 >= a.episodes // 3 or not procs[1].is_alive():
                    break
                time.sleep(0.2)
            os.kill(procs[1].pid, signal.SIGKILL)
            procs[1].join()
            killed_at = lake.rows("episodes", "run_key = 'w1'", "count(*) AS n")[0]["n"]
            procs[0].join()
            first_s = time.time() - t0
            t0 = time.time()
            rerun = ctx.Process(target=_write, args=(uri, 1, 0, a.episodes, 2, kws[1]))
            rerun.start()
            rerun.join()
            rerun_s = time.time() - t0
            con = connect(lake)
            ep = con.execute("SELECT run_key, count(*), count(DISTINCT episode_id) FROM episodes GROUP BY 1 ORDER BY 1")
            ep = ep.fetchall()
            st = con.execute("SELECT count(*), count(DISTINCT (episode_id, step_idx)) FROM steps").fetchone()
            orphans = con.execute("SELECT count(*) FROM episodes ANTI JOIN steps USING (episode_id)").fetchone()[0]
    finally:
        stop(moto)
    want = 2 * a.episodes
    got, distinct = sum(n for _, n, _ in ep), sum(d for *_, d in ep)
    return {
        "benchmark": "lakehouse_kill",
        "episodes_per_writer": a.episodes,
        "killed_writer_had": killed_at,
        "exitcode_killed": procs[1].exitcode,
        "first_pass_s": round(first_s, 1),
        "rerun_s": round(rerun_s, 1),
        "episodes_by_run": {k: {"rows": n, "distinct": d} for k, n, d in ep},
        "lost_episodes": want - distinct,
        "duplicated_episodes": got - distinct,
        "step_rows": st[0],
        "duplicated_steps": st[0] - st[1],
        "episodes_without_steps": orphans,
        "complete": got == want and st[0] == st[1] == want * 2,
    }


def writes(a) -> dict:
    """One writer, two fresh lakes side by side: each episode written with the replace (DELETE of its part, then
    INSERT: what every write did before session 20) and without it (a rollout worker's new episode), alternating, so
    both see the same box. Seconds per episode per window of --window episodes, to show how each grows with the lake."""
    scratch = Path(a.scratch).resolve()
    shutil.rmtree(scratch, ignore_errors=True)
    lakes = {"replace": Lake(scratch / "replace"), "new_part": Lake(scratch / "new_part")}
    pngs = png_pool(16)
    spent = {k: 0.0 for k in lakes}
    windows: dict[str, list[float]] = {k: [] for k in lakes}
    for i in range(a.episodes):
        for mode, lake in lakes.items():
            eps, st = synthetic_episodes(1, 3, seed=i, run_key="w0", id_prefix=f"w0-{i}", pngs=pngs)
            t0 = time.perf_counter()
            lake.write_many(
                [("steps", st), ("episodes", eps)],
                iteration=0,
                stage="rollouts",
                run_key="w0",
                part=eps[0]["episode_id"],
                replace=mode == "replace",
            )
            spent[mode] += time.perf_counter() - t0
        if (i + 1) % a.window == 0:
            for mode in lakes:
                windows[mode].append(round(spent[mode] / a.window, 4))
                spent[mode] = 0.0
    counts = {k: connect(lake).execute("SELECT count(*) FROM episodes").fetchone()[0] for k, lake in lakes.items()}
    return {
        "benchmark": "lakehouse_writes",
        "episodes": a.episodes,
        "steps_per_episode": 3,
        "window": a.window,
        "s_per_episode_by_window": windows,
        "episodes_written": counts,
        "speedup_last_window": round(windows["replace"][-1] / windows["new_part"][-1], 2)
        if windows["replace"]
        else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grow")
    g.add_argument("--episodes", type=int, default=20000)
    g.add_argument("--procs", type=int, default=4)
    g.add_argument("--lake", default="bench-out/grown")
    g.add_argument("--reps", type=int, default=3)
    k = sub.add_parser("kill")
    k.add_argument("--episodes", type=int, default=5000)
    k.add_argument("--scratch", default="bench-out/killed")
    w = sub.add_parser("writes")
    w.add_argument("--episodes", type=int, default=1000)
    w.add_argument("--window", type=int, default=250)
    w.add_argument("--scratch", default="bench-out/writes")
    m = sub.add_parser("measure")
    m.add_argument("--lake", required=True)
    a = ap.parse_args()
    if a.cmd == "measure":
        print(json.dumps(_measure(a.lake)))
        return
    print(json.dumps({"grow": grow, "kill": kill, "writes": writes}[a.cmd](a), indent=1))


if __name__ == "__main__":
    main()
