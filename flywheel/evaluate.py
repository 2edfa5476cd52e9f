"""Evaluation: a checkpoint on held-out seeds (and held-out tasks) -> `evals` rows, a table, a plot.

    res = evaluate_checkpoint(cfg, iteration=1, checkpoint="lake/_checkpoints/sft-it1/merged")
    res["success_rate"], res["ci_low"], res["ci_high"], res["plot"]

Episodes run through the same rollout runner and prompt builder as training (greedy
decoding), on the eval seed range, which never overlaps the train seeds. Success is the
env's binary task reward. Per task and overall: success rate with a 95% Wilson interval,
average steps, parse-error rate. `checkpoint="scripted"` evaluates the teacher (the ceiling).
"""

from __future__ import annotations

import hashlib
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from configs.models import FlywheelConfig
from flywheel.runtime.rollout import PolicySpec, git_sha, run_rollouts
from storage.catalog import connect
from storage.lake import Lake

OVERALL = "__all__"  # trained tasks on held-out seeds (the headline number)
HELD_OUT = "__held_out_tasks__"  # tasks never trained on


def wilson(successes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for a binomial rate (well-behaved at 0/n and n/n)."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # the interval holds the rate itself: at n/n the float sum can land a hair under 1 (n = 100: 0.9999999999999999)
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def eval_policy(cfg: FlywheelConfig, checkpoint: str) -> PolicySpec:
    if checkpoint == "scripted":
        return PolicySpec("scripted", version="scripted")
    student = cfg.student.policy_config(model=checkpoint, temperature=0.0)  # greedy for evaluation
    return PolicySpec("student", {"model": checkpoint, "config": student}, version=str(checkpoint))


_PER_TASK_SQL = """
SELECT e.task_id, count(*) AS n, count(*) FILTER (e.success) AS successes, avg(e.n_steps) AS avg_steps,
       sum(e.n_parse_errors) AS parse_errors, sum(e.n_steps) AS steps
FROM episodes e WHERE e.run_key = ? AND e.iteration = ? AND e.stage = ?
GROUP BY e.task_id ORDER BY e.task_id
"""


def _rows(
    lake: Lake,
    run_key: str,
    iteration: int,
    eval_id: str,
    checkpoint: str,
    held_out: set[str],
    config_hash: str,
    stage: str = "evaluate",
) -> list[dict[str, Any]]:
    con = connect(lake)
    per_task = con.execute(_PER_TASK_SQL, [run_key, iteration, stage]).fetchall()
    now = datetime.now(timezone.utc)

    def row(task: str, split: str, n: int, s: int, steps: int, pe: int, avg_steps: float) -> dict[str, Any]:
        lo, hi = wilson(s, n)
        return dict(
            eval_id=eval_id,
            checkpoint_id=checkpoint,
            task_id=task,
            split=split,
            n_episodes=n,
            successes=s,
            success_rate=s / max(n, 1),
            ci_low=lo,
            ci_high=hi,
            avg_steps=avg_steps,
            parse_error_rate=pe / max(steps, 1),
            created_at=now,
        )

    rows = []
    totals = {"eval-seed": [0, 0, 0, 0], "eval-task": [0, 0, 0, 0]}
    for task, n, s, avg_steps, pe, steps in per_task:
        split = "eval-task" if task in held_out else "eval-seed"
        rows.append(row(task, split, n, s, steps or 0, pe or 0, float(avg_steps or 0)))
        for i, v in enumerate((n, s, steps or 0, pe or 0)):
            totals[split][i] += v
    for name, split in ((HELD_OUT, "eval-task"), (OVERALL, "eval-seed")):
        n, s, steps, pe = totals[split]
        if n or name == OVERALL:
            rows.append(row(name, split, n, s, steps, pe, steps / max(n, 1)))
    for r in rows:
        r.update(run_key=run_key, git_sha=git_sha(), config_hash=config_hash)
    return rows


def plot_success(lake: Lake, out: Path) -> Path | None:
    """Overall success rate (with its 95% interval) per iteration and checkpoint, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = (
        connect(lake)
        .execute(f"""
        SELECT iteration, checkpoint_id, success_rate, ci_low, ci_high FROM evals
        WHERE task_id = '{OVERALL}' AND stage = 'evaluate' ORDER BY iteration, created_at""")
        .fetchall()
    )
    if not data:
        return None
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    xs = [f"it{it}\n{Path(str(ck)).name[:18]}" for it, ck, *_ in data]
    ys = [r[2] for r in data]
    # clipped at 0: an interval's bound can round a hair past the rate (a 100% rate, ci_high 0.99999...)
    err = [[max(0.0, r[2] - r[3]) for r in data], [max(0.0, r[4] - r[2]) for r in data]]
    ax.errorbar(range(len(xs)), ys, yerr=err, fmt="o-", capsize=4)
    ax.set_xticks(range(len(xs)), xs, fontsize=7)
    ax.set_ylim(0, 1)
    ax.set_ylabel("held-out success rate (95% CI)")
    ax.set_title("Success rate per iteration / checkpoint")
    ax.grid(alpha=0.3)
    return save_png(fig, out)


def save_png(fig, out: Path) -> Path:
    """Write a matplotlib figure atomically (temp name, then rename) and close it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(out)
    return out


def _row_checkpoint(lake: Lake, checkpoint: str) -> str:
    """How `evals.checkpoint_id` names the checkpoint: a folder inside the lake relative to its root (a moved lake
    keeps meaningful rows), anything else (a folder elsewhere, a Hub id, 'scripted') as given."""
    p = Path(checkpoint).expanduser()
    return lake.rel(p) if p.exists() and p.resolve().is_relative_to(lake.root) else checkpoint


def evaluate_checkpoint(
    cfg: FlywheelConfig,
    iteration: int,
    checkpoint: str,
    *,
    progress: bool = True,
    selection: Any = None,
    held_out_tasks: bool | None = None,
    stage: str = "evaluate",
    eval_stage: str | None = None,
    on_result: Any = None,
) -> dict[str, Any]:
    """`selection` (a TaskSelection; default cfg.evaluate.selection) and `held_out_tasks` (default
    cfg.evaluate.held_out_tasks) pick the episodes; `stage` names their episodes, `eval_stage` (default: `stage`)
    the `evals` rows. The flywheel's evaluation is stage 'evaluate'; mid-training's skill report uses its own.
    `on_result` gets each finished episode (the Prefect progress artifact)."""
    from envs import registry
    from flywheel.specs import lake_for, resolve_tasks, rollout_spec

    sel = selection or cfg.evaluate.selection
    with_held_out = cfg.evaluate.held_out_tasks if held_out_tasks is None else held_out_tasks
    tasks = resolve_tasks(sel.tasks, for_training=False, cfg=cfg)
    held_out = {t.task_id for t in registry.TASKS if t.held_out and t.teacher_supported}
    extra = [t for t in sorted(held_out) if t not in tasks] if with_held_out else []
    tasks += extra
    seeds = registry.seeds("eval", sel.seeds_per_task, offset=sel.seed_offset)
    n_held = cfg.evaluate.held_out_seeds_per_task
    fewer = {t: n_held for t in extra} if extra and n_held is not None and n_held < len(seeds) else None
    spec = rollout_spec(
        cfg,
        iteration=iteration,
        stage=stage,
        policy=eval_policy(cfg, checkpoint),
        tasks=tasks,
        seeds=seeds,
        split="eval",
        max_seeds=fewer,
    )
    summary = run_rollouts(spec, progress=progress, on_result=on_result)
    lake = lake_for(cfg)
    eval_id = "eval-" + hashlib.sha1(f"{spec.run_key}|{checkpoint}".encode()).hexdigest()[:12]
    rows = _rows(
        lake, spec.run_key, iteration, eval_id, _row_checkpoint(lake, checkpoint), held_out, cfg.config_hash(), stage
    )
    lake.replace_run("evals", [rows], iteration=iteration, stage=eval_stage or stage, run_key=spec.run_key)
    plot = plot_success(lake, lake.root / "_reports" / "success_rate.png")
    overall = rows[-1]
    return {
        "eval_id": eval_id,
        "run_key": spec.run_key,
        "iteration": iteration,
        "checkpoint": checkpoint,
        "success_rate": overall["success_rate"],
        "ci_low": overall["ci_low"],
        "ci_high": overall["ci_high"],
        "n_episodes": overall["n_episodes"],
        "parse_error_rate": overall["parse_error_rate"],
        "plot": str(plot) if plot else None,
        "ran": summary.ran,
        "skipped": summary.skipped,
        "eval_rows": len(rows),
        "per_task": {r["task_id"]: round(r["success_rate"], 3) for r in rows if not r["task_id"].startswith("__")},
    }
