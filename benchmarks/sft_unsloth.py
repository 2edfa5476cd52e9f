"""Benchmark (GPU): Unsloth's vision fine-tuning path and `transformers.Trainer` + `use_liger_kernel=True`, on the
same random-init model and the same 4-sample batches as benchmarks/sft_mfu.py's `b4` sides.

    python benchmarks/sft_mfu.py --data EXPORT.parquet --dump DIR ...          # writes DIR/model and DIR/b4.pt
    PYTHONPATH=UNSLOTH_SITE python benchmarks/sft_unsloth.py --dump DIR --side unsloth --out u.json
    PYTHONPATH=LIGER_SITE python benchmarks/sft_unsloth.py --dump DIR --side trainer_liger --out t.json

Self-contained (no project imports): Unsloth 2026.10 pins transformers <= 5.17, the project needs >= 5.18, so these
sides run in their own process on the GPU image's transformers 5.17, peft and accelerate, with Unsloth and its
dependencies (or liger-kernel) from their own folder on PYTHONPATH. Every side trains on DIR/b4.pt, the padded
batches (SFTCollator.pad of the curate export's samples, screenshots at 1280x704) that our `b4` sides pack, and
starts from DIR/model (Qwen3-VL, released 2B shape, random init, bf16), vision tower frozen:
  unsloth        FastVisionModel.from_pretrained (bf16, no 4-bit; full_finetuning for `full`), get_peft_model with
                 finetune_vision_layers=False, r 16 / alpha 32 for `lora`, FastVisionModel.for_training; then the
                 model's own loss (Unsloth's patched forward) + backward + fused AdamW per batch
                 (--gc: Unsloth's gradient checkpointing, "unsloth" by default in its notebooks; off here by default,
                 as on our side)
  trainer_liger  transformers.Trainer (fused AdamW, bf16, constant lr) with use_liger_kernel=True; PEFT LoRA r16 /
                 alpha 32 on the language model's linear layers (PEFT's fp32 adapters) for `lora`
Prints JSON: per mode, tokens/s over the timed steps (real tokens: attention_mask), the median step, peak memory,
MFU = 6 * N * tokens/s / 989 TFLOP/s (N = the model's parameters, as sft_mfu.py counts them), or the error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

PEAK_BF16 = 989e12
PROFILE = False  # --profile: torch.profiler over one more step after the timed ones
LM_TARGETS = r".*language_model.*\.(q_proj|k_proj|v_proj|o_proj|gate_proj|up_proj|down_proj)"


def _params(model) -> int:
    seen, n = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            n += p.numel()
    return n


def _stats(times, tokens, n_params) -> dict:
    import torch

    tok_s = sum(tokens) / sum(times)
    return {
        "tokens_per_s": round(tok_s, 1),
        "step_s_median": round(sorted(times)[len(times) // 2], 4),
        "step_times": [round(t, 4) for t in times],
        "real_tokens_per_step": round(sum(tokens) / len(tokens), 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "mfu": round(6 * n_params * tok_s / PEAK_BF16, 3),
    }


def _freeze_vision(model) -> None:
    for name, p in model.named_parameters():
        if ".visual." in f".{name}" or name.startswith("visual."):
            p.requires_grad_(False)


def profile_step(step) -> dict:
    """torch.profiler over one call of `step`: the top CUDA kernels and the GPU's busy fraction."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    top = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)[:40]
    return {
        "wall_s": round(wall, 4),
        "gpu_kernel_s": round(kernel_us / 1e6, 4),
        "gpu_busy_fraction": round(kernel_us / 1e6 / wall, 3),
        "top_cuda": [
            {"name": e.key[:110], "calls": e.count, "cuda_ms": round(e.self_device_time_total / 1e3, 2)} for e in top
        ],
    }


def run_unsloth(dump: Path, mode: str, batches: list, warmup: int, gc, extra: dict | None = None) -> dict:
    import torch
    from unsloth import FastVisionModel

    t0 = time.time()
    model, _ = FastVisionModel.from_pretrained(
        str(dump / "model"),
        load_in_4bit=False,
        dtype=torch.bfloat16,
        full_finetuning=mode == "full",
        use_gradient_checkpointing=gc,
        local_files_only=True,
    )
    n_params = _params(model)
    if mode == "lora":
        model = FastVisionModel.get_peft_model(
            model,
            finetune_vision_layers=False,
            finetune_language_layers=True,
            finetune_attention_modules=True,
            finetune_mlp_modules=True,
            r=16,
            lora_alpha=32,
            lora_dropout=0,
            bias="none",
            random_state=0,
            use_gradient_checkpointing=gc,
        )
    else:
        _freeze_vision(model)
    FastVisionModel.for_training(model)
    load_s = time.time() - t0
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5, weight_decay=0.01, fused=True)

    def step(b):
        loss = model(**b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def timed(stream) -> dict:
        times, toks = [], []
        torch.cuda.reset_peak_memory_stats()
        for k, b in enumerate(stream):
            b = {key: v.cuda(non_blocking=True) for key, v in b.items()}
            torch.cuda.synchronize()
            t = time.perf_counter()
            loss = step(b)
            torch.cuda.synchronize()
            if k >= warmup:
                times.append(time.perf_counter() - t)
                toks.append(int(b["attention_mask"].sum()))
        return dict(_stats(times, toks, n_params), loss_last=float(loss.detach()))

    out = timed(batches)
    out.update(load_s=round(load_s, 1), trainable_params=sum(p.numel() for p in params), gradient_checkpointing=str(gc))
    if PROFILE:
        b = {key: v.cuda() for key, v in batches[-1].items()}
        out["profile"] = profile_step(lambda: step(b))
    for name, stream in (extra or {}).items():  # more batch sizes, the same model and optimizer
        try:
            out[name] = timed(stream)
        except Exception as e:  # noqa: BLE001 - e.g. out of memory at a big padded batch
            out[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        torch.cuda.empty_cache()
    model = opt = None  # free before the next mode loads its model
    torch.cuda.empty_cache()
    return out


def run_trainer(dump: Path, mode: str, batches: list, warmup: int, liger: bool) -> dict:
    import dataclasses

    import torch
    from transformers import Qwen3VLForConditionalGeneration, Trainer, TrainerCallback, TrainingArguments

    model = Qwen3VLForConditionalGeneration.from_pretrained(str(dump / "model"), dtype=torch.bfloat16).cuda()
    model.config.use_cache = False
    n_params = _params(model)
    if mode == "lora":
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=LM_TARGETS))
    else:
        _freeze_vision(model)

    class Timer(TrainerCallback):
        def __init__(self):
            self.times, self.t0 = [], 0.0

        def on_step_begin(self, *a, **k):
            torch.cuda.synchronize()
            self.t0 = time.perf_counter()

        def on_step_end(self, *a, **k):
            torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.t0)

    class Batches(torch.utils.data.Dataset):
        def __len__(self):
            return len(batches)

        def __getitem__(self, i):
            return batches[i]

    kw = dict(
        output_dir="/tmp/sft_unsloth_trainer",
        per_device_train_batch_size=1,  # one item = one whole padded batch of 4 (the collator unwraps it)
        max_steps=len(batches),
        bf16=True,
        optim="adamw_torch_fused",
        learning_rate=1e-5,
        weight_decay=0.01,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        use_liger_kernel=liger,
        train_sampling_strategy="sequential",
    )
    names = {f.name for f in dataclasses.fields(TrainingArguments)}
    timer = Timer()
    torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(
        model=model,
        args=TrainingArguments(**{k: v for k, v in kw.items() if k in names}),
        train_dataset=Batches(),
        data_collator=lambda items: items[0],
        callbacks=[timer],
    )
    trainer.train()
    toks = [int(b["attention_mask"].sum()) for b in batches]
    out = _stats(timer.times[warmup:], toks[warmup : len(timer.times)], n_params)
    out["trainable_params"] = sum(p.numel() for p in model.parameters() if p.requires_grad)
    del trainer, model
    torch.cuda.empty_cache()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dump", type=Path, required=True)
    ap.add_argument("--side", choices=("unsloth", "trainer_liger", "trainer"), required=True)
    ap.add_argument("--modes", nargs="+", default=["lora", "full"])
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--gc", default="false", help="unsloth: use_gradient_checkpointing (false, true, unsloth)")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--profile", action="store_true", help="unsloth: torch.profiler of one step per mode")
    ap.add_argument("--big", action="store_true", help="unsloth: also DIR/b24.pt (sft_mfu.py --dump-big)")
    a = ap.parse_args()
    global PROFILE
    PROFILE = a.profile
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    out: dict = {"side": a.side, "results": {}}
    t0 = time.time()
    try:
        if a.side == "unsloth":
            import unsloth  # noqa: F401 - first, so that it patches transformers / peft / trl before they load

            out["unsloth"] = getattr(unsloth, "__version__", None)
            out["import_s"] = round(time.time() - t0, 1)
        import peft
        import torch
        import transformers

        out.update(
            gpu=torch.cuda.get_device_name(0),
            torch=torch.__version__,
            transformers=transformers.__version__,
            peft=peft.__version__,
        )
        if a.side == "trainer_liger":
            from importlib.metadata import version

            out["liger_kernel"] = version("liger-kernel")
        batches = torch.load(a.dump / "b4.pt")
    except Exception as e:  # noqa: BLE001 - the blocker is the result
        out["error"] = f"{type(e).__name__}: {e}"[:1500]
        out["trace"] = traceback.format_exc()[-3000:]
        batches = None
    out["setup_s"] = round(time.time() - t0, 1)
    print(json.dumps(out)[:1500], file=sys.stderr, flush=True)
    if a.out:  # so far: a side stopped at its time limit keeps what it reached
        a.out.write_text(json.dumps(out, indent=1))
    gc = {"false": False, "true": True}.get(a.gc.lower(), a.gc)
    for mode in a.modes if batches is not None else []:
        try:
            out["results"][mode] = {"started_s": round(time.time() - t0, 1)}
            if a.out:
                a.out.write_text(json.dumps(out, indent=1))
            if a.side == "unsloth":
                extra = {"b24": torch.load(a.dump / "b24.pt")} if a.big else None
                out["results"][mode] = run_unsloth(a.dump, mode, batches, a.warmup, gc, extra)
            else:
                out["results"][mode] = run_trainer(a.dump, mode, batches, a.warmup, a.side == "trainer_liger")
        except Exception as e:  # noqa: BLE001
            out["results"][mode] = {"error": f"{type(e).__name__}: {e}"[:1500], "trace": traceback.format_exc()[-3000:]}
        print(json.dumps({mode: out["results"][mode]})[:1500], file=sys.stderr, flush=True)
        if a.out:
            a.out.write_text(json.dumps(out, indent=1))
    text = json.dumps(out, indent=1)
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
