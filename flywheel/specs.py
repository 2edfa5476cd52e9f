"""What the stages share: the lake they use, task selections, run keys, rollout specs, the teacher and the student.

    lake = lake_for(cfg)                                   # $FLYWHEEL_LAKE, else the config's lake.root
    tasks = resolve_tasks(["all"], for_training=True)      # task ids (held-out ones only for evaluation)
    spec = rollout_spec(cfg, iteration=0, stage="bootstrap", policy=teacher_policy(cfg), tasks=tasks,
                        seeds=[0, 1], split="train")       # deterministic run key + jobs

Small, plain helpers with no stage logic: the stage modules (flywheel/stages.py, curriculum.py, evaluate.py,
rl_stage.py, midtrain.py), the CLI and the Prefect tasks all import them from here, so none of those needs another.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from configs.models import FlywheelConfig
from configs.runkeys import run_key
from flywheel.errors import UserError
from flywheel.runtime.spec import PolicySpec, RolloutSpec, git_sha, make_jobs
from storage.lake import Lake, LakeError, open_lake


def lake_for(cfg: FlywheelConfig) -> Lake:
    """The lake the stages read and write: $FLYWHEEL_LAKE, else the config's lake.root. A command's `--lake`
    sets $FLYWHEEL_LAKE (flywheel.cli.common.use_lake), so it outranks both, here and in every process it starts.
    A lake the OS will not let us create or open (a root under a missing or read-only parent, a folder without
    write permission) raises LakeError: one line naming the path, not a traceback (docs/ERRORS.md)."""
    try:
        return open_lake(cfg)
    except OSError as e:
        where = f" ({e.filename})" if e.filename else ""
        raise LakeError(f"cannot create or open the lake: {e.strerror or e}{where}") from None


def resolve_tasks(tasks: list[str], *, for_training: bool, cfg: FlywheelConfig | None = None) -> list[str]:
    """Task ids from a selection; 'all' = every teacher-supported task (held-out ones only for eval).

    With `cfg` on a remote env, ids the registry does not know are looked up in the lake's `tasks` table too: the
    OSWorld tasks `flywheel import osworld-tasks` put there (split 'both', so training and evaluation may use them).
    Raises UserError for unknown ids, and for held-out tasks in a training-side stage."""
    from envs import registry

    known = {t.task_id: t for t in registry.TASKS}
    if tasks == ["all"]:
        return registry.teacher_tasks(include_held_out=not for_training)
    unknown = [t for t in tasks if t not in known]
    if unknown and cfg is not None and cfg.env.name == "remote":
        in_lake = lake_task_configs(cfg, unknown)
        unknown = [t for t in unknown if t not in in_lake]
    if unknown:
        hint = "" if cfg is None or cfg.env.name == "remote" else " (OSWorld tasks from the lake need env.name: remote)"
        raise UserError(f"unknown task ids {unknown}{hint}; known: {', '.join(sorted(known))}")
    held = [t for t in tasks if t in known and known[t].held_out]
    if for_training and held:
        raise UserError(f"tasks {held} are held out for evaluation; remove them from training-side stages")
    return list(tasks)


def lake_task_configs(cfg: FlywheelConfig, task_ids: list[str]) -> dict[str, dict[str, Any]]:
    """The task JSON (what OSWorld's DesktopEnv.reset takes) of those ids that the lake's `tasks` table holds as
    OSWorld tasks (`flywheel import osworld-tasks`); ids it does not hold are left out."""
    import json

    lake = lake_for(cfg)
    if not task_ids or not lake.has_data("tasks"):
        return {}
    from storage.catalog import connect

    rows = (
        connect(lake)
        .execute(
            "SELECT task_id, config, instruction FROM tasks WHERE env = 'osworld' AND list_contains($1, task_id)",
            [list(task_ids)],
        )
        .fetchall()
    )
    out: dict[str, dict[str, Any]] = {}
    for task_id, config, instruction in rows:
        c = json.loads(config or "{}")
        out[task_id] = c.get("task_json") or {  # rows written before the task JSON was kept whole
            "id": task_id.rsplit("/", 1)[-1],
            "instruction": instruction,
            "snapshot": c.get("snapshot"),
            "config": c.get("config", []),
            "evaluator": c.get("evaluator"),
            "related_apps": c.get("related_apps", []),
            "proxy": c.get("proxy", False),
        }
    return out


def run_key_for(stage: str, iteration: int, payload: dict[str, Any]) -> str:
    """Deterministic: the same stage inputs give the same key (so a rerun replaces, not duplicates)."""
    return run_key(f"{stage}-it{iteration}", payload)


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
    openings: int = 0,
    openings_temperature: float | None = None,
) -> RolloutSpec:
    """The rollout job list of a stage. `max_seeds` runs only the first n of `seeds` for the named tasks;
    `task_seeds` replaces `tasks` x `seeds` with each task's own seeds; `openings` > 0 branches each instance's
    attempts at their first step (flywheel.runtime.openings)."""
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
        known = {t.task_id for t in registry.TASKS}
        configs = lake_task_configs(cfg, [t for t in dict.fromkeys([*tasks, *(task_seeds or {})]) if t not in known])
        if configs:  # OSWorld tasks from the lake: each reset sends its task JSON, so no server needs --tasks-dir
            env_kwargs["task_configs"] = configs
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
    if openings:
        payload["openings"] = openings
        if openings_temperature is not None:
            payload["openings_temperature"] = openings_temperature
    if task_seeds is not None:
        tasks = [t for t in tasks if t in task_seeds] + [t for t in task_seeds if t not in tasks]
        payload.update(tasks=tasks, seeds=None, task_seeds=task_seeds)
    if any(t.startswith("synth/") for t in tasks):  # a changed page generator draws other pages for the same seeds
        from envs import synth

        payload["synth_pages"] = synth.version()
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
        lake_catalog=lake.catalog_setting,
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
        env_error_retries=cfg.env.error_retries,  # a crashed browser restarts at the next reset
        openings=openings,
        openings_temperature=openings_temperature,
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
        check_model_folder(p)
        return model
    try:
        _hub_preflight(model)
    except ModelError as e:
        raise UserError(f"no model folder at {model}, and as a Hub id: {e}") from None
    return model


def check_model_folder(p) -> None:
    """A local model or adapter folder the workers could load: a Qwen-VL `model_type` in config.json and complete
    weights. Reads only config.json and each safetensors header (no torch), so a folder of another architecture,
    a checkpoint missing its weights or one cut short mid-copy fails in one line before any worker starts."""
    import json
    import struct

    from training.models import _MODEL_TYPES

    if (p / "config.json").is_file() and not (p / "adapter_config.json").is_file():
        try:
            model_type = json.loads((p / "config.json").read_text()).get("model_type")
        except (OSError, ValueError, AttributeError) as e:
            raise UserError(f"{p}/config.json is not a readable JSON object: {e}") from None
        if model_type not in _MODEL_TYPES:
            raise UserError(f"{p}: model type {model_type!r} is not Qwen3-VL or Qwen2.5-VL (config.json)")
        stem = "model"
    else:
        stem = "adapter_model"
    index = p / f"{stem}.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"{index} is not a readable weight index: {e}") from None
    elif (p / f"{stem}.safetensors").is_file():
        shards = [f"{stem}.safetensors"]
    elif (p / f"{stem}.bin").is_file() or (p / "pytorch_model.bin").is_file():
        return  # a torch pickle: no header to check without loading it
    else:
        raise UserError(f"{p} has no weights ({stem}.safetensors): an incomplete checkpoint folder")
    for name in shards:
        f = p / name
        if not f.is_file():
            raise UserError(f"{p} is missing the weight file {name} its index names: an incomplete checkpoint folder")
        size = f.stat().st_size
        try:
            with f.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                header = json.loads(fh.read(n)) if 8 + n <= size else None
        except (OSError, ValueError, struct.error):
            header = None
        if not isinstance(header, dict):
            raise UserError(f"{f} is not a whole safetensors file (bad header): an incomplete checkpoint folder")
        end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        if 8 + n + end > size:
            raise UserError(
                f"{f} is cut short ({size} of {8 + n + end} bytes): an incomplete checkpoint folder, "
                "copy or save it again"
            )


def latest_checkpoint(cfg: FlywheelConfig, before: int) -> str | None:
    """The newest checkpoint an earlier iteration trained (where a resumed flywheel continues from)."""
    from storage.catalog import connect

    lake = lake_for(cfg)
    if before == 0 or not lake.has_data("checkpoints"):
        return None
    from training.core import ITERATION_CHECKPOINTS, MERGED_DIR

    row = (
        connect(lake)
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
