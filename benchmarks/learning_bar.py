"""The learning bar: does the student get better? Teacher demos -> curate -> SFT -> held-out eval, on CPU.

    .venv/bin/python benchmarks/learning_bar.py [--config configs/local.yaml] [--lake bench-out/learn-lake]

Runs the flywheel's own stage functions (flywheel.stages) on the config's embedded default:
  1. a fresh random-init student (training.models.init_model, the config's arch/size)
  2. untrained baseline: evaluate on held-out eval seeds (5 per task, 2 steps: it never stops talking)
  3. bootstrap: scripted-teacher demonstrations on train seeds
  4. curate: successful episodes -> dataset manifest + export
  5. sft: fine-tune within cfg.sft.max_minutes
  6. evaluate the fine-tuned checkpoint on the same held-out seeds
Prints JSON with per-task success before/after (95% CIs) and the wall time of each phase; the bar is
>= 60% overall held-out success within 15 minutes of wall time (phases 3-6).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default="configs/local.yaml")
    ap.add_argument("--lake", default="bench-out/learn-lake", help="fresh lake for this run (deleted first)")
    ap.add_argument("--skip-baseline", action="store_true", help="skip evaluating the untrained model")
    a = ap.parse_args()

    from configs.models import load_config
    from flywheel import stages
    from training.models import init_model

    lake = Path(a.lake).resolve()
    if lake.exists():
        shutil.rmtree(lake)
    os.environ["FLYWHEEL_LAKE"] = str(lake)
    cfg = load_config(a.config, {"sft.output_root": str(lake.parent / "learn-checkpoints")})
    shutil.rmtree(lake.parent / "learn-checkpoints", ignore_errors=True)
    model_dir = lake.parent / f"learn-{cfg.student.size}-{cfg.student.arch}"
    shutil.rmtree(model_dir, ignore_errors=True)
    init_model(cfg.student.arch, cfg.student.size, model_dir, seed=0)
    over = {"sft.output_root": str(lake.parent / "learn-checkpoints"), "student.model": str(model_dir),
            "evaluate.held_out_tasks": False}  # held-out tasks are the flywheel's business, not this bar's
    cfg = load_config(a.config, over)
    # the untrained model never stops generating, so its (near-zero) baseline is taken on fewer seeds
    base_cfg = load_config(a.config, {**over, "evaluate.selection.seeds_per_task": 5, "env.max_steps": 2})
    out: dict = {"benchmark": "learning_bar", "config": a.config, "model": f"{cfg.student.arch} {cfg.student.size}",
                 "tasks": cfg.evaluate.selection.tasks, "phases_s": {}}
    stages.register_tasks(cfg)
    if not a.skip_baseline:
        t0 = time.time()
        out["before"] = stages.evaluate(base_cfg, 0, str(model_dir))
        out["phases_s"]["eval_untrained"] = round(time.time() - t0, 1)
    t_start = time.time()
    t0 = time.time()
    out["bootstrap"] = {k: v for k, v in stages.bootstrap(cfg, 0).items() if k in ("ran", "successes", "steps")}
    out["phases_s"]["bootstrap"] = round(time.time() - t0, 1)
    t0 = time.time()
    ds = stages.curate(cfg, 0)
    out["dataset"] = {k: ds.get(k) for k in ("dataset_id", "n_episodes", "n_steps")}
    out["phases_s"]["curate"] = round(time.time() - t0, 1)
    t0 = time.time()
    ck = stages.sft(cfg, 0, ds["dataset_id"])
    out["sft"] = {k: ck.get(k) for k in ("checkpoint_id", "final_loss", "first_loss", "steps")}
    out["phases_s"]["sft"] = round(time.time() - t0, 1)
    t0 = time.time()
    out["after"] = stages.evaluate(cfg, 0, ck.get("model_path") or ck["path"])
    out["phases_s"]["eval_trained"] = round(time.time() - t0, 1)
    out["wall_s_bootstrap_to_eval"] = round(time.time() - t_start, 1)
    for side in ("before", "after"):
        if side in out:
            r = out[side]
            out[side] = {"success_rate": round(r["success_rate"], 3), "ci": [round(r["ci_low"], 3), round(r["ci_high"], 3)],
                         "n": r["n_episodes"], "per_task": r["per_task"], "parse_error_rate": round(r["parse_error_rate"], 3)}
    out["bar"] = {"success_rate": 0.6, "wall_s": 900,
                  "met": out["after"]["success_rate"] >= 0.6 and out["wall_s_bootstrap_to_eval"] <= 900}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
