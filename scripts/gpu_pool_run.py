"""Run the training stages on this machine's `gpu` pool, through Prefect, on a lake collected elsewhere.

    FLYWHEEL_GPU=1 ./scripts/setup.sh                       # once: the GPU mode (no browser)
    .venv/bin/python scripts/gpu_pool_run.py --lake LAKE --config configs/gpu.yaml [--iteration 0] [--out DIR]

What a team does on a GPU box: `flywheel up` (Prefect server, the cpu and gpu pools, every deployment, one
worker per pool), then the `sft/gpu` deployment on the iteration's curated dataset and the `rl/gpu` deployment
from SFT's checkpoint (rl.source: lake trains on the rollout groups the CPU machines stored), each started with
`run_deployment` and run by the gpu-pool worker as its own subprocess; then `flywheel down`. Prints (and writes
to --out) a JSON summary: the flow runs with their pool and state, the checkpoints rows, and the device the
stages trained on. --out also gets the Prefect database, so the UI can be shown elsewhere.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def flywheel(*args: str, env: dict) -> str:
    r = subprocess.run([sys.executable, "-m", "flywheel", *args], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"flywheel {' '.join(args)} failed ({r.returncode}): {(r.stderr or r.stdout)[-2000:]}")
    return r.stdout + r.stderr


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lake", required=True, type=Path)
    ap.add_argument("--config", default="configs/gpu.yaml")
    ap.add_argument("--iteration", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=420.0, help="max seconds per stage run")
    a = ap.parse_args()
    lake = a.lake.expanduser().resolve()
    env = {**os.environ, "FLYWHEEL_LAKE": str(lake), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    t0 = time.time()
    print(flywheel("up", "--lake", str(lake), "--port", "4200", env=env)[-600:], file=sys.stderr)
    summary: dict = {"lake": str(lake), "config": a.config, "iteration": a.iteration}
    try:
        env["PREFECT_API_URL"] = "http://127.0.0.1:4200/api"
        os.environ.update(env)
        from prefect.deployments import run_deployment

        from storage.catalog import connect

        con = connect(lake)
        ds = con.execute(
            "SELECT dataset_id FROM datasets WHERE iteration = ? ORDER BY created_at DESC LIMIT 1", [a.iteration]
        ).fetchone()
        if ds is None:
            raise SystemExit(f"no curated dataset for iteration {a.iteration} in {lake}: run curate first")
        config = {"path": a.config, "overrides": {}}
        runs = []
        fr = run_deployment(
            "sft/gpu",
            parameters={"config": config, "iteration": a.iteration, "dataset_id": ds[0]},
            flow_run_name=f"sft-it{a.iteration}",
            tags=["stage:sft", "gpu-demo"],
            timeout=a.timeout,
        )
        runs.append(fr)
        con = connect(lake)
        sft_ck = con.execute(
            "SELECT path FROM checkpoints WHERE stage = 'sft' AND iteration = ? ORDER BY created_at DESC LIMIT 1",
            [a.iteration],
        ).fetchone()
        if fr.state.is_completed() and sft_ck:
            merged = lake / sft_ck[0] / "merged"
            start = str(merged if merged.is_dir() else lake / sft_ck[0])
            runs.append(
                run_deployment(
                    "rl/gpu",
                    parameters={"config": config, "iteration": a.iteration, "checkpoint": start},
                    flow_run_name=f"rl-it{a.iteration}",
                    tags=["stage:rl", "gpu-demo"],
                    timeout=a.timeout,
                )
            )
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as c:
            summary["flow_runs"] = []
            for r in runs:
                r = c.read_flow_run(r.id)
                summary["flow_runs"].append(
                    {
                        "name": r.name,
                        "deployment": str(r.deployment_id),
                        "pool": r.work_pool_name,
                        "state": r.state.name,
                        "message": (r.state.message or "")[:300],
                        "seconds": r.total_run_time.total_seconds(),
                    }
                )
        con = connect(lake)
        rows = con.execute(
            "SELECT checkpoint_id, method, path, parent_checkpoint, metrics FROM checkpoints "
            "WHERE iteration = ? ORDER BY created_at",
            [a.iteration],
        ).fetchall()
        summary["checkpoints"] = [
            {"id": r[0], "method": r[1], "path": r[2], "parent": r[3], "metrics": json.loads(r[4] or "{}")}
            for r in rows
        ]
        for ck in summary["checkpoints"]:
            for name in ("sft_result.json", "rl_round.json"):
                hits = sorted((lake / ck["path"]).glob(name)) + sorted((lake / ck["path"]).parent.glob(f"*/{name}"))
                if hits:
                    ck[name] = json.loads(hits[0].read_text())
        summary["rl_metrics_rows"] = con.execute("SELECT count(*) FROM rl_metrics").fetchone()[0]
        import torch

        summary["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    finally:
        print(flywheel("down", env=env)[-300:], file=sys.stderr)
        summary["wall_s"] = round(time.time() - t0, 1)
        if a.out:
            a.out.mkdir(parents=True, exist_ok=True)
            (a.out / "gpu_pool_run.json").write_text(json.dumps(summary, indent=1, default=str))
            db = ROOT / ".prefect" / "home" / "prefect.db"
            if db.exists():  # sqlite's backup API: the WAL's pages too (a plain copy can miss the newest runs)
                import sqlite3

                src, dst = sqlite3.connect(db), sqlite3.connect(a.out / "prefect.db")
                with dst:
                    src.backup(dst)
                src.close()
                dst.close()
            logs = ROOT / ".prefect" / "logs"
            if logs.exists():
                shutil.copytree(logs, a.out / "logs", dirs_exist_ok=True)
    print(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
