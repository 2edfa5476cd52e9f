"""Parallel rollouts with real Chromium: lake contents, idempotent reruns, SIGKILL and timeouts."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
from storage.catalog import connect

pytestmark = pytest.mark.browser


def _spec(lake_root, run_key, tasks=("click-test", "focus-text"), seeds=(0, 1, 2), group=1, **kw) -> RolloutSpec:
    jobs = make_jobs(run_key, list(tasks), list(seeds), group_size=group, policy_tag="scripted:0")
    kw.setdefault("n_envs", 2)
    return RolloutSpec(
        run_key=run_key,
        iteration=0,
        stage="rollouts",
        lake_root=str(lake_root),
        jobs=jobs,
        policy=PolicySpec("scripted"),
        max_steps=6,
        episode_timeout_s=60,
        **kw,
    )


def _group_members(pgid: int) -> list[int]:
    """Live pids whose process group is `pgid` (a SIGKILLed worker's browsers would show up here)."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(d.name))
    return out


def test_scripted_rollouts_fill_the_lake_and_rerun_is_idempotent(lake_root):
    spec = _spec(lake_root, "roll-a", group=2)
    s = run_rollouts(spec, progress=False)
    assert (s.ran, s.skipped, s.errors) == (12, 0, 0)
    assert s.successes == 12  # the teacher solves both tasks
    con = connect(lake_root)
    eps = con.execute(
        "SELECT count(*), count(DISTINCT group_id), min(n_steps), bool_and(success) FROM episodes"
    ).fetchone()
    assert eps == (12, 6, 1, True)
    # every action row has a PNG screenshot, a parsed action and the teacher's text; plus one final row each
    row = con.execute("""SELECT count(*) FILTER (NOT is_final), count(*) FILTER (is_final),
                                bool_and(screenshot[1:4] = '\\x89PNG'::BLOB), bool_and(parse_ok OR is_final),
                                bool_and(response_text LIKE '%<tool_call>%' OR is_final)
                         FROM steps""").fetchone()
    n_actions, n_final, png, parsed, text = row
    assert n_final == 12 and n_actions >= 12 and png and parsed and text
    assert con.execute("SELECT sum(n_steps) FROM episodes").fetchone()[0] == n_actions
    # a rerun of the same key runs nothing and leaves the row counts as they were
    s2 = run_rollouts(spec, progress=False)
    assert (s2.ran, s2.skipped) == (0, 12)
    assert connect(lake_root).execute("SELECT count(*) FROM episodes").fetchone()[0] == 12


def test_sigkill_mid_episode_leaves_no_orphans_and_rerun_fills_in(lake_root):
    # a slow policy (0.4 s per step) so the worker is surely inside an episode when it is killed
    spec = _spec(lake_root, "roll-kill", seeds=(0, 1, 2), step_delay_s=0.4)
    killed: dict[str, int] = {}

    def on_result(r):
        if not killed and r.get("worker_pid"):
            pid = r["worker_pid"]
            killed["pid"] = pid
            killed["members_before"] = len(_group_members(pid))  # worker + chromedriver + chromium
            # the runner hands this worker its next job as soon as this callback returns
            threading.Timer(0.25, os.kill, (pid, signal.SIGKILL)).start()

    s = run_rollouts(spec, progress=False, on_result=on_result)
    assert s.ran == 6 and s.errors == 1 and s.per_status == {"ok": 5, "error": 1}
    time.sleep(0.5)
    assert killed["members_before"] >= 3  # the group really held the browser (else the next check is vacuous)
    assert _group_members(killed["pid"]) == []  # chromium + chromedriver of the dead worker are gone
    con = connect(lake_root)
    assert con.execute("SELECT count(*) FROM episodes").fetchone()[0] == 6
    err = con.execute("SELECT error FROM episodes WHERE status = 'error'").fetchone()[0]
    assert "worker died" in err
    # rerun: only the errored episode runs again; nothing is duplicated
    s2 = run_rollouts(_spec(lake_root, "roll-kill", seeds=(0, 1, 2)), progress=False)
    assert (s2.ran, s2.skipped, s2.errors) == (1, 5, 0)
    assert connect(lake_root).execute(
        "SELECT count(*), count(DISTINCT episode_id), count(*) FILTER (status = 'ok') FROM episodes"
    ).fetchone() == (6, 6, 6)


def test_timeouts_soft_and_hard(lake_root):
    # soft: the worker notices between steps that the episode ran out of time
    spec = _spec(lake_root, "roll-soft", tasks=("click-test",), seeds=(0,), n_envs=1, step_delay_s=1.2)
    spec.episode_timeout_s = 1.0
    spec.jobs = [j.__class__(**{**j.to_dict(), "task_id": "click-button-sequence"}) for j in spec.jobs]
    s = run_rollouts(spec, progress=False)
    assert s.per_status == {"timeout": 1}
    # hard: a step that hangs far past the timeout (30 s) gets the worker killed at timeout + grace, while the step
    # still hangs: the runner's row (no step) says so. Had the worker lived until its step returned, its own row
    # would hold that step and say "episode exceeded 0s after 1 steps" (the soft path above).
    spec = _spec(lake_root, "roll-hard", tasks=("click-test",), seeds=(0,), n_envs=1, step_delay_s=30)
    spec.episode_timeout_s, spec.kill_grace_s = 0.5, 1.0
    s = run_rollouts(spec, progress=False)
    assert s.per_status == {"timeout": 1}
    con = connect(lake_root)
    got = con.execute("SELECT status, n_steps, error FROM episodes WHERE run_key = 'roll-hard'").fetchall()
    assert got == [("timeout", 0, "episode exceeded 0s; worker killed")]
    assert con.execute("SELECT count(*) FROM steps WHERE run_key = 'roll-hard'").fetchone()[0] == 0
