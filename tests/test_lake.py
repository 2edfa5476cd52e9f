"""The lake: atomic idempotent writes, concurrent writers, DuckDB views, catalog, bad input."""

from __future__ import annotations

import multiprocessing as mp
import shutil
import subprocess
import sys

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from storage.catalog import CATALOG_FILE, QueryError, connect, export_query, run_query
from storage.inspect import lake_stats, verify_lake
from storage.lake import Lake, LakeError
from storage.schema import STEPS
from storage.synthetic import png_pool, synthetic_episodes


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
    assert [f.name for f in lake.files_of_runs("episodes", ["r2"])] == ["r2-00000.parquet"]
    con = connect(lake)
    got = con.execute(
        f"SELECT run_key, iteration, count(*) FROM ({runs_sql(lake, 'episodes', ['r1'])}) GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    assert got == [("r1", 0, 20), ("r1", 1, 20)]
    same = con.execute("SELECT * FROM episodes WHERE run_key = 'r2' ORDER BY episode_id").fetchall()
    assert con.execute(f"SELECT * FROM ({runs_sql(lake, 'episodes', ['r2'])}) ORDER BY episode_id").fetchall() == same
    none = con.execute(f"SELECT * FROM ({runs_sql(lake, 'steps', ['nope'])})")  # no files: the typed empty view
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
    assert not list(lake.root.rglob("*.tmp"))


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
    assert not list(lake.root.rglob("*.parquet"))


def _writer(root: str, worker: int, n: int) -> None:
    lake = Lake(root)
    for i in range(n):  # one small file per episode, like rollout workers do
        eps, st = synthetic_episodes(1, 2, seed=worker * 1000 + i, id_prefix=f"w{worker}-{i}")
        lake.write("steps", st, iteration=0, stage="rollouts", run_key="conc", part=f"w{worker}-e{i}")
        lake.write("episodes", eps, iteration=0, stage="rollouts", run_key="conc", part=f"w{worker}-e{i}")


def test_concurrent_writers_lose_nothing(tmp_path):
    root = str(tmp_path / "lake")
    Lake(root)
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(root, w, 15)) for w in range(4)]
    for p in procs:
        p.start()
    # read while they write: every file a reader sees is complete
    seen = 0
    while any(p.is_alive() for p in procs):
        if Lake(root).has_data("episodes"):
            seen = max(seen, connect(root).execute("SELECT count(*) FROM episodes").fetchone()[0])
    for p in procs:
        p.join()
        assert p.exitcode == 0
    con = connect(root)
    assert con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes").fetchone() == (60, 60)
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == 120
    assert verify_lake(Lake(root)).bad == []


def test_catalog_file_opens_in_plain_duckdb(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake)
    connect(lake)
    cat = lake.root / CATALOG_FILE
    assert cat.exists()
    # a separate process with nothing but duckdb, like `cd lake && duckdb -readonly catalog.duckdb`
    assert _plain_duckdb_counts(lake.root, "episodes", "evals") == ["20", "0"]


def _plain_duckdb_counts(cwd, *tables: str) -> list[str]:
    """Row counts of `tables` through `catalog.duckdb`, opened read-only by a separate Python process that imports
    nothing but duckdb, from the folder `cwd` (as a user of the DuckDB CLI would)."""
    counts = ", ".join(f"c.execute('SELECT count(*) FROM {t}').fetchone()[0]" for t in tables)
    code = f"import duckdb; c = duckdb.connect({CATALOG_FILE!r}, read_only=True); print({counts})"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def test_catalog_of_a_moved_lake_still_works(tmp_path):
    """The catalog file holds paths relative to the lake root: a copied lake whose original is gone still
    opens, and reading it through the project does not rewrite it."""
    lake = Lake(tmp_path / "lake")
    _fill(lake, n=7, steps=2)
    connect(lake)  # writes catalog.duckdb
    moved = tmp_path / "elsewhere" / "lake"
    shutil.copytree(lake.root, moved)
    lake.root.rename(tmp_path / "gone")  # nothing may still point at the original folder
    assert _plain_duckdb_counts(moved, "episodes", "steps", "evals") == ["7", "14", "0"]
    cat = moved / CATALOG_FILE
    before = (cat.stat().st_mtime_ns, cat.stat().st_ino)
    assert _count(Lake(moved), "steps") == 14
    assert (cat.stat().st_mtime_ns, cat.stat().st_ino) == before  # the move alone needs no rewrite


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
    f = next(p for p in lake.root.glob("steps/*/*/*.parquet"))
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


def test_corrupt_file_is_named_and_quarantine_restores_queries(tmp_path):
    lake = Lake(tmp_path / "lake")
    _fill(lake, run_key="good")
    _fill(lake, run_key="bad", seed=5)
    bad = lake.file_path("episodes", iteration=0, stage="rollouts", run_key="bad")
    bad.write_bytes(bad.read_bytes()[:200] + b"garbage")  # truncated file
    with pytest.raises((QueryError, LakeError), match="bad-00000.parquet"):
        run_query(connect(lake), "SELECT count(*) FROM episodes", lake)
    rep = verify_lake(lake)
    assert [b.path for b in rep.bad] == [bad] and rep.checked == 4
    lake.quarantine(bad)
    assert _count(lake, "episodes") == 20  # the rest stays queryable
    assert (lake.root / "_quarantine" / bad.relative_to(lake.root)).exists()  # kept, not lost
    assert lake_stats(lake)["episodes"].rows == 20


def test_older_schema_files_stay_readable(tmp_path):
    lake = Lake(tmp_path / "lake")
    _, st = _fill(lake)
    # a file from an "older version": no logprobs/feedback/token columns
    old_cols = [f for f in STEPS if f.name not in ("logprobs", "token_ids", "feedback")]
    old = pa.Table.from_pylist([{k: v for k, v in r.items()} for r in st[:3]], schema=pa.schema(old_cols))
    path = lake.partition_dir("steps", 0, "old") / "old-00000.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(old, path)
    con = connect(lake)
    assert con.execute("SELECT count(*), count(logprobs) FROM steps WHERE stage='old'").fetchone() == (3, 0)
    rep = verify_lake(lake)
    assert rep.bad == [] and rep.older_version == 1
    # a type mismatch is not "older", it is bad
    wrong = pa.table({"episode_id": ["x"], "step_idx": ["zero"], "is_final": [False], "run_key": ["r"]})
    wpath = lake.partition_dir("steps", 0, "old") / "wrong-00000.parquet"
    pq.write_table(wrong, wpath)
    assert [b.path for b in verify_lake(lake).bad] == [wpath]


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
    from configs.models import parse_config
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
    from configs.models import parse_config
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
        dict(root="s3://bucket/lake", create=True, endpoint="http://cfg:9000", cache_dir=cache),
        dict(root="s3://bucket/other", create=False, endpoint="http://env:9000", cache_dir=cache),
        dict(root="s3://bucket/lake", create=True, endpoint="http://spec:9000"),
    ]
