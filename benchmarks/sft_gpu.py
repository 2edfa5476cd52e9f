"""Benchmark (GPU): SFT step throughput of the project's loss path vs plain `transformers.Trainer`.

    python benchmarks/sft_gpu.py [--size 2b] [--batch 4] [--modes lora full] [--steps 8]

Model: Qwen3-VL with the released 2B shape (random init, bf16, SDPA, no gradient checkpointing).
Data: one 1280x704 screenshot (880 image tokens after the 2x2 merge) + ~600 text tokens per sample,
of which the last 100 (the assistant reply) carry labels; identical samples and batch on both sides.
  trainer: transformers.Trainer (fused AdamW, bf16), loss from the model's own forward (full logits)
  ours:    the same model + optimizer; loss from training.losses.labelled_token_loss (backbone once,
           LM head and cross-entropy only at labelled positions); --liger adds fused kernels
           (training.kernels), --compile compiles each decoder layer
Prints JSON: step time, tokens/s, peak memory, MFU (6*N*T / 989 TFLOP/s dense bf16, as in
shared/research/gpu_baseline.md; for LoRA 6*N*T overstates the work, so MFU is comparable across
sides, not across modes) and the speedup per mode. Also `ours` at --max-batch to show what the
memory saving buys.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PEAK_BF16 = 989e12  # H100 SXM dense bf16


def make_samples(proc, n: int, text_tokens: int, label_tokens: int, seed: int = 0) -> list[dict]:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        img = Image.fromarray(rng.integers(0, 255, (704, 1280, 3), dtype=np.uint8))
        words = " ".join(f"w{int(x)}" for x in rng.integers(0, 500, text_tokens))
        msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": words}]}]
        text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        enc = proc(text=[text], images=[img], return_tensors="pt")
        ids = enc["input_ids"][0]
        extra = text_tokens + 880 - ids.shape[0]  # pad the text part to a fixed length with more words
        if extra > 0:
            ids = torch.cat([ids, torch.randint(10, 900, (extra,))])
        ids = ids[: text_tokens + 880]
        labels = torch.full_like(ids, -100)
        labels[-label_tokens:] = ids[-label_tokens:]
        s = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "labels": labels,
            "pixel_values": enc["pixel_values"],
            "image_grid_thw": enc["image_grid_thw"],
        }
        if "mm_token_type_ids" in enc:
            mm = torch.zeros_like(ids)
            mm[: enc["mm_token_type_ids"].shape[1]] = enc["mm_token_type_ids"][0][: ids.shape[0]]
            s["mm_token_type_ids"] = mm
        out.append(s)
    return out


def collate(samples: list[dict]) -> dict:
    b = {k: torch.stack([s[k] for s in samples]) for k in ("input_ids", "attention_mask", "labels")}
    b["pixel_values"] = torch.cat([s["pixel_values"] for s in samples])
    b["image_grid_thw"] = torch.cat([s["image_grid_thw"] for s in samples])
    if "mm_token_type_ids" in samples[0]:
        b["mm_token_type_ids"] = torch.stack([s["mm_token_type_ids"] for s in samples])
    return b


def build(size: str, mode: str, fp32_adapters: bool = True, device: str = "cuda"):
    """A random-init Qwen3-VL of `size` for a timed step: LoRA r16 (vision frozen by PEFT) or full with the vision
    tower frozen; bf16 on CUDA, fp32 on CPU (smoke runs). Shared with benchmarks/sft_packing.py."""
    from training.models import apply_lora, build_model, count_parameters, freeze_vision

    model, proc = build_model(
        "qwen3-vl", size, seed=0, dtype="bfloat16" if device == "cuda" else "float32", device=device
    )
    model.config.use_cache = False
    if mode == "lora":
        model = apply_lora(model, r=16, alpha=32, dropout=0.0, fp32_adapters=fp32_adapters)
    else:
        freeze_vision(model)
    model.train()
    return model, proc, count_parameters(model)


def _stats(times: list[float], tokens: int, n_params: int, batch: int) -> dict:
    t = sorted(times)[len(times) // 2]
    return {
        "batch": batch,
        "step_s": round(t, 4),
        "tokens_per_s": round(tokens / t, 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "mfu": round(6 * n_params * tokens / t / PEAK_BF16, 3),
    }


def run_ours(model, samples, batch: int, steps: int, warmup: int, n_params: int) -> dict:
    from training.losses import labelled_token_loss

    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5, fused=True)
    times = []
    torch.cuda.reset_peak_memory_stats()
    for i in range(warmup + steps):
        b = {k: v.cuda(non_blocking=True) for k, v in collate(samples[:batch]).items()}
        labels = b.pop("labels")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss_sum, n = labelled_token_loss(model, b, labels)
        (loss_sum / n).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return _stats(times, batch * samples[0]["input_ids"].shape[0], n_params, batch)


def run_trainer(model, samples, batch: int, steps: int, warmup: int, n_params: int) -> dict:
    from transformers import Trainer, TrainingArguments

    from benchmarks.trainer_timer import StepTimer

    timer = StepTimer()
    args = TrainingArguments(
        output_dir="/tmp/sft_bench_trainer",
        per_device_train_batch_size=batch,
        max_steps=warmup + steps,
        bf16=True,
        optim="adamw_torch_fused",
        learning_rate=1e-5,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
    )
    torch.cuda.reset_peak_memory_stats()
    Trainer(
        model=model, args=args, train_dataset=samples * (warmup + steps), data_collator=collate, callbacks=[timer]
    ).train()
    return _stats(timer.times[warmup:], batch * samples[0]["input_ids"].shape[0], n_params, batch)


def _guard(fn, batch: int) -> dict:
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"batch": batch, "oom": True}


def _text_layers(model):
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model.language_model.layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="2b")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--max-batch", type=int, default=8, help="extra `ours` run at this batch (0 = skip)")
    ap.add_argument("--modes", nargs="+", default=["lora", "full"])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--text-tokens", type=int, default=600)
    ap.add_argument("--label-tokens", type=int, default=100)
    ap.add_argument("--liger", action="store_true", help="ours: fused RMSNorm/RoPE/SwiGLU kernels (training.kernels)")
    ap.add_argument("--compile", action="store_true", help="ours: torch.compile each decoder layer")
    ap.add_argument(
        "--bf16-adapters",
        action="store_true",
        help="ours, LoRA: adapters in bf16 (the Trainer side keeps PEFT's fp32 adapters)",
    )
    a = ap.parse_args()
    out = {
        "benchmark": "sft_gpu_step",
        "size": a.size,
        "gpu": torch.cuda.get_device_name(0),
        "seq_len": a.text_tokens + 880,
        "labelled_tokens": a.label_tokens,
        "results": {},
    }
    # plain Trainer sides first: kernel patches are global to the transformers modules
    for mode in a.modes:
        res = out["results"].setdefault(mode, {})
        model, proc, counts = build(a.size, mode)
        samples = make_samples(proc, max(a.batch, a.max_batch), a.text_tokens, a.label_tokens)
        res["trainer"] = _guard(
            lambda: run_trainer(model, samples, a.batch, a.steps, a.warmup, counts["total"]), a.batch
        )
        res["trainable_params"], res["params"] = counts["trainable"], counts["total"]
        model = None  # drop the reference so empty_cache can release its memory
        torch.cuda.empty_cache()
    if a.liger:
        from training.kernels import apply_fused_kernels

        out["ours_kernels"] = apply_fused_kernels("qwen3-vl")
    out["ours_compile"], out["ours_bf16_adapters"] = a.compile, a.bf16_adapters
    for mode in a.modes:
        res = out["results"][mode]
        model, proc, counts = build(a.size, mode, fp32_adapters=not a.bf16_adapters)
        if a.compile:
            for layer in _text_layers(model):
                layer.compile()
        samples = make_samples(proc, max(a.batch, a.max_batch), a.text_tokens, a.label_tokens)
        res["ours"] = _guard(lambda: run_ours(model, samples, a.batch, a.steps, a.warmup, counts["total"]), a.batch)
        if a.max_batch > a.batch:
            res["ours_max_batch"] = _guard(
                lambda: run_ours(model, samples, a.max_batch, a.steps, a.warmup, counts["total"]), a.max_batch
            )
        model = None  # drop the reference so empty_cache can release its memory
        torch.cuda.empty_cache()
        if "step_s" in res["trainer"] and "step_s" in res["ours"]:
            res["speedup"] = round(res["trainer"]["step_s"] / res["ours"]["step_s"], 3)
        print(json.dumps({mode: res}), file=sys.stderr)
    out["target"] = {"speedup": 1.3, "mfu": 0.4}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
