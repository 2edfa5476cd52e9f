"""The flywheel's stages as plain functions (no Prefect): each takes the config and an
iteration, writes to the lake under a deterministic run key, and returns a small JSON-able
result (ids, counts, lake paths) that the next stage or a Prefect task can pass on.

    cfg = load_config("configs/local.yaml")
    register_tasks(cfg)
    bootstrap(cfg, iteration=0)          # scripted-teacher demos on the train split
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from typing import Any

from configs.models import FlywheelConfig
from flywheel.errors import UserError
from flywheel.rollout import PolicySpec, RolloutSpec, git_sha, make_jobs, run_rollouts
from storage.lake import Lake


def lake_for(cfg: FlywheelConfig) -> Lake:
    import os
    return Lake(os.environ.get("FLYWHEEL_LAKE") or cfg.lake.root)


def resolve_tasks(tasks: list[str], *, for_training: bool) -> list[str]:
    """Task ids from a selection; 'all' = every teacher-supported task (held-out ones only for eval).

    Raises UserError for unknown ids, and for held-out tasks in a training-side stage."""
    from envs import registry
    known = {t.task_id: t for t in registry.TASKS}
    if tasks == ["all"]:
        return registry.teacher_tasks(include_held_out=not for_training)
    unknown = [t for t in tasks if t not in known]
    if unknown:
        raise UserError(f"unknown task ids {unknown}; known: {', '.join(sorted(known))}")
    held = [t for t in tasks if known[t].held_out]
    if for_training and held:
        raise UserError(f"tasks {held} are held out for evaluation; remove them from training-side stages")
    return list(tasks)


def run_key_for(stage: str, iteration: int, payload: dict[str, Any]) -> str:
    """Deterministic: the same stage inputs give the same key (so a rerun replaces, not duplicates)."""
    h = hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"{stage}-it{iteration}-{h}"


def register_tasks(cfg: FlywheelConfig) -> dict[str, Any]:
    """Write the task registry (ids, instruction templates, splits) to the lake's `tasks` table."""
    from envs import registry
    rows = [dict(r, run_key="registry", git_sha=git_sha(), config_hash=None,
                 teacher_supported=registry.get_task(r["task_id"]).teacher_supported)
            for r in registry.tasks_table_rows()]
    path = lake_for(cfg).replace_run("tasks", [rows], iteration=0, stage="registry", run_key="registry")
    return {"tasks": len(rows), "paths": [str(p) for p in path]}


def rollout_spec(cfg: FlywheelConfig, *, iteration: int, stage: str, policy: PolicySpec, tasks: list[str],
                 seeds: list[int], split: str, group_size: int = 1, n_envs: int | None = None) -> RolloutSpec:
    from envs import registry
    env_kwargs: dict[str, Any] = {"name": cfg.env.name, "screenshot_scale": cfg.env.screenshot_scale}
    if cfg.env.name == "miniwob":
        env_kwargs.update(chrome_binary=cfg.env.chrome_binary, chromedriver=cfg.env.chromedriver)
    else:
        env_kwargs.update(server_url=cfg.env.server_url)
    key = run_key_for(stage, iteration, {"policy": asdict(policy), "tasks": tasks, "seeds": seeds,
                                         "group": group_size, "env": env_kwargs, "split": split})
    caps = {t.task_id: cfg.env.max_steps or t.max_steps for t in registry.TASKS if t.task_id in tasks}
    jobs = make_jobs(key, tasks, seeds, group_size=group_size, policy_tag=policy.tag, split=split, max_steps=caps)
    return RolloutSpec(
        run_key=key, iteration=iteration, stage=stage, lake_root=str(lake_for(cfg).root), jobs=jobs, policy=policy,
        env=env_kwargs, n_envs=n_envs or cfg.rollout.envs, max_steps=cfg.env.max_steps or 8,
        episode_timeout_s=cfg.rollout.episode_timeout_s, worker_start_timeout_s=cfg.rollout.worker_start_timeout_s,
        end_on_parse_error=cfg.rollout.on_parse_error == "end", config_hash=cfg.config_hash(),
    )


def bootstrap(cfg: FlywheelConfig, iteration: int = 0, *, progress: bool = True) -> dict[str, Any]:
    """Teacher demonstrations on the train split into `episodes`/`steps` (stage 'bootstrap')."""
    from envs import registry
    sel = cfg.bootstrap.selection
    seeds = registry.seeds("train", sel.seeds_per_task, offset=sel.seed_offset)
    spec = rollout_spec(cfg, iteration=iteration, stage="bootstrap", policy=PolicySpec(cfg.bootstrap.policy),
                        tasks=resolve_tasks(sel.tasks, for_training=True), seeds=seeds, split="train")
    summary = run_rollouts(spec, progress=progress)
    return {"run_key": spec.run_key, "iteration": iteration, "stage": "bootstrap", **asdict(summary)}
