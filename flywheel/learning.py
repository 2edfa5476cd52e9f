"""The learning bar as a function: a fresh random-init student, teacher demos, SFT, held-out evaluation.

    res = learning_bar("configs/local.yaml", workdir=Path("bench-out"))        # benchmarks/learning_bar.py
    res["after"]["success_rate"], res["before"]["success_rate"], res["wall_s_bootstrap_to_eval"]

Runs the flywheel's own stage functions (flywheel.stages) in a fresh lake under `workdir`:
  1. a fresh random-init student (training.models.init_model: the config's arch and size, seed 0)
  2. the untrained baseline on held-out eval seeds (optional; fewer seeds and 2 steps per episode,
     since an untrained model never writes a stop token and each episode costs the full budget)
  3. bootstrap: scripted-teacher demonstrations on train seeds
  4. curate: successful episodes -> dataset manifest + export
  5. sft within cfg.sft.max_minutes
  6. evaluate the fine-tuned checkpoint on held-out eval seeds of the trained tasks
Held-out *tasks* are left out (the flywheel's evaluate stage reports them); this measures whether the
student learns the tasks it was shown, on seeds it never saw.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any


def _summary(r: dict[str, Any]) -> dict[str, Any]:
    return {
        "success_rate": round(r["success_rate"], 3),
        "ci": [round(r["ci_low"], 3), round(r["ci_high"], 3)],
        "n": r["n_episodes"],
        "per_task": r["per_task"],
        "parse_error_rate": round(r["parse_error_rate"], 3),
    }


def learning_bar(
    config: str | Path,
    workdir: Path,
    overrides: dict[str, Any] | None = None,
    *,
    baseline: bool = True,
    baseline_seeds: int = 5,
    progress: bool = True,
) -> dict[str, Any]:
    """Run the bar in `workdir` (its lake, checkpoints and student folder are replaced); returns the JSON dict."""
    workdir = Path(workdir).resolve()
    lake = workdir / "learn-lake"
    before = os.environ.get("FLYWHEEL_LAKE")
    os.environ["FLYWHEEL_LAKE"] = str(lake)  # it outranks lake.root: point it here, and put it back after
    try:
        return _run(config, workdir, lake, overrides, baseline, baseline_seeds, progress)
    finally:
        if before is None:
            os.environ.pop("FLYWHEEL_LAKE", None)
        else:
            os.environ["FLYWHEEL_LAKE"] = before


def _run(
    config, workdir: Path, lake: Path, overrides, baseline: bool, baseline_seeds: int, progress: bool
) -> dict[str, Any]:
    from configs.loading import load_config
    from flywheel import specs, stages
    from training.models import init_model

    ckpts = workdir / "learn-checkpoints"
    for d in (lake, ckpts):
        shutil.rmtree(d, ignore_errors=True)
    over = {
        **(overrides or {}),
        "lake.root": str(lake),
        "sft.output_root": str(ckpts),
        "evaluate.held_out_tasks": False,
        "midtrain.enabled": False,  # the bar is SFT from the random init
    }
    cfg = load_config(config, over)
    model_dir = workdir / f"learn-{cfg.student.size}-{cfg.student.arch}"
    shutil.rmtree(model_dir, ignore_errors=True)
    init_model(cfg.student.arch, cfg.student.size, model_dir, seed=0)
    over["student.model"] = str(model_dir)
    cfg = load_config(config, over)
    out: dict[str, Any] = {
        "benchmark": "learning_bar",
        "config": str(config),
        "overrides": overrides or {},
        "model": f"{cfg.student.arch} {cfg.student.size}",
        "tasks": cfg.evaluate.selection.tasks,
        "sft_targets": cfg.sft.targets,
        "sft_max_minutes": cfg.sft.max_minutes,
        "phases_s": {},
    }
    specs.register_tasks(cfg)
    if baseline:
        base_cfg = load_config(
            config, {**over, "evaluate.selection.seeds_per_task": baseline_seeds, "env.max_steps": 2}
        )
        t0 = time.time()
        out["before"] = _summary(stages.evaluate(base_cfg, 0, str(model_dir), progress=progress))
        out["phases_s"]["eval_untrained"] = round(time.time() - t0, 1)
    t_start = t0 = time.time()
    boot = stages.bootstrap(cfg, 0, progress=progress)
    out["bootstrap"] = {k: v for k, v in boot.items() if k in ("ran", "successes", "steps")}
    out["phases_s"]["bootstrap"] = round(time.time() - t0, 1)
    t0 = time.time()
    ds = stages.curate(cfg, 0)
    out["dataset"] = {k: ds.get(k) for k in ("dataset_id", "n_episodes", "n_steps")}
    out["phases_s"]["curate"] = round(time.time() - t0, 1)
    t0 = time.time()
    ck = stages.sft(cfg, 0, ds["dataset_id"], progress=progress)
    out["sft"] = {k: ck.get(k) for k in ("checkpoint_id", "first_loss", "final_loss", "steps", "tokens_per_s")}
    out["phases_s"]["sft"] = round(time.time() - t0, 1)
    t0 = time.time()
    out["after"] = _summary(stages.evaluate(cfg, 0, ck.checkpoint, progress=progress))
    out["phases_s"]["eval_trained"] = round(time.time() - t0, 1)
    out["wall_s_bootstrap_to_eval"] = round(time.time() - t_start, 1)
    return out
