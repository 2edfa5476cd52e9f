"""Success rate of the scripted teacher on every task it supports (train-split seeds).

    .venv/bin/python scripts/teacher_success.py                  # all teacher tasks x 20 seeds
    .venv/bin/python scripts/teacher_success.py --seeds 5 --tasks click-test,enter-text
    .venv/bin/python scripts/teacher_success.py --workers 2 --json out.json

Episodes run through the rollout runner's own episode loop (`flywheel.runtime.episode.run_episode`)
with each task's registry step cap, so the numbers are what `bootstrap` will see. Prints a
per-task table and a JSON summary; exits 1 if a task falls below --min-success.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def run_tasks(tasks: list[str], seeds: list[int], env_kwargs: dict) -> list[dict]:
    """One env + one teacher for a list of tasks; one result dict per task."""
    from agents.teacher import ScriptedTeacher
    from envs.registry import make_env, max_steps_for
    from flywheel.runtime.episode import EpisodeJob, run_episode

    env, teacher, out = make_env("miniwob", **env_kwargs), ScriptedTeacher(), []
    try:
        for task in tasks:
            t0, eps = time.monotonic(), []
            for seed in seeds:
                job = EpisodeJob("teacher-success", task, seed)
                ep, _ = run_episode(env, teacher, job, max_steps=max_steps_for(task), timeout_s=120)
                eps.append(ep)
            wall = time.monotonic() - t0
            errors = [
                f"seed {e['seed']}: status {e['status']}, reward {e['task_reward']}, {e['n_steps']} steps"
                + (f", {e['error']}" if e["error"] else "")
                for e in eps
                if not e["success"]
            ]
            out.append(
                dict(
                    task_id=task,
                    episodes=len(eps),
                    successes=sum(bool(e["success"]) for e in eps),
                    success_rate=sum(bool(e["success"]) for e in eps) / max(1, len(eps)),
                    mean_steps=sum(e["n_steps"] for e in eps) / max(1, len(eps)),
                    max_steps=max((e["n_steps"] for e in eps), default=0),
                    step_cap=max_steps_for(task),
                    s_per_episode=wall / max(1, len(eps)),
                    failures=errors[:5],
                )
            )
    finally:
        env.close()
    return out


def main(argv: list[str] | None = None) -> int:
    from envs.registry import seeds as split_seeds
    from envs.registry import teacher_tasks

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", default="all", help="comma-separated task ids, or 'all' (held-out tasks included)")
    ap.add_argument("--seeds", type=int, default=20, help="episodes per task (the first N train seeds)")
    ap.add_argument("--seed-offset", type=int, default=0, help="first train seed index")
    ap.add_argument("--workers", type=int, default=1, help="parallel env processes (tasks are split between them)")
    ap.add_argument("--screenshot-scale", type=int, default=1, help="env screenshot_scale")
    ap.add_argument("--min-success", type=float, default=0.95, help="exit 1 if any task is below this rate")
    ap.add_argument("--json", default=None, help="also write the JSON summary to this file")
    args = ap.parse_args(argv)

    tasks = teacher_tasks(include_held_out=True) if args.tasks == "all" else args.tasks.split(",")
    seeds = split_seeds("train", args.seeds, offset=args.seed_offset)
    env_kwargs = {"screenshot_scale": args.screenshot_scale}
    t0 = time.monotonic()
    if args.workers <= 1:
        results = run_tasks(tasks, seeds, env_kwargs)
    else:
        shards = [tasks[i :: args.workers] for i in range(args.workers)]
        with ProcessPoolExecutor(args.workers) as pool:
            parts = list(pool.map(run_tasks, shards, [seeds] * len(shards), [env_kwargs] * len(shards)))
        by_id = {r["task_id"]: r for part in parts for r in part}
        results = [by_id[t] for t in tasks]
    wall = time.monotonic() - t0

    print(f"{'task':28s} {'success':>9s} {'rate':>6s} {'steps':>6s} {'max':>4s} {'cap':>4s} {'s/ep':>6s}")
    for r in results:
        print(
            f"{r['task_id']:28s} {r['successes']:>4d}/{r['episodes']:<4d} {r['success_rate']:6.2f} "
            f"{r['mean_steps']:6.2f} {r['max_steps']:4d} {r['step_cap']:4d} {r['s_per_episode']:6.2f}"
        )
        for f in r["failures"]:
            print(f"    {f}")
    n_ok = sum(r["successes"] for r in results)
    n = sum(r["episodes"] for r in results)
    passing = [r["task_id"] for r in results if r["success_rate"] >= args.min_success]
    print(
        f"overall {n_ok}/{n} = {n_ok / max(1, n):.3f}; {len(passing)}/{len(results)} tasks "
        f">= {args.min_success:.2f}; wall {wall:.1f}s with {args.workers} worker(s)"
    )
    summary = {
        "seeds": [seeds[0], seeds[-1]],
        "n_seeds": len(seeds),
        "workers": args.workers,
        "wall_s": round(wall, 1),
        "overall": n_ok / max(1, n),
        "tasks_passing": len(passing),
        "min_success": args.min_success,
        "results": results,
    }
    print(json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    return 0 if len(passing) == len(results) else 1


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    raise SystemExit(main())
