"""Ctrl-C (SIGINT to the command's process group) during `flywheel stage bootstrap | curate | rl | evaluate`
(issue 32, part 4; rollouts and SFT: tests/test_bad_input.py, whose harness these share). Each test interrupts the
stage once it is observably mid-work, then checks the one line and exit 130, that nothing partial is in the lake
(whole episodes only, no dataset / checkpoint / eval row for the interrupted work), and that the same command run
again completes and keeps what the interrupted run had finished. The table: docs/ERRORS.md."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import pytest
import yaml
from test_bad_input import TINY, _interrupted, run_fw

from storage.catalog import connect
from storage.lake import Lake

pytestmark = pytest.mark.browser


def _config(tmp_path: Path, **sections) -> str:
    """tiny.yaml with some keys changed (nested dicts merge into its sections), written next to the test's lake."""

    def merge(base: dict, over: dict) -> dict:
        return {**base, **{k: merge(base.get(k, {}), v) if isinstance(v, dict) else v for k, v in over.items()}}

    c = merge(yaml.safe_load(Path(TINY).read_text()), sections)
    out = tmp_path / "cfg.yaml"
    out.write_text(yaml.safe_dump(c))
    return str(out)


def _new_lake(tmp_path: Path) -> Path:
    """An empty lake made before the command starts: polling a lake that the command is still creating can make
    the command's own DuckLake set-up fail (`database is locked`)."""
    return Lake(tmp_path / "lake").root


def _episodes(lake: Path, stage: str) -> dict[str, str]:
    """episode_id -> started_at of a stage's episodes."""
    rows = connect(Lake(lake, create=False)).execute(
        "SELECT episode_id, started_at::VARCHAR FROM episodes WHERE stage = ?", [stage]
    )
    return dict(rows.fetchall())


def _assert_whole(lake: Path) -> None:
    """No half episode: every episode has exactly its n_steps + 1 step rows (its actions and the final
    observation, step_idx 0..n_steps) and no episode id twice; `flywheel lake verify` is clean."""
    con = connect(Lake(lake, create=False))
    dup = con.execute("SELECT count(*) - count(DISTINCT episode_id) FROM episodes").fetchone()[0]
    bad = con.execute("""
        SELECT e.episode_id, e.n_steps, count(s.step_idx), count(DISTINCT s.step_idx), max(s.step_idx)
        FROM episodes e LEFT JOIN steps s USING (episode_id) GROUP BY e.episode_id, e.n_steps
        HAVING count(s.step_idx) != e.n_steps + 1 OR count(DISTINCT s.step_idx) != e.n_steps + 1
            OR max(s.step_idx) != e.n_steps""").fetchall()
    assert dup == 0 and not bad, (dup, bad[:5])
    v = run_fw("lake", "verify", "--lake", str(lake))
    assert v.returncode == 0 and "0 bad" in v.stdout, v.stdout + v.stderr


def _rows(lake: Path, table: str) -> list[dict]:
    return Lake(lake, create=False).rows(table)


# ---------------------------------------------------------------------------- bootstrap
@pytest.mark.slow
def test_ctrl_c_during_bootstrap_keeps_whole_demos_and_the_rerun_runs_only_the_rest(tmp_path):
    """Scripted teacher demos, 2 tasks x 25 seeds: interrupted once 2 are in the lake; the rerun runs only the
    demos the interrupted run did not finish and keeps those it did (same ids, same rows)."""
    lake = _new_lake(tmp_path)
    cmd = ["stage", "bootstrap", "-c", _config(tmp_path, bootstrap={"selection": {"seeds_per_task": 25}})]
    cmd += ["--lake", str(lake)]
    _interrupted(cmd, lambda: len(_episodes(lake, "bootstrap")) >= 2)

    kept = _episodes(lake, "bootstrap")
    assert 0 < len(kept) < 50
    _assert_whole(lake)
    r = run_fw(*cmd, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"ran {50 - len(kept)} episodes ({len(kept)} already in the lake)" in r.stdout, r.stdout
    after = _episodes(lake, "bootstrap")
    assert len(after) == 50 and all(after[k] == v for k, v in kept.items())  # the finished demos were not redone
    _assert_whole(lake)


# ---------------------------------------------------------------------------- curate
def test_ctrl_c_during_curate_keeps_the_previous_dataset_and_the_rerun_replaces_it(tmp_path):
    """Curate writes its export to a temp file, renames it, then writes the `datasets` row in one transaction, so
    an interrupt can only land before the rename (old export and old row), between rename and row (new export,
    old row: the rerun rewrites both) or after. Here it lands mid-export, while the temp file is on disk (a lake
    of 3,000 synthetic episodes: seconds of export), over an earlier finished curate: the old row and the old
    export stay as they were, byte for byte, no temp file is left, and the rerun replaces both."""
    from synthetic import png_pool, synthetic_episodes

    lake, pngs = tmp_path / "lake", png_pool(4)
    lk = Lake(lake)
    cfg = _config(tmp_path, curate={"max_episodes_per_task": 100_000})
    cmd = ["stage", "curate", "-c", cfg, "--lake", str(lake)]

    def add(n: int, prefix: str) -> None:
        eps, steps = synthetic_episodes(n, 2, pngs=pngs, id_prefix=prefix, run_key=prefix)
        lk.write_many([("episodes", eps), ("steps", steps)], iteration=0, stage="rollouts", run_key=prefix)

    add(40, "old")
    r = run_fw(*cmd)
    assert r.returncode == 0, r.stderr[-2000:]
    (old,) = _rows(lake, "datasets")
    export = lake / old["path"] / "train.parquet"
    old_sha = hashlib.sha256(export.read_bytes()).hexdigest()
    add(3000, "new")
    temps = lambda: list(export.parent.glob(".train.parquet.*.tmp"))  # noqa: E731
    _interrupted(cmd, lambda: len(temps()) > 0)

    assert not temps()  # the half-written export was removed
    (row,) = _rows(lake, "datasets")
    assert row == old and hashlib.sha256(export.read_bytes()).hexdigest() == old_sha  # nothing partial
    r = run_fw(*cmd)
    assert r.returncode == 0, r.stderr[-2000:]
    (new,) = _rows(lake, "datasets")
    import pyarrow.parquet as pq

    assert new["dataset_id"] == old["dataset_id"] and new["n_episodes"] > old["n_episodes"]
    assert pq.read_metadata(export).num_rows == new["n_steps"]  # the row describes the export on disk


# ---------------------------------------------------------------------------- RL
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    from training.models import init_model

    return str(init_model("qwen3-vl", "tiny", tmp_path_factory.mktemp("model") / "m", seed=0))


@pytest.mark.slow
def test_ctrl_c_during_rl_keeps_finished_rounds_and_the_rerun_resumes(tmp_path, tiny_model):
    """RL, 2 rounds of 2 tasks x 1 seed x group 2 from a tiny model (its groups all fail; the bootstrap's demos are
    replayed, so each round updates the weights): interrupted once round 0 is finished (its
    `rl_round.json`), i.e. during round 1. No `checkpoints` row, round 0 kept as it was, only whole episodes; the
    rerun starts at round 1 (it prints round 1 only), leaves round 0's folder untouched and records the one
    checkpoint."""
    lake = tmp_path / "lake"
    rl = {"rounds": 2, "group_size": 2, "seeds_per_task_per_round": 1, "batch_size": 4}
    cfg = _config(tmp_path, rl=rl, env={"max_steps": 2}, student={"max_new_tokens": 8})
    r = run_fw("stage", "bootstrap", "-c", cfg, "--lake", str(lake))  # stored successes: replay gives updates
    assert r.returncode == 0, r.stderr[-2000:]
    cmd = ["stage", "rl", "--checkpoint", tiny_model, "-c", cfg, "--lake", str(lake)]
    done = lambda i: list(lake.glob(f"_checkpoints/rl-*/round-{i}/rl_round.json"))  # noqa: E731
    _interrupted(cmd, lambda: len(done(0)) > 0)

    (marker,) = done(0)
    before = (marker.read_text(), marker.stat().st_mtime_ns, (marker.parent / "model.safetensors").read_bytes())
    assert not done(1) and not _rows(lake, "checkpoints")  # nothing for the round and the run that did not finish
    _assert_whole(lake)
    r = run_fw(*cmd, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert re.findall(r"^round (\d+):", r.stdout, re.M) == ["1"], r.stdout
    assert (marker.read_text(), marker.stat().st_mtime_ns, (marker.parent / "model.safetensors").read_bytes()) == before
    (ck,) = _rows(lake, "checkpoints")
    assert ck["method"] == "rl-grpo" and json.loads(ck["metrics"])["rounds"] == 2
    assert len(_episodes(lake, "rl")) == 2 * 2 * 1 * 2  # each round's episodes once
    metrics = connect(Lake(lake, create=False)).execute(
        "SELECT list(DISTINCT round ORDER BY round), count(*) - count(DISTINCT (round, global_step)) FROM rl_metrics"
    )
    assert metrics.fetchone() == ([0, 1], 0)  # each round's update metrics once
    _assert_whole(lake)


# ---------------------------------------------------------------------------- evaluate
@pytest.mark.slow
def test_ctrl_c_during_evaluate_writes_no_eval_row_and_the_rerun_completes(tmp_path):
    """The scripted teacher on 2 tasks x 25 held-out seeds: interrupted once 2 eval episodes are in the lake. No
    `evals` row (they are written after the last episode, in one transaction), only whole episodes; the rerun
    keeps the finished episodes (same ids, same rows), runs the rest and writes the per-task and overall rows."""
    lake = _new_lake(tmp_path)
    cfg = _config(tmp_path, evaluate={"selection": {"seeds_per_task": 25}, "held_out_tasks": False})
    cmd = ["stage", "evaluate", "--checkpoint", "scripted", "-c", cfg, "--lake", str(lake)]
    _interrupted(cmd, lambda: len(_episodes(lake, "evaluate")) >= 2)

    kept = _episodes(lake, "evaluate")
    assert 0 < len(kept) < 50 and not _rows(lake, "evals")
    _assert_whole(lake)
    r = run_fw(*cmd, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    after = _episodes(lake, "evaluate")
    assert len(after) == 50 and all(after[k] == v for k, v in kept.items())
    evals = _rows(lake, "evals")
    assert sorted(e["task_id"] for e in evals) == ["__all__", "click-test", "focus-text"]
    assert {e["task_id"]: e["n_episodes"] for e in evals}["__all__"] == 50
    _assert_whole(lake)
