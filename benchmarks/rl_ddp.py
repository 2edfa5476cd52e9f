"""Benchmark (GPU): the RL update on 2 GPUs (rl.distributed: ddp) vs 1 GPU, same rows, minibatch and steps.

    python benchmarks/rl_ddp.py [--size 2b] [--modes lora full] [--algos grpo sdpo] [--rows 48] [--micro 8]
                                [--steps 5] [--warmup 2] [--json OUT.json]

Both sides run `training.rl.RLTrainer.update` under torchrun (1 or 2 processes, one GPU each), as the RL stage's
workers do with rl.distributed ddp: every rank builds the same rows (benchmarks/rl_gpu.py's `make_rows`: one-step
click episodes in groups of 4 with a 1280x704 screenshot, ~--text-tokens prompt text, 64-96 sampled response
tokens), the old-log-prob pass is split across the ranks, and each optimizer step takes the whole batch (--rows):
one GPU runs it as rows/micro micro-batches, two GPUs take half of them each (token-balanced) and DDP all-reduces
the gradients once a step. Model: Qwen3-VL with the released 2B shape (random init, bf16), LoRA r16 (bf16 adapters)
or full fine-tune, vision frozen. Throughput: the batch's tokens (prompt + response, image tokens included) over the
median step time after --warmup steps, each step timed between CUDA syncs on rank 0. Prints JSON with tokens/s per
side and the speedup (the issue's target for SFT: >= 1.8x).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))


def worker(a: argparse.Namespace) -> None:
    from rl_gpu import batch_shape, build, calibrate_ui, make_rows, time_update

    from training.distributed import setup, teardown
    from training.rl import RLSettings, RLTrainer

    ctx = setup()
    model, proc, n_params = build(a.size, a.mode)
    screen = (1280, 704)
    rows = make_rows(
        proc, a.rows, group=4, screen=screen, ui_elems=calibrate_ui(proc, a.text_tokens, screen), resp=(64, 96), seed=0
    )
    shape = batch_shape(proc, rows)
    s = RLSettings(
        algorithm=a.algo,
        lr=1e-5,
        batch_size=len(rows),
        micro_batch=a.micro,
        epochs=a.warmup + a.steps,
        warmup_steps=0,
        seed=0,
    )
    out = time_update(RLTrainer(model, proc, s, ctx=ctx), rows, s, a.steps, a.warmup, shape, n_params["total"], False)
    if ctx.main:  # rl_gpu's timing: each step between CUDA syncs, the median after the warmup steps
        Path(a.out).write_text(
            json.dumps(
                {**out, "world_size": ctx.world, "rows": len(rows), "tokens": shape["tokens"], "params": n_params}
            )
        )
    teardown(ctx)


def side(a: argparse.Namespace, mode: str, algo: str, n: int) -> dict:
    out = a.work / f"{mode}-{algo}-{n}gpu.json"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={n}",
        __file__,
        "--worker",
        "--mode",
        mode,
        "--algo",
        algo,
        "--out",
        str(out),
        "--size",
        a.size,
        "--rows",
        str(a.rows),
        "--micro",
        str(a.micro),
        "--steps",
        str(a.steps),
        "--warmup",
        str(a.warmup),
        "--text-tokens",
        str(a.text_tokens),
    ]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, range(n))), "OMP_NUM_THREADS": "4"}
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"{mode}/{algo} on {n} GPU(s) failed: {r.stderr[-3000:]}")
    return {**json.loads(out.read_text()), "process_s": round(time.time() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="lora", help=argparse.SUPPRESS)
    ap.add_argument("--algo", default="grpo", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--size", default="2b")
    ap.add_argument("--modes", nargs="+", default=["lora", "full"])
    ap.add_argument("--algos", nargs="+", default=["grpo"])
    ap.add_argument("--rows", type=int, default=48, help="rows per optimizer step (rl.batch_size)")
    ap.add_argument("--micro", type=int, default=8, help="rows per forward/backward (rl.micro_batch)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--text-tokens", type=int, default=150)
    ap.add_argument("--work", type=Path, default=Path("bench-out/rl_ddp"))
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="sides to run (1 alone: a check on one GPU)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    if a.worker:
        return worker(a)
    import torch

    a.work.mkdir(parents=True, exist_ok=True)
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    res = {
        "benchmark": "rl_ddp",
        "gpus": torch.cuda.device_count(),
        "device": device,
        "size": a.size,
        "rows": a.rows,
        "micro_batch": a.micro,
        "steps": a.steps,
        "warmup": a.warmup,
        "runs": {},
    }
    for mode in a.modes:
        for algo in a.algos:
            sides = {f"{n}gpu": side(a, mode, algo, n) for n in a.gpus}
            if len(sides) == 2:
                sides["speedup"] = round(sides["2gpu"]["tokens_per_s"] / sides["1gpu"]["tokens_per_s"], 3)
            res["runs"][f"{mode}/{algo}"] = sides
            print(
                json.dumps(
                    {f"{mode}/{algo}": {k: v if k == "speedup" else v["tokens_per_s"] for k, v in sides.items()}}
                ),
                file=sys.stderr,
            )
            if a.json:
                a.json.write_text(json.dumps(res, indent=1))
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
