"""Benchmark: env steps/s of the rollout stage: scripted teacher vs a bare miniwob loop, and the student.

    .venv/bin/python benchmarks/rollout_speed.py [--tasks ...] [--seeds 12] [--envs 1 2]
    .venv/bin/python benchmarks/rollout_speed.py --student [--model CKPT] --envs 8 [--before]

For each N in --envs, side by side in one run:
  stage: flywheel.runtime.rollout.run_rollouts with the scripted teacher, N worker processes, writing
         every episode (steps, PNG screenshots, final screen) to a temp lake;
  bare:  N plain processes, each looping gym.make("miniwob/<task>-v1") / reset(seed) / step(...)
         over the SAME actions the stage executed (read back from the lake), no lake, no policy.
Both count wall time from start (browser launches included) to the last step. JSON out;
target: stage >= 0.9x bare.

With --student, the same tasks, seeds and env count also run:
  student: the `hf` student (a trained checkpoint via --model, else a random-init `mini`) as the rollout
           stage runs it: --student-workers processes x (envs / workers) envs in lockstep, sampling at
           temperature 1, each task's step cap; steps/s and the per-phase split (RolloutSummary.timings);
  backend: bare replies/s of the same backend in one process (1 thread), batches of envs/workers prompts
           rebuilt from the student's own steps: the ceiling the rollout loop can approach;
  before:  (--before) the student as it ran before issue #10: torch's default threads per worker and
           transformers generate.
Target: student >= 0.5x scripted steps/s at the same env count.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_TASKS = [
    "click-test",
    "click-button",
    "focus-text",
    "click-tab",
    "enter-text",
    "click-link",
    "click-checkboxes",
    "login-user",
]


def _bare_worker(episodes: list[tuple[str, int, list[dict]]]) -> int:
    """A plain miniwob loop: one gym env per task (closed on task switch), the given actions."""
    os.environ.setdefault("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
    os.environ.setdefault("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")
    import gymnasium as gym
    import miniwob
    import numpy as np
    from miniwob.action import ActionTypes as A

    from agents.compile import miniwob_key

    gym.register_envs(miniwob)
    env, task, steps = None, None, 0
    try:
        for t, seed, actions in episodes:
            if t != task:
                if env is not None:
                    env.close()
                env, task = gym.make(f"miniwob/{t}-v1"), t
                env.unwrapped.instance.driver.execute_script("core.EPISODE_MAX_TIME = 3600*1000;")
            u = env.unwrapped
            env.reset(seed=seed)
            for a in actions:
                kind = a["action"]
                if kind == "click":
                    act = u.create_action(A.CLICK_COORDS, coords=np.array([a["x"], a["y"]], np.float32))
                elif kind == "type":
                    act = u.create_action(A.TYPE_TEXT, text=a["text"])
                elif kind == "key":
                    act = u.create_action(
                        A.PRESS_KEY, key=u.action_space_config.allowed_keys.index(miniwob_key(a["keys"]))
                    )
                else:
                    act = u.create_action(A.NONE)
                env.step(act)
                steps += 1
    finally:
        if env is not None:
            env.close()
    return steps


def run_bare(episodes: list[tuple[str, int, list[dict]]], n: int) -> tuple[int, float]:
    # shard by task so each process switches tasks as rarely as the stage's workers do
    shards: list[list] = [[] for _ in range(n)]
    for i, ep in enumerate(sorted(episodes, key=lambda e: (e[0], e[1]))):
        shards[i * n // len(episodes)].append(ep)
    t0 = time.perf_counter()
    with get_context("spawn").Pool(n) as pool:
        steps = sum(pool.map(_bare_worker, shards))
    return steps, time.perf_counter() - t0


def run_stage(lake_root: Path, tasks: list[str], seeds: list[int], n: int):
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from storage.catalog import connect

    key = f"bench-n{n}"
    jobs = make_jobs(key, tasks, seeds, policy_tag="scripted:0")
    spec = RolloutSpec(
        run_key=key,
        iteration=0,
        stage="bench",
        lake_root=str(lake_root),
        jobs=jobs,
        policy=PolicySpec("scripted"),
        n_envs=n,
        max_steps=10,
        episode_timeout_s=120,
    )
    t0 = time.perf_counter()
    s = run_rollouts(spec, progress=False)
    wall = time.perf_counter() - t0
    con = connect(lake_root)
    rows = con.execute(f"""SELECT e.task_id, e.seed, list(s.action ORDER BY s.step_idx)
        FROM episodes e JOIN steps s USING (episode_id)
        WHERE e.run_key = '{key}' AND NOT s.is_final AND s.action IS NOT NULL GROUP BY ALL""").fetchall()
    episodes = [(t, seed, [json.loads(a) for a in acts]) for t, seed, acts in rows]
    return s, wall, episodes


def run_student(
    lake_root: Path, tasks: list[str], seeds: list[int], n_envs: int, workers: int, model: str, before: bool = False
) -> tuple[dict, list]:
    from envs import registry
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts

    workers = max(1, min(workers, n_envs))
    per = max(1, n_envs // workers)
    key = f"student-{'before' if before else 'now'}-e{n_envs}"
    cfg = {"model": model, "temperature": 1.0, "max_new_tokens": 64, "lean_decode": not before}
    caps = {t.task_id: t.max_steps for t in registry.TASKS if t.task_id in tasks}
    jobs = make_jobs(key, tasks, seeds, policy_tag="student:bench", max_steps=caps)
    spec = RolloutSpec(
        run_key=key,
        iteration=0,
        stage="bench",
        lake_root=str(lake_root),
        jobs=jobs,
        policy=PolicySpec("student", {"model": model, "config": cfg}),
        n_envs=workers,
        envs_per_worker=per,
        episode_timeout_s=1800,
        policy_threads=(os.cpu_count() or 1) if before else None,
    )
    t0 = time.perf_counter()
    s = run_rollouts(spec, progress=False)
    wall = time.perf_counter() - t0
    from storage.catalog import connect

    rows = (
        connect(lake_root)
        .execute(f"""SELECT s.screenshot, s.ui_text, e.instruction FROM steps s
        JOIN episodes e USING (episode_id) WHERE e.run_key = '{key}' AND NOT s.is_final LIMIT 64""")
        .fetchall()
    )
    return (
        {
            "workers": workers,
            "envs_per_worker": per,
            "episodes": s.ran,
            "steps": s.steps,
            "success_rate": round(s.successes / max(s.ran, 1), 3),
            "wall_s": round(wall, 2),
            "steps_per_s": round(s.steps / wall, 3),
            "timings_s": s.timings,
        },
        rows,
    )


def run_backend(model: str, rows: list, batch: int, calls: int = 6) -> dict:
    """Bare replies/s: the backend alone on prompts from the student's own steps (1 thread, one process)."""
    import torch

    torch.set_num_threads(1)
    from agents.backends.base import Sampling
    from agents.backends.hf import HFBackend
    from agents.prompts import PromptOptions, build_prompt, transform_for

    be = HFBackend(model)
    t = transform_for(be.arch, 160, 210)
    prompts = [build_prompt(instr, png, ui, [], PromptOptions(), t) for png, ui, instr in rows]
    s = Sampling(temperature=1.0, max_new_tokens=64, seed=0)
    be.generate(prompts[:batch], s)  # warm-up
    n, toks, t0 = 0, 0, time.perf_counter()
    for i in range(calls):
        chunk = [prompts[(i * batch + j) % len(prompts)] for j in range(batch)]
        toks += sum(g.completion_tokens for g in be.generate(chunk, s))
        n += batch
    wall = time.perf_counter() - t0
    return {"batch": batch, "replies": n, "replies_per_s": round(n / wall, 2), "tokens_per_reply": round(toks / n, 1)}


def _random_mini(root: Path) -> str:
    from training.models import init_model

    return str(init_model("qwen3-vl", "mini", root / "mini-random", seed=0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS)
    ap.add_argument("--seeds", type=int, default=12, help="seeds per task (train split 0..)")
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--student", action="store_true", help="also run the student and the bare backend")
    ap.add_argument("--model", default=None, help="student checkpoint folder (default: a random-init mini)")
    ap.add_argument("--student-workers", type=int, default=2, help="student worker processes (envs split among them)")
    ap.add_argument("--before", action="store_true", help="also run the pre-#10 student path (slow)")
    ap.add_argument("--no-bare", action="store_true", help="skip the bare miniwob loop")
    a = ap.parse_args()
    out = {"benchmark": "rollout_env_steps_per_s", "tasks": a.tasks, "seeds_per_task": a.seeds, "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        model = (a.model or _random_mini(Path(tmp))) if a.student else None
        out["student_model"] = model if a.model else ("random-init mini" if a.student else None)
        for n in a.envs:
            s, wall, episodes = run_stage(Path(tmp) / "lake", a.tasks, list(range(a.seeds)), n)
            stage_sps = s.steps / wall
            res = {
                "envs": n,
                "episodes": s.ran,
                "success_rate": round(s.successes / max(s.ran, 1), 3),
                "stage_steps": s.steps,
                "stage_wall_s": round(wall, 2),
                "stage_steps_per_s": round(stage_sps, 2),
            }
            if not a.no_bare:
                bare_steps, bare_wall = run_bare(episodes, n)
                res.update(
                    bare_steps=bare_steps,
                    bare_wall_s=round(bare_wall, 2),
                    bare_steps_per_s=round(bare_steps / bare_wall, 2),
                    ratio=round(stage_sps / (bare_steps / bare_wall), 3),
                )
            if a.student:
                st, rows = run_student(Path(tmp) / "lake", a.tasks, list(range(a.seeds)), n, a.student_workers, model)
                res["student"] = st
                res["student_vs_scripted"] = round(st["steps_per_s"] / stage_sps, 3)
                res["backend"] = run_backend(model, rows, st["envs_per_worker"])
                if a.before:
                    bt, _ = run_student(
                        Path(tmp) / "lake", a.tasks, list(range(a.seeds)), n, a.student_workers, model, before=True
                    )
                    res["student_before"] = bt
                    res["speedup_vs_before"] = round(st["steps_per_s"] / max(bt["steps_per_s"], 1e-9), 2)
            out["results"].append(res)
            print(json.dumps(out["results"][-1]), file=sys.stderr)
    out["target_ratio"] = 0.9
    if a.student:
        out["target_student_vs_scripted"] = 0.5
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
