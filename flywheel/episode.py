"""One episode: drive a policy in an env and turn what happened into lake rows.

    ep_row, step_rows = run_episode(env, policy, job, max_steps=8, timeout_s=120)

No Prefect here: the parallel runner (flywheel.rollout) calls this in worker processes.
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
from envs.base import EnvError, GuiEnv, Observation


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
    return dict(episode_id=job.episode_id, step_idx=idx, screenshot=obs.screenshot_png, screen_w=obs.width,
                screen_h=obs.height, ui_text=obs.ui_text, run_key=job.run_key, git_sha=prov.git_sha,
                config_hash=prov.config_hash, **kw)


def _decision_fields(d: Decision) -> dict[str, Any]:
    return dict(
        response_text=d.response_text, thought=d.thought, action_desc=d.action_desc,
        raw_action=json.dumps(d.raw_action) if d.raw_action is not None else None,
        action=d.action.model_dump_json() if d.action is not None else None,
        parse_ok=d.action is not None, parse_error=d.parse_error, fallback_parse=d.fallback_parse,
        latency_ms=d.latency_ms, prompt_tokens=d.prompt_tokens, completion_tokens=d.completion_tokens,
        token_ids=d.token_ids, logprobs=d.logprobs,
        prompt_context=json.dumps(d.extra["prompt_context"]) if "prompt_context" in d.extra else None,
    )


def run_episode(env: GuiEnv, policy: Policy, job: EpisodeJob, *, max_steps: int, timeout_s: float,
                prov: Provenance | None = None, end_on_parse_error: bool = False,
                policy_name: str | None = None, policy_version: str | None = None,
                ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run one episode to its end; never raises for env/policy failures (they become status 'error')."""
    prov = prov or Provenance()
    max_steps = job.max_steps or max_steps
    started, t0 = _now(), time.monotonic()
    steps: list[dict[str, Any]] = []
    history: list[StepRecord] = []
    status, error, reward, instruction = "ok", None, None, None
    obs: Observation | None = None
    n_parse_errors = 0
    try:
        obs = env.reset(job.task_id, job.seed)
        instruction = obs.instruction
        policy.reset(job.task_id, job.seed)
        ended = False
        for idx in range(max_steps):
            if time.monotonic() - t0 > timeout_s:
                status, error = "timeout", f"episode exceeded {timeout_s:.0f}s after {idx} steps"
                break
            t_pol = time.monotonic()
            decision = policy.act(obs, history)
            if decision.latency_ms is None:
                decision.latency_ms = (time.monotonic() - t_pol) * 1000
            row = _step_row(job, idx, obs, prov, is_final=False, **_decision_fields(decision))
            if decision.action is None:
                n_parse_errors += 1
                row["env_ms"] = 0.0
                steps.append(row)
                history.append(StepRecord(idx, decision.thought, decision.action_desc, None,
                                          f"parse error: {decision.parse_error}", obs.screenshot_png))
                if end_on_parse_error:
                    break
                continue
            t_env = time.monotonic()
            res = env.step(decision.action)
            row.update(env_ms=(time.monotonic() - t_env) * 1000, exec_error=res.exec_error,
                       executed=json.dumps(res.executed) if res.executed is not None else None,
                       reward=res.info.get("reward"), feedback=res.info.get("feedback"))
            steps.append(row)
            history.append(StepRecord(idx, decision.thought, decision.action_desc, decision.action,
                                      f"exec error: {res.exec_error}" if res.exec_error else "ok", obs.screenshot_png))
            obs = res.observation
            if res.done:
                ended = True
                break
        if status == "ok" and not ended and len(steps) >= max_steps:
            status = "truncated"
        reward = float(env.evaluate())
    except EnvError as e:
        status, error = "error", _one_line(e)
    except Exception as e:  # noqa: BLE001 - a policy/env bug must end this episode, not the worker
        status, error = "error", _one_line(e)
    if obs is not None:  # the screen after the last action (SDPO's self-teacher and the viewer need it)
        steps.append(_step_row(job, len([s for s in steps if not s["is_final"]]), obs, prov, is_final=True))
    ended_at = _now()
    n_actions = sum(1 for s in steps if not s["is_final"])
    episode = dict(
        episode_id=job.episode_id, task_id=job.task_id, seed=job.seed, split=job.split, instruction=instruction,
        env=getattr(env, "name", None), env_version=prov.env_version,
        policy=policy_name or policy.name, policy_version=policy_version or policy.version,
        group_id=job.group_id, sample_idx=job.sample_idx, task_reward=reward,
        success=(reward is not None and reward >= 1.0), n_steps=n_actions, n_parse_errors=n_parse_errors,
        status=status, error=error, started_at=started, ended_at=ended_at,
        duration_s=time.monotonic() - t0, cost=0.0, run_key=job.run_key, git_sha=prov.git_sha,
        config_hash=prov.config_hash,
    )
    return episode, steps


def error_episode(job: EpisodeJob, *, status: str, error: str, policy_name: str, policy_version: str,
                  env_name: str | None, prov: Provenance | None = None) -> dict[str, Any]:
    """The row the runner writes for an episode whose worker died or was killed (no steps survive)."""
    prov = prov or Provenance()
    now = _now()
    return dict(episode_id=job.episode_id, task_id=job.task_id, seed=job.seed, split=job.split, env=env_name,
                env_version=prov.env_version, policy=policy_name, policy_version=policy_version,
                group_id=job.group_id, sample_idx=job.sample_idx, task_reward=None, success=False, n_steps=0,
                n_parse_errors=0, status=status, error=error, started_at=now, ended_at=now, duration_s=0.0,
                cost=0.0, run_key=job.run_key, git_sha=prov.git_sha, config_hash=prov.config_hash)
