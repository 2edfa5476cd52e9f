"""Benchmark (GPU): the SFT stage on 2 GPUs (sft.distributed: ddp) vs 1 GPU, same data, steps and global batch.

    python benchmarks/sft_ddp.py --data EXPORT.parquet [--size 2b] [--modes lora full] [--steps 24] [--batch 8]
                                 [--packing --pack-tokens 24576] [--json OUT.json]

Model: Qwen3-VL with the released 2B shape (random init, written once to --work). Data: a curate export
(messages + images); --upscale W H resizes its screenshots (MiniWoB's 160x210 to a desktop-sized 1280x704:
880 image tokens a sample) so a step carries a realistic GUI load. Both sides run the project's own path,
`python -m training.sft` (one process on GPU 0, or torchrun with DDP over GPUs 0-1), with the same settings:
global batch --batch, --steps optimizer steps, no merge, no intermediate saves. Throughput is the tokens of
the steps after the first --warmup, over their time (sft_result.json's per-step times). Prints JSON with
tokens/s per side and the speedup (target >= 1.8x). --packing trains packed micro-batches (sft.packing: a step's
samples, split across the ranks by tokens, packed into rows of at most --pack-tokens); --json also writes the
result after each mode, so a run cut short keeps the modes it finished.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def upscaled(data: Path, out: Path, size: tuple[int, int], n: int) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq
    from PIL import Image

    t = pq.read_table(data)
    rows = t.slice(0, n).to_pylist()
    for r in rows:
        for im in r["images"]:
            buf = io.BytesIO()
            Image.open(io.BytesIO(im["bytes"])).convert("RGB").resize(size, Image.BICUBIC).save(buf, format="PNG")
            im["bytes"] = buf.getvalue()
    out.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=t.schema), out)
    return out


def run(base: Path, data: Path, out: Path, settings: dict, nproc: int) -> dict:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in range(nproc))}
    s = dict(settings, distributed="ddp" if nproc > 1 else "none", nproc=nproc if nproc > 1 else None)
    t0 = time.time()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "training.sft",
            "--base",
            str(base),
            "--data",
            str(data),
            "--out",
            str(out),
            "--settings",
            json.dumps(s),
            "--no-progress",
        ],
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"{nproc}-GPU run failed: {r.stderr[-3000:]}")
    res = json.loads((out / "sft_result.json").read_text())
    res["process_s"] = round(time.time() - t0, 1)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("bench-out/ddp"))
    ap.add_argument("--size", default="2b")
    ap.add_argument("--modes", nargs="+", default=["lora", "full"])
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="micro-batch (sft.batch_size)")
    ap.add_argument(
        "--accum",
        type=int,
        default=2,
        help="sft.grad_accum: the global batch is batch x accum; one GPU "
        "runs `accum` micro-batches a step, two GPUs split them",
    )
    ap.add_argument("--upscale", type=int, nargs=2, default=[1280, 704])
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--packing", action="store_true", help="sft.packing (the step's samples as packed rows)")
    ap.add_argument("--pack-tokens", type=int, default=24576)
    ap.add_argument("--cache-gib", type=float, default=4.0, help="sft.encode_cache_gib (per process)")
    ap.add_argument("--vision-cache", action="store_true", help="sft.vision_cache (the frozen tower's outputs kept)")
    ap.add_argument("--encode-workers", type=int, default=None, help="sft.encode_workers (default: automatic)")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2], help="sides to run (1 alone: a check on one GPU)")
    ap.add_argument("--json", type=Path, help="also write the result here after each mode")
    a = ap.parse_args()
    import torch

    from training.models import init_model

    base = a.work / f"qwen3vl-{a.size}"
    if not (base / "config.json").exists():
        init_model("qwen3-vl", a.size, base, seed=0)
        import gc

        gc.collect()
        torch.cuda.empty_cache()  # the training processes need this GPU memory back (else 9.8 GiB stay reserved here)
    data = upscaled(a.data, a.work / "data.parquet", tuple(a.upscale), a.samples)
    out = {
        "gpus": torch.cuda.device_count(),
        "size": a.size,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
        "micro_batch": a.batch,
        "global_batch": a.batch * a.accum,
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "packing": a.packing,
        "pack_tokens": a.pack_tokens if a.packing else None,
        "modes": {},
    }
    for mode in a.modes:
        settings = {
            "method": mode,
            "batch_size": a.batch,
            "grad_accum": a.accum,
            "max_steps": a.steps,
            "epochs": 1000.0,
            "lr": 1e-4,
            "warmup_ratio": 0.0,
            "save_every": 10**6,
            "merge": False,
            "record_step_times": True,
            "packing": a.packing,
            "pack_tokens": a.pack_tokens,
            "encode_cache_gib": a.cache_gib,
            "vision_cache": a.vision_cache,
            "encode_workers": a.encode_workers,
        }
        sides = {}
        for n in a.gpus:
            res = run(base, data, a.work / f"{mode}-{n}gpu", settings, n)
            times = res["step_times"][a.warmup :]
            toks = res["step_tokens"][a.warmup :]
            sides[f"{n}gpu"] = {
                "tokens_per_s": round(sum(toks) / sum(times), 1),
                "step_s": round(sum(times) / len(times), 4),
                "final_loss": res["final_loss"],
                "world_size": res.get("world_size"),
                "process_s": res["process_s"],
                "step_times": res["step_times"],
            }
        if len(sides) == 2:
            sides["speedup"] = round(sides["2gpu"]["tokens_per_s"] / sides["1gpu"]["tokens_per_s"], 3)
        out["modes"][mode] = sides
        print(json.dumps({mode: sides}), file=sys.stderr)
        if a.json:
            a.json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
