"""Benchmark: MiniWoB steps/s through env servers (remote) vs local envs, same env count, side by side in one run.

    PYTHONPATH=. .venv/bin/python benchmarks/env_server.py --envs 2 --steps-per-env 100 [--repeats 2] [--out FILE]

Both sides run the rollout stage's own code path (flywheel.runtime.rollout with the scripted teacher, every episode
written to a temp lake) over the same jobs:
  local:  N worker processes, each with its own Chromium (env.name miniwob);
  remote: N worker processes, each leasing a slot per episode on one `flywheel env serve --slots N` process
          on this machine (env.name remote): the HTTP hop, JSON+base64 screenshots, leases and releases.
Workers and browsers are started and warmed up (one episode per env) before the clock starts, so both
numbers are steady-state steps/s. Sides alternate for --repeats rounds; each side reports its median.
JSON out; target: remote >= 0.9x local.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TASKS = ["click-test", "click-button", "focus-text", "enter-text", "login-user", "click-checkboxes"]


def start_server(slots: int, token: str) -> tuple[subprocess.Popen, str]:
    """A `flywheel env serve` process in its own process group; returns once every slot is ready."""
    import httpx

    env = dict(os.environ, FLYWHEEL_ENV_TOKEN=token)
    proc = subprocess.Popen(
        [sys.executable, "-m", "flywheel", "env", "serve", "--slots", str(slots), "--port", "0"],
        stdout=subprocess.PIPE,
        env=env,
        text=True,
        start_new_session=True,
        cwd=Path(__file__).resolve().parents[1],
    )
    url = re.search(r"http://[0-9.]+:\d+", proc.stdout.readline() or "")
    if not url:
        os.killpg(proc.pid, signal.SIGKILL)
        raise SystemExit("env server did not start")
    http = httpx.Client(headers={"Authorization": f"Bearer {token}"})
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # readiness by polling
        try:
            if http.get(f"{url.group(0)}/v1/health").json()["free"] == slots:
                return proc, url.group(0)
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)
    raise SystemExit("env server slots did not become ready")


def measure(spec, pool, seeds: list[int], tag: str) -> dict:
    from flywheel.runtime.rollout import make_jobs, run_rollouts

    jobs = make_jobs(tag, TASKS, seeds, policy_tag="scripted:0")
    s = run_rollouts(replace(spec, run_key=tag, jobs=jobs), progress=False, pool=pool)
    return {
        "steps": s.steps,
        "episodes": s.ran,
        "successes": s.successes,
        "errors": s.errors,
        "seconds": round(s.duration_s, 2),
        "steps_per_s": round(s.steps_per_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--envs", type=int, default=2, help="envs on each side (local workers = remote slots)")
    ap.add_argument("--steps-per-env", type=int, default=100, help="approximate env steps per env per measurement")
    ap.add_argument("--repeats", type=int, default=2, help="alternating rounds per side (median reported)")
    ap.add_argument("--servers", type=int, default=1, help="env server processes sharing the remote slots")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    a = ap.parse_args()
    from flywheel.runtime.rollout import PolicySpec, RolloutPool, RolloutSpec

    # the scripted teacher takes ~2.2 steps per episode on TASKS (measured on the first run of this script)
    seeds_per_task = max(1, round(a.steps_per_env * a.envs / 2.2 / len(TASKS)))
    token = secrets.token_urlsafe(16)
    os.environ["FLYWHEEL_ENV_TOKEN"] = token  # the remote workers inherit it
    if a.envs % a.servers:
        raise SystemExit("--envs must be a multiple of --servers")
    started = [start_server(a.envs // a.servers, token) for _ in range(a.servers)]
    urls = [u for _, u in started]
    results: dict[str, list[dict]] = {"local": [], "remote": []}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            base = dict(
                iteration=0,
                stage="bench",
                lake_root=tmp,
                jobs=[],
                policy=PolicySpec("scripted"),
                n_envs=a.envs,
                max_steps=12,
                episode_timeout_s=120,
            )
            specs = {
                "local": RolloutSpec(run_key="x", env={"name": "miniwob"}, **base),
                "remote": RolloutSpec(
                    run_key="x", env={"name": "remote", "servers": urls}, env_error_retries=1, **base
                ),
            }
            pools = {k: RolloutPool(v) for k, v in specs.items()}
            try:
                for side in specs:  # start workers and browsers, one warm-up episode per env
                    measure(specs[side], pools[side], list(range(9000, 9000 + a.envs)), f"warm-{side}")
                for r in range(a.repeats):
                    seeds = list(range(r * seeds_per_task, (r + 1) * seeds_per_task))
                    for side in ["local", "remote"] if r % 2 == 0 else ["remote", "local"]:
                        results[side].append(measure(specs[side], pools[side], seeds, f"{side}-{r}"))
            finally:
                for p in pools.values():
                    p.close()
    finally:
        for proc, _ in started:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
    med = {k: round(statistics.median(x["steps_per_s"] for x in v), 2) for k, v in results.items()}
    out = {
        "benchmark": "env_server",
        "envs": a.envs,
        "servers": a.servers,
        "tasks": TASKS,
        "seeds_per_task": seeds_per_task,
        "repeats": a.repeats,
        "local_steps_per_s": med["local"],
        "remote_steps_per_s": med["remote"],
        "remote_over_local": round(med["remote"] / med["local"], 3) if med["local"] else None,
        "target": 0.9,
        "runs": results,
        "cpus": os.cpu_count(),
        "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
        "command": f"PYTHONPATH=. .venv/bin/python benchmarks/env_server.py --envs {a.envs} "
        f"--steps-per-env {a.steps_per_env} --repeats {a.repeats} --servers {a.servers}",
    }
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
