"""The lake with its data on an object store, against a real S3-compatible server (moto in server mode, started
here, ended by pid) read and written by DuckDB's httpfs: writes, idempotent reruns, queries, screenshot bytes never
read unless selected; many machines through a real PostgreSQL catalog (tests/pg_server.py): rollouts from two
processes (real Chromium), curate on one machine and SFT on another (separate local caches: no shared path), the
parent lock across two processes that share no folder; `flywheel query`; `lake verify` naming a corrupt object;
one-line errors that never show a credential."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from synthetic import synthetic_episodes

from storage.catalog import FilteredRows, connect
from storage.lake import Lake, LakeError

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pg_server  # noqa: E402

pytest.importorskip("s3fs")
pytest.importorskip("moto")
ROOT = Path(__file__).resolve().parents[1]
BUCKET = "flywheel-test"
SECRET = "not-a-real-secret-7f3a9c"  # must never appear in any output or repr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A moto S3 server process on a free port with one bucket; the AWS variables point at it for this module."""
    port = _free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=fh,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    endpoint = f"http://127.0.0.1:{port}"
    saved = {
        k: os.environ.get(k)
        for k in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
            "FLYWHEEL_S3_ENDPOINT",
            "FLYWHEEL_LAKE_CACHE",
        )
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing",
        AWS_SECRET_ACCESS_KEY=SECRET,
        AWS_DEFAULT_REGION="us-east-1",
        FLYWHEEL_S3_ENDPOINT=endpoint,
        FLYWHEEL_LAKE_CACHE=str(tmp_path_factory.mktemp("cache")),
    )
    try:
        for _ in range(150):  # up to 15 s for the server to answer
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError(f"moto server did not start: {log.read_text()[-500:]}")
        import s3fs

        s3fs.S3FileSystem(endpoint_url=endpoint, skip_instance_cache=True).mkdir(BUCKET)
        yield endpoint
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # its own process group: the server and nothing else
        proc.wait(timeout=10)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="module")
def pg():
    why = pg_server.available()
    if why:
        pytest.skip(why)
    with pg_server.PostgresServer() as server:
        yield server


def test_writes_views_reruns_and_replace_run(s3):
    lake = Lake(f"s3://{BUCKET}/unit")
    assert lake.remote and lake.uri == f"s3://{BUCKET}/unit" and SECRET not in repr(lake) + repr(lake.store)
    eps, steps = synthetic_episodes(6, 3, seed=0, run_key="r1")
    lake.write("steps", steps, iteration=0, stage="rollouts", run_key="r1")
    lake.replace_run("episodes", [eps[:3], eps[3:]], iteration=0, stage="rollouts", run_key="r1")
    con = connect(lake)
    assert con.execute("SELECT iteration, stage, count(*) FROM episodes GROUP BY ALL").fetchall() == [
        (0, "rollouts", 6)
    ]
    got = con.execute(
        "SELECT screenshot FROM steps WHERE episode_id = ? AND step_idx = 1", [eps[0]["episode_id"]]
    ).fetchone()
    assert got[0] == steps[1]["screenshot"]
    # a rerun of the same part replaces it; a rerun with fewer parts drops the stale one
    lake.write("steps", steps, iteration=0, stage="rollouts", run_key="r1")
    lake.replace_run("episodes", [eps], iteration=0, stage="rollouts", run_key="r1")
    con = connect(lake)
    assert con.execute("SELECT count(*), count(DISTINCT episode_id) FROM episodes").fetchone() == (6, 6)
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] == len(steps)
    # compaction writes the data as Parquet objects in the bucket, and the bytes round-trip through it
    lake.compact()
    files = lake.files()
    assert files and all(f.path.startswith(f"s3://{BUCKET}/unit/data/") for f in files)
    assert lake.store.fs.exists(files[0].path)
    got = connect(lake).execute(
        "SELECT screenshot FROM steps WHERE episode_id = ? AND step_idx = 1", [eps[0]["episode_id"]]
    )
    assert got.fetchone()[0] == steps[1]["screenshot"]
    ok = FilteredRows(lake, "episodes", "episode_id", "success")
    want = sorted(r[0] for r in con.execute("SELECT episode_id FROM episodes WHERE success").fetchall())
    assert sorted(r["episode_id"] for r in ok.rows(con)) == want
    more, _ = synthetic_episodes(2, 1, seed=1, run_key="r2")
    lake.write("episodes", [dict(e, success=True) for e in more], iteration=0, stage="rollouts", run_key="r2")
    assert sorted(r["episode_id"] for r in ok.rows(con)) == sorted(want + [e["episode_id"] for e in more])
    assert con.execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 0
    assert Lake(f"s3://{BUCKET}/unit", create=False).has_data("steps")
    with pytest.raises(LakeError, match="no lake at"):
        Lake(f"s3://{BUCKET}/nothing-here", create=False)


def test_screenshots_are_never_read_unless_selected(s3):
    """The screenshot column's bytes in the bucket are garbage: a query that does not select them still works (so
    they were never read), and one that does fails."""
    from test_lake import _corrupt_column_chunk

    from flywheel.query import QueryError, run_query

    lake = Lake(f"s3://{BUCKET}/shots")
    _, steps = synthetic_episodes(40, 3, seed=1, run_key="s")
    lake.write("steps", steps, iteration=0, stage="rollouts", run_key="s")
    lake.compact()
    (obj,) = [f.path for f in lake.files("steps")]
    local = Path(lake.root) / "obj.parquet"
    lake.store.fs.get(obj, str(local))
    _corrupt_column_chunk(local, "screenshot")
    lake.store.fs.pipe_file(obj, local.read_bytes())
    con = connect(lake)
    assert con.execute("SELECT count(*), max(ui_text) IS NOT NULL FROM steps WHERE parse_ok").fetchone()[1]
    with pytest.raises(QueryError):
        run_query(con, "SELECT sum(octet_length(screenshot)) FROM steps", lake)


@pytest.mark.browser
def test_two_rollout_processes_then_curate_and_sft_on_another_machine(s3, pg, tmp_path, capsys, monkeypatch):
    import threading

    from configs.loading import load_config
    from flywheel.cli import main
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from training.export import curate
    from training.models import init_model
    from training.sft_stage import sft_stage

    uri = f"s3://{BUCKET}/fly"
    catalog = pg.database("fly")  # many machines: the catalog in PostgreSQL, the data in the bucket
    # two rollout runs at once, each with its own env worker process (as two machines would): disjoint seeds,
    # one short task; the workers get the lake as a URI + endpoint, nothing else
    specs = [
        RolloutSpec(
            run_key=f"boot-{i}",
            iteration=0,
            stage="bootstrap",
            lake_root=uri,
            lake_endpoint=s3,
            lake_catalog=catalog,
            jobs=make_jobs(f"boot-{i}", ["click-test"], seeds, policy_tag="scripted:0"),
            policy=PolicySpec("scripted"),
            max_steps=4,
            episode_timeout_s=60,
            n_envs=1,
        )
        for i, seeds in enumerate(([0, 1], [2, 3]))
    ]
    results: list = []
    threads = [threading.Thread(target=lambda sp=sp: results.append(run_rollouts(sp, progress=False))) for sp in specs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=240)
    assert sorted((r.ran, r.successes, r.errors) for r in results) == [(2, 2, 0), (2, 2, 0)]
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "flywheel",
            "query",
            "SELECT count(*) AS n, count(DISTINCT run_key) AS runs, count(DISTINCT seed) AS seeds FROM episodes",
            "--format",
            "json",
            "--lake",
            uri,
        ],
    )
    monkeypatch.setenv("FLYWHEEL_LAKE_CATALOG", catalog)
    # the rollouts' progress lines reach stdout too once an earlier CLI call in this process set up the progress
    # logger (tests/test_layout.py's entry-point test does): read only what the query prints
    before = capsys.readouterr()
    assert SECRET not in before.out + before.err
    with pytest.raises(SystemExit) as e:
        main()
    out = capsys.readouterr()
    assert e.value.code == 0, out.err
    assert json.loads(out.out) == [{"n": 4, "runs": 2, "seeds": 4}] and SECRET not in out.out + out.err

    # "machine A" curates into its own local cache; "machine B" trains from a different, empty one
    tiny = init_model("qwen3-vl", "tiny", tmp_path / "tiny", seed=0)
    over = {
        "lake.root": uri,
        "lake.catalog": catalog,
        "student.model": str(tiny),
        "sft.max_steps": 2,
        "sft.batch_size": 2,
        "sft.warmup_ratio": 0.0,
        "sft.save_every": 2,
    }
    cfg_a = load_config(ROOT / "configs" / "tiny.yaml", {**over, "lake.cache_dir": str(tmp_path / "a")})
    res = curate(cfg_a, 0)
    assert res["n_episodes"] == 4
    lake_b = Lake(uri, cache_dir=tmp_path / "b", catalog=catalog)
    assert not (tmp_path / "b" / "_datasets").exists()
    cfg_b = load_config(ROOT / "configs" / "tiny.yaml", {**over, "lake.cache_dir": str(tmp_path / "b")})
    out = sft_stage(cfg_b, 0, res["dataset_id"], lake=lake_b, progress=False)
    assert out["steps"] == 2 and not out["skipped"]
    assert (tmp_path / "b" / "_datasets" / res["dataset_id"] / "train.parquet").exists()  # fetched from the bucket
    # the checkpoint went to the bucket before its row: machine A sees both
    row = connect(Lake(uri, cache_dir=tmp_path / "a", catalog=catalog)).execute("SELECT path FROM checkpoints")
    row = row.fetchall()
    assert row == [(f"_checkpoints/{out['checkpoint_id']}",)]
    assert lake_b.store.fs.exists(lake_b.store.join(row[0][0], "sft_result.json"))
    # a rerun reuses the checkpoint without downloading the export again
    import shutil

    shutil.rmtree(tmp_path / "b" / "_datasets")
    again = sft_stage(cfg_b, 0, res["dataset_id"], lake=lake_b, progress=False)
    assert again["skipped"] and again["checkpoint_id"] == out["checkpoint_id"]
    assert not (tmp_path / "b" / "_datasets").exists()


def test_a_checkpoint_upload_failing_partway_leaves_no_row_and_a_rerun_completes_it(s3, tmp_path, monkeypatch):
    """The object store fails on the 3rd file of the SFT checkpoint folder's upload (injected where s3fs sends each
    file to the bucket): the stage fails with one line, the bucket holds 2 files of the folder, and no checkpoints
    row names it, so no reader is sent to a half-uploaded folder. A rerun trains it again, uploads every file, then
    writes the row; another machine (an empty cache) loads the checkpoint from the bucket."""
    import s3fs

    from configs.loading import load_config
    from training.export import curate
    from training.models import init_model, load_model
    from training.sft_stage import sft_stage

    uri = f"s3://{BUCKET}/partial"
    lake = Lake(uri, cache_dir=tmp_path / "a")
    eps, steps = synthetic_episodes(8, 2, seed=3, run_key="boot", tasks=("click-test",))
    eps = [dict(e, policy="scripted") for e in eps]  # teacher demos: what curate exports
    lake.write_many([("episodes", eps), ("steps", steps)], iteration=0, stage="bootstrap", run_key="boot")
    tiny = init_model("qwen3-vl", "tiny", tmp_path / "tiny", seed=0)
    over = {
        "lake.root": uri,
        "lake.cache_dir": str(tmp_path / "a"),
        "student.model": str(tiny),
        "sft.max_steps": 2,
        "sft.batch_size": 2,
        "sft.warmup_ratio": 0.0,
        "sft.save_every": 2,
    }
    cfg = load_config(ROOT / "configs" / "tiny.yaml", over)
    dataset_id = curate(cfg, 0)["dataset_id"]

    real, sent = s3fs.S3FileSystem._put_file, []

    async def flaky(self, lpath, rpath, *args, **kwargs):  # each S3FileSystem made from now on binds this one
        sent.append(rpath)
        if len(sent) == 3:
            raise OSError("injected: connection reset by the object store")
        return await real(self, lpath, rpath, *args, **kwargs)

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", flaky)
    with pytest.raises(LakeError, match="object store error.*uploading .*injected") as e:
        sft_stage(cfg, 0, dataset_id, progress=False)
    assert SECRET not in str(e.value) and len(sent) == 3
    (local,) = (tmp_path / "a" / "_checkpoints").iterdir()
    files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert len(files) > 3 and (local / "sft_result.json").exists()  # trained and saved whole, here
    folder = lake.store.join("_checkpoints", local.name)
    assert len(lake.store.list_files(folder)) == 2  # half of it in the bucket
    assert connect(lake).execute("SELECT count(*) FROM checkpoints").fetchone()[0] == 0  # no row names it

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", real)
    out = sft_stage(cfg, 0, dataset_id, progress=False)
    assert out["checkpoint_id"] == local.name and not out["skipped"] and out["steps"] == 2
    rows = connect(lake).execute("SELECT checkpoint_id, path FROM checkpoints").fetchall()
    assert rows == [(local.name, f"_checkpoints/{local.name}")]
    here = {p.relative_to(local).as_posix(): p.stat().st_size for p in local.rglob("*") if p.is_file()}
    there = {u[len(folder) + 1 :]: n for u, n in lake.store.list_files(folder)}
    assert there == here and sorted(here) == files  # every file of the folder, whole
    other = Lake(uri, cache_dir=tmp_path / "b", catalog=str(tmp_path / "a" / "catalog.sqlite"))
    fetched = other.fetch(rows[0][1])
    assert fetched.is_relative_to(tmp_path / "b")
    assert all((fetched / f).read_bytes() == (local / f).read_bytes() for f in files)
    load_model(str(fetched / "merged"))  # tiny.yaml trains a LoRA: its merged model too


def _hold(uri: str, catalog: str, cache: str, ready) -> None:
    socket.gethostname = lambda: "machine-a"  # another machine: its pid cannot be checked from here
    from storage.lock import parent_lock

    with parent_lock(Lake(uri, cache_dir=cache, catalog=catalog), "flywheel run (machine A)", lease_s=3):
        ready.set()
        time.sleep(600)


def test_the_parent_lock_spans_machines(s3, pg, tmp_path):
    """Two processes with separate caches (no shared folder) on one bucket + PostgreSQL catalog: the second gets the
    one-line error while the first holds the lock, and takes it over once the SIGKILLed first's lease expires."""
    import multiprocessing as mp

    from storage.lock import LakeBusy, holder, parent_lock

    uri, catalog = f"s3://{BUCKET}/locked", pg.database("locked")
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    p = ctx.Process(target=_hold, args=(uri, catalog, str(tmp_path / "a"), ready))
    p.start()
    try:
        assert ready.wait(60)
        b = Lake(uri, cache_dir=tmp_path / "b", catalog=catalog)
        with pytest.raises(LakeBusy, match=r"another flywheel run \(machine A\) is running"):
            with parent_lock(b):
                pass
        os.kill(p.pid, signal.SIGKILL)
        p.join(10)
        deadline = time.monotonic() + 10
        while holder(b) is not None:
            assert time.monotonic() < deadline
            time.sleep(0.2)
        with parent_lock(b, "flywheel run (machine B)"):
            assert holder(b)["what"] == "flywheel run (machine B)"
    finally:
        if p.is_alive():
            os.kill(p.pid, signal.SIGKILL)
            p.join(5)


def test_verify_names_a_corrupt_object(s3, capsys, monkeypatch):
    from flywheel.cli import main

    uri = f"s3://{BUCKET}/verify"
    lake = Lake(uri)
    eps, steps = synthetic_episodes(4, 2, seed=2, run_key="v")
    lake.write_many([("episodes", eps), ("steps", steps)], iteration=0, stage="rollouts", run_key="v")
    lake.compact()
    bad = next(f.path for f in lake.files("steps"))
    lake.store.fs.pipe_file(bad, b"PAR1 this is not parquet PAR1")  # a corrupt object under a data key
    monkeypatch.setattr(sys, "argv", ["flywheel", "lake", "verify", "--lake", uri])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 1
    err = capsys.readouterr()
    assert f"BAD steps: {bad}: unreadable" in err.err.replace("\n", "")
    assert "checked 2 data file(s)" in err.out
    assert connect(lake).execute("SELECT count(*) FROM episodes").fetchone()[0] == 4


@pytest.mark.parametrize("case", ["unreachable", "no-bucket", "bad-uri"])
def test_bad_store_settings_are_one_line_exit_2(s3, case, capsys, monkeypatch):
    from flywheel.cli import main

    uri = {"no-bucket": "s3://no-such-bucket/x", "bad-uri": "s3://Bad_Bucket/x"}.get(case, f"s3://{BUCKET}/unit")
    if case == "unreachable":
        monkeypatch.setenv("FLYWHEEL_S3_ENDPOINT", f"http://127.0.0.1:{_free_port()}")  # nothing listens there
    monkeypatch.setattr(sys, "argv", ["flywheel", "query", "SELECT 1", "--lake", uri])
    with pytest.raises(SystemExit) as e:
        main()
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and len(err.splitlines()) == 1 and SECRET not in err, err
    expect = {"unreachable": "cannot reach the object store", "no-bucket": "no bucket", "bad-uri": "invalid lake URI"}
    assert expect[case] in err, err
