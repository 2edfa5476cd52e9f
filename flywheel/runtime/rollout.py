"""Parallel rollouts: N env worker processes over (task, seed, policy) jobs, every episode into the lake.

    spec = RolloutSpec(run_key="bootstrap-it0-1a2b", iteration=0, stage="bootstrap", lake_root="lake",
                       jobs=make_jobs(...), policy=PolicySpec("scripted"), n_envs=2)
    summary = run_rollouts(spec)

How it stays correct under faults:
- Each worker runs in its own session (process group); its chromium/chromedriver inherit it.
  Any worker that dies, hangs past the episode timeout or is left at the end is ended with
  `killpg(SIGKILL)`, so no browser outlives the run.
- Workers write each finished episode (steps first, then the episode row, each an atomic
  file named by episode id) before reporting it: a dead worker loses at most its in-flight
  episode, which the runner records as status 'error' (or 'timeout'); a replacement worker
  takes the remaining jobs.
- An episode that ended in 'error' (an env error such as a crashed browser, or its worker died)
  runs again within the run while it has `env_error_retries` left (the flywheel's specs:
  `env.error_retries`, 2): a finished stage is cached, so a rerun would never reach it.
- A rerun with the same run key skips episodes already in the lake (except status 'error',
  which are retried), so it fills in only what is missing.
- Jobs go to each worker over its own pipe (no shared queue lock a SIGKILL could leave held).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections import deque
from dataclasses import dataclass, field
from multiprocessing import connection, get_context
from typing import Any, Callable

from flywheel.runtime.episode import EpisodeJob, Provenance, error_episode
from flywheel.runtime.spec import (  # noqa: F401 - the runner's public names, importable from here as before
    PolicySpec,
    RolloutError,
    RolloutSpec,
    RolloutSummary,
    _env_version,
    build_policy,
    git_sha,
    make_jobs,
)
from flywheel.runtime.worker import worker_main
from storage.lake import Lake
from training.progress import ProgressLog, draws_bar


# --------------------------------------------------------------------------- runner side
@dataclass
class _Worker:
    proc: Any
    conn: Any
    jobs: dict[str, tuple[EpisodeJob, float]] = field(default_factory=dict)  # in flight: id -> (job, sent at)
    slots: int = 1
    ready: bool = False
    version: str | None = None  # weights the worker's policy holds (None: the spec's)
    started: float = field(default_factory=time.monotonic)


def kill_group(pid: int | None) -> None:
    """SIGKILL a worker's whole process group (the worker, chromedriver, chromium)."""
    if not pid:
        return
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def existing_episodes(lake: Lake, spec: RolloutSpec, costs: dict[str, float] | None = None) -> dict[str, str]:
    """episode_id -> status of the episodes this run key already wrote (their cost into `costs` if given)."""
    out: dict[str, str] = {}
    where = lake.where(spec.iteration, spec.stage, spec.run_key)
    for r in lake.rows("episodes", where, "episode_id, status, cost"):
        out[r["episode_id"]] = r["status"]
        if costs is not None:
            costs[r["episode_id"]] = r["cost"] or 0.0
    return out


class _Runner:
    def __init__(self, spec: RolloutSpec, on_result: Callable[[dict], None] | None):
        self.spec = spec
        self.lake = spec.lake()
        self.ctx = get_context("spawn")
        env_name = spec.env.get("name", "miniwob")
        self.prov = Provenance(git_sha=git_sha(), config_hash=spec.config_hash, env_version=_env_version(env_name))
        self.on_result = on_result or (lambda r: None)
        self.workers: list[_Worker] = []
        self.init_failures = 0
        self.timings: dict[str, float] = {}
        self.spent_usd = 0.0  # cost of this run's finished episodes (budget_usd)
        self.budget_usd = spec.budget_usd  # the current run's (a pool's later runs bring their own)
        self.budget_stopped = 0
        self.retries: dict[str, int] = {}  # episode id -> reruns after an env error or a dead worker
        self._pending: deque | None = None  # the queue of the run in progress (retire requeues into it)

    def start_worker(self) -> None:
        parent, child = self.ctx.Pipe(duplex=True)
        p = self.ctx.Process(target=worker_main, args=(child, self.spec, self.prov), daemon=False)
        p.start()
        child.close()
        self.workers.append(_Worker(p, parent))

    def retire(
        self, w: _Worker, status: str | None = None, error: str | None = None, culprit: str | None = None
    ) -> None:
        """End a worker's process group; record its in-flight episodes (the `culprit` one with `status`,
        any others it was stepping alongside as errors)."""
        kill_group(w.proc.pid)
        w.proc.join(timeout=10)
        w.conn.close()
        self.workers.remove(w)
        if status:
            for eid, (job, _) in w.jobs.items():
                if culprit is None or eid == culprit:
                    st, err = status, error or "worker died"
                else:
                    st, err = "error", f"worker killed because episode {culprit} hung"
                # the error row goes in first (a parent killed now leaves it for the rerun to retry)
                self.write_failed(job, st, err, report=not self.requeue(job, st))

    def requeue(self, job: EpisodeJob, status: str) -> bool:
        """Put an episode that ended in 'error' (an env error, or its worker died) back at the front of the queue
        while it has retries left (env_error_retries); its error row is replaced when it finishes."""
        eid = job.episode_id
        if status != "error" or self._pending is None or self.retries.get(eid, 0) >= self.spec.env_error_retries:
            return False
        self.retries[eid] = self.retries.get(eid, 0) + 1
        self._pending.appendleft(dataclasses.replace(job, new=False))  # its error row is in the lake now
        return True

    def write_failed(self, job: EpisodeJob, status: str, error: str, report: bool = True) -> None:
        sp = self.spec
        ep = error_episode(
            job,
            status=status,
            error=error,
            policy_name=sp.policy.kind,
            policy_version=sp.policy.version,
            env_name=sp.env.get("name"),
            prov=self.prov,
        )
        self.lake.write_many(  # replaces what the worker may have committed before it died, steps included
            [("steps", []), ("episodes", [ep])],
            iteration=sp.iteration,
            stage=sp.stage,
            run_key=job.run_key,
            part=job.episode_id,
        )
        if not report:  # it runs again
            return
        self.on_result(
            {
                "episode_id": job.episode_id,
                "task_id": job.task_id,
                "status": status,
                "success": False,
                "n_steps": 0,
                "error": error,
            }
        )

    def handle_message(self, w: _Worker, pending: deque) -> None:
        try:
            kind, payload = w.conn.recv()
        except (EOFError, OSError):
            code = w.proc.exitcode
            self.retire(w, "error", f"rollout worker died (exit code {code}) during the episode")
            return
        if kind == "ready":
            w.ready, w.slots = True, int(payload["slots"])
        elif kind == "init_error":
            self.init_failures += 1
            self.retire(w)
            if self.init_failures >= 2:
                raise RolloutError(f"env workers cannot start: {payload}")
        elif kind == "done":
            entry = w.jobs.pop(payload["episode_id"], None)
            if entry is not None and self.requeue(entry[0], payload.get("status") or ""):
                return
            self.spent_usd += float(payload.get("cost") or 0.0)
            self.check_budget(pending)
            self.on_result(payload)
        elif kind == "stats":
            self.handle_stats(payload)
        elif kind == "reloaded":
            w.version = payload["version"]
        elif kind == "reload_error":
            raise RolloutError(f"workers could not load the new weights: {payload}")

    def check_budget(self, pending: deque) -> None:
        """Once the run's budget is spent, drop the jobs not yet handed out (running episodes finish)."""
        budget = self.budget_usd
        if budget is not None and self.spent_usd >= budget and pending:
            self.budget_stopped += len(pending)
            import logging

            logging.getLogger(__name__).warning(
                "budget reached: $%.4f of $%.4f spent; %d episode(s) not started", self.spent_usd, budget, len(pending)
            )
            pending.clear()

    def handle_stats(self, payload: dict[str, float]) -> None:
        for k, v in payload.items():
            self.timings[k] = self.timings.get(k, 0.0) + float(v)

    def run(self, jobs: list[EpisodeJob]) -> None:
        """Run the jobs to completion on the live workers (started as needed); the workers stay up."""
        pending = self._pending = deque(jobs)
        try:
            self._run(pending)
        finally:
            self._pending = None

    def _run(self, pending: deque) -> None:
        sp = self.spec
        self.check_budget(pending)
        while pending or any(w.jobs for w in self.workers):
            busy = sum(1 for w in self.workers if w.jobs)
            while len(self.workers) < min(sp.n_envs, busy + len(pending)):
                self.start_worker()
            for w in self.workers:
                while w.ready and len(w.jobs) < w.slots and pending:
                    job = pending.popleft()
                    w.jobs[job.episode_id] = (job, time.monotonic())
                    w.conn.send(job.to_dict())
            waitables = [w.conn for w in self.workers] + [w.proc.sentinel for w in self.workers]
            ready = set(connection.wait(waitables, timeout=0.5))
            for w in list(self.workers):
                if w.conn in ready:
                    self.handle_message(w, pending)
                elif w.proc.sentinel in ready and w in self.workers and not w.conn.poll():
                    if not w.ready:  # died while starting: counts like an init error (no endless respawns)
                        self.retire(w)
                        self.init_failures += 1
                        if self.init_failures >= 2:
                            raise RolloutError(
                                f"env workers exit while starting (exit code {w.proc.exitcode}); "
                                "run one episode with --envs 1 to see the worker's error"
                            )
                    else:
                        self.retire(w, "error", f"rollout worker died (exit code {w.proc.exitcode}) during the episode")
            self.enforce_deadlines()

    def reload(self, path: str, version: str, timeout_s: float = 300.0) -> None:
        """Every live worker loads new weights in place (browsers keep running); called between runs only.

        A worker started later builds its policy from `self.spec.policy`, so the spec follows the reload."""
        from dataclasses import replace

        opts = dict(self.spec.policy.options, model=path)
        if isinstance(opts.get("config"), dict):
            opts["config"] = {**opts["config"], "model": path}
        self.spec = replace(self.spec, policy=replace(self.spec.policy, options=opts, version=version))
        deadline = time.monotonic() + timeout_s
        for w in list(self.workers):
            while not w.ready and time.monotonic() < deadline:  # a starting worker must be ready to take messages
                if w.conn.poll(0.5):
                    self.handle_message(w, deque())
                if w not in self.workers:
                    break
            if w in self.workers and w.ready:
                w.conn.send(("reload", path, version))
        for w in list(self.workers):
            while w in self.workers and w.version != version:
                if time.monotonic() > deadline:
                    raise RolloutError(f"workers did not load {path} within {timeout_s:.0f}s")
                if w.conn.poll(0.5):
                    self.handle_message(w, deque())
                elif not w.proc.is_alive():
                    self.retire(w)  # a replacement starts from the updated spec

    def enforce_deadlines(self) -> None:
        now, sp = time.monotonic(), self.spec
        for w in list(self.workers):
            late = [eid for eid, (_, t) in w.jobs.items() if now - t > sp.episode_timeout_s + sp.kill_grace_s]
            if late:
                # the worker is stuck inside a step (its own timeout check runs between steps)
                self.retire(
                    w, "timeout", f"episode exceeded {sp.episode_timeout_s:.0f}s; worker killed", culprit=late[0]
                )
            elif not w.ready and now - w.started > sp.worker_start_timeout_s:
                self.retire(w)
                self.init_failures += 1
                if self.init_failures >= 2:
                    raise RolloutError(f"env workers did not start within {sp.worker_start_timeout_s:.0f}s")

    def shutdown(self) -> None:
        for w in self.workers:
            try:
                w.conn.send(None)
            except (OSError, BrokenPipeError):
                pass
        deadline = time.monotonic() + 10
        for w in self.workers:
            try:  # each worker answers the stop with its timing split, then closes its browsers
                while w.conn.poll(max(0.0, deadline - time.monotonic())):
                    kind, payload = w.conn.recv()
                    if kind == "stats":
                        self.handle_stats(payload)
                        break
            except (EOFError, OSError):
                pass
            w.proc.join(timeout=max(0.1, deadline - time.monotonic()))
        for w in list(self.workers):
            kill_group(w.proc.pid)  # whatever is left of the group (browsers) goes too
            w.proc.join(timeout=5)
            w.conn.close()
        self.workers.clear()


class RolloutPool:
    """Rollout workers that outlive one run: RL rounds sample on the same processes and browsers, and
    `reload(path)` swaps the student's weights in place between rounds.

        with RolloutPool(spec) as pool:
            run_rollouts(spec_round0, pool=pool)
            pool.reload("ckpt/round-0", version="round-0")
            run_rollouts(spec_round1, pool=pool)

    Runs on one pool must share the spec's env, policy kind, iteration and stage; each run has its own run key."""

    def __init__(self, spec: RolloutSpec):
        self.runner = _Runner(spec, None)

    def reload(self, path: str, version: str | None = None) -> None:
        self.runner.reload(path, version or str(path))

    @property
    def timings(self) -> dict[str, float]:
        return {k: round(v, 2) for k, v in sorted(self.runner.timings.items())}

    def close(self) -> None:
        self.runner.shutdown()

    def __enter__(self) -> "RolloutPool":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_rollouts(
    spec: RolloutSpec,
    *,
    progress: bool = True,
    on_result: Callable[[dict], None] | None = None,
    pool: RolloutPool | None = None,
) -> RolloutSummary:
    """Run every job of the spec not already in the lake; returns counts for this call.

    Without a pool, workers start for this call and end with it; with one, they stay for the next run. `progress`
    draws a bar on a terminal; anywhere else the run logs progress lines (training.progress)."""
    lake = spec.lake()
    costs: dict[str, float] = {}
    done = existing_episodes(lake, spec, costs)
    todo = [
        dataclasses.replace(j, new=j.episode_id not in done)
        for j in spec.jobs
        if j.episode_id not in done or (spec.retry_errors and done[j.episode_id] == "error")
    ]
    stats = {"ran": 0, "succ": 0, "steps": 0, "errors": 0, "status": {}, "cost": 0.0}
    timings: dict[str, float] = {}
    retries = 0
    t0 = time.monotonic()
    bar = _ProgressBar(len(todo), spec.run_key) if draws_bar(progress) and todo else None
    label = spec.stage if spec.stage != "rl" else f"rl {spec.policy.kind} rollouts"  # rl: the student's, the teacher's
    plog = ProgressLog(
        label, len(todo), unit="episodes", unit_after=True, rate_unit="ep", quiet=bar is not None or not todo
    )

    def record(r: dict) -> None:
        stats["ran"] += 1
        stats["succ"] += int(bool(r.get("success")))
        stats["steps"] += int(r.get("n_steps") or 0)
        stats["errors"] += int(r.get("status") == "error")
        stats["cost"] += float(r.get("cost") or 0.0)
        stats["status"][r["status"]] = stats["status"].get(r["status"], 0) + 1
        if bar:
            bar.update(stats, time.monotonic() - t0)
        plog.update(stats["ran"], success=stats["succ"] / stats["ran"], errors=stats["errors"] or None)
        if on_result:
            on_result(r)

    if todo:
        runner = pool.runner if pool else _Runner(spec, record)
        runner.on_result = record
        # the budget covers the whole run key: what earlier attempts spent counts (an errored episode that is
        # retried counts once more, since its spend was real)
        runner.spent_usd = sum(costs.values())
        runner.budget_usd = spec.budget_usd
        runner.budget_stopped = 0
        try:
            if bar:
                bar.start()
            try:
                runner.run(todo)
            finally:
                if pool is None:
                    runner.shutdown()
            timings = {k: round(v, 2) for k, v in sorted(runner.timings.items())}
        finally:
            retries = sum(runner.retries.values())
            runner.retries = {}
            runner.on_result = lambda r: None
            if bar:
                bar.stop()
            plog.stop()
        budget_stopped = runner.budget_stopped
    else:
        budget_stopped = 0
    return RolloutSummary(
        spec.run_key,
        len(spec.jobs),
        len(spec.jobs) - len(todo),
        stats["ran"],
        stats["succ"],
        stats["steps"],
        stats["errors"],
        time.monotonic() - t0,
        stats["status"],
        timings,
        round(stats["cost"], 6),
        budget_stopped,
        retries,
    )


class _ProgressBar:
    """Rich progress: episodes done / success rate / steps per second."""

    def __init__(self, total: int, label: str):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            transient=False,
        )
        self.task = self.p.add_task(label, total=total, stats="")

    def start(self) -> None:
        self.p.start()

    def stop(self) -> None:
        self.p.stop()

    def update(self, stats: dict, elapsed: float) -> None:
        n = stats["ran"]
        text = f"success {stats['succ'] / max(n, 1):.0%} | {stats['steps'] / max(elapsed, 1e-6):.1f} steps/s"
        if stats["errors"]:
            text += f" | [red]{stats['errors']} errors[/red]"
        self.p.update(self.task, completed=n, stats=text)
