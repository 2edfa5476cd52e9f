"""Benchmark: what Prefect costs. `flywheel run` on a config vs the same stages called as plain functions.

    .venv/bin/python benchmarks/orchestration_overhead.py [--config configs/tiny.yaml] [--repeats 1]
        [--out docs/bench_orchestration.json]

Side by side in one run, each in a fresh Python process with its own fresh lake (and checkpoint
folder beside it), so both pay interpreter start, imports, browser and model start-up:
  prefect: `python -m flywheel run -c CONFIG` (local mode: every stage a Prefect subflow in one
           process, results persisted, artifacts published, against Prefect's ephemeral API);
  plain:   the same stage functions of flywheel/stages.py in the same order, no Prefect import.
Overhead = prefect / plain - 1 (target <= 5%). The sides alternate when --repeats > 1. $PREFECT_API_URL is
removed from the children's environment, so unless `flywheel up` is running (the JSON's
`prefect_api` says which), the prefect side includes starting Prefect's ephemeral API, as a first
`flywheel run` on a laptop does.
The student folder named in the config is built first if it is missing (not timed).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# The plain side: exactly the stage sequence of flows/flywheel.py for one iteration (iteration 0
# always bootstraps), written as ordinary function calls.
PLAIN = """
import sys
from configs.loading import load_config
from flywheel import specs, stages
cfg = load_config(sys.argv[1])
specs.register_tasks(cfg)
stages.bootstrap(cfg, 0, progress=False)
stages.student_rollouts(cfg, 0, None, progress=False)
cur = stages.curate(cfg, 0)
trained = stages.sft(cfg, 0, cur["dataset_id"], None, progress=False)
ck = trained.checkpoint
rl = stages.rl(cfg, 0, ck)
ck = rl.checkpoint or ck
stages.evaluate(cfg, 0, ck, progress=False)
"""


def ensure_student(config: str) -> None:
    from configs.loading import load_config
    from training.models import init_model

    s = load_config(config).student
    if s.backend == "hf" and s.model.startswith(("models/", "./", "/")) and not Path(s.model).exists():
        print(f"building the student {s.model} ({s.arch}, {s.size}) first", file=sys.stderr)
        init_model(s.arch, s.size, Path(s.model), seed=0)


def run_side(side: str, config: str, work: Path) -> dict:
    (work / side).mkdir(parents=True)  # Prefect creates PREFECT_HOME but not its missing parents
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        FLYWHEEL_LAKE=str(work / side / "lake"),
        FLYWHEEL_RESULTS=str(work / side / "results"),
        PREFECT_HOME=str(work / side / "prefect-home"),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
    )
    if side == "prefect":
        cmd = [sys.executable, "-m", "flywheel", "run", "-c", config]
    else:
        cmd = [sys.executable, "-c", PLAIN, config]
    t0 = time.monotonic()
    p = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if p.returncode != 0:
        raise SystemExit(f"{side} side failed (exit {p.returncode}):\n{(p.stdout + p.stderr)[-3000:]}")
    return {"side": side, "wall_s": round(wall, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default="configs/tiny.yaml", help="flywheel config (one iteration is run)")
    ap.add_argument("--repeats", type=int, default=1, help="pairs of runs (sides alternate)")
    ap.add_argument("--out", default=None, help="JSON file to write (also printed)")
    a = ap.parse_args()
    os.chdir(ROOT)  # relative paths in the config (the student folder) are project-relative
    ensure_student(a.config)
    runs = []
    with tempfile.TemporaryDirectory(prefix="orch-bench-") as tmp:
        for i in range(a.repeats):
            for side in ("plain", "prefect") if i % 2 == 0 else ("prefect", "plain"):
                r = run_side(side, a.config, Path(tmp) / f"r{i}")
                print(json.dumps(r), file=sys.stderr)
                runs.append(r)
    plain = sorted(r["wall_s"] for r in runs if r["side"] == "plain")
    pref = sorted(r["wall_s"] for r in runs if r["side"] == "prefect")
    med = lambda xs: xs[len(xs) // 2]  # noqa: E731
    from flows.orchestrate import running_api_url

    out = {
        "benchmark": "orchestration_overhead",
        "config": a.config,
        "repeats": a.repeats,
        "prefect_api": running_api_url() or "ephemeral",
        "plain_s": med(plain),
        "prefect_s": med(pref),
        "overhead_pct": round(100 * (med(pref) / med(plain) - 1), 2),
        "target_pct": 5.0,
        "runs": runs,
        "host": platform.node(),
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if a.out:
        Path(a.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
