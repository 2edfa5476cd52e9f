"""The `flywheel` CLI as a user runs it (a real subprocess): query, lake stats/verify, config errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from synthetic import synthetic_episodes

from storage.lake import Lake

ROOT = Path(__file__).resolve().parents[1]


def fw(*args, env=None, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "flywheel", *args], capture_output=True, text=True, cwd=cwd or ROOT, env=env, timeout=120
    )


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
    # nested values (a list, a struct) print as JSON text, as --format json writes them
    r = fw(
        "query",
        "SELECT task_id, list(seed ORDER BY seed) AS seeds, {'n': count(*)} AS s FROM episodes "
        "GROUP BY 1 ORDER BY 1 LIMIT 1",
        "--format",
        "csv",
        "--lake",
        str(lake.root),
    )
    assert r.returncode == 0, r.stderr
    head, row = list(csv.reader(r.stdout.splitlines()))
    assert head == ["task_id", "seeds", "s"] and row[0] == "click-button"
    assert json.loads(row[2]) == {"n": 3} and len(json.loads(row[1])) == 3
    out = tmp_path / "x.parquet"
    r = fw("query", "SELECT * FROM episodes", "--format", "parquet", "--out", str(out), "--lake", str(lake.root))
    assert r.returncode == 0 and pq.read_table(out).num_rows == 12


@pytest.mark.parametrize(
    "args,needle",
    [
        (["query", "SELEC nonsense"], "SQL error"),
        (["query", "SELECT * FROM nope"], "SQL error"),
        (["query", "SELECT 1", "--format", "xml"], "unknown --format"),
    ],
)
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
    # compact a copy of the lake, then corrupt one of its data files: verify names it, the rest stays queryable
    import shutil

    copy = tmp_path / "lake"
    shutil.copytree(lake.root, copy)
    r = fw("lake", "compact", "--lake", str(copy))
    assert r.returncode == 0 and "data file(s)" in r.stdout, r.stderr
    assert fw("lake", "verify", "--lake", str(copy)).returncode == 0
    bad = next(copy.glob("data/main/episodes/*.parquet"))
    bad.write_bytes(b"PAR1 not really parquet")
    r = fw("lake", "verify", "--lake", str(copy))
    assert r.returncode == 1 and bad.name in r.stderr and "BAD episodes" in r.stderr
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
    from flywheel.pipeline import stage_names

    stages = [["stage", name] for name in stage_names()]  # every registered stage has a command
    for cmd in (["query"], ["lake", "stats"], ["lake", "verify"], ["config", "show"], ["rollout"], ["run"], *stages):
        r = fw(*cmd, "--help")
        assert r.returncode == 0, (cmd, r.stderr)
        assert "Usage" in r.stdout and len(r.stdout) > 200


# ---------------------------------------------------------------------------- model errors: one line, exit 2
def _one_line_error(r) -> str:
    """The error line of a failed command: exit 2, stderr exactly one line, no traceback anywhere."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr + r.stdout and len(lines) == 1, r.stderr[-2000:]
    return lines[0]


def _offline_env(**extra) -> dict:
    import os

    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_LAKE"}
    return {**env, "HF_HUB_OFFLINE": "1", "COLUMNS": "400", **extra}


def test_missing_model_is_one_line_before_any_worker(tmp_path):
    lake = tmp_path / "lake"
    r = fw("stage", "evaluate", "--checkpoint", "/nonexistent", "--lake", str(lake), env=_offline_env())
    assert "no model folder at /nonexistent" in _one_line_error(r)
    # a path that could be a Hub id, offline: named as both
    r = fw(
        "rollout",
        "--policy",
        "student",
        "--model",
        "wrong/path",
        "--tasks",
        "click-test",
        "--seeds",
        "0",
        "--lake",
        str(lake),
        env=_offline_env(),
    )
    line = _one_line_error(r)
    assert "no model folder at wrong/path" in line and "Hugging Face Hub" in line
    assert not lake.exists()  # checked up front: nothing was written, no worker started
    # `flywheel stage rollouts`: the command built from the registry, the same one-line error
    r = fw("stage", "rollouts", "-i", "1", "--checkpoint", "/nonexistent", "--lake", str(lake), env=_offline_env())
    assert "no model folder at /nonexistent" in _one_line_error(r) and not lake.exists()


def test_evaluate_defaults_to_the_lakes_newest_checkpoint(tmp_path):
    """After `stage sft`, a bare `stage evaluate` scores the lake's newest checkpoint of this iteration or an
    earlier one (not the config's start weights); a later iteration's row is not picked for iteration 0."""
    from datetime import datetime, timezone

    lk = Lake(tmp_path / "lake")
    for it, name in ((0, "sft-it0-a"), (1, "sft-it1-b")):
        lk.replace_run(
            "checkpoints",
            [
                [
                    dict(
                        checkpoint_id=name,
                        path=f"_checkpoints/{name}",
                        method="sft",
                        base_model="m",
                        parent_checkpoint=None,
                        dataset_id="d",
                        adapter=False,
                        metrics="{}",
                        created_at=datetime.now(timezone.utc),
                        run_key=name,
                        git_sha=None,
                        config_hash="abc",
                    )
                ]
            ],
            iteration=it,
            stage="sft",
            run_key=name,
        )
    # the folders were never written, so the one-line error names the checkpoint the command chose
    for it, name in (("0", "sft-it0-a"), ("1", "sft-it1-b"), ("3", "sft-it1-b")):
        line = _one_line_error(fw("stage", "evaluate", "-i", it, "--lake", str(lk.root), env=_offline_env()))
        assert f"no model folder at {lk.root / '_checkpoints' / name}" in line, (it, line)


def test_rollout_error_from_the_workers_is_one_line(tmp_path):
    """A folder that passes the up-front check (a Qwen-VL config.json; torch weights, whose content only loading
    checks) but cannot load: the workers' RolloutError ends as one line too."""
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "qwen3_vl"}')
    (bad / "pytorch_model.bin").write_bytes(b"not a torch file")
    r = fw(
        "rollout",
        "--policy",
        "student",
        "--model",
        str(bad),
        "--tasks",
        "click-test",
        "--seeds",
        "0",
        "--lake",
        str(tmp_path / "lake"),
        "-c",
        str(ROOT / "configs" / "tiny.yaml"),
        env=_offline_env(),
    )
    line = _one_line_error(r)
    assert line.startswith("error: env workers cannot start:")


# ---------------------------------------------------------------------------- --lake on every lake command
@pytest.mark.parametrize(
    "cmd",
    [
        ["run"],
        ["rollout"],
        ["up"],
        ["stage", "curate"],
        ["stage", "sft"],
        ["stage", "evaluate"],
        ["stage", "rl"],
        ["query"],
        ["lake", "stats"],
        ["lake", "verify"],
    ],
)
def test_lake_option_on_every_lake_command(cmd):
    r = fw(*cmd, "--help", env=_offline_env())
    assert r.returncode == 0 and "--lake" in r.stdout, (cmd, r.stdout)


def test_lake_option_outranks_the_environment(tmp_path):
    """--lake > $FLYWHEEL_LAKE > lake.root, for a command whose workers write the lake and a stage that reads it."""
    lake, decoy = tmp_path / "mine", tmp_path / "decoy"
    env = _offline_env(FLYWHEEL_LAKE=str(decoy))
    r = fw(
        "rollout",
        "--policy",
        "scripted",
        "--tasks",
        "click-test",
        "--seeds",
        "0-1",
        "--envs",
        "1",
        "--lake",
        str(lake),
        env=env,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    got = fw(
        "query", "SELECT count(*) AS n FROM episodes WHERE stage = 'rollouts'", "--format", "json", "--lake", str(lake)
    )
    assert json.loads(got.stdout) == [{"n": 2}]  # written by the workers, into the --lake (not $FLYWHEEL_LAKE)
    r = fw("stage", "curate", "-i", "0", "--lake", str(lake), env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "2 episodes" in r.stdout and len(list(lake.glob("_datasets/*/train.parquet"))) == 1
    r = fw("query", "SELECT count(*) AS n FROM datasets", "--format", "json", "--lake", str(lake), env=env)
    assert json.loads(r.stdout) == [{"n": 1}]
    assert not decoy.exists()
