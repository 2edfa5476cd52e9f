"""Benchmark: env steps/s of the rollout stage (scripted teacher) vs a bare miniwob loop, same actions.

    .venv/bin/python benchmarks/rollout_speed.py [--tasks ...] [--seeds 12] [--envs 1 2]

For each N in --envs, side by side in one run:
  stage: flywheel.rollout.run_rollouts with the scripted teacher, N worker processes, writing
         every episode (steps, PNG screenshots, final screen) to a temp lake;
  bare:  N plain processes, each looping gym.make("miniwob/<task>-v1") / reset(seed) / step(...)
         over the SAME actions the stage executed (read back from the lake), no lake, no policy.
Both count wall time from start (browser launches included) to the last step. JSON out;
target: stage >= 0.9x bare.
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

DEFAULT_TASKS = ["click-test", "click-button", "focus-text", "click-tab", "enter-text", "click-link",
                 "click-checkboxes", "login-user"]


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
                    act = u.create_action(A.PRESS_KEY, key=u.action_space_config.allowed_keys.index(miniwob_key(a["keys"])))
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
    from flywheel.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from storage.catalog import connect
    key = f"bench-n{n}"
    jobs = make_jobs(key, tasks, seeds, policy_tag="scripted:0")
    spec = RolloutSpec(run_key=key, iteration=0, stage="bench", lake_root=str(lake_root), jobs=jobs,
                       policy=PolicySpec("scripted"), n_envs=n, max_steps=10, episode_timeout_s=120)
    t0 = time.perf_counter()
    s = run_rollouts(spec, progress=False)
    wall = time.perf_counter() - t0
    con = connect(lake_root)
    rows = con.execute(f"""SELECT e.task_id, e.seed, list(s.action ORDER BY s.step_idx)
        FROM episodes e JOIN steps s USING (episode_id)
        WHERE e.run_key = '{key}' AND NOT s.is_final AND s.action IS NOT NULL GROUP BY ALL""").fetchall()
    episodes = [(t, seed, [json.loads(a) for a in acts]) for t, seed, acts in rows]
    return s, wall, episodes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tasks", nargs="+", default=DEFAULT_TASKS)
    ap.add_argument("--seeds", type=int, default=12, help="seeds per task (train split 0..)")
    ap.add_argument("--envs", type=int, nargs="+", default=[1, 2])
    a = ap.parse_args()
    out = {"benchmark": "rollout_env_steps_per_s", "tasks": a.tasks, "seeds_per_task": a.seeds, "results": []}
    with tempfile.TemporaryDirectory() as tmp:
        for n in a.envs:
            s, wall, episodes = run_stage(Path(tmp) / "lake", a.tasks, list(range(a.seeds)), n)
            bare_steps, bare_wall = run_bare(episodes, n)
            stage_sps, bare_sps = s.steps / wall, bare_steps / bare_wall
            out["results"].append({
                "envs": n, "episodes": s.ran, "success_rate": round(s.successes / max(s.ran, 1), 3),
                "stage_steps": s.steps, "stage_wall_s": round(wall, 2), "stage_steps_per_s": round(stage_sps, 2),
                "bare_steps": bare_steps, "bare_wall_s": round(bare_wall, 2), "bare_steps_per_s": round(bare_sps, 2),
                "ratio": round(stage_sps / bare_sps, 3),
            })
            print(json.dumps(out["results"][-1]), file=sys.stderr)
    out["target_ratio"] = 0.9
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
