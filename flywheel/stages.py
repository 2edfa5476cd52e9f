"""The flywheel's built-in stages as plain functions (no Prefect): each takes the config and an iteration, writes
to the lake under a deterministic run key, and returns a StageResult (flywheel/pipeline.py) whose outputs are lake
ids, counts and paths that the next stage or a Prefect task passes on. flywheel/pipeline.py registers them.

    cfg = load_config("configs/local.yaml")
    register_tasks(cfg)                  # flywheel.specs
    bootstrap(cfg, iteration=0)          # scripted-teacher demos on the train split
"""

from __future__ import annotations

from typing import Any, Callable

from configs.models import FlywheelConfig
from flywheel.errors import UserError
from flywheel.pipeline import StageResult, episodes_result, skipped_result, stage_result, trained_result
from flywheel.runtime.rollout import PolicySpec, git_sha, run_rollouts
from flywheel.runtime.spec import RolloutSpec
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

        con = connect(lake) if lake.has_data("episodes") else None
        spent = demos_spent(con, tasks) if con else {}
        teacher = episodes_by_task(con, tasks) if con else {}
        want = {t: (min(sel.seeds_per_task, max(0, cap - teacher.get(t, 0))), spent.get(t, 0)) for t in tasks}
        want = {t: v for t, v in want.items() if v[0] > 0}
    else:
        return None
    return {t: registry.seeds("train", n, offset=sel.seed_offset + used) for t, (n, used) in want.items() if t in tasks}


def bootstrap(
    cfg: FlywheelConfig, iteration: int = 0, *, progress: bool = True, on_result: Callable[[dict], None] | None = None
) -> StageResult:
    """Teacher demonstrations on the train split into `episodes`/`steps` (stage 'bootstrap'), within the teacher
    budget left (`teacher_budget`, every stage's teacher episodes counted: `teacher_budget_capped` counts the
    jobs it cut). With a paid teacher, `bootstrap.budget_usd` caps the run's dollars too (the result's
    `budget_stopped` counts the episodes not started; `cost_usd` what this call spent)."""
    from envs import registry

    sel = cfg.bootstrap.selection
    tasks = resolve_tasks(sel.tasks, for_training=True, cfg=cfg)
    seeds = registry.seeds("train", sel.seeds_per_task, offset=sel.seed_offset)
    task_seeds = _demo_seeds(cfg, iteration, tasks)
    if task_seeds is not None and not task_seeds:
        why = "no task gets teacher demos this iteration (curriculum / teacher budget)"
        return skipped_result("bootstrap", iteration, why)
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
        why = cap.reason or "no teacher episodes to run"
        return skipped_result("bootstrap", iteration, why, run_key=spec.run_key, teacher_budget_capped=cap.dropped)
    summary = run_rollouts(spec, progress=progress, on_result=on_result)
    return episodes_result(
        "bootstrap", iteration, spec.run_key, summary, policy=spec.policy.kind, teacher_budget_capped=cap.dropped
    )


def student_rollouts(
    cfg: FlywheelConfig,
    iteration: int,
    checkpoint: str | None = None,
    *,
    progress: bool = True,
    on_result: Callable[[dict], None] | None = None,
) -> StageResult:
    """The current student (`checkpoint`, default: cfg.student.model), G episodes per task instance,
    on the train split (stage 'rollouts'). Outputs: "run_key", "checkpoint" (the student), "ran", "successes", ..."""
    model = check_student_model(cfg, checkpoint or cfg.student.model)
    spec = rollouts_spec(cfg, iteration, model)
    if spec is None:
        return skipped_result("rollouts", iteration, "the curriculum parked every task", checkpoint=model)
    summary = run_rollouts(spec, progress=progress, on_result=on_result)
    return episodes_result("rollouts", iteration, spec.run_key, summary, checkpoint=model)


def rollouts_spec(cfg: FlywheelConfig, iteration: int, model: str) -> RolloutSpec | None:
    """The rollouts stage's job list for student `model`: train seeds after the bootstrap's (instances the teacher
    did not demo), a fresh range per iteration; with the curriculum, each task's seeds as its plan says (None when
    it parked every task)."""
    from envs import registry

    sel = cfg.rollouts.selection
    student = cfg.student.policy_config(model=model)
    if cfg.rollouts.temperature is not None:
        student["temperature"] = cfg.rollouts.temperature
    policy = PolicySpec("student", {"model": model, "config": student}, version=str(model))
    offset = cfg.bootstrap.selection.seed_offset + cfg.bootstrap.selection.seeds_per_task + sel.seed_offset
    sized = cfg.curriculum.enabled and bool(cfg.curriculum.target_successes)  # the plan sizes each task's seeds
    stride = max(sel.seeds_per_task, cfg.curriculum.max_rollout_seeds) if sized else sel.seeds_per_task
    seeds = registry.seeds("train", stride, offset=offset + iteration * stride)
    tasks, max_seeds = resolve_tasks(sel.tasks, for_training=True, cfg=cfg), None
    if cfg.curriculum.enabled:  # parked tasks get none, solved ones a small check, frontier ones maybe more
        from flywheel.curriculum import plan_for

        planned = plan_for(cfg, lake_for(cfg), iteration).rollout_seeds
        tasks = [t for t in tasks if planned.get(t, 0) > 0]
        max_seeds = {t: planned[t] for t in tasks if planned[t] < stride}
        if not tasks:
            return None
    return rollout_spec(
        cfg,
        iteration=iteration,
        stage="rollouts",
        policy=policy,
        tasks=tasks,
        seeds=seeds,
        split="train",
        group_size=cfg.rollout_attempts(),
        max_seeds=max_seeds or None,
        openings=cfg.rollouts.openings or 0,
        openings_temperature=cfg.rollouts.openings_temperature,
    )


def curate(cfg: FlywheelConfig, iteration: int) -> StageResult:
    """Successful episodes up to this iteration -> a dataset manifest (`datasets`) + exported SFT set.
    Outputs: "dataset_id", "path", "data_files", "n_episodes", "n_steps", "source_counts"; rerunning
    replaces the manifest row and the export (the dataset id is deterministic)."""
    from envs import registry
    from training.export import curate as curate_lake

    res = curate_lake(cfg, iteration, lake_for(cfg), held_out=registry.HELD_OUT, git_sha=git_sha())
    return stage_result("curate", iteration, res, rows=1)


def _sft_base(cfg: FlywheelConfig, iteration: int, base: str | None) -> str | None:
    if base is None and cfg.midtrain.enabled and latest_checkpoint(cfg, iteration) is None:
        from flywheel.midtrain import base_checkpoint  # the first SFT starts from the mid-trained base

        return base_checkpoint(cfg)
    return base


def sft_plan(cfg: FlywheelConfig, iteration: int, dataset_id: str, base: str | None = None) -> dict[str, Any]:
    """What `sft` would train, to train it on another machine and adopt the run (training.sft_stage.sft_plan)."""
    from training.sft_stage import sft_plan as plan

    try:
        return plan(cfg, iteration, dataset_id, _sft_base(cfg, iteration, base))
    except FileNotFoundError as e:
        raise UserError(str(e).splitlines()[0]) from None


def sft(
    cfg: FlywheelConfig,
    iteration: int,
    dataset_id: str,
    base: str | None = None,
    *,
    progress: bool = True,
    adopt: str | None = None,
) -> StageResult:
    """Fine-tune `base` (a folder or checkpoint id; default: latest checkpoint of an earlier iteration, else
    cfg.student.model) on a dataset manifest, within cfg.sft.max_minutes if set. Outputs: "checkpoint_id",
    "path", "model_path" (full model for rollouts/eval: the result's checkpoint), "final_loss", "steps", ...; a row
    lands in `checkpoints`. A finished checkpoint of this lake (same data, base and settings) is reused, not
    retrained (`reused`). `adopt`: a finished run of this stage trained on another machine (training.adopt),
    checked against this stage's data, base and settings and recorded in its place."""
    from training.adopt import AdoptError
    from training.models import ModelError
    from training.sft_stage import sft_stage

    base = _sft_base(cfg, iteration, base)
    try:
        res = sft_stage(
            cfg, iteration, dataset_id, base, lake=lake_for(cfg), progress=progress, git_sha=git_sha(), adopt=adopt
        )
    except AdoptError as e:
        raise UserError(str(e)) from None
    # missing export, unloadable base or parent checkpoint, another lake's checkpoint in the way
    except (FileNotFoundError, FileExistsError, ModelError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return trained_result("sft", iteration, res)


def rl(cfg: FlywheelConfig, iteration: int, checkpoint: str | None = None, *, progress: bool = True) -> StageResult:
    """GRPO / SDPO rounds from `checkpoint` (default: this iteration's latest checkpoint) on fresh student
    groups (skipped unless cfg.rl.enabled: `checkpoint` is handed on). Outputs: "checkpoint_id", "model_path"
    (the last round: the result's checkpoint), "history", ...; a `checkpoints` row (method rl-<algo>) lands in the
    lake. Reruns resume by round."""
    if not cfg.rl.enabled:
        return skipped_result("rl", iteration, "rl.enabled is false", checkpoint=checkpoint)
    if cfg.curriculum.enabled:  # RL samples only the tasks whose groups carry a signal
        from flywheel.curriculum import plan_for
        from flywheel.rl_stage import _rl_tasks

        planned = plan_for(cfg, lake_for(cfg), iteration).rl_tasks
        tasks = [t for t in _rl_tasks(cfg) if t in planned]
        if not tasks:
            why = "the curriculum gives RL no task this iteration (none with 0 < success < solved)"
            return skipped_result("rl", iteration, why, checkpoint=checkpoint)
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
        res = rl_stage(cfg, iteration, checkpoint, lake=lake, progress=progress)
    except (FileNotFoundError, ModelError) as e:
        raise UserError(str(e).splitlines()[0] if str(e) else type(e).__name__) from None
    return trained_result("rl", iteration, res)


def evaluate(
    cfg: FlywheelConfig,
    iteration: int,
    checkpoint: str,
    *,
    progress: bool = True,
    on_result: Callable[[dict], None] | None = None,
) -> StageResult:
    """Held-out seeds (and held-out tasks) for a checkpoint -> `evals` rows, a table and a plot.
    Outputs: "eval_id", "checkpoint" (the one evaluated), "success_rate", "ci_low", "ci_high", "plot", ..."""
    from flywheel.evaluate import evaluate_checkpoint

    if checkpoint != "scripted":
        check_student_model(cfg, checkpoint)
    res = evaluate_checkpoint(cfg, iteration, checkpoint, progress=progress, on_result=on_result)
    return stage_result("evaluate", iteration, res, rows=res["eval_rows"])


def expected_episodes(cfg: FlywheelConfig, stage: str) -> int:
    """Episodes a rollout-type stage (bootstrap, rollouts, evaluate) runs on a fresh lake: tasks x seeds x group."""
    from envs import registry

    if stage == "bootstrap":
        sel, group = cfg.bootstrap.selection, 1
    elif stage == "rollouts":
        sel, group = cfg.rollouts.selection, cfg.rollout_attempts()
    else:
        sel, group = cfg.evaluate.selection, 1
    tasks = set(resolve_tasks(sel.tasks, for_training=stage != "evaluate", cfg=cfg))
    if stage == "evaluate" and cfg.evaluate.held_out_tasks:
        tasks |= {t.task_id for t in registry.TASKS if t.held_out and t.teacher_supported}
    return len(tasks) * sel.seeds_per_task * group
