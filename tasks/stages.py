"""Prefect tasks over the stage functions of flywheel/stages.py: one thin task per stage.

    from tasks import stages as t
    res = t.curate(ConfigRef(path="configs/tiny.yaml"), iteration=0)   # inside a flow

Each task loads the config from its reference, calls the stage, and returns the stage's small
dict (lake ids and paths). Results are persisted and cached on (stage, iteration, config hash,
lake, inputs) (tasks/common.py), so a retried flow run skips stages that already finished; a
stage that must run again anyway is called with `.with_options(refresh_cache=True)`, and the
stages' deterministic run keys keep the lake free of duplicates.

Result files go to Prefect's local result storage (`PREFECT_RESULTS_LOCAL_STORAGE_PATH`), which
flows/orchestrate.py points at `.prefect/results`, outside the lake.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable

from prefect import task

from configs.models import FlywheelConfig
from flywheel import stages
from tasks.artifacts import RolloutProgress
from tasks.common import ConfigRef, stage_cache_key

PERSISTED: dict[str, Any] = {"persist_result": True, "cache_key_fn": stage_cache_key}


def expected_episodes(cfg: FlywheelConfig, stage: str) -> int:
    """Episodes a rollout-type stage will run (the progress bar's 100%): tasks x seeds x group."""
    from envs import registry

    if stage == "bootstrap":
        sel, group = cfg.bootstrap.selection, 1
    elif stage == "rollouts":
        sel, group = cfg.rollouts.selection, cfg.rollout_attempts()
    else:
        sel, group = cfg.evaluate.selection, 1
    tasks = set(stages.resolve_tasks(sel.tasks, for_training=stage != "evaluate"))
    if stage == "evaluate" and cfg.evaluate.held_out_tasks:
        tasks |= {t.task_id for t in registry.TASKS if t.held_out and t.teacher_supported}
    return len(tasks) * sel.seeds_per_task * group


def runner_kwargs(fn: Callable[..., Any], progress: RolloutProgress) -> dict[str, Any]:
    """No terminal progress bar under Prefect; the runner's per-episode callback feeds the progress
    artifact when the stage passes one through to `run_rollouts`."""
    params = inspect.signature(fn).parameters
    kw: dict[str, Any] = {"progress": False} if "progress" in params else {}
    if "on_result" in params:
        kw["on_result"] = progress.on_result
    return kw


@task(name="register-tasks", **PERSISTED)
def register_tasks(config: ConfigRef) -> dict[str, Any]:
    return stages.register_tasks(config.load())


@task(name="curriculum")
def plan_curriculum(config: ConfigRef, iteration: int) -> dict[str, Any]:
    """The iteration's curriculum (read from the lake, else made and written there): not cached by Prefect,
    the lake's `curriculum` rows are the record, so a resumed iteration follows the same decisions."""
    from dataclasses import asdict

    from flywheel.curriculum import plan_for

    cfg = config.load()
    plan = plan_for(cfg, stages.lake_for(cfg), iteration)
    return {
        "decisions": [asdict(d) for d in plan.decisions],
        "bootstrap_tasks": plan.bootstrap_tasks,
        "rollout_seeds": plan.rollout_seeds,
        "rl_tasks": plan.rl_tasks,
        "run_sft": plan.run_sft,
    }


@task(name="bootstrap", **PERSISTED)
def bootstrap(config: ConfigRef, iteration: int) -> dict[str, Any]:
    cfg = config.load()
    with RolloutProgress("bootstrap", expected_episodes(cfg, "bootstrap")) as p:
        return stages.bootstrap(cfg, iteration, **runner_kwargs(stages.bootstrap, p))


@task(name="rollouts", **PERSISTED)
def rollouts(config: ConfigRef, iteration: int, checkpoint: str | None = None) -> dict[str, Any]:
    cfg = config.load()
    with RolloutProgress("rollouts", expected_episodes(cfg, "rollouts")) as p:
        return stages.student_rollouts(cfg, iteration, checkpoint, **runner_kwargs(stages.student_rollouts, p))


@task(name="curate", **PERSISTED)
def curate(config: ConfigRef, iteration: int) -> dict[str, Any]:
    return stages.curate(config.load(), iteration)


@task(name="sft", **PERSISTED)
def sft(config: ConfigRef, iteration: int, dataset_id: str, base: str | None = None) -> dict[str, Any]:
    kw = {"progress": False} if "progress" in inspect.signature(stages.sft).parameters else {}
    return stages.sft(config.load(), iteration, dataset_id, base, **kw)


@task(name="rl", **PERSISTED)
def rl(config: ConfigRef, iteration: int, checkpoint: str) -> dict[str, Any]:
    return stages.rl(config.load(), iteration, checkpoint, progress=False)


@task(name="evaluate", **PERSISTED)
def evaluate(config: ConfigRef, iteration: int, checkpoint: str) -> dict[str, Any]:
    cfg = config.load()
    with RolloutProgress("evaluate", expected_episodes(cfg, "evaluate")) as p:
        return stages.evaluate(cfg, iteration, checkpoint, **runner_kwargs(stages.evaluate, p))


@task(name="midtrain", **PERSISTED)
def midtrain(config: ConfigRef, iteration: int = 0) -> dict[str, Any]:
    """Mid-training (flywheel/midtrain.py): the base checkpoint the first SFT starts from; `iteration` is only
    part of the cache key (the base belongs to the lake, not to an iteration)."""
    from flywheel.midtrain import midtrain as run

    return run(config.load(), progress=False)
