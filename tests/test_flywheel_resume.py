"""Two flywheel iterations as a user runs them (`flywheel run`, a real subprocess with its own Prefect), killed
with SIGKILL in the second iteration and run again: the rerun finishes iteration 1 without duplicate rows and
without running a finished stage again, and iteration 1 continues from iteration 0's checkpoint."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from storage.catalog import connect

pytestmark = [pytest.mark.flow, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[1]


def _config(tmp: Path) -> Path:
    from training.models import init_model

    init_model("qwen3-vl", "tiny", tmp / "student", seed=0)
    cfg = yaml.safe_load((ROOT / "configs" / "tiny.yaml").read_text())
    cfg["iterations"] = 2
    cfg["student"]["model"] = str(tmp / "student")
    cfg["evaluate"]["held_out_tasks"] = False
    cfg["curriculum"] = {"enabled": True}
    cfg["bootstrap"]["max_demos_per_task"] = 5
    cfg["sft"] = {"method": "lora", "max_steps": 40, "batch_size": 2, "epochs": 100}  # long enough to be killed in
    path = tmp / "tiny2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "FLYWHEEL_LAKE"))}
    env.update(
        PREFECT_HOME=str(tmp / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        HF_HUB_OFFLINE="1",
        PYTHONUNBUFFERED="1",
    )
    return env


def _files(lake: Path) -> dict[str, tuple[int, ...]]:
    """Each write's rows, keyed like the old per-write files (a rerun that rewrites a write changes its row ids)."""
    from lake_parts import written_parts

    return written_parts(lake)


def test_kill_in_iteration_two_then_rerun_finishes_it_once(tmp_path):
    cfg, lake, log = _config(tmp_path), tmp_path / "lake", tmp_path / "run.log"
    cmd = [sys.executable, "-m", "flywheel", "run", "-c", str(cfg), "--lake", str(lake)]
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, cwd=ROOT, env=_env(tmp_path), stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        # SFT of iteration 1 has started (curate's result is recorded by then): kill it mid-training
        deadline = time.monotonic() + 480
        while "Beginning subflow run 'sft-it1'" not in log.read_text():
            assert proc.poll() is None, (
                f"flywheel run ended (exit {proc.returncode}) before iteration 1's curate:\n{log.read_text()[-3000:]}"
            )
            assert time.monotonic() < deadline, f"no iteration 1 curate in 480 s:\n{log.read_text()[-3000:]}"
            time.sleep(0.1)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the run's own process group: the flow and its workers
        proc.wait()
    con = connect(lake)
    assert con.execute("SELECT count(*) FROM evals WHERE iteration = 1").fetchone()[0] == 0, "killed too late"
    assert con.execute("SELECT count(*) FROM checkpoints WHERE iteration = 1").fetchone()[0] == 0, "killed too late"
    before = _files(lake)
    finished = {
        p: t
        for p, t in before.items()
        if "iteration=0" in p or "stage=curate" in p or "stage=bootstrap" in p or "stage=rollouts" in p
    }
    assert any("iteration=1" in p for p in finished)

    with (tmp_path / "rerun.log").open("w") as fh:
        again = subprocess.run(
            [*cmd, "--iterations", "1"], cwd=ROOT, env=_env(tmp_path), stdout=fh, stderr=subprocess.STDOUT, timeout=600
        )
    assert again.returncode == 0, (tmp_path / "rerun.log").read_text()[-3000:]
    after = _files(lake)
    assert {p: after.get(p) for p in finished} == finished  # no finished stage wrote again ...
    finished_dirs = {str(Path(p).parent) for p in finished}
    assert {p for p in after if str(Path(p).parent) in finished_dirs} == set(finished)  # ... nor added a run
    con = connect(lake)
    one = lambda sql: con.execute(sql).fetchall()  # noqa: E731
    assert one("SELECT iteration, count(*) FROM evals WHERE task_id = '__all__' GROUP BY 1 ORDER BY 1") == [
        (0, 1),
        (1, 1),
    ]
    assert one("SELECT count(*) - count(DISTINCT episode_id) FROM episodes") == [(0,)]
    assert one("SELECT count(*) - count(DISTINCT (episode_id, step_idx)) FROM steps") == [(0,)]
    assert one("SELECT iteration, count(*) FROM datasets GROUP BY 1 ORDER BY 1") == [(0, 1), (1, 1)]
    assert one("SELECT iteration, count(*) FROM checkpoints WHERE stage = 'sft' GROUP BY 1 ORDER BY 1") == [
        (0, 1),
        (1, 1),
    ]
    assert one("SELECT iteration, count(DISTINCT task_id) FROM curriculum GROUP BY 1 ORDER BY 1") == [(0, 3), (1, 3)]
    # lineage: iteration 1 trained from iteration 0's checkpoint
    parent, ck0 = con.execute(
        "SELECT (SELECT parent_checkpoint FROM checkpoints WHERE iteration = 1 AND stage = 'sft'), "
        "(SELECT checkpoint_id FROM checkpoints WHERE iteration = 0 ORDER BY created_at DESC LIMIT 1)"
    ).fetchone()
    assert parent == ck0
