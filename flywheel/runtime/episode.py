"""One episode: drive a policy in an env and turn what happened into lake rows.

    ep_row, step_rows = run_episode(env, policy, job, max_steps=8, timeout_s=120)

No Prefect here: the parallel runner (flywheel.runtime.rollout) calls this in worker processes.
Every ending is recorded: success or failure ('ok'), the step cap ('truncated'), the
wall-clock limit ('timeout') and crashes of the env or the policy ('error'); the screen
after the last action is kept as a final `is_final` step row.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from agents.base import Decision, Policy, StepRecord
from envs.base import GuiEnv, Observation


@dataclass(frozen=True)
class EpisodeJob:
    run_key: str
    task_id: str
    seed: int
    split: str = "train"
    group_id: str | None = None
    sample_idx: int = 0
    policy_tag: str = "policy"  # part of the episode id, so two policies never collide
    max_steps: int | None = None  # the task's step cap (None: the runner's default)
    new: bool = False  # no row of this episode is in the lake (the runner checked): its write skips the replace

    @property
    def episode_id(self) -> str:
        key = f"{self.run_key}|{self.task_id}|{self.seed}|{self.policy_tag}|{self.sample_idx}"
        return hashlib.sha1(key.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Provenance:
    git_sha: str | None = None
    config_hash: str | None = None
    env_version: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300]}" if s else type(e).__name__


def _step_row(job: EpisodeJob, idx: int, obs: Observation, prov: Provenance, **kw) -> dict[str, Any]:
    return dict(
        episode_id=job.episode_id,
        step_idx=idx,
        screenshot=obs.screenshot_png,
        screen_w=obs.width,
        screen_h=obs.height,
        ui_text=obs.ui_text,
        run_key=job.run_key,
        git_sha=prov.git_sha,
        config_hash=prov.config_hash,
        **kw,
    )


def _decision_fields(d: Decision) -> dict[str, Any]:
    return dict(
        response_text=d.response_text,
        thought=d.thought,
        action_desc=d.action_desc,
        raw_action=json.dumps(d.raw_action) if d.raw_action is not None else None,
        action=d.action.model_dump_json() if d.action is not None else None,
        parse_ok=d.action is not None,
        parse_error=d.parse_error,
        fallback_parse=d.fallback_parse,
        latency_ms=d.latency_ms,
        prompt_tokens=d.prompt_tokens,
        completion_tokens=d.completion_tokens,
        token_ids=d.token_ids,
        logprobs=d.logprobs,
        prompt_context=json.dumps(d.extra["prompt_context"]) if "prompt_context" in d.extra else None,
        # paid teachers (agents/claude.py): usage and dollars of this step's API calls, and the raw replies
        cost=d.extra.get("cost_usd"),
        cache_read_tokens=d.extra.get("cache_read_tokens"),
        cache_write_tokens=d.extra.get("cache_write_tokens"),
        raw_response=d.extra.get("raw_response"),
    )


class EpisodeRun:
    """One episode as a state machine, so a worker can step several episodes in lockstep with a
    batched policy: `start()`, then `apply(decision)` until `ended`, then `finish()` -> rows.

    Never raises for env/policy failures: they end the episode with status 'error'."""

    def __init__(
        self,
        env: GuiEnv,
        job: EpisodeJob,
        *,
        max_steps: int,
        timeout_s: float,
        prov: Provenance,
        end_on_parse_error: bool,
        policy_name: str,
        policy_version: str,
    ):
        self.env, self.job, self.prov = env, job, prov
        self.max_steps = job.max_steps or max_steps
        self.timeout_s, self.end_on_parse_error = timeout_s, end_on_parse_error
        self.policy_name, self.policy_version = policy_name, policy_version
        self.steps: list[dict[str, Any]] = []
        self.history: list[StepRecord] = []
        self.status, self.error, self.instruction = "ok", None, None
        self.obs: Observation | None = None
        self.n_parse_errors, self.ended, self.env_done = 0, False, False
        self.cost, self.tokens_in, self.tokens_out = 0.0, 0, 0  # API usage of the policy (paid teachers)
        self.started, self.t0 = _now(), time.monotonic()

    def fail(self, e: BaseException) -> None:
        self.status, self.error, self.ended = "error", _one_line(e), True

    def start(self) -> None:
        try:
            self.obs = self.env.reset(self.job.task_id, self.job.seed)
            self.instruction = self.obs.instruction
        except Exception as e:  # noqa: BLE001 - EnvError or a bug: this episode ends, the worker lives
            self.fail(e)
        self._check_limits()

    def _check_limits(self) -> None:
        if self.ended:
            return
        if len(self.steps) >= self.max_steps:
            self.status, self.ended = "truncated", True
        elif time.monotonic() - self.t0 > self.timeout_s:
            self.status, self.ended = "timeout", True
            self.error = f"episode exceeded {self.timeout_s:.0f}s after {len(self.steps)} steps"

    def apply(self, decision: Decision) -> None:
        """Record the policy's decision for the current observation and execute it."""
        obs, idx = self.obs, len(self.steps)
        assert obs is not None and not self.ended
        self.cost += float(decision.extra.get("cost_usd") or 0.0)
        self.tokens_in += int(decision.prompt_tokens or 0)
        self.tokens_out += int(decision.completion_tokens or 0)
        row = _step_row(self.job, idx, obs, self.prov, is_final=False, **_decision_fields(decision))
        try:
            if decision.action is None:
                self.n_parse_errors += 1
                row["env_ms"] = 0.0
                self.steps.append(row)
                self.history.append(
                    StepRecord(
                        idx,
                        decision.thought,
                        decision.action_desc,
                        None,
                        f"parse error: {decision.parse_error}",
                        obs.screenshot_png,
                    )
                )
                self.ended = self.end_on_parse_error
            else:
                t_env = time.monotonic()
                res = self.env.step(decision.action)
                row.update(
                    env_ms=(time.monotonic() - t_env) * 1000,
                    exec_error=res.exec_error,
                    executed=json.dumps(res.executed) if res.executed is not None else None,
                    reward=res.info.get("reward"),
                    feedback=res.info.get("feedback"),
                )
                self.steps.append(row)
                self.history.append(
                    StepRecord(
                        idx,
                        decision.thought,
                        decision.action_desc,
                        decision.action,
                        f"exec error: {res.exec_error}" if res.exec_error else "ok",
                        obs.screenshot_png,
                    )
                )
                self.obs = res.observation
                self.env_done = self.ended = bool(res.done)
        except Exception as e:  # noqa: BLE001
            self.fail(e)
        self._check_limits()

    def finish(self) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """Score the episode and return (episode row, step rows incl. the final-screen row)."""
        reward = None
        if self.status != "error":
            try:
                reward = float(self.env.evaluate())
            except Exception as e:  # noqa: BLE001
                self.fail(e)
        steps = list(self.steps)
        if self.obs is not None:  # the screen after the last action (SDPO's self-teacher and the viewer need it)
            steps.append(_step_row(self.job, len(self.steps), self.obs, self.prov, is_final=True))
        job, prov = self.job, self.prov
        episode = dict(
            episode_id=job.episode_id,
            task_id=job.task_id,
            seed=job.seed,
            split=job.split,
            instruction=self.instruction,
            env=getattr(self.env, "name", None),
            env_version=getattr(self.env, "env_version", None) or prov.env_version,  # a remote env: its server
            policy=self.policy_name,
            policy_version=self.policy_version,
            group_id=job.group_id,
            sample_idx=job.sample_idx,
            task_reward=reward,
            success=(reward is not None and reward >= 1.0),
            n_steps=len(self.steps),
            n_parse_errors=self.n_parse_errors,
            status=self.status,
            error=self.error,
            started_at=self.started,
            ended_at=_now(),
            duration_s=time.monotonic() - self.t0,
            cost=self.cost,
            input_tokens=self.tokens_in,
            output_tokens=self.tokens_out,
            run_key=job.run_key,
            git_sha=prov.git_sha,
            config_hash=prov.config_hash,
        )
        return episode, steps


def timed_decisions(policy: Policy, runs: list[EpisodeRun]) -> list[Decision]:
    """One decision per run: a single batched call when the policy can batch, else one call each."""
    t0 = time.monotonic()
    if len(runs) > 1 and hasattr(policy, "act_batch"):
        decisions = policy.act_batch([r.obs for r in runs], [r.history for r in runs])  # type: ignore[attr-defined]
    else:
        decisions = [policy.act(r.obs, r.history) for r in runs]  # type: ignore[arg-type]
    per = (time.monotonic() - t0) * 1000 / max(len(runs), 1)
    for d in decisions:
        if d.latency_ms is None:
            d.latency_ms = per
    return decisions


def run_episode(
    env: GuiEnv,
    policy: Policy,
    job: EpisodeJob,
    *,
    max_steps: int,
    timeout_s: float,
    prov: Provenance | None = None,
    end_on_parse_error: bool = False,
    policy_name: str | None = None,
    policy_version: str | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one episode to its end; never raises for env/policy failures (they become status 'error')."""
    run = EpisodeRun(
        env,
        job,
        max_steps=max_steps,
        timeout_s=timeout_s,
        prov=prov or Provenance(),
        end_on_parse_error=end_on_parse_error,
        policy_name=policy_name or policy.name,
        policy_version=policy_version or policy.version,
    )
    run.start()
    if not run.ended:
        try:
            policy.reset(job.task_id, job.seed)
        except Exception as e:  # noqa: BLE001
            run.fail(e)
    while not run.ended:
        try:
            decision = timed_decisions(policy, [run])[0]
        except Exception as e:  # noqa: BLE001 - a policy bug ends this episode, not the worker
            run.fail(e)
            break
        run.apply(decision)
    return run.finish()


def error_episode(
    job: EpisodeJob,
    *,
    status: str,
    error: str,
    policy_name: str,
    policy_version: str,
    env_name: str | None,
    prov: Provenance | None = None,
) -> dict[str, Any]:
    """The row the runner writes for an episode whose worker died or was killed (no steps survive)."""
    prov = prov or Provenance()
    now = _now()
    return dict(
        episode_id=job.episode_id,
        task_id=job.task_id,
        seed=job.seed,
        split=job.split,
        env=env_name,
        env_version=prov.env_version,
        policy=policy_name,
        policy_version=policy_version,
        group_id=job.group_id,
        sample_idx=job.sample_idx,
        task_reward=None,
        success=False,
        n_steps=0,
        n_parse_errors=0,
        status=status,
        error=error,
        started_at=now,
        ended_at=now,
        duration_s=0.0,
        cost=0.0,
        run_key=job.run_key,
        git_sha=prov.git_sha,
        config_hash=prov.config_hash,
    )
