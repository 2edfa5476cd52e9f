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
    """The lake the stages read and write: $FLYWHEEL_LAKE, else the config's lake.root. A command's `--lake`
    sets $FLYWHEEL_LAKE (flywheel.cli.use_lake), so it outranks both, here and in every process it starts."""
    import os

    return Lake(
        os.environ.get("FLYWHEEL_LAKE") or cfg.lake.root,
        endpoint=os.environ.get("FLYWHEEL_S3_ENDPOINT") or cfg.lake.s3_endpoint,
        cache_dir=cfg.lake.cache_dir,
    )


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

    rows = [
        dict(
            r,
            run_key="registry",
            git_sha=git_sha(),
            config_hash=None,
            teacher_supported=registry.get_task(r["task_id"]).teacher_supported,
        )
        for r in registry.tasks_table_rows()
    ]
    path = lake_for(cfg).replace_run("tasks", [rows], iteration=0, stage="registry", run_key="registry")
    return {"tasks": len(rows), "paths": [str(p) for p in path]}


def rollout_spec(
    cfg: FlywheelConfig,
    *,
    iteration: int,
    stage: str,
    policy: PolicySpec,
    tasks: list[str],
    seeds: list[int],
    split: str,
    group_size: int = 1,
    n_envs: int | None = None,
    max_seeds: dict[str, int] | None = None,
    task_seeds: dict[str, list[int]] | None = None,
) -> RolloutSpec:
    """The rollout job list of a stage. `max_seeds` runs only the first n of `seeds` for the named tasks;
    `task_seeds` replaces `tasks` x `seeds` with each task's own seeds."""
    from envs import registry

    env_kwargs: dict[str, Any] = {"name": cfg.env.name}
    key_env = dict(env_kwargs, screenshot_scale=cfg.env.screenshot_scale)  # where the envs run is not in the run key
    if cfg.env.name == "miniwob":
        env_kwargs.update(
            screenshot_scale=cfg.env.screenshot_scale,
            chrome_binary=cfg.env.chrome_binary,
            chromedriver=cfg.env.chromedriver,
        )
        key_env = env_kwargs
    else:  # remote: the screen is the server's; the token stays in the workers' environment
        env_kwargs.update(
            servers=list(cfg.env.servers),
            token_env=cfg.env.token_env,
            acquire_timeout_s=cfg.env.acquire_timeout_s,
            ca_file=cfg.env.ca_file,
        )
    payload = {
        "policy": asdict(policy),
        "tasks": tasks,
        "seeds": seeds,
        "group": group_size,
        "env": key_env,
        "split": split,
    }
    if max_seeds:
        payload["max_seeds"] = max_seeds
    if task_seeds is not None:
        tasks = [t for t in tasks if t in task_seeds] + [t for t in task_seeds if t not in tasks]
        payload.update(tasks=tasks, seeds=None, task_seeds=task_seeds)
    key = run_key_for(stage, iteration, payload)
    caps = {t.task_id: cfg.env.max_steps or t.max_steps for t in registry.TASKS if t.task_id in tasks}
    if task_seeds is not None:
        jobs = [
            j
            for t in tasks
            for j in make_jobs(
                key, [t], task_seeds[t], group_size=group_size, policy_tag=policy.tag, split=split, max_steps=caps
            )
        ]
    else:
        jobs = make_jobs(key, tasks, seeds, group_size=group_size, policy_tag=policy.tag, split=split, max_steps=caps)
    if max_seeds:
        keep = {t: set(seeds[:n]) for t, n in max_seeds.items()}
        jobs = [j for j in jobs if j.task_id not in keep or j.seed in keep[j.task_id]]
    lake = lake_for(cfg)
    return RolloutSpec(
        run_key=key,
        iteration=iteration,
        stage=stage,
        lake_root=lake.uri,
        lake_endpoint=lake.endpoint,
        jobs=jobs,
        policy=policy,
        env=env_kwargs,
        n_envs=n_envs or cfg.rollout.envs,
        envs_per_worker=cfg.rollout.envs_per_worker,
        max_steps=cfg.env.max_steps or 8,
        episode_timeout_s=cfg.rollout.episode_timeout_s,
        worker_start_timeout_s=cfg.rollout.worker_start_timeout_s,
        end_on_parse_error=cfg.rollout.on_parse_error == "end",
        config_hash=cfg.config_hash(),
        policy_threads=cfg.rollout.policy_threads,
        env_error_retries=cfg.env.error_retries if cfg.env.name == "remote" else 0,
    )


def teacher_policy(cfg: FlywheelConfig) -> PolicySpec:
    """The bootstrap teacher: scripted, claude, or auto (claude when $ANTHROPIC_API_KEY is set, else scripted).
    A Claude teacher is checked first (key accepted, model known), so a bad key or model fails here in one line
    instead of in every episode. The key itself never enters the spec (it is part of the run key's payload)."""
    import logging
    import os

    kind = cfg.bootstrap.policy
    if kind == "auto":
        kind = "claude" if os.environ.get("ANTHROPIC_API_KEY") else "scripted"
        if kind == "scripted":
            logging.getLogger(__name__).warning(
                "bootstrap.policy is 'auto' and ANTHROPIC_API_KEY is not set: using the scripted teacher"
            )
    if kind == "scripted":
        return PolicySpec("scripted")
    from agents.claude import ClaudeError, check_claude

    c = cfg.claude
    try:
        check_claude(c.model, base_url=c.base_url, timeout_s=min(c.timeout_s, 30.0), max_retries=c.max_retries)
    except ClaudeError as e:
        raise UserError(str(e)) from None
    options = {
        "model": c.model,
        "prices": {k: v.model_dump() for k, v in c.prices.items()},
        "base_url": c.base_url,
        "max_tokens": c.max_tokens,
        "thinking_budget": c.thinking_budget,
        "tool_version": c.tool_version,
        "history_images": c.history_images,
        "max_retries": c.max_retries,
        "timeout_s": c.timeout_s,
        "max_long_edge": c.max_long_edge,
        "max_pixels": c.max_pixels,
    }
    return PolicySpec("claude", options, version=c.model)


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
def ensure_student(cfg: FlywheelConfig) -> str:
    """The base student folder, built (random init, cfg.student.arch/size, seed 0) if it is a missing local
    path. `flywheel run` calls this first, so a fresh clone's main job needs no manual `flywheel model init`;
    the stages themselves fail clearly on a missing model instead of building one behind a user's back."""
    from pathlib import Path

    from training.models import _looks_local, init_model

    model = cfg.student.model
    p = Path(model).expanduser()
    if _looks_local(model) and not p.exists():
        init_model(cfg.student.arch, cfg.student.size, p, seed=0)
    return model


def check_student_model(cfg: FlywheelConfig, model: str) -> str:
    """Fail here, in one line, on a student model the rollout workers could not load, before any worker starts
    (a worker's load error would end as "env workers cannot start" after two spawned processes each tried).

    A path that looks local (training.models._looks_local) must be a model or LoRA adapter folder; anything else
    is a Hub id, which must be cached or reachable (load_model's fast preflight). The `openai` backend names a
    served model, which only its server can check."""
    from pathlib import Path

    from training.models import ModelError, _hub_preflight, _looks_local

    if cfg.student.backend != "hf":
        return model
    p = Path(model).expanduser()
    todo = "pass a model folder (`flywheel model init --out PATH` builds one), a checkpoint folder or a Hub id"
    if _looks_local(model):
        if not p.exists():
            raise UserError(f"no model folder at {model}: {todo}")
        if not (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
            raise UserError(f"{model} is not a model folder (no config.json or adapter_config.json): {todo}")
        return model
    try:
        _hub_preflight(model)
    except ModelError as e:
        raise UserError(f"no model folder at {model}, and as a Hub id: {e}") from None
    return model


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
    from storage.curate import curate as curate_lake

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


def latest_checkpoint(cfg: FlywheelConfig, before: int) -> str | None:
    """The newest checkpoint an earlier iteration trained (where a resumed flywheel continues from)."""
    from storage.catalog import connect

    lake = lake_for(cfg)
    if before == 0 or not lake.has_data("checkpoints"):
        return None
    from training.core import ITERATION_CHECKPOINTS, MERGED_DIR

    row = (
        connect(lake, write_catalog_file=False)
        .execute(
            f"SELECT checkpoint_id, path, adapter FROM checkpoints WHERE iteration < ? AND {ITERATION_CHECKPOINTS} "
            "ORDER BY iteration DESC, created_at DESC LIMIT 1",
            [before],
        )
        .fetchone()
    )
    if row is None:
        return None
    # the same folder the iteration itself handed on (checkpoint_of: a LoRA adapter's merged model), so a resumed
    # iteration's stages see the same inputs and find their finished results instead of running again
    path = lake.resolve(row[1])  # rows store lake-relative paths
    return str(path / MERGED_DIR) if row[2] and (path / MERGED_DIR).exists() else str(path)


def evaluate(cfg: FlywheelConfig, iteration: int, checkpoint: str, *, progress: bool = True) -> dict[str, Any]:
    """Held-out seeds (and held-out tasks) for a checkpoint -> `evals` rows, a table and a plot.
    Returns {"eval_id", "success_rate", "ci_low", "ci_high", "plot"}."""
    from flywheel.evaluate import evaluate_checkpoint

    if checkpoint != "scripted":
        check_student_model(cfg, checkpoint)
    return evaluate_checkpoint(cfg, iteration, checkpoint, progress=progress)
