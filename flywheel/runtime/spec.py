"""What a rollout run is: its policy, jobs and settings (picklable: the runner hands them to spawned workers).

    spec = RolloutSpec(run_key="bootstrap-it0-1a2b", iteration=0, stage="bootstrap", lake_root="lake",
                       jobs=make_jobs(...), policy=PolicySpec("scripted"), n_envs=2)

The runner (flywheel.runtime.rollout) and its workers (flywheel.runtime.worker) both import this module;
neither imports the other's side, so the two stay free of an import cycle.
"""

from __future__ import annotations

import hashlib
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from flywheel.runtime.episode import EpisodeJob
from storage.lake import Lake, open_lake


class RolloutError(RuntimeError):
    """The rollout could not run at all (e.g. the env cannot start): one clear line."""


@dataclass(frozen=True)
class PolicySpec:
    """A picklable description of a policy; each worker builds its own instance."""

    kind: str  # "scripted" | "student" | "claude"
    options: dict[str, Any] = field(default_factory=dict)
    version: str = "0"

    @property
    def tag(self) -> str:
        return f"{self.kind}:{self.version}"


def build_policy(spec: PolicySpec):
    if spec.kind == "scripted":
        from agents.teacher import ScriptedTeacher

        return ScriptedTeacher(**spec.options)
    if spec.kind == "student":
        from agents.student import build_student_policy  # lands with the student issue

        return build_student_policy(**spec.options)
    if spec.kind == "claude":
        from agents.claude import ClaudePolicy  # the key comes from the worker's environment, never the spec

        return ClaudePolicy(**spec.options)
    raise RolloutError(f"unknown policy kind {spec.kind!r}; use 'scripted', 'student' or 'claude'")


@dataclass
class RolloutSpec:
    run_key: str
    iteration: int
    stage: str
    lake_root: str  # a folder, or s3://bucket/prefix
    jobs: list[EpisodeJob]
    policy: PolicySpec
    env: dict[str, Any] = field(default_factory=lambda: {"name": "miniwob"})
    n_envs: int = 2  # worker processes
    envs_per_worker: int = 1  # envs stepped in lockstep per worker (batched policies only, e.g. the student)
    max_steps: int = 8
    episode_timeout_s: float = 120.0
    worker_start_timeout_s: float = 60.0
    end_on_parse_error: bool = False
    config_hash: str | None = None
    retry_errors: bool = True
    kill_grace_s: float = 15.0  # a worker stuck in one step this long past the episode timeout is killed
    # Artificial policy latency per step: fault-injection tests, and benchmarks simulating a slow model.
    step_delay_s: float = 0.0
    # Intra-op threads of the policy's torch in each worker. None = auto: 1. Measured on 2 cores (docs/LOG.md):
    # torch's default (one thread per core) in each of N workers next to Chromium made a batch-2 generate of the
    # mini student 10x slower (5.4 s vs 0.56 s); tiny models gain nothing from intra-op threads anyway.
    policy_threads: int | None = None
    # Dollar budget of the run (paid teachers): once finished episodes (this run key's earlier attempts included)
    # cost this much, no new episode is handed out; running ones finish and are kept. None = no limit.
    budget_usd: float | None = None
    # S3-compatible endpoint of an object-store lake_root (None: $FLYWHEEL_S3_ENDPOINT, else AWS's)
    lake_endpoint: str | None = None
    lake_catalog: str | None = None  # lake.catalog (a postgresql:// URL names no password: $PGPASSWORD carries it)

    def lake(self) -> Lake:
        return open_lake(self.lake_root, endpoint=self.lake_endpoint, catalog=self.lake_catalog)

    # Replies drawn to an instance's first screen; its attempts start with the distinct ones, most drawn first
    # (flywheel.runtime.openings). 0 = every attempt samples its own first step.
    openings: int = 0
    openings_temperature: float | None = None  # of those draws (None: the policy's own)

    # Rerun an episode that ended in status 'error' up to this many times before its error row stands (remote
    # envs: a dead server's episodes go to another server). Each retry replaces the same lake files.
    env_error_retries: int = 0


@dataclass
class RolloutSummary:
    run_key: str
    total: int
    skipped: int  # already in the lake from an earlier attempt
    ran: int
    successes: int
    steps: int
    errors: int
    duration_s: float
    per_status: dict[str, int] = field(default_factory=dict)
    # seconds summed over workers: start (spawn, imports, model load, browsers), env (reset/step/evaluate),
    # policy (prompt build + image processing + generate; the policy's own split under policy_*), lake writes,
    # idle (waiting for jobs)
    timings: dict[str, float] = field(default_factory=dict)
    cost_usd: float = 0.0  # API dollars of the episodes this call ran
    budget_stopped: int = 0  # jobs not started because the run's budget_usd was reached
    retries: int = 0  # episodes rerun after an env error (env_error_retries)

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.duration_s if self.duration_s > 0 else 0.0


@lru_cache(maxsize=1)
def git_sha() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
        )
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def make_jobs(
    run_key: str,
    tasks: list[str],
    seeds: list[int],
    *,
    group_size: int = 1,
    policy_tag: str = "policy",
    split: str = "train",
    max_steps: dict[str, int] | None = None,
) -> list[EpisodeJob]:
    """One job per (task, seed, sample); the G samples of a (task, seed) share a group id (GRPO)."""
    max_steps = max_steps or {}
    jobs = []
    for task in tasks:
        for seed in seeds:
            gid = hashlib.sha1(f"{run_key}|{task}|{seed}".encode()).hexdigest()[:12]
            for k in range(group_size):
                jobs.append(EpisodeJob(run_key, task, seed, split, gid, k, policy_tag, max_steps.get(task)))
    return jobs


def _env_version(env_name: str) -> str | None:
    try:
        from importlib.metadata import version

        return f"{env_name} {version(env_name)}" if env_name == "miniwob" else env_name
    except Exception:  # noqa: BLE001
        return env_name
