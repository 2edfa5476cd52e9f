"""Rollout worker processes: one per env group, started by flywheel.runtime.rollout's runner (spawn).

Each worker runs in its own session (process group), caps its torch threads, builds its policy while its
browsers launch, then steps its envs in lockstep: one batched decision per tick, every finished episode
written to the lake (steps, then the episode row) before it is reported. Messages from the runner: a job
dict, ("reload", path, version) between RL rounds, or None to stop (answered with the timing split).
"""

from __future__ import annotations

import os
import time
import traceback
from typing import Any

from flywheel.runtime.episode import EpisodeJob, EpisodeRun, Provenance
from flywheel.runtime.openings import decide
from flywheel.runtime.spec import RolloutSpec, build_policy


class _Delayed:
    """Wraps a policy to add a fixed latency per decision (see RolloutSpec.step_delay_s)."""

    def __init__(self, inner, delay_s: float):
        self.inner, self.delay_s = inner, delay_s
        self.name, self.version = inner.name, inner.version

    def act(self, obs, history):
        time.sleep(self.delay_s)
        return self.inner.act(obs, history)

    def reset(self, task_id, seed):
        self.inner.reset(task_id, seed)

    def close(self):
        self.inner.close()


def _make_env(env_kwargs: dict[str, Any]):
    from envs.registry import make_env

    kw = dict(env_kwargs)
    return make_env(kw.pop("name", "miniwob"), **kw)


def _limit_threads(n: int) -> None:
    """Cap the worker's BLAS/OpenMP/torch threads before any of them start (spawned workers import torch late)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(n)
    import torch  # the policy imports it next anyway; sizing the pools now means they are sized once

    torch.set_num_threads(n)
    try:
        torch.set_num_interop_threads(n)
    except RuntimeError:  # already started: keep whatever it has
        pass


class _Clock:
    """Seconds per phase in one worker (the profile behind RolloutSummary.timings)."""

    def __init__(self):
        self.t: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.t[phase] = self.t.get(phase, 0.0) + now - self._last
        self._last = now


def _start(spec: RolloutSpec):
    """Build the policy while the browsers launch (threads: both mostly wait on I/O and subprocesses).

    Several envs per worker only pay off for a policy that decides for all of them in one call (the student)."""
    from concurrent.futures import ThreadPoolExecutor

    slots = spec.envs_per_worker if spec.policy.kind == "student" else 1
    with ThreadPoolExecutor(max_workers=slots) as pool:
        futures = [pool.submit(_make_env, spec.env) for _ in range(slots)]
        policy, failure = None, None
        try:
            policy = build_policy(spec.policy)
        except Exception as e:  # noqa: BLE001 - raised below, once the browsers are accounted for
            failure = e
        envs = []
        for f in futures:
            try:
                envs.append(f.result())
            except Exception as e:  # noqa: BLE001
                failure = failure or e
    if failure is not None:
        for obj in [policy, *envs]:
            if obj is not None:
                obj.close()
        raise failure
    if spec.step_delay_s > 0:
        policy = _Delayed(policy, spec.step_delay_s)
    return policy, envs


def worker_main(conn, spec: RolloutSpec, prov: Provenance) -> None:
    os.setsid()  # own process group: the runner can end this worker and every browser it started
    clock = _Clock()
    if spec.policy.kind == "student":  # the only policy with torch inside
        _limit_threads(spec.policy_threads or 1)
    envs: list = []
    policy = None
    try:
        try:
            policy, envs = _start(spec)
        except Exception as e:  # noqa: BLE001 - reported to the runner as one line
            conn.send(("init_error", f"{type(e).__name__}: {e}".splitlines()[0]))
            return
        clock.lap("start")
        conn.send(("ready", {"pid": os.getpid(), "slots": len(envs)}))
        _lockstep_loop(conn, spec, prov, envs, policy, clock)
        timings = dict(clock.t)
        for k, v in getattr(getattr(policy, "inner", policy), "timings", {}).items():
            timings[f"policy_{k}"] = v
        conn.send(("stats", timings))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        raise
    finally:
        for obj in [policy, *envs]:
            try:
                if obj is not None:
                    obj.close()
            except Exception:  # noqa: BLE001
                pass


def _lockstep_loop(conn, spec: RolloutSpec, prov: Provenance, envs: list, policy, clock: _Clock) -> None:
    """Take up to len(envs) jobs, step all running episodes together (one batched decision per
    tick), write each finished episode to the lake and report it; until the runner says stop."""
    lake = spec.lake()
    free, active = list(range(len(envs))), {}
    stopping, current_version = False, spec.policy.version
    while True:
        while free and not stopping and (not active or conn.poll()):  # block only when idle
            clock.lap("other")
            msg = conn.recv()
            clock.lap("idle")
            if msg is None:
                stopping = True
                break
            if (
                isinstance(msg, tuple) and msg[0] == "reload"
            ):  # new weights between RL rounds (runner: never mid-episode)
                _, path, version = msg
                try:
                    getattr(policy, "inner", policy).reload(path)
                    current_version = version
                    conn.send(("reloaded", {"version": version}))
                except Exception as e:  # noqa: BLE001 - reported as one line; the runner raises it
                    conn.send(("reload_error", f"{type(e).__name__}: {e}".splitlines()[0]))
                clock.lap("policy")
                continue
            job, slot = EpisodeJob(**msg), free.pop()
            run = EpisodeRun(
                envs[slot],
                job,
                max_steps=spec.max_steps,
                timeout_s=spec.episode_timeout_s,
                prov=prov,
                end_on_parse_error=spec.end_on_parse_error,
                policy_name=spec.policy.kind,
                policy_version=current_version,
            )
            run.start()
            try:
                policy.reset(job.task_id, job.seed)
            except Exception as e:  # noqa: BLE001
                run.fail(e)
            active[slot] = run
            clock.lap("env")
        if not active:
            if stopping:
                return
            continue
        running = [k for k, r in active.items() if not r.ended]
        if running:
            try:
                clock.lap("other")
                decisions = decide(policy, [active[k] for k in running], spec.openings, spec.openings_temperature)
                clock.lap("policy")
            except Exception as e:  # noqa: BLE001 - a policy bug ends these episodes, not the worker
                for k in running:
                    active[k].fail(e)
            else:
                for k, d in zip(running, decisions):
                    active[k].apply(d)
                clock.lap("env")
        for k in [k for k, r in active.items() if r.ended]:
            done_run = active.pop(k)
            ep, steps = done_run.finish()
            clock.lap("env")
            part = ep["episode_id"]
            key = ep["run_key"]  # the job's own run key: a pooled worker serves several runs (RL rounds)
            lake.write_many(  # one transaction: an episode row never exists without its steps
                [("steps", steps), ("episodes", [ep])],
                iteration=spec.iteration,
                stage=spec.stage,
                run_key=key,
                part=part,
                replace=not done_run.job.new,
            )
            clock.lap("lake")
            conn.send(
                (
                    "done",
                    {
                        **{
                            f: ep[f] for f in ("episode_id", "task_id", "status", "success", "n_steps", "error", "cost")
                        },
                        "worker_pid": os.getpid(),
                    },
                )
            )
            if ep["status"] == "error":  # the env may be broken: a fresh one for the next job
                try:
                    envs[k].close()
                finally:
                    envs[k] = _make_env(spec.env)
            free.append(k)
