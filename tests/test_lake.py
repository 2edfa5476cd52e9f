"""The lake (DuckLake): transactional idempotent writes, concurrent writers, snapshots, compaction, migration,
the lease lock, the plain DuckDB CLI, bad input."""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import time

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from synthetic import png_pool, synthetic_episodes

from flywheel.query import QueryError, export_query, run_query
from storage.attach import upgrade
from storage.catalog import connect
from storage.duck import extension_path
from storage.inspect import lake_stats, verify_lake
from storage.lake import CATALOG_FILE, Lake, LakeError
from storage.schema import STEPS


def _fill(lake: Lake, n=20, steps=3, iteration=0, run_key="r1", seed=0):
    eps, st = synthetic_episodes(n, steps, seed=seed, run_key=run_key)
    lake.write("episodes", eps, iteration=iteration, stage="rollouts", run_key=run_key)
    lake.write("steps", st, iteration=iteration, stage="rollouts", run_key=run_key)
    return eps, st


def _count(lake: Lake, table: str) -> int:
    return connect(lake).execute(f"SELECT count(*) FROM {table}").fetchone()[0]


def test_write_and_query_with_partitions(tmp_path):
    lake = Lake(tmp_path / "lake")
    eps, st = _fill(lake, iteration=0)
    _fill(lake, iteration=1, run_key="r2", seed=1)
    con = connect(lake)
    rows = con.execute("SELECT iteration, stage, count(*) FROM episodes GROUP BY ALL ORDER BY 1").fetchall()
    assert rows == [(0, "rollouts", 20), (1, "rollouts", 20)]
    # joins across tables and the screenshot bytes round-trip exactly
    png = con.execute(
        "SELECT s.screenshot FROM steps s JOIN episodes e USING (episode_id) WHERE e.episode_id = ? AND s.step_idx = 1",
        [eps[3]["episode_id"]],
    ).fetchone()[0]
    assert png == st[3 * 3 + 1]["screenshot"]
    # empty tables are typed, queryable views
    assert con.execute("SELECT count(*) FROM evals").fetchone()[0] == 0
    assert "success_rate" in [d[0] for d in con.execute("SELECT * FROM evals").description]


def test_runs_sql_reads_only_the_named_runs(tmp_path):
    from storage.catalog import runs_sql

    lake = Lake(tmp_path / "lake")
    _fill(lake, run_key="r1")
    _fill(lake, iteration=1, run_key="r1", seed=2)  # a run key's files in two partitions
    _fill(lake, run_key="r1-x", seed=1)  # its file names start with "r1-" too: the run_key filter drops them
    _fill(lake, run_key="r2", seed=3)
    con = connect(lake)
    got = con.execute(
        f"SELECT run_key, iteration, count(*) FROM ({runs_sql(lake, 'episodes', ['r1'])}) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [("r1", 0, 20), ("r1", 1, 20)]
    same = con.execute("SELECT * FROM episodes WHERE run_key = 'r2' ORDER BY episode_id").fetchall()
    assert con.execute(f"SELECT * FROM ({runs_sql(lake, 'episodes', ['r2'])}) ORDER BY episode_id").fetchall() == same
    none = con.execute(f"SELECT * FROM ({runs_sql(lake, 'steps', ['nope'])})")  # no rows: the same columns
    assert none.fetchall() == [] and [d[0] for d in none.description] == [
        d[0] for d in con.execute("SELECT * FROM steps LIMIT 0").description
    ]


def test_rerun_replaces_instead_of_duplicating(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    _fill(lake)  # same run key and part: the file is replaced
    assert _count(lake, "episodes") == 20
    # replace_run with fewer parts drops the parts an earlier attempt wrote
    eps, _ = synthetic_episodes(30, 1)
    lake.replace_run("episodes", [eps[:10], eps[10:20], eps[20:]], iteration=0, stage="curate", run_key="c")
    lake.replace_run("episodes", [eps[:10]], iteration=0, stage="curate", run_key="c")
    assert connect(lake).execute("SELECT count(*) FROM episodes WHERE stage='curate'").fetchone()[0] == 10


def test_bad_rows_rejected_with_clear_error(tmp_path):
    lake = Lake(tmp_path / "lake")
    with pytest.raises(LakeError, match="unknown columns"):
        lake.write(
            "episodes",
            [{"episode_id": "x", "task_id": "t", "seed": 1, "status": "ok", "run_key": "r", "sucess": True}],
            iteration=0,
            stage="s",
            run_key="r",
        )
    with pytest.raises(LakeError, match="do not match"):
        lake.write(
            "episodes",
            [{"episode_id": "x", "task_id": "t", "seed": "one", "status": "ok", "run_key": "r"}],
            iteration=0,
            stage="s",
            run_key="r",
        )
    with pytest.raises(LakeError, match="invalid run_key"):
        lake.write("episodes", [], iteration=0, stage="s", run_key="../escape")
    assert _count(lake, "episodes") == 0


def test_a_write_is_one_transaction(tmp_path, monkeypatch):
    """An episode and its steps commit together: a failure between the two tables leaves neither."""
    lake = Lake(tmp_path / "lake")
    eps, st = synthetic_episodes(1, 3, seed=1)
    real = Lake._insert

    def fail_on_episodes(self, cur, table, rows, **kw):
        if table == "episodes":
            raise duckdb.IOException("disk full (injected)")
        return real(self, cur, table, rows, **kw)

    monkeypatch.setattr(Lake, "_insert", fail_on_episodes)
    with pytest.raises(LakeError, match="disk full"):
        lake.write_many([("steps", st), ("episodes", eps)], iteration=0, stage="rollouts", run_key="r", part="e0")
    assert (_count(lake, "steps"), _count(lake, "episodes")) == (0, 0)
    monkeypatch.setattr(Lake, "_insert", real)
    lake.write_many([("steps", st), ("episodes", eps)], iteration=0, stage="rollouts", run_key="r", part="e0")
    assert (_count(lake, "steps"), _count(lake, "episodes")) == (3, 1)


def _writer(root: str, worker: int, n: int) -> None:
    lake = Lake(root)
    for i in range(n):  # one transaction per episode, like rollout workers do
        eps, st = synthetic_episodes(1, 2, seed=worker * 1000 + i, id_prefix=f"w{worker}-{i}")
        rows = [("steps", st), ("episodes", eps)]
        lake.write_many(rows, iteration=0, stage="rollouts", run_key="conc", part=f"w{worker}-e{i}")


def _make_at_once(root: str, go: str, worker: int) -> None:
    while not os.path.exists(go):  # every process reaches the start line before any opens the lake
        time.sleep(0.001)
    _writer(root, worker, 1)


def test_processes_that_make_the_same_new_lake_at_once_all_open_it(tmp_path):
    """Two commands on one new lake (a test polling the lake its command is creating, two stages started by hand):
    both initialise DuckLake's catalog, and the loser of SQLite's write lock got `database is locked` (2 of 12
    processes in 3 rounds of 4 before the attach was retried)."""
    ctx = mp.get_context("spawn")
    for r in range(3):
        root, go = str(tmp_path / f"lake{r}"), str(tmp_path / f"go{r}")
        procs = [ctx.Process(target=_make_at_once, args=(root, go, w)) for w in range(5)]
        for p in procs:
            p.start()
        time.sleep(3)  # their imports
        open(go, "w").close()
        for p in procs:
            p.join(timeout=120)
        assert [p.exitcode for p in procs] == [0] * 5, f"round {r}"
        con = connect(root)
        assert con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes").fetchone() == (5, 5)
        assert verify_lake(Lake(root)).bad == []


def test_concurrent_writers_lose_nothing(tmp_path):
    root = str(tmp_path / "lake")
    Lake(root)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(root, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    # read while they write: a reader sees whole episodes only (every episode row has its 2 steps)
    while any(p.is_alive() for p in procs):
        n_ep, n_st = (
            connect(root).execute("SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM steps)").fetchone()
        )
        assert n_st >= 2 * n_ep
    for p in procs:
        p.join()
        assert p.exitcode == 0
    con = connect(root)
    assert con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes").fetchone() == (60, 60)
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 120
    assert verify_lake(Lake(root)).bad == []


def test_plain_duckdb_opens_the_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    # a separate process with nothing but duckdb, as docs/SCHEMA.md tells a DuckDB CLI user
    assert _plain_duckdb_counts(lake.root, "episodes", "evals") == ["20", "0"]


def _plain_duckdb_counts(cwd, *tables: str) -> list[str]:
    """Row counts of `tables` through the DuckLake catalog, attached read-only by a separate Python process that
    imports nothing but duckdb, from the folder `cwd` (as a user of the DuckDB CLI would)."""
    counts = ", ".join(f"c.execute('SELECT count(*) FROM {t}').fetchone()[0]" for t in tables)
    code = (
        f"import duckdb; c = duckdb.connect(); c.execute(\"LOAD '{extension_path('ducklake')}'\"); "
        f"c.execute(\"LOAD '{extension_path('sqlite')}'\"); "
        f"c.execute(\"ATTACH 'ducklake:sqlite:{CATALOG_FILE}' AS lake (DATA_PATH 'data/', OVERRIDE_DATA_PATH true, "
        f"READ_ONLY)\"); c.execute('USE lake'); print({counts})"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_a_moved_lake_still_opens(tmp_path):
    """The catalog's data path follows the folder: a copied lake whose original is gone still opens, before and
    after compaction (which writes Parquet files under data/)."""
    lake = Lake(tmp_path / "lake")
    _fill(lake, n=7, steps=2)
    lake.compact()
    _fill(lake, n=3, steps=2, run_key="r2", seed=4)  # some rows still inlined in the catalog
    moved = tmp_path / "elsewhere" / "lake"
    shutil.copytree(lake.root, moved)
    lake.root.rename(tmp_path / "gone")  # nothing may still point at the original folder
    assert _plain_duckdb_counts(moved, "episodes", "steps", "evals") == ["10", "20", "0"]
    assert _count(Lake(moved), "steps") == 20


def test_snapshots_time_travel_and_the_cli_at(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    s1 = lake.snapshot()
    _fill(lake, run_key="r2", seed=3)
    assert lake.snapshot() > s1
    assert connect(lake, at=s1).execute("SELECT count(*) FROM episodes").fetchone()[0] == 20
    assert _count(lake, "episodes") == 40
    with pytest.raises(LakeError, match="no snapshot 999"):
        connect(lake, at=999)
    lake.replace_run("datasets", [[{"dataset_id": "d1", "run_key": "d1"}]], iteration=0, stage="curate", run_key="d1")
    rec = connect(lake).execute("SELECT lake_snapshot FROM datasets").fetchone()[0]
    assert rec == lake.snapshot() - 1  # the snapshot before its own commit: what the stage read
    env = {**os.environ, "FLYWHEEL_LAKE": str(lake.root)}
    for at, want in ((str(s1), "20"), ("d1", "40")):
        r = subprocess.run(
            [
                sys.executable,
                "-m",
                "flywheel",
                "query",
                "--at",
                at,
                "--format",
                "csv",
                "SELECT count(*) AS n FROM episodes",
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert r.returncode == 0, r.stderr
        assert [c.strip('"') for c in r.stdout.split()] == ["n", want]


def test_compaction_leaves_few_files_and_the_same_rows(tmp_path):
    lake = Lake(tmp_path / "lake")
    for i in range(30):  # per-episode writes, as rollouts make them
        eps, st = synthetic_episodes(1, 2, seed=i, id_prefix=f"e{i}")
        lake.write_many([("steps", st), ("episodes", eps)], iteration=0, stage="rollouts", run_key="r", part=f"e{i}")
    before = connect(lake).execute("SELECT sum(hash(episode_id, success)) FROM episodes").fetchone()[0]
    got = lake.compact()
    assert got["files_after"] <= 2  # one file each for episodes and steps
    assert {f.table for f in lake.files()} == {"episodes", "steps"}
    assert connect(lake).execute("SELECT sum(hash(episode_id, success)) FROM episodes").fetchone()[0] == before
    assert (_count(lake, "episodes"), _count(lake, "steps")) == (30, 60)


def _hold_lock(root: str, ready, lease: float) -> None:
    from storage.lock import parent_lock

    with parent_lock(Lake(root), "flywheel run (holder)", lease_s=lease):
        ready.set()
        time.sleep(600)


def test_a_writer_flushes_its_inlined_rows_and_new_parts_skip_the_replace(tmp_path, monkeypatch):
    import storage.lake as lake_mod

    monkeypatch.setattr(lake_mod, "FLUSH_ROWS", 5)
    lake = Lake(tmp_path / "lake")
    for i in range(4):  # 2 steps + 1 episode a write: steps reach 5 inlined rows at the 3rd write
        eps, st = synthetic_episodes(1, 2, seed=i, id_prefix=f"e{i}")
        lake.write_many(
            [("steps", st), ("episodes", eps)], iteration=0, stage="rollouts", run_key="r", part=f"e{i}", replace=False
        )
    assert [f.table for f in lake.files()] == ["steps"]  # flushed once, episodes (4 rows) still inlined
    assert (_count(lake, "episodes"), _count(lake, "steps")) == (4, 8)
    # replace=False trusts the caller: the same part again is appended, where the default replaces it
    eps, st = synthetic_episodes(1, 2, seed=0, id_prefix="e0")
    lake.write_many([("episodes", eps)], iteration=0, stage="rollouts", run_key="r", part="e0", replace=False)
    assert _count(lake, "episodes") == 5
    lake.write_many([("episodes", eps)], iteration=0, stage="rollouts", run_key="r", part="e0")
    assert _count(lake, "episodes") == 4


def test_lock_lives_in_the_catalog_and_a_killed_holder_is_taken_over(tmp_path):
    """Two processes that share nothing but the lake: the second gets the one-line error while the first holds the
    lease (renewed by its heartbeat), and takes the lock over at once when the holder, on this machine, is SIGKILLed
    (its pid is gone; across machines the lease runs out first: tests/test_lake_s3.py)."""
    from storage.lock import LakeBusy, holder, parent_lock

    root = str(tmp_path / "lake")
    Lake(root)
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold_lock, args=(root, ready, 3.0))
    p.start()
    try:
        assert ready.wait(60)
        with pytest.raises(LakeBusy, match=r"another flywheel run \(holder\) is running .*pid \d+"):
            with parent_lock(Lake(root)):
                pass
        time.sleep(3.5)  # the holder's heartbeat renews its lease: still busy
        with pytest.raises(LakeBusy):
            with parent_lock(Lake(root)):
                pass
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        with parent_lock(Lake(root), "flywheel run (second)"):  # no wait for the lease
            assert holder(Lake(root))["what"] == "flywheel run (second)"
        assert holder(Lake(root)) is None  # released on exit
    finally:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)


def test_the_lock_heartbeat_waits_for_catalog_maintenance(tmp_path):
    """The heartbeat's catalog write never runs beside a flush or merge of the same process: while maintenance holds
    storage.lake.MAINTENANCE the lease is not renewed, and it is renewed once maintenance ends."""
    from storage.lake import MAINTENANCE
    from storage.lock import _Meta, parent_lock

    lake = Lake(str(tmp_path / "lake"))
    with parent_lock(lake, lease_s=0.6):  # a beat every 0.2 s
        meta = _Meta(lake)
        with MAINTENANCE:
            held = meta.row()["expires"]
            time.sleep(0.9)
            assert meta.row()["expires"] == held  # three beats due, none written
        deadline = time.time() + 10
        while meta.row()["expires"] == held and time.time() < deadline:
            time.sleep(0.05)
        assert meta.row()["expires"] > held
    assert meta.row() is None  # released on exit


def _corrupt_column_chunk(path, column: str) -> None:
    """Overwrite the bytes of one column's data pages in place (the footer stays valid)."""
    md = pq.ParquetFile(path).metadata
    idx = md.schema.to_arrow_schema().get_field_index(column)
    with open(path, "r+b") as fh:
        for rg in range(md.num_row_groups):
            col = md.row_group(rg).column(idx)
            start = col.dictionary_page_offset or col.data_page_offset
            fh.seek(start)
            fh.write(b"\xff" * col.total_compressed_size)


def test_queries_that_skip_screenshot_never_read_it(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    lake.compact()
    f = next(f.path for f in lake.files("steps"))
    _corrupt_column_chunk(f, "screenshot")
    con = connect(lake)
    # curate-style query without the screenshot works: its bytes are never touched
    n = con.execute(
        "SELECT count(*), sum(s.step_idx) FROM steps s JOIN episodes e USING (episode_id) "
        "WHERE e.success AND s.parse_ok"
    ).fetchone()[0]
    assert n > 0
    with pytest.raises(QueryError):
        run_query(con, "SELECT sum(length(screenshot)) FROM steps", lake)


def test_a_corrupt_data_file_is_named(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, run_key="good")
    lake.compact()
    bad = next(f.path for f in lake.files("episodes"))
    data = open(bad, "rb").read()
    with open(bad, "wb") as fh:
        fh.write(data[:200] + b"garbage")  # truncated
    with pytest.raises((QueryError, LakeError), match=os.path.basename(bad)):
        run_query(connect(lake), "SELECT * FROM episodes", lake)
    rep = verify_lake(lake)
    assert [(b.table, b.path) for b in rep.bad if b.path == bad] == [("episodes", bad)]
    assert rep.checked == 2
    assert lake_stats(lake)["steps"].rows == 60  # the rest is intact


def test_a_newer_schema_adds_its_columns_to_an_older_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    cur = lake.cursor()
    cur.execute(f"ALTER TABLE {lake.ref('steps')} DROP COLUMN feedback")  # as a lake of an older version
    assert "feedback" not in [d[0] for d in connect(lake).execute("SELECT * FROM steps LIMIT 0").description]
    upgrade(lake)  # what opening it in a new process does
    assert connect(lake).execute("SELECT count(*), count(feedback) FROM steps").fetchone() == (60, 0)


def _old_layout_lake(root, *, bad: bool = True) -> dict[str, int]:
    """A lake as the code before DuckLake wrote it: one Parquet file per write under
    <table>/iteration=<n>/stage=<stage>/<run_key>-<part>.parquet, one file from an older schema, one corrupt file."""
    from storage.lake import to_table

    counts = {"episodes": 0, "steps": 0, "datasets": 0}
    for it, key in ((0, "boot"), (1, "roll")):
        for k in range(3):
            eps, st = synthetic_episodes(2, 2, seed=it * 10 + k, run_key=key, id_prefix=f"{key}{k}")
            for table, rows in (("episodes", eps), ("steps", st)):
                d = root / table / f"iteration={it}" / "stage=rollouts"
                d.mkdir(parents=True, exist_ok=True)
                pq.write_table(to_table(table, rows), d / f"{key}-ep{k}.parquet")
                counts[table] += len(rows)
    old = [f for f in STEPS if f.name not in ("logprobs", "token_ids", "feedback")]
    _, st = synthetic_episodes(1, 3, seed=99, run_key="old", id_prefix="old")
    d = root / "steps" / "iteration=0" / "stage=import"
    d.mkdir(parents=True)
    pq.write_table(
        pa.Table.from_pylist([{k: r.get(k) for k in pa.schema(old).names} for r in st], schema=pa.schema(old)),
        d / "old-00000.parquet",
    )
    counts["steps"] += 3
    d = root / "datasets" / "iteration=1" / "stage=curate"
    d.mkdir(parents=True)
    pq.write_table(
        to_table("datasets", [{"dataset_id": "d", "path": "_datasets/d", "run_key": "d"}]), d / "d-00000.parquet"
    )
    counts["datasets"] = 1
    (root / "_datasets" / "d").mkdir(parents=True)
    (root / "_datasets" / "d" / "train.parquet").write_bytes(b"export")
    if bad:
        (root / "episodes" / "iteration=1" / "stage=rollouts" / "junk-00000.parquet").write_bytes(b"not parquet")
    return counts


def test_migrate_an_old_layout_lake(tmp_path):
    old = tmp_path / "old"
    counts = _old_layout_lake(old)
    with pytest.raises(LakeError, match="old one-file-per-write layout.*lake migrate"):
        Lake(old)
    env = {**os.environ}
    env.pop("FLYWHEEL_LAKE", None)
    r = subprocess.run(
        [sys.executable, "-m", "flywheel", "lake", "migrate", str(old), str(tmp_path / "new")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "junk-00000.parquet: unreadable" in r.stderr  # the bad file rejects only itself, by name
    new = Lake(tmp_path / "new", create=False)
    con = connect(new)
    for table, n in counts.items():
        assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == n, table
    assert con.execute("SELECT count(*) FROM steps WHERE run_key = 'old' AND feedback IS NULL").fetchone()[0] == 3
    assert con.execute("SELECT DISTINCT iteration, stage FROM episodes ORDER BY 1").fetchall() == [
        (0, "rollouts"),
        (1, "rollouts"),
    ]
    assert (new.root / "_datasets" / "d" / "train.parquet").read_bytes() == b"export"  # the side folders came too
    # a rerun replaces what it copied: the same counts
    from storage.migrate import migrate

    migrate(old, new, log=lambda s: None)
    assert connect(new).execute("SELECT count(*) FROM steps").fetchone()[0] == counts["steps"]


def test_bad_sql_and_missing_lake(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    con = connect(lake)
    with pytest.raises(QueryError, match="SQL error"):
        run_query(con, "SELEC 1", lake)
    with pytest.raises(QueryError, match="SQL error.*nope"):
        run_query(con, "SELECT nope FROM episodes", lake)
    with pytest.raises(LakeError, match="no lake at"):
        connect(tmp_path / "missing")
    out = export_query(con, "SELECT task_id, count(*) n FROM episodes GROUP BY 1", tmp_path / "o.parquet", "parquet")
    assert pq.read_table(out).num_rows == 4


def test_png_pool_is_realistic():
    pngs = png_pool(3)
    assert all(p[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert all(3_000 < len(p) < 200_000 for p in pngs)
    assert duckdb.__version__


def test_open_lake_from_a_config_a_section_a_lake_or_a_path(tmp_path, monkeypatch):
    """The one way to open a lake: --lake (root=) > $FLYWHEEL_LAKE > lake.root for a config; a path as given."""
    from configs.loading import parse_config
    from storage.lake import open_lake

    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    cfg = parse_config({"lake": {"root": str(tmp_path / "cfg")}})
    assert open_lake(cfg).root == open_lake(cfg.lake).root == (tmp_path / "cfg").resolve()
    lake = open_lake(cfg)
    assert open_lake(lake) is lake
    monkeypatch.setenv("FLYWHEEL_LAKE", str(tmp_path / "env"))
    assert open_lake(cfg).root == (tmp_path / "env").resolve()
    assert open_lake(cfg, root=tmp_path / "arg").root == (tmp_path / "arg").resolve()
    assert open_lake(tmp_path / "path").root == (tmp_path / "path").resolve()
    assert open_lake(str(tmp_path / "path"), create=False).root == (tmp_path / "path").resolve()
    with pytest.raises(LakeError, match="no lake at"):
        open_lake(tmp_path / "missing", create=False)


def test_open_lake_passes_an_object_store_its_endpoint_and_cache(tmp_path, monkeypatch):
    from configs.loading import parse_config
    from storage.lake import open_lake

    seen: list[dict] = []

    class Spy(Lake):  # records what the lake would be opened with (no S3 server here)
        def __init__(self, root=None, **kw):
            seen.append(dict(root=str(root), **kw))

    monkeypatch.setattr("storage.lake.Lake", Spy)
    monkeypatch.delenv("FLYWHEEL_LAKE", raising=False)
    monkeypatch.delenv("FLYWHEEL_S3_ENDPOINT", raising=False)
    cache = str(tmp_path / "cache")
    cfg = parse_config({"lake": {"root": "s3://bucket/lake", "s3_endpoint": "http://cfg:9000", "cache_dir": cache}})
    open_lake(cfg)
    monkeypatch.setenv("FLYWHEEL_S3_ENDPOINT", "http://env:9000")
    open_lake(cfg.lake, root="s3://bucket/other", create=False)
    open_lake("s3://bucket/lake", endpoint="http://spec:9000")
    assert seen == [
        dict(root="s3://bucket/lake", create=True, endpoint="http://cfg:9000", cache_dir=cache, catalog=None),
        dict(root="s3://bucket/other", create=False, endpoint="http://env:9000", cache_dir=cache, catalog=None),
        dict(root="s3://bucket/lake", create=True, endpoint="http://spec:9000", catalog=None),
    ]
