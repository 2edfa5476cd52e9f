"""Issue 32, part 1: a whole flywheel iteration survives SIGKILLs of any of its processes (benchmarks/chaos.py),
and what the chaos run found: a `flywheel run` killed with -9 left its ephemeral Prefect server running for ever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import chaos  # noqa: E402

# what `flywheel run` does in local mode, stopped right after Prefect started its ephemeral API server
_START_SERVER = """
from flows.orchestrate import local_settings
from prefect.client.orchestration import get_client
with local_settings():
    with get_client(sync_client=True) as client:
        client.api_healthcheck()
        print("up", flush=True)
        import time; time.sleep(600)
"""


def _env(tmp: Path) -> dict[str, str]:
    return {**chaos._env(tmp), "PYTHONPATH": str(ROOT)}  # the benchmark's run environment, with this checkout


def _gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.flow
def test_sigkilled_parent_takes_its_ephemeral_prefect_server_with_it(tmp_path):
    proc = subprocess.Popen(
        [sys.executable, "-c", _START_SERVER],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    server = None
    try:
        assert proc.stdout.readline().strip() == "up", "the ephemeral Prefect server did not start"
        kids = [p for p in chaos.descendants(proc.pid) if "prefect.server" in chaos.cmdline(p)]
        assert len(kids) == 1, f"expected one ephemeral server under the run, found {kids}"
        server = kids[0]
        proc.kill()  # SIGKILL: no atexit, no Prefect shutdown hook runs
        proc.wait()
        deadline = time.monotonic() + 15
        while not _gone(server) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _gone(server), f"the Prefect server {server} outlived its killed parent: {chaos.cmdline(server)}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if server is not None and not _gone(server):
            os.kill(server, signal.SIGKILL)  # ours: started by the process this test started


def _start_server(tmp_path) -> subprocess.Popen:
    """A process that starts Prefect's ephemeral server the way a local run does (prints "up" once it answers)."""
    return subprocess.Popen(
        [sys.executable, "-c", _START_SERVER],
        cwd=tmp_path,
        env=_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


@pytest.mark.flow
def test_server_killed_while_starting_fails_the_start_at_once(tmp_path):
    """Prefect restarts its ephemeral server only on exit code 3; a server killed while starting made the run wait
    out the whole startup timeout (120 s) and then fail. Now the start fails as soon as the server is gone."""
    proc = _start_server(tmp_path)
    try:
        server = None
        while server is None and proc.poll() is None:  # kill it as soon as it exists: long before it answers
            server = next((p for p in chaos.descendants(proc.pid) if "prefect.server" in chaos.cmdline(p)), None)
            time.sleep(0.02)
        assert server is not None, "no ephemeral server was started"
        os.kill(server, signal.SIGKILL)
        out, err = proc.communicate(timeout=90)  # the startup timeout is 120 s: this fails without the fix
        assert proc.returncode != 0 and "up" not in out
        assert "the ephemeral Prefect API server exited with code -9" in err, err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.flow
def test_server_killed_mid_run_ends_the_run_at_once(tmp_path):
    """A local run whose ephemeral server died retried every API call for minutes (6 min in one SFT stage of the
    chaos run) before failing; now it ends at once with one line, and the rerun resumes."""
    proc = _start_server(tmp_path)
    try:
        assert proc.stdout.readline().strip() == "up", "the ephemeral Prefect server did not start"
        (server,) = [p for p in chaos.descendants(proc.pid) if "prefect.server" in chaos.cmdline(p)]
        os.kill(server, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)  # without the watch it sleeps its 600 s
        assert proc.returncode == 1
        line = "error: the ephemeral Prefect API server exited with code -9; rerun the same command to continue"
        assert line in err.splitlines(), err[-2000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _facts(instances: list) -> dict:
    """lake_facts of a clean lake holding `instances` (nothing duplicated, partial or failing verify)."""
    zero = dict.fromkeys(["dup_episodes", "dup_steps", "partial_episodes", "orphan_steps"], 0)
    return {
        "instances": instances,
        **zero,
        "verify_rc": 0,
        "verify_tail": [],
        "datasets": [],
        "checkpoints": [],
        "weights": {},
    }


def _attempt(n: int, saved: tuple[int, int], resumed: tuple, kills: list[int]) -> dict:
    return {
        "attempt": n,
        "kills": kills,
        "saved_at_start": {"sft_step": saved[0], "rl_round": saved[1]},
        "resumed": {"sft_step": resumed[0], "rl_round": resumed[1]},
        "stuck": False,
        "orphans": [],
    }


def _kill(n: int, attempt: int, target: str | None, saved: tuple[int, int]) -> dict:
    return {"kill": n, "attempt": attempt, "target": target, "saved": {"sft_step": saved[0], "rl_round": saved[1]}}


# attempt 0 is killed mid-SFT (step 10 saved), attempt 1 mid-RL (round 1 finished), attempt 2 completes; each
# attempt: (state saved when it began, where its SFT / RL started: None = it did not run them)
_GOOD = [((0, 0), (0, None)), ((10, 0), (10, 0)), ((30, 1), (None, 1))]


@pytest.mark.parametrize(
    "attempts, missed, problem",
    [
        (_GOOD, [], None),
        ([_GOOD[0], ((10, 0), (0, 0)), _GOOD[2]], [], "attempt 1 started sft at 0"),  # SFT ignored its state
        ([_GOOD[0], ((0, 0), (0, 0)), _GOOD[2]], [], "attempt 1 started sft at 0"),  # ... and the harness missed it
        ([*_GOOD[:2], ((30, 1), (None, 0))], [], "attempt 2 started rl at 0"),  # RL redid its finished round
        ([_GOOD[0], ((10, 0), (None, 0)), _GOOD[2]], [], "no attempt ran sft again"),  # no line: nothing to check
        (_GOOD, ["rl"], "no kill landed mid-stage in ['rl']"),
    ],
)
def test_check_fails_a_seed_whose_stage_restarted_after_a_mid_stage_kill(attempts, missed, problem):
    """chaos.check: the attempt that runs SFT / RL again after a mid-stage kill must start it from the step /
    round saved before the kill; a restart from scratch, no sign of the restart, or a missed target fails the seed."""
    inst = [[0, "bootstrap", "click-test", 0, -1]]
    run = {
        "completed": True,
        "missed_targets": missed,
        "kills": [_kill(0, 0, "sft", (10, 0)), _kill(1, 1, "rl", (10, 1))],
        "attempts": [_attempt(n, saved, resumed, [n] if n < 2 else []) for n, (saved, resumed) in enumerate(attempts)],
    }
    res = chaos.check(run, _facts(inst), _facts(inst), None)
    if problem is None:
        assert res["ok"] and res["problems"] == [] and res["kills_survived"] == 2
        assert res["resumes_mid_stage"] == {"sft": 1, "rl": 1}
    else:
        assert not res["ok"] and res["kills_survived"] == 0
        assert any(problem in p for p in res["problems"]), res["problems"]


@pytest.mark.slow
def test_chaos_iteration_survives_kills(tmp_path):
    """Three seeded kills over one tiny iteration (with RL), each followed by a rerun of the same command, one of
    them mid-SFT once it saved a step: every episode once and whole, the lake verifies, SFT resumes from the saved
    step (not 0) and RL where its state was, no orphan process."""
    out = tmp_path / "chaos.json"
    res = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "chaos.py"),
            "--seeds", "0",
            "--kills", "3",
            "--targets", "sft",
            "--env-server", "none",
            "--no-reference",
            "--work", str(tmp_path / "work"),
            "--out", str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=580,
    )  # fmt: skip
    assert out.exists(), res.stderr[-3000:]
    rep = json.loads(out.read_text())
    seed = rep["seeds"][0]
    assert rep["kills_sent"] == 3, res.stderr[-3000:]
    assert seed["completed"], res.stderr[-3000:]
    assert seed["problems"] == [], res.stderr[-3000:]
    assert rep["rows_lost"] == 0 and rep["orphans"] == 0
    assert rep["kills_survived"] == rep["kills_sent"]
    assert seed["episodes"] == sum(rep["expected_episodes_per_stage"].values())
    assert len(seed["datasets"]) == 1 and len(seed["checkpoints"]) == 2  # one SFT and one RL checkpoint
    assert seed["verify_rc"] == 0
    (mid,) = [k for k in seed["kills"] if k["target"] == "sft"]  # the parent runs the trainer in local mode
    assert mid["role"] == "parent" and mid["stage"] == "sft" and mid["saved"]["sft_step"] > 0
    rerun = next(a for a in seed["attempts"] if a["attempt"] > mid["attempt"] and a["resumed"]["sft_step"] is not None)
    assert rerun["resumed"]["sft_step"] == rerun["saved_at_start"]["sft_step"] >= mid["saved"]["sft_step"]
    assert seed["resumes_mid_stage"]["sft"] >= 1 and rep["kills_mid_stage"] == {"sft": 1}
    assert res.returncode == 0, res.stderr[-3000:]
