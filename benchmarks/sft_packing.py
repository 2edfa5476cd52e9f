"""Benchmark (GPU): SFT on a realistic length mix, packed vs padded, vs `transformers.Trainer` (plain and Liger).

    python benchmarks/sft_packing.py --data EXPORT.parquet [--modes lora full] [--batch 4] [--steps 10]
    python benchmarks/sft_packing.py --data EXPORT.parquet --sides trainer trainer_liger   # the Trainer sides alone

Data: a curate export (`flywheel stage curate`: the student's real prompts, history screenshots and replies), its
screenshots resized to --upscale (MiniWoB's 160x210 to a desktop-sized 1280x704: 880 image tokens each, as
benchmarks/sft_ddp.py does for the 2B shape), encoded once by training.data.SFTCollator (chat template,
assistant-only labels). Every side trains on the same stream of samples (a seeded permutation), --batch samples
an optimizer step, Qwen3-VL with the released 2B shape (random init, bf16, SDPA, no gradient checkpointing):
  trainer        transformers.Trainer, right-padded batches of --batch, the model's own loss (full logits),
                 fused AdamW, LoRA adapters as PEFT makes them (fp32)
  trainer_liger  the same with `use_liger_kernel=True` (Liger's fused linear cross-entropy, RMSNorm, RoPE, SwiGLU)
  ours_padded    training.sft.train_step + optimizer_step (the stage's own step: labelled-only LM head, fused
                 kernels, bf16 adapters with fp32 masters), padded micro-batches of --batch
  ours_packed    the same with sft.packing (one packed row per micro-batch, torch varlen flash attention)
  ours_packed_sdpa   packing with SDPA and transformers' block-diagonal mask instead of varlen
  ours_packed_big_N  packing with --big-batch samples a step and packs of N tokens (--big-pack; what the memory
                     saved buys: compare its peak memory with the Trainer's)
  *_epoch2       the same with sft.vision_cache filled by one untimed pass over every sample first (the frozen
                 vision tower's outputs reused, as from the second epoch on; the tower does not run)
  *_epoch1       sft.vision_cache from empty, over the first len(data) // big-batch steps (no sample seen twice)
  old_packed, old_packed_big_N   the last commit's step (--old-code: its training/ package renamed old_training)
The ours sides without a suffix run the tower in every forward (sft.vision_cache off), as a first epoch would.
Throughput counts real tokens only (no pads): tokens/s = the timed steps' tokens over their time (and the median of
the per-step rates, less sensitive to a stray slow step), MFU = 6 * N * tokens / step / 989
TFLOP/s (dense bf16 H100; for LoRA 6N overstates the work, so compare sides, not modes). Peak memory per side.
Also a correctness check on the GPU: packed (varlen) per-sample losses vs each sample alone, bf16.
Prints JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PEAK_BF16 = 989e12  # H100 SXM dense bf16
DEVICE = "cuda"  # --device cpu: a smoke run of this script (with --size tiny), no numbers worth reading
TRAINER_SIDES = ("trainer", "trainer_liger")
OURS_SIDES = (
    "ours_padded",
    "ours_packed",
    "ours_packed_epoch2",
    "ours_packed_sdpa",
    "ours_packed_big",
    "ours_packed_big_epoch1",
    "ours_packed_big_epoch2",
)
OLD_SIDES = ("old_packed", "old_packed_big")  # the last commit's step (--old-code)


_WORKER: dict = {}


def _encode_one(args) -> tuple[dict, dict]:
    """One row: screenshots resized to `upscale` (PNG, as benchmarks/sft_ddp.upscaled writes them), then encoded."""
    import io

    from PIL import Image

    from training.data import SFTCollator

    row, size, upscale = args
    if "col" not in _WORKER:
        _WORKER["col"] = SFTCollator(processor_for(size))
    images = []
    for im in row.get("images") or []:
        buf = io.BytesIO()
        raw = im["bytes"] if isinstance(im, dict) else im
        Image.open(io.BytesIO(raw)).convert("RGB").resize(tuple(upscale), Image.BICUBIC).save(buf, format="PNG")
        images.append({"bytes": buf.getvalue(), "path": None} if isinstance(im, dict) else buf.getvalue())
    row = dict(row, images=images)
    return row, _WORKER["col"].encode(row)


def encode_all(data: Path, size: str, upscale: tuple[int, int], workers: int = 1) -> tuple[list[dict], list[dict]]:
    """The export's rows with their screenshots resized, and each encoded once (SFTCollator.encode), over
    `workers` processes."""
    from training.sft import read_samples

    rows = read_samples(data)
    jobs = [(r, size, upscale) for r in rows]
    if workers > 1:
        import multiprocessing as mp

        with mp.get_context("fork").Pool(workers) as pool:
            done = pool.map(_encode_one, jobs, chunksize=4)
    else:
        done = [_encode_one(j) for j in jobs]
    return [r for r, _ in done], [e for _, e in done]


def stream(n: int, batch: int, steps: int, seed: int = 0) -> list[list[int]]:
    from training.core import sample_at

    return [[sample_at(k * batch + j, n, seed) for j in range(batch)] for k in range(steps)]


def build(size: str, mode: str, peft_default: bool):
    from benchmarks.sft_gpu import build as build_model_for_step

    return build_model_for_step(size, mode, fp32_adapters=peft_default, device=DEVICE)


def _stats(times: list[float], tokens: list[int], n_params: int, **extra) -> dict:
    order = sorted(range(len(times)), key=lambda i: times[i])
    med = order[len(order) // 2]
    tok_s = sum(tokens) / sum(times)
    return {
        "step_s_median": round(times[med], 4),
        "tokens_per_s": round(tok_s, 1),
        "tokens_per_s_median_step": round(sorted(t / d for t, d in zip(tokens, times))[len(times) // 2], 1),
        "step_times": [round(t, 4) for t in times],
        "real_tokens_per_step": round(sum(tokens) / len(tokens), 1),
        "peak_mem_gib": round((torch.cuda.max_memory_allocated() if DEVICE == "cuda" else 0) / 2**30, 2),
        "mfu": round(6 * n_params * tok_s / PEAK_BF16, 3),
        **extra,
    }


def run_trainer(mode: str, size: str, encoded: list[dict], batches: list[list[int]], warmup: int, liger: bool) -> dict:
    from transformers import Trainer, TrainingArguments

    from training.data import SFTCollator

    model, proc, counts = build(size, mode, peft_default=True)
    col = SFTCollator(proc)
    order = [i for b in batches for i in b]
    real = [sum(int(encoded[i]["attention_mask"].sum()) for i in b) for b in batches]
    padded = [len(b) * max(encoded[i]["input_ids"].shape[1] for i in b) for b in batches]

    class Ordered(torch.utils.data.Dataset):
        def __len__(self):
            return len(order)

        def __getitem__(self, k):
            return encoded[order[k]]

    from benchmarks.trainer_timer import StepTimer

    timer = StepTimer()
    kw = dict(
        output_dir="/tmp/sft_pack_trainer",
        per_device_train_batch_size=len(batches[0]),
        max_steps=len(batches),
        bf16=True,
        optim="adamw_torch_fused",
        learning_rate=1e-5,
        report_to="none",
        save_strategy="no",
        logging_strategy="no",
        remove_unused_columns=False,
        dataloader_num_workers=0,
        lr_scheduler_type="constant",
        use_liger_kernel=liger,
        train_sampling_strategy="sequential",
    )  # the same sample stream as ours (older releases: random)
    if DEVICE == "cpu":
        kw.update(bf16=False, use_cpu=True, optim="adamw_torch")
    names = {f.name for f in __import__("dataclasses").fields(TrainingArguments)}
    args = TrainingArguments(**{k: v for k, v in kw.items() if k in names})
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(model=model, args=args, train_dataset=Ordered(), data_collator=col.pad, callbacks=[timer])
    trainer.train()
    out = _stats(
        timer.times[warmup:],
        real[warmup:],
        counts["total"],
        batch=len(batches[0]),
        pad_fraction=round(1 - sum(real) / sum(padded), 3),
    )
    del trainer, model
    torch.cuda.empty_cache()
    return out


def processor_for(size: str):
    """The processor build_model gives a model of `size` (image sizes differ between CPU and GPU sizes)."""
    from training.models import CPU_SIZES
    from training.tokenizer import build_processor, build_tokenizer, image_processor_settings

    return build_processor("qwen3-vl", build_tokenizer(), image_processor_settings("qwen3-vl", small=size in CPU_SIZES))


def run_ours(
    model,
    proc,
    counts,
    mode: str,
    rows,
    encoded: list[dict],
    batches: list[list[int]],
    warmup: int,
    packing: bool,
    pack_tokens: int,
    varlen: bool,
    vision: str = "off",
    impl: str = "training",
) -> dict:
    """Our step on `batches`. vision: "off" (the tower runs in every forward), "epoch1" (sft.vision_cache from
    empty: give it batches of samples not seen before) or "epoch2" (the cache filled by one untimed pass over
    every sample first, as after the first epoch). impl "old_training": the code of the last commit (a renamed
    copy of its training/ package, benchmarks/old_training.sh): fp32 pixel_values, make_optimizer."""
    import importlib

    packing_mod = importlib.import_module(f"{impl}.packing")
    core = importlib.import_module(f"{impl}.core")
    sft = importlib.import_module(f"{impl}.sft")
    from training.data import SFTCollator

    s = sft.TrainSettings(
        method=mode,
        batch_size=len(batches[0]),
        grad_accum=1,
        packing=packing,
        pack_tokens=pack_tokens,
        lora_dropout=0.0,
    )
    positions = packing_mod.rope_positions_fn(model) if packing else None
    # every sample encoded once, outside the timed steps (the stage caches the same way, up to sft.encode_cache_gib),
    # pixel_values in the vision tower's dtype as the stage keeps them (the old code kept fp32)
    dtype = next(p.dtype for n, p in model.named_parameters() if ".visual." in n) if impl == "training" else None
    samples = sft.EncodedSamples(
        rows,
        SFTCollator(proc),
        positions=positions,
        max_bytes=1 << 40,
        **({"pixel_dtype": dtype} if dtype is not None else {}),
    )
    samples.cache = {
        i: dict(
            e,
            pixel_values=e["pixel_values"].to(dtype or e["pixel_values"].dtype),
            **({"position_ids": positions(e)} if packing else {}),
        )
        for i, e in enumerate(encoded)
    }
    samples.bytes = sum(t.numel() * t.element_size() for e in samples.cache.values() for t in e.values())
    weights = core.TrainableWeights(model, master=mode == "lora")
    if impl == "training":
        opt = sft._optimizer(weights, dataclasses.replace(s, lr=1e-5, weight_decay=0.01))
        if vision != "off":
            from training.vision_cache import VisionFeatures

            samples.vision = VisionFeatures(model, samples)
            if vision == "epoch2":
                prefill(model, samples, s, len(rows))
    else:
        opt = core.make_optimizer(weights, 1e-5, 0.01)
    optimizer_step, train_step = core.optimizer_step, sft.train_step
    stock = packing_mod.varlen_available
    packing_mod.varlen_available = (lambda: False) if not varlen else stock
    times, toks = [], []
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        for k, idx in enumerate(batches):
            _sync()
            t0 = time.perf_counter()
            _, _, tokens = train_step(model, samples, idx, s, torch.device(DEVICE))
            optimizer_step(weights, opt, 1.0)
            _sync()
            if k >= warmup:
                times.append(time.perf_counter() - t0)
                toks.append(tokens)
    finally:
        packing_mod.varlen_available = stock
    out = _stats(times, toks, counts["total"], batch=len(batches[0]), vision=vision, code=impl)
    if packing:
        out["pack_tokens"] = pack_tokens
    if getattr(samples, "vision", None) is not None:
        out["tower_calls"] = samples.vision.tower_calls
        out["host_cache_gib"] = round(samples.bytes / 2**30, 2)
    del opt, weights, samples
    torch.cuda.empty_cache()
    return out


def prefill(model, samples, s, n: int) -> None:
    """sft.vision_cache as after one epoch: every sample's features computed and kept (no training)."""
    from training.packing import plan_packs

    device = torch.device(DEVICE)
    with torch.no_grad():
        for k in range(0, n, 24):
            group = list(range(k, min(n, k + 24)))
            for pack in plan_packs([samples.length(i) for i in group], 1 << 30):
                g = [group[j] for j in sorted(pack)]
                encs = [samples.get(i) for i in g]
                b = samples.packed(g, encs=encs) if s.packing else samples.batch(g, encs=encs)
                b.pop("labels")
                b = {key: v.to(device) if hasattr(v, "to") else v for key, v in b.items()}
                samples.vision.attach(g, encs, b, device)


def varlen_check(model, proc, rows, idx: list[int]) -> dict:
    """bf16 on the GPU: each sample's loss in a packed row (varlen) vs alone (unpadded), relative differences."""
    from training.data import SFTCollator
    from training.losses import _backbone_and_head, labelled_token_loss
    from training.packing import packed_attention, rope_positions_fn, varlen_available
    from training.sft import EncodedSamples

    samples = EncodedSamples(rows, SFTCollator(proc), positions=rope_positions_fn(model))
    model.eval()
    backbone, head = _backbone_and_head(model)
    with torch.no_grad():
        alone = []
        for i in idx:
            b = samples.batch([i])
            labels = b.pop("labels")
            alone.append(float(labelled_token_loss(model, {k: v.to(DEVICE) for k, v in b.items()}, labels)[0]))
        out = {"varlen_available": varlen_available(), "alone": alone}
        for name, varlen in (("varlen", True), ("sdpa_mask", False)):
            p = samples.packed(idx)
            labels = p.pop("labels")
            bounds = p["cu_seq_lens_q"].tolist()
            p = {k: v.to(DEVICE) if hasattr(v, "to") else v for k, v in p.items()}
            with packed_attention(model, p, varlen=varlen and varlen_available()):
                hidden = backbone(**p).last_hidden_state[0]
            got = []
            for a, b in zip(bounds, bounds[1:]):
                lab = labels[0, a + 1 : b].to(DEVICE)
                sel = lab != -100
                got.append(
                    float(
                        torch.nn.functional.cross_entropy(
                            head(hidden[a : b - 1][sel]).float(), lab[sel], reduction="sum"
                        )
                    )
                )
            out[name] = got
            out[f"{name}_max_rel_diff"] = max(abs(g - a) / abs(a) for g, a in zip(got, alone))
    model.train()
    return out


def _sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _guard(fn) -> dict:
    try:
        return fn()
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        return {"oom": True}
    except Exception as e:  # a side that cannot run (e.g. the Liger flag): its error is the result
        torch.cuda.empty_cache()
        return {"error": f"{type(e).__name__}: {e}"[:500], "trace": traceback.format_exc()[-1500:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/sft_packing"))
    ap.add_argument("--size", default="2b")
    ap.add_argument("--modes", nargs="+", default=["lora", "full"])
    ap.add_argument("--sides", nargs="+", default=list(TRAINER_SIDES + OURS_SIDES))
    ap.add_argument("--batch", type=int, default=4, help="samples per optimizer step (all sides)")
    ap.add_argument("--steps", type=int, default=10, help="timed steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--pack-tokens", type=int, default=0, help="ours_packed: tokens a pack (0 = batch x longest sample)"
    )
    ap.add_argument("--big-batch", type=int, default=16)
    ap.add_argument("--big-pack", type=int, nargs="+", default=[8192, 16384], help="ours_packed_big: one side per size")
    ap.add_argument("--upscale", type=int, nargs=2, default=[1280, 704])
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (--size tiny)")
    ap.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    ap.add_argument("--workers", type=int, default=8, help="processes that encode the samples")
    ap.add_argument(
        "--old-code",
        type=Path,
        default=None,
        help="folder holding `old_training`, the last commit's training/ package renamed, for the old_* "
        "sides: git archive HEAD training | tar -x -C DIR; mv DIR/training DIR/old_training; "
        "sed -i 's/\\btraining\\./old_training./g' DIR/old_training/*.py",
    )
    a = ap.parse_args()
    global DEVICE
    DEVICE = a.device
    import transformers

    a.work.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows, encoded = encode_all(a.data, a.size, tuple(a.upscale), a.workers)
    print(f"encoded {len(rows)} samples in {time.time() - t0:.0f} s", file=sys.stderr)
    lengths = sorted(int(e["input_ids"].shape[1]) for e in encoded)
    n_images = [int(e["image_grid_thw"].shape[0]) for e in encoded]
    gpu = torch.cuda.get_device_name(0) if DEVICE == "cuda" else "cpu"
    out = {
        "benchmark": "sft_packing",
        "size": a.size,
        "gpu": gpu,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "data": {
            "samples": len(rows),
            "upscale": a.upscale,
            "tokens_min": lengths[0],
            "tokens_median": lengths[len(lengths) // 2],
            "tokens_max": lengths[-1],
            "tokens_mean": round(sum(lengths) / len(lengths), 1),
            "images_per_sample": {str(k): n_images.count(k) for k in sorted(set(n_images))},
        },
        "batch": a.batch,
        "steps": a.steps,
        "warmup": a.warmup,
        "results": {},
    }
    from importlib.metadata import PackageNotFoundError, version

    try:
        out["liger_kernel"] = version("liger-kernel")
    except PackageNotFoundError:
        out["liger_kernel"] = None
    batches = stream(len(rows), a.batch, a.warmup + a.steps)
    big = stream(len(rows), a.big_batch, a.warmup + a.steps, seed=1)
    pack_tokens = a.pack_tokens or a.batch * lengths[-1]
    for mode in a.modes:  # Trainer sides first: our fused kernels patch the transformers modules globally
        res = out["results"].setdefault(mode, {})
        for side in TRAINER_SIDES:
            if side in a.sides:
                liger = side == "trainer_liger"
                res[side] = _guard(lambda: run_trainer(mode, a.size, encoded, batches, a.warmup, liger))
                print(json.dumps({mode: {side: res[side]}})[:800], file=sys.stderr)
    if any(s in a.sides for s in OURS_SIDES + OLD_SIDES):
        from training.kernels import apply_fused_kernels, linear_patch_embed

        out["ours_kernels"] = apply_fused_kernels("qwen3-vl")
        if a.old_code:
            sys.path.insert(0, str(a.old_code.resolve()))
        n_e1 = len(rows) // a.big_batch  # steps of the big stream that see no sample twice (the first epoch)
        for mode in a.modes:
            res = out["results"][mode]
            model, proc2, counts = build(a.size, mode, peft_default=False)
            res["params"], res["trainable_params"] = counts["total"], counts["trainable"]
            # side: (batches, packing, pack tokens, varlen, vision cache, code, warmup)
            plan = {"old_packed": (batches, True, pack_tokens, True, "off", "old_training", a.warmup)}
            plan.update(
                {f"old_packed_big_{n}": (big, True, n, True, "off", "old_training", a.warmup) for n in a.big_pack}
            )
            plan.update(
                {
                    "ours_padded": (batches, False, pack_tokens, False, "off", "training", a.warmup),
                    "ours_packed": (batches, True, pack_tokens, True, "off", "training", a.warmup),
                    "ours_packed_epoch2": (batches, True, pack_tokens, True, "epoch2", "training", a.warmup),
                    "ours_packed_sdpa": (batches, True, pack_tokens, False, "off", "training", a.warmup),
                }
            )
            for n in a.big_pack:
                plan.update(
                    {
                        f"ours_packed_big_{n}": (big, True, n, True, "off", "training", a.warmup),
                        f"ours_packed_big_{n}_epoch1": (big[:n_e1], True, n, True, "epoch1", "training", 1),
                        f"ours_packed_big_{n}_epoch2": (big, True, n, True, "epoch2", "training", a.warmup),
                    }
                )
            for side, (bs, packing, pt, varlen, vision, impl, warm) in plan.items():
                kind = side.replace(f"_{pt}", "") if "_big_" in side else side
                if kind not in a.sides or (impl == "old_training" and not a.old_code):
                    continue
                if impl == "training" and DEVICE == "cuda":  # as training.sft does on CUDA (old sides run first)
                    linear_patch_embed(model)
                if mode == a.modes[0] and impl == "training" and "varlen_check" not in out:
                    out["varlen_check"] = _guard(lambda: varlen_check(model, proc2, rows, batches[0]))
                res[side] = _guard(
                    lambda: run_ours(
                        model, proc2, counts, mode, rows, encoded, bs, warm, packing, pt, varlen, vision, impl
                    )
                )
                print(json.dumps({mode: {side: res[side]}})[:800], file=sys.stderr)
                if a.out:  # so far: a run stopped at its time limit keeps what it measured
                    a.out.write_text(json.dumps(out, indent=1))
            del model
            torch.cuda.empty_cache()
            for base in TRAINER_SIDES:
                b = res.get(base, {})
                if "tokens_per_s" in b:
                    res[f"speedup_vs_{base}"] = {
                        s: round(res[s]["tokens_per_s"] / b["tokens_per_s"], 3)
                        for s in res
                        if s.startswith(("ours", "old")) and "tokens_per_s" in res[s]
                    }
    out["target"] = {"speedup_vs_trainer": 1.8, "mfu": 0.5}
    print(json.dumps(out, indent=1))
    if a.out:
        a.out.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
