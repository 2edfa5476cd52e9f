"""Prefect tasks over the registered stages (flywheel/pipeline.py): one factory, one thin task per stage.

    from tasks.stages import stage_task
    res = stage_task("curate")(ConfigRef(path="configs/tiny.yaml"), iteration=0)   # inside a flow: a StageResult

A stage's task takes the stage flow's parameters (`config`, `iteration`, the stage's inputs), loads the config from
its reference and calls the stage. Results are persisted and cached on (stage, iteration, config hash, lake,
inputs) (tasks/common.py), so a retried flow run skips stages that already finished; a stage that must run again
anyway is called with `.with_options(refresh_cache=True)`, and the stages' deterministic run keys keep the lake
free of duplicates. A stage that takes `on_result` (it reports each finished episode) also gets a progress
artifact.

Result files go to Prefect's local result storage (`PREFECT_RESULTS_LOCAL_STORAGE_PATH`), which
flows/orchestrate.py points at `.prefect/results`, outside the lake.
"""

from __future__ import annotations

import inspect
from typing import Any

from prefect import task
from prefect.tasks import Task

from flywheel import specs
from flywheel.pipeline import Stage, StageResult, get_stage
from tasks.artifacts import RolloutProgress
from tasks.common import ConfigRef, stage_cache_key

PERSISTED: dict[str, Any] = {"persist_result": True, "cache_key_fn": stage_cache_key}

_TASKS: dict[str, tuple[Stage, Task]] = {}  # built on first use; rebuilt when the registry's stage changes


def stage_parameters(stage: Stage) -> list[inspect.Parameter]:
    """The stage's task and flow parameters: config, iteration, then its inputs (types and defaults of the
    stage function)."""
    kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    return [
        inspect.Parameter("config", kw, annotation=ConfigRef),
        inspect.Parameter("iteration", kw, annotation=int),
        *(inspect.Parameter(p.name, kw, default=p.default, annotation=p.annotation) for p in stage.parameters()),
    ]


def stage_task(name: str) -> Task:
    """The Prefect task of a registered stage (named after it: the cache key's prefix)."""
    stage = get_stage(name)
    hit = _TASKS.get(name)
    if hit is not None and hit[0] is stage:
        return hit[1]
    sig = inspect.Signature(stage_parameters(stage), return_annotation=StageResult)
    reports_episodes = "on_result" in stage.signature().parameters  # a rollout-type stage: a progress artifact

    def run(*args: Any, **kwargs: Any) -> StageResult:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        cfg, iteration = a.pop("config").load(), a.pop("iteration")
        if not reports_episodes:
            return stage(cfg, iteration, progress=False, **a)
        with RolloutProgress(name, None) as p:  # no terminal bar under Prefect; the artifact counts the episodes
            return stage(cfg, iteration, progress=False, on_result=p.on_result, **a)

    run.__signature__ = sig  # what Prefect binds the call's parameters (and the cache key's inputs) by
    run.__name__ = run.__qualname__ = f"{name.replace('-', '_')}_task"
    run.__doc__ = stage.description
    t = task(name=name, **PERSISTED)(run)
    _TASKS[name] = (stage, t)
    return t


@task(name="register-tasks", **PERSISTED)
def register_tasks(config: ConfigRef) -> dict[str, Any]:
    return specs.register_tasks(config.load())


@task(name="curriculum")
def plan_curriculum(config: ConfigRef, iteration: int) -> dict[str, Any]:
    """The iteration's curriculum (read from the lake, else made and written there): not cached by Prefect,
    the lake's `curriculum` rows are the record, so a resumed iteration follows the same decisions."""
    from dataclasses import asdict

    from flywheel.curriculum import plan_for

    cfg = config.load()
    plan = plan_for(cfg, specs.lake_for(cfg), iteration)
    return {
        "decisions": [asdict(d) for d in plan.decisions],
        "bootstrap_tasks": plan.bootstrap_tasks,
        "rollout_seeds": plan.rollout_seeds,
        "rl_tasks": plan.rl_tasks,
        "run_sft": plan.run_sft,
    }
