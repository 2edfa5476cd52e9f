"""The flywheel's stages as plain functions (no Prefect): each takes the config and an
iteration, writes to the lake under a deterministic run key, and returns a small JSON-able
result (ids, counts, lake paths) that the next stage or a Prefect task can pass on.

    cfg = load_config("configs/local.yaml")
    register_tasks(cfg)
    bootstrap(cfg, iteration=0)          # scripted-teacher demos on the train split
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from configs.models import FlywheelConfig
from flywheel.errors import UserError
from flywheel.runtime.rollout import PolicySpec, git_sha, run_rollouts
from flywheel.specs import (
    check_student_model,
    lake_for,
    latest_checkpoint,
    resolve_tasks,
    rollout_spec,
    teacher_policy,
)


def _demo_seeds(cfg: FlywheelConfig, iteration: int, tasks: list[str]) -> dict[str, list[int]] | None:
    """Per-task demo seeds when the teacher is a budget (curriculum on, or a per-task teacher budget:
    teacher_budget.max_episodes_per_task / bootstrap.max_demos_per_task); None = the plain selection. The budget
    counts every stage's teacher episodes (flywheel/teacher_budget.py); a task's new demos take the seeds after
    the bootstrap demos it already has."""
    from envs import registry
    from flywheel.curriculum import demos_spent, plan_for
    from flywheel.teacher_budget import episodes_by_task, limits

    sel, cap = cfg.bootstrap.selection, limits(cfg).per_task
    lake = lake_for(cfg)
    if cfg.curriculum.enabled:
        plan = plan_for(cfg, lake, iteration)
        want = {d.task_id: (d.teacher_demos, d.demos_spent) for d in plan.decisions if d.teacher_demos > 0}
    elif cap is not None:
        from storage.catalog import connect

        con = connect(lake, write_catalog_file=False) if lake.has_data("episodes") else None
        spent = demos_spent(con, tasks) if con else {}
        teacher = episodes_by_task(con, tasks) if con else {}
        want = {t: (min(sel.seeds_per_task, max(0, cap - teacher.get(t, 0))), spent.get(t, 0)) for t in tasks}
        want = {t: v for t, v in want.items() if v[0] > 0}
    else:
        return None
    return {t: registry.seeds("train", n, offset=sel.seed_offset + used) for t, (n, used) in want.items() if t in tasks}


def bootstrap(cfg: FlywheelConfig, iteration: int = 0, *, progress: bool = True) -> dict[str, Any]:
    """Teacher demonstrations on the train split into `episodes`/`steps` (stage 'bootstrap'), within the teacher
    budget left (`teacher_budget`, every stage's teacher episodes counted: `teacher_budget_capped` counts the
    jobs it cut). With a paid teacher, `bootstrap.budget_usd` caps the run's dollars too (the result's
    `budget_stopped` counts the episodes not started; `cost_usd` what this call spent)."""
    from envs import registry

    sel = cfg.bootstrap.selection
    tasks = resolve_tasks(sel.tasks, for_training=True)
    seeds = registry.seeds("train", sel.seeds_per_task, offset=sel.seed_offset)
    task_seeds = _demo_seeds(cfg, iteration, tasks)
    if task_seeds is not None and not task_seeds:
        return {
            "skipped": True,
            "iteration": iteration,
            "stage": "bootstrap",
            "reason": "no task gets teacher demos this iteration (curriculum / teacher budget)",
        }
    from flywheel.teacher_budget import cap_teacher_spec

    spec = rollout_spec(
        cfg,
        iteration=iteration,
        stage="bootstrap",
        policy=teacher_policy(cfg),
        tasks=tasks,
        seeds=seeds,
        split="train",
        task_seeds=task_seeds,
    )
    # the budgets are not in the run key: raising one resumes the run
    spec, cap = cap_teacher_spec(cfg, spec, run_usd=cfg.bootstrap.budget_usd, what="the bootstrap")
    if not spec.jobs:
        return {
            "skipped": True,
            "iteration": iteration,
            "stage": "bootstrap",
            "run_key": spec.run_key,
            "teacher_budget_capped": cap.dropped,
            "reason": cap.reason or "no teacher episodes to run",
        }
    summary = run_rollouts(spec, progress=progress)
    return {
        "run_key": spec.run_key,
        "iteration": iteration,
        "stage": "bootstrap",
        "policy": spec.policy.kind,
        **asdict(summary),
        "teacher_budget_capped": cap.dropped,
    }


# ----------------------------------------------------------------------------------------------
# Stage contract (issues #5/#6). Each returns a small JSON-able dict; inputs/outputs are lake ids
# and paths. Stubs raise until their issue lands; the Prefect flows call exactly these.
def student_rollouts(
    cfg: FlywheelConfig, iteration: int, checkpoint: str | None = None, *, progress: bool = True
) -> dict[str, Any]:
    """The current student (`checkpoint`, default: cfg.student.model), G episodes per task instance,
    on the train split (stage 'rollouts'). Returns {"run_key", "ran", "successes", ...}."""
    from envs import registry

    sel = cfg.rollouts.selection
    model = check_student_model(cfg, checkpoint or cfg.student.model)
    student = {**cfg.student.model_dump(), "model": model}
    if cfg.rollouts.temperature is not None:
        student["temperature"] = cfg.rollouts.temperature
    policy = PolicySpec("student", {"model": model, "config": student}, version=str(model))
    # seeds after the bootstrap's, so student rollouts see task instances the teacher did not demo
    offset = cfg.bootstrap.selection.seed_offset + cfg.bootstrap.selection.seeds_per_task + sel.seed_offset
    seeds = registry.seeds("train", sel.seeds_per_task, offset=offset + iteration * sel.seeds_per_task)
    tasks, max_seeds = resolve_tasks(sel.tasks, for_training=True), None
    if cfg.curriculum.enabled:  # parked tasks get none, solved ones a small check
        from flywheel.curriculum import plan_for

        planned = plan_for(cfg, lake_for(cfg), iteration).rollout_seeds
        tasks = [t for t in tasks if planned.get(t, 0) > 0]
        max_seeds = {t: planned[t] for t in tasks if planned[t] < sel.seeds_per_task}
        if not tasks:
            return {
                "skipped": True,
                "iteration": iteration,
                "stage": "rollouts",
                "checkpoint": model,
                "reason": "the curriculum parked every task",
            }
    spec = rollout_spec(
        cfg,
        iteration=iteration,
        stage="rollouts",
        policy=policy,
        tasks=tasks,
        seeds=seeds,
        split="train",
        group_size=cfg.rollout_attempts(),
        max_seeds=max_seeds or None,
    )
    summary = run_rollouts(spec, progress=progress)
    return {
        "run_key": spec.run_key,
        "iteration": iteration,
        "stage": "rollouts",
        "checkpoint": model,
        **asdict(summary),
    }


def curate(cfg: FlywheelConfig, iteration: int) -> dict[str, Any]:
    """Successful episodes up to this iteration -> a dataset manifest (`datasets`) + exported SFT set.
    Returns {"dataset_id", "path", "data_files", "n_episodes", "n_steps", "source_counts"}; rerunning
    replaces the manifest row and the export (the dataset id is deterministic)."""
    from envs import registry
    from training.export import curate as curate_lake

    return curate_lake(cfg, iteration, lake_for(cfg), held_out=registry.HELD_OUT, git_sha=git_sha())


def sft(
    cfg: FlywheelConfig, iteration: int, dataset_id: str, base: str | None = None, *, progress: bool = True
) -> dict[str, Any]:
    """Fine-tune `base` (a folder or checkpoint id; default: latest checkpoint of an earlier iteration, else
    cfg.student.model) on a dataset manifest, within cfg.sft.max_minutes if set. Returns {"checkpoint_id",
    "path", "model_path" (full model for rollouts/eval), "final_loss", "steps", "skipped", ...}; a row lands
    in `checkpoints`. A finished checkpoint of this lake (same data, base and settings) is reused, not retrained."""
    from training.models import ModelError
    from training.sft import sft_stage

    if base is None and cfg.midtrain.enabled and latest_checkpoint(cfg, iteration) is None:
        from flywheel.midtrain import base_checkpoint  # the first SFT starts from the mid-trained base

        base = base_checkpoint(cfg)
    try:
        return sft_stage(cfg, iteration, dataset_id, base, lake=lake_for(cfg), progress=progress, git_sha=git_sha())
    # missing export, unloadable base or parent checkpoint, another lake's checkpoint in the way
    except (FileNotFoundError, FileExistsError, ModelError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def rl(cfg: FlywheelConfig, iteration: int, checkpoint: str | None = None, *, progress: bool = True) -> dict[str, Any]:
    """GRPO / SDPO rounds from `checkpoint` (default: this iteration's latest checkpoint) on fresh student
    groups (skipped unless cfg.rl.enabled). Returns {"checkpoint_id", "checkpoint", "model_path", "history", ...};
    a `checkpoints` row (method rl-<algo>) lands in the lake. Reruns resume by round."""
    if not cfg.rl.enabled:
        return {"skipped": True, "checkpoint": checkpoint}
    if cfg.curriculum.enabled:  # RL samples only the tasks whose groups carry a signal
        from flywheel.curriculum import plan_for
        from flywheel.rl_stage import _rl_tasks

        planned = plan_for(cfg, lake_for(cfg), iteration).rl_tasks
        tasks = [t for t in _rl_tasks(cfg) if t in planned]
        if not tasks:
            return {
                "skipped": True,
                "checkpoint": checkpoint,
                "reason": "the curriculum gives RL no task this iteration (none with 0 < success < solved)",
            }
        cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"tasks": tasks})})
    from flywheel.rl_stage import rl_stage
    from training.models import ModelError

    lake = lake_for(cfg)
    if checkpoint is None:
        from storage.catalog import connect
        from training.core import ITERATION_CHECKPOINTS

        row = (
            connect(lake)
            .execute(
                f"SELECT path FROM checkpoints WHERE iteration = ? AND {ITERATION_CHECKPOINTS} "
                "ORDER BY created_at DESC LIMIT 1",
                [iteration],
            )
            .fetchone()
        )
        if row is None:
            raise UserError(
                f"no checkpoint in iteration {iteration} to start RL from; "
                f"run `flywheel stage sft -i {iteration}` or pass --checkpoint"
            )
        checkpoint = row[0]
    try:
        return rl_stage(cfg, iteration, checkpoint, lake=lake, progress=progress)
    except (FileNotFoundError, ModelError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None


def evaluate(cfg: FlywheelConfig, iteration: int, checkpoint: str, *, progress: bool = True) -> dict[str, Any]:
    """Held-out seeds (and held-out tasks) for a checkpoint -> `evals` rows, a table and a plot.
    Returns {"eval_id", "success_rate", "ci_low", "ci_high", "plot"}."""
    from flywheel.evaluate import evaluate_checkpoint

    if checkpoint != "scripted":
        check_student_model(cfg, checkpoint)
    return evaluate_checkpoint(cfg, iteration, checkpoint, progress=progress)
