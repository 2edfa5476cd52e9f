"""Benchmark: the `hf` student backend, batched vs unbatched: decode tokens/s and episode steps/s.

    .venv/bin/python benchmarks/student_speed.py                      # small Qwen3-VL on CPU (+ episodes)
    python benchmarks/student_speed.py --size 2b --device cuda --dtype bf16 --no-episodes   # GPU box

decode:   the same prompts (MiniWoB-sized screenshot + instruction + UI text, the real prompt
          builder) generated one at a time vs in batches of --batch, --new-tokens each
          (stop tokens disabled so every call decodes the same length). tokens/s counts generated tokens.
episodes: real MiniWoB student rollouts (untrained model, every step decoded) through the rollout
          runner: 1 env per worker (unbatched) vs --batch envs stepped in lockstep by one worker.
Side by side in one run; JSON out.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # test data: synthetic


def _prompts(n: int, arch: str):
    from synthetic import png_pool

    from agents.prompts import PromptOptions, build_prompt, transform_for

    pngs = png_pool(n)
    t = transform_for(arch, 160, 210)
    ui = "\n".join(f'button "Option {i}" @ ({20 + 15 * i},{60 + 12 * i}) [40x20]' for i in range(6))
    return [
        build_prompt(f"Click the button labelled Option {i % 6}.", pngs[i], ui, [], PromptOptions(), t)
        for i in range(n)
    ]


def bench_decode(backend, arch: str, n_prompts: int, batch: int, new_tokens: int) -> dict:
    from agents.backends.base import Sampling

    s = Sampling(temperature=1.0, max_new_tokens=new_tokens, seed=0, stop=())
    prompts = _prompts(n_prompts, arch)
    backend.generate(prompts[:batch], s)  # warm-up (kernels, allocator)
    out = {}
    for name, bs in (("unbatched", 1), ("batched", batch)):
        _sync()
        t0 = time.perf_counter()
        toks = 0
        for i in range(0, n_prompts, bs):
            toks += sum(g.completion_tokens for g in backend.generate(prompts[i : i + bs], s))
        _sync()
        dt = time.perf_counter() - t0
        out[name] = {
            "batch": bs,
            "tokens": toks,
            "seconds": round(dt, 2),
            "tokens_per_s": round(toks / dt, 1),
            "calls_per_s": round(n_prompts / dt, 2),
        }
    out["speedup"] = round(out["batched"]["tokens_per_s"] / out["unbatched"]["tokens_per_s"], 2)
    return out


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def bench_episodes(model_dir: Path, batch: int, episodes: int, max_new_tokens: int) -> dict:
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts

    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, per_worker in (("unbatched", 1), ("batched", batch)):
            key = f"speed-{name}"
            tasks = ["click-test", "focus-text"]
            jobs = make_jobs(key, tasks, list(range(episodes // len(tasks))), policy_tag="student")
            cfg = {"model": str(model_dir), "max_new_tokens": max_new_tokens}
            spec = RolloutSpec(
                run_key=key,
                iteration=0,
                stage="bench",
                lake_root=f"{tmp}/lake",
                jobs=jobs,
                policy=PolicySpec("student", {"model": str(model_dir), "config": cfg}),
                n_envs=1,
                envs_per_worker=per_worker,
                max_steps=3,
                episode_timeout_s=600,
            )
            t0 = time.perf_counter()
            s = run_rollouts(spec, progress=False)
            dt = time.perf_counter() - t0
            out[name] = {
                "envs_per_worker": per_worker,
                "episodes": s.ran,
                "steps": s.steps,
                "seconds": round(dt, 1),
                "steps_per_s": round(s.steps / dt, 2),
            }
    out["speedup"] = round(out["batched"]["steps_per_s"] / out["unbatched"]["steps_per_s"], 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="qwen3-vl")
    ap.add_argument("--size", default="small")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=48)
    ap.add_argument("--episodes", type=int, default=8)
    ap.add_argument("--no-episodes", action="store_true", help="decode only (e.g. a GPU box without Chromium)")
    a = ap.parse_args()
    import torch

    from agents.backends.hf import HFBackend
    from training.models import build_model, count_parameters, init_model

    model, proc = build_model(a.arch, a.size, seed=0, dtype=a.dtype, device=a.device)
    backend = HFBackend(model=model, processor=proc)
    res = {
        "benchmark": "student_hf_backend",
        "arch": a.arch,
        "size": a.size,
        "params": count_parameters(model)["total"],
        "device": str(backend.device),
        "dtype": str(next(model.parameters()).dtype),
        "torch_threads": torch.get_num_threads(),
        "decode": bench_decode(backend, a.arch, a.prompts, a.batch, a.new_tokens),
    }
    if torch.cuda.is_available():
        res["gpu"] = torch.cuda.get_device_name(0)
        res["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
    if not a.no_episodes:
        with tempfile.TemporaryDirectory() as tmp:
            del backend, model
            path = init_model(a.arch, a.size, Path(tmp) / "model", seed=0)
            res["episodes"] = bench_episodes(path, a.batch, a.episodes, a.new_tokens)
    print(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
