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


def _chaos_spec(tmp_path, run_key: str):
    """The flywheel's own rollout spec for configs/tiny.yaml (local MiniWoB), with a slow scripted policy."""
    import dataclasses

    from configs.loading import load_config
    from flywheel.specs import rollout_spec

    root = Path(__file__).resolve().parents[1]
    cfg = load_config(root / "configs" / "tiny.yaml", {"lake.root": str(tmp_path / "lake")})
    spec = rollout_spec(
        cfg,
        iteration=0,
        stage=run_key,
        policy=PolicySpec("scripted"),
        tasks=["click-test", "focus-text"],
        seeds=[0, 1, 2],
        split="train",
    )
    return dataclasses.replace(spec, step_delay_s=0.4)  # so a kill lands inside an episode


def _kill_after_first(what: str):
    """on_result callback: once the first episode is in, SIGKILL the worker (`worker`) or its Chromium processes
    (`chromium`) 0.25 s into the worker's next episode."""
    killed: dict[str, object] = {}

    def kill(pid: int) -> None:
        if what == "worker":
            os.kill(pid, signal.SIGKILL)
            killed["pids"] = [pid]
            return
        pids = []
        for p in _group_members(pid):
            try:
                exe = Path(f"/proc/{p}/cmdline").read_bytes().split(b"\0", 1)[0]
            except OSError:
                continue
            if b"chrom" in Path(exe.decode()).name.encode() and b"chromedriver" not in exe:
                pids.append(p)
                os.kill(p, signal.SIGKILL)
        killed["pids"] = pids

    def on_result(r):
        if not killed and r.get("worker_pid"):
            killed["worker"] = r["worker_pid"]
            threading.Timer(0.25, kill, (r["worker_pid"],)).start()

    return killed, on_result


@pytest.mark.parametrize("what", ["worker", "chromium"])
def test_flywheel_rollouts_retry_a_killed_worker_or_browser_within_the_run(tmp_path, what):
    """Issue 32's chaos run: a Chromium or a rollout worker killed mid-episode left that episode as 'error' once
    the stage finished, and the flywheel's stage cache never ran it again (a teacher demo lost from curation, an
    infrastructure failure counted as a failed evaluation). The flywheel's specs now retry such episodes in the
    run (env.error_retries, which only env 'remote' used): every instance ends whole, none in 'error'."""
    spec = _chaos_spec(tmp_path, "rollouts")
    assert spec.env_error_retries == 2
    killed, on_result = _kill_after_first(what)
    s = run_rollouts(spec, progress=False, on_result=on_result)
    assert killed.get("pids"), f"nothing was killed ({what})"
    assert (s.ran, s.errors, s.per_status) == (6, 0, {"ok": 6}), s
    assert s.retries >= 1  # the killed episode ran again
    con = connect(tmp_path / "lake")
    assert con.execute(
        "SELECT count(*), count(DISTINCT episode_id), count(*) FILTER (status = 'ok') FROM episodes"
    ).fetchone() == (6, 6, 6)
    partial = con.execute(
        "SELECT count(*) FROM episodes e LEFT JOIN (SELECT episode_id, count(*) AS n FROM steps GROUP BY 1) s "
        "USING (episode_id) WHERE coalesce(s.n, 0) <> e.n_steps + 1"
    ).fetchone()[0]
    assert partial == 0
