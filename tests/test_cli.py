"""The `flywheel` CLI as a user runs it (a real subprocess): query, lake stats/verify, config errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from storage.lake import Lake
from storage.synthetic import synthetic_episodes

ROOT = Path(__file__).resolve().parents[1]


def fw(*args, env=None, cwd=None):
    return subprocess.run([sys.executable, "-m", "flywheel", *args], capture_output=True, text=True,
                          cwd=cwd or ROOT, env=env, timeout=120)


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    lk = Lake(tmp_path_factory.mktemp("cli") / "lake")
    eps, steps = synthetic_episodes(12, 2)
    lk.write("episodes", eps, iteration=0, stage="rollouts", run_key="r")
    lk.write("steps", steps, iteration=0, stage="rollouts", run_key="r")
    return lk


def test_query_table_json_csv_parquet(lake, tmp_path):
    r = fw("query", "SELECT task_id, count(*) AS n FROM episodes GROUP BY 1 ORDER BY 1", "--lake", str(lake.root))
    assert r.returncode == 0, r.stderr
    assert "click-button" in r.stdout and "4 row(s)" in r.stdout
    r = fw("query", "SELECT episode_id, screenshot FROM steps LIMIT 1", "--lake", str(lake.root))
    assert "<png" in r.stdout  # blobs render as a size, not bytes
    r = fw("query", "SELECT count(*) AS n FROM steps", "--format", "json", "--lake", str(lake.root))
    assert json.loads(r.stdout) == [{"n": 24}]
    r = fw("query", "SELECT task_id FROM episodes ORDER BY 1 LIMIT 2", "--format", "csv", "--lake", str(lake.root))
    import csv
    assert list(csv.reader(r.stdout.splitlines())) == [["task_id"], ["click-button"], ["click-button"]]
    out = tmp_path / "x.parquet"
    r = fw("query", "SELECT * FROM episodes", "--format", "parquet", "--out", str(out), "--lake", str(lake.root))
    assert r.returncode == 0 and pq.read_table(out).num_rows == 12


@pytest.mark.parametrize("args,needle", [
    (["query", "SELEC nonsense"], "SQL error"),
    (["query", "SELECT * FROM nope"], "SQL error"),
    (["query", "SELECT 1", "--format", "xml"], "unknown --format"),
])
def test_query_user_errors_are_one_line(lake, args, needle):
    r = fw(*args, "--lake", str(lake.root))
    assert r.returncode == 2
    assert needle in r.stderr and "Traceback" not in r.stderr


def test_missing_lake(tmp_path):
    r = fw("query", "SELECT 1", "--lake", str(tmp_path / "none"))
    assert r.returncode == 2 and "no lake at" in r.stderr and "Traceback" not in r.stderr


def test_lake_stats_and_verify(lake, tmp_path):
    r = fw("lake", "stats", "--json", "--lake", str(lake.root))
    stats = json.loads(r.stdout)
    assert stats["episodes"]["rows"] == 12 and stats["steps"]["rows"] == 24 and stats["evals"]["files"] == 0
    # corrupt a copy of the lake and verify names the file; quarantine makes the rest queryable
    import shutil
    copy = tmp_path / "lake"
    shutil.copytree(lake.root, copy)
    bad = next(copy.glob("episodes/*/*/*.parquet"))
    bad.write_bytes(b"PAR1 not really parquet")
    r = fw("lake", "verify", "--lake", str(copy))
    assert r.returncode == 1 and bad.name in r.stderr
    r = fw("lake", "verify", "--quarantine", "--lake", str(copy))
    assert "moved to _quarantine" in r.stderr
    assert fw("lake", "verify", "--lake", str(copy)).returncode == 0
    assert fw("query", "SELECT count(*) FROM steps", "--lake", str(copy)).returncode == 0


def test_config_errors_name_file_key_and_expectation(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  envs: two\n  enns: 3\n")
    r = fw("config", "validate", str(bad))
    assert r.returncode == 2
    assert f"{bad}: rollout.envs: Input should be a valid integer" in r.stderr
    assert "rollout.enns: unknown key" in r.stderr
    bad.write_text("env: [unclosed\n")
    r = fw("config", "validate", str(bad))
    assert r.returncode == 2 and "invalid YAML (line" in r.stderr
    r = fw("config", "validate", str(ROOT / "configs" / "local.yaml"))
    assert r.returncode == 0 and "ok" in r.stdout


def test_every_command_has_help():
    for cmd in (["query"], ["lake", "stats"], ["lake", "verify"], ["config", "show"], ["rollout"], ["run"]):
        r = fw(*cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        assert "Usage" in r.stdout and len(r.stdout) > 200
