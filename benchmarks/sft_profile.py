"""Profile (GPU): where one packed SFT step's time goes, and the step's levers one at a time.

    python benchmarks/sft_profile.py --data EXPORT.parquet [--mode full] [--batch 24] [--pack 24576] [--out DIR]

The data, model and step are benchmarks/sft_packing.py's (Qwen3-VL 2B shape, random init, bf16, the curate export
with its screenshots resized to 1280x704, every sample encoded once before timing). Prints JSON:
- `checks`: GPU numerics of the levers that change kernels: GQA flash varlen without repeated K/V against torch's
  varlen_attn with the repeat (outputs and gradients), and one packed row's loss with each lever against the
  stock step (bf16 rounding only);
- `variants`: tokens/s, MFU and peak memory of `training.sft.train_step` + the optimizer step over --steps timed
  steps, with the levers switched on one after another (`before`: fp32 pixel_values from pageable memory, K/V
  repeated for GQA, Conv3d patch embedding, foreach AdamW; then bf16 pixel_values, pinned memory, GQA flash
  varlen, the linear patch embedding, fused AdamW, and the vision cache after one epoch), and
  a CUDA-event split of each step into vision forward / text forward / the rest (loss, backward) / optimizer;
- `profile_<variant>`: torch.profiler's top CUDA kernels of one step and the GPU's busy fraction.
--compile also tries torch.compile on the text decoder layers (slow to build; last).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PEAK_BF16 = 989e12


def _toggle(model, name: str, on: bool) -> None:
    import training.data as data_mod
    import training.packing as packing_mod
    from training.kernels import linear_patch_embed

    if name == "pin":
        data_mod.PIN = on
    elif name == "gqa":
        packing_mod.GQA_NATIVE = on
    elif name == "patch":
        if on:
            linear_patch_embed(model)
        else:
            for mod in model.modules():
                if "forward" in mod.__dict__ and type(mod).__name__.endswith("PatchEmbed"):
                    del mod.forward


class Phases:
    """CUDA events around the vision tower's and the text model's forwards, the optimizer step and the whole step."""

    def __init__(self, model):
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.events: list[tuple[str, torch.cuda.Event]] = []
        for name, mod in (("vision", base.model.visual), ("text", base.model.language_model)):
            mod.register_forward_pre_hook(lambda *_, n=name: self.mark(f"{n}_start"))
            mod.register_forward_hook(lambda *_, n=name: self.mark(f"{n}_end"))

    def mark(self, name: str) -> None:
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        self.events.append((name, e))

    def split(self) -> dict[str, float]:
        torch.cuda.synchronize()
        out: dict[str, float] = {}
        starts: dict[str, torch.cuda.Event] = {}
        for name, e in self.events:
            if name.endswith("_start"):
                starts[name[:-6]] = e
            elif name.endswith("_end") and name[:-4] in starts:
                key = name[:-4]
                out[key] = out.get(key, 0.0) + starts.pop(key).elapsed_time(e) / 1e3
        self.events = []
        return {k: round(v, 4) for k, v in out.items()}


def _defer() -> bool:
    """What training.sft's stage passes as train_step(defer=...), where this tree has it (else False)."""
    import training.sft as sft_mod

    return bool(getattr(sft_mod, "DEFER_LOSS", False))


def run_variant(model, samples, weights, opt, batches, s, n_params: int, phases: Phases, profile: Path | None = None):
    from training.core import optimizer_step
    from training.sft import train_step

    times, toks, splits = [], [], []
    torch.cuda.reset_peak_memory_stats()
    for k, idx in enumerate(batches):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        phases.mark("step_start")
        loss, _, tokens = train_step(model, samples, idx, s, torch.device("cuda"), defer=_defer())
        phases.mark("optimizer_start")
        optimizer_step(weights, opt, 1.0)
        float(loss)  # as training.sft reads it: after the optimizer step is queued
        phases.mark("optimizer_end")
        phases.mark("step_end")
        torch.cuda.synchronize()
        split = phases.split()
        if k >= 1:
            times.append(time.perf_counter() - t0)
            toks.append(tokens)
            splits.append(split)
    tok_s = sum(toks) / sum(times)
    mean_split = {key: round(sum(d.get(key, 0) for d in splits) / len(splits), 4) for key in splits[0]}
    mean_split["rest_of_step"] = round(mean_split["step"] - sum(v for k, v in mean_split.items() if k != "step"), 4)
    out = {
        "tokens_per_s": round(tok_s, 1),
        "mfu": round(6 * n_params * tok_s / PEAK_BF16, 3),
        "step_times": [round(t, 4) for t in times],
        "tokens_per_step": round(sum(toks) / len(toks), 1),
        "peak_mem_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2),
        "split_s": mean_split,
    }
    if profile is not None:
        out["profile"] = profile_step(model, samples, weights, opt, batches[-1], s, profile)
    return out


def profile_step(model, samples, weights, opt, idx, s, trace: Path) -> dict:
    from torch.profiler import ProfilerActivity, profile

    from training.core import optimizer_step
    from training.sft import train_step

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        loss, _, _ = train_step(model, samples, idx, s, torch.device("cuda"), defer=_defer())
        optimizer_step(weights, opt, 1.0)
        float(loss)
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    events = prof.key_averages()
    rows = sorted(events, key=lambda e: e.self_device_time_total, reverse=True)
    kernel_us = sum(e.self_device_time_total for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
    top = [
        {
            "name": e.key[:110],
            "calls": e.count,
            "cuda_ms": round(e.self_device_time_total / 1e3, 2),
            "cpu_ms": round(e.self_cpu_time_total / 1e3, 2),
        }
        for e in rows[:40]
    ]
    kernels = [  # device-side rows only (kernels, copies, memsets), the whole list down to 0.2 ms
        {"name": e.key[:160], "calls": e.count, "cuda_ms": round(e.self_device_time_total / 1e3, 2)}
        for e in rows
        if e.device_type == torch.autograd.DeviceType.CUDA and e.self_device_time_total >= 200
    ]
    cpu_top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:25]
    gaps: dict = {}
    try:
        raw = trace.with_suffix("")
        prof.export_chrome_trace(str(raw))
        try:
            gaps = gpu_gaps(json.loads(raw.read_text()))
        except Exception as e:  # noqa: BLE001 - the gap table is a bonus too
            gaps = {"error": f"{type(e).__name__}: {e}"[:300]}
        with open(raw, "rb") as f, gzip.open(trace, "wb") as g:
            g.write(f.read())
        raw.unlink()
    except Exception as e:  # noqa: BLE001 - the trace is a bonus
        print(f"trace not written: {e}", file=sys.stderr)
    return {
        "gpu_gaps": gaps,
        "wall_s": round(wall, 4),
        "gpu_kernel_s": round(kernel_us / 1e6, 4),
        "gpu_busy_fraction": round(kernel_us / 1e6 / wall, 3),
        "top_cuda": top,
        "kernels": kernels,
        "top_cpu": [
            {"name": e.key[:110], "calls": e.count, "cpu_ms": round(e.self_cpu_time_total / 1e3, 2)} for e in cpu_top
        ],
    }


def gpu_gaps(trace: dict, min_us: float = 20.0, top: int = 20) -> dict:
    """Where the GPU idles in a chrome trace: the gaps between its kernels/copies longer than `min_us`, grouped by
    the CPU ops around the launch of the kernel after each gap (outermost two and innermost), and the host's
    synchronizing runtime calls (stream/device/event syncs, blocking copies) by their enclosing op."""
    import bisect

    ev = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    gpu = sorted(
        (e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")), key=lambda e: float(e["ts"])
    )
    runtime = {e["args"].get("correlation"): e for e in ev if e.get("cat") == "cuda_runtime" and "args" in e}
    ops: dict = {}
    for e in ev:
        if e.get("cat") == "cpu_op":
            ops.setdefault(e.get("tid"), []).append(e)
    for v in ops.values():
        v.sort(key=lambda e: float(e["ts"]))
    starts = {tid: [float(e["ts"]) for e in v] for tid, v in ops.items()}

    def around(tid, t: float) -> list[str]:
        v, st = ops.get(tid, []), starts.get(tid, [])
        i = bisect.bisect_right(st, t)
        chain = [e for e in v[max(0, i - 4000) : i] if float(e["ts"]) + float(e.get("dur", 0)) >= t]
        return [e["name"][:60] for e in chain]

    groups: dict[str, list[float]] = {}
    end, idle, n = None, 0.0, 0
    for k in gpu:
        ts, dur = float(k["ts"]), float(k.get("dur", 0))
        if end is not None and ts - end > min_us:
            gap = ts - end
            idle += gap
            n += 1
            r = runtime.get(k.get("args", {}).get("correlation"))
            chain = around(r.get("tid"), float(r["ts"])) if r else []
            key = " > ".join(chain[:2] + (["..", chain[-1]] if len(chain) > 2 else [])) or k["name"][:60]
            g = groups.setdefault(key, [0.0, 0])
            g[0] += gap
            g[1] += 1
        end = ts + dur if end is None else max(end, ts + dur)
    syncs: dict[str, list[float]] = {}
    for e in ev:
        name = e.get("name", "")
        if e.get("cat") == "cuda_runtime" and ("Synchronize" in name or name == "cudaMemcpy" or "MemcpyAsync" in name):
            if float(e.get("dur", 0)) < 50:
                continue
            chain = around(e.get("tid"), float(e["ts"]))
            key = name + " in " + " > ".join(chain[:2] + (["..", chain[-1]] if len(chain) > 2 else []))
            g = syncs.setdefault(key, [0.0, 0])
            g[0] += float(e["dur"])
            g[1] += 1
    span = (float(gpu[-1]["ts"]) + float(gpu[-1].get("dur", 0)) - float(gpu[0]["ts"])) if gpu else 0.0

    def table(d):
        rows = sorted(d.items(), key=lambda kv: -kv[1][0])[:top]
        return [{"where": k, "ms": round(v[0] / 1e3, 2), "count": v[1]} for k, v in rows]

    return {
        "gpu_span_ms": round(span / 1e3, 2),
        "idle_ms": round(idle / 1e3, 2),
        "gaps": n,
        "by_next_launch": table(groups),
        "host_syncs": table(syncs),
    }


def gqa_check() -> dict:
    """GQA flash varlen (K/V not repeated) vs torch varlen_attn on repeated K/V: outputs and gradients, bf16."""
    import training.packing as packing_mod

    g = torch.Generator(device="cuda").manual_seed(0)
    lengths = [1500, 700, 2200]
    t = sum(lengths)
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    q = torch.randn(1, 16, t, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    k = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    v = torch.randn(1, 8, t, 128, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    dout = torch.randn(1, t, 16, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    res = []
    for native in (True, False):
        packing_mod.GQA_NATIVE = native
        out, _ = packing_mod.varlen_attention(
            None,
            q,
            k,
            v,
            None,
            scaling=128**-0.5,
            cu_seq_lens_q=cu,
            cu_seq_lens_k=cu,
            max_length_q=max(lengths),
            max_length_k=max(lengths),
        )
        grads = torch.autograd.grad(out, (q, k, v), dout)
        res.append((out.float(), [x.float() for x in grads]))
    packing_mod.GQA_NATIVE = True

    def rel(a, b):
        return float((a - b).abs().max() / b.abs().max())

    return {"out_max_rel": rel(res[0][0], res[1][0]), "grad_max_rel": [rel(a, b) for a, b in zip(res[0][1], res[1][1])]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--work", type=Path, default=Path("/tmp/sft_profile"))
    ap.add_argument("--size", default="2b")
    ap.add_argument("--mode", default="full")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--pack", type=int, default=24576)
    ap.add_argument("--steps", type=int, default=3, help="timed steps a variant (after one untimed)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args()
    import benchmarks.sft_packing as bench
    import training.packing as packing_mod
    from training.core import TrainableWeights, make_optimizer
    from training.data import SFTCollator
    from training.kernels import apply_fused_kernels
    from training.losses import labelled_token_loss
    from training.sft import EncodedSamples, TrainSettings

    a.work.mkdir(parents=True, exist_ok=True)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    rows, encoded = bench.encode_all(a.data, a.size, (1280, 704), 8)
    out: dict = {
        "encode_s": round(time.time() - t0, 1),
        "samples": len(rows),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "mode": a.mode,
        "batch": a.batch,
        "pack": a.pack,
    }
    out["checks"] = {"gqa": gqa_check()}
    print(json.dumps(out["checks"]), file=sys.stderr)
    out["kernels"] = apply_fused_kernels("qwen3-vl")
    model, proc, counts = bench.build(a.size, a.mode, peft_default=False)
    positions = packing_mod.rope_positions_fn(model)
    fp32 = {i: dict(e, position_ids=positions(e)) for i, e in enumerate(encoded)}
    bf16 = {i: dict(e, pixel_values=e["pixel_values"].to(torch.bfloat16)) for i, e in fp32.items()}
    samples = EncodedSamples(rows, SFTCollator(proc), positions=positions, max_bytes=1 << 40)
    s = TrainSettings(method=a.mode, batch_size=a.batch, packing=True, pack_tokens=a.pack, lora_dropout=0.0)
    weights = TrainableWeights(model, master=a.mode == "lora")
    opt = make_optimizer(weights, 1e-5, 0.01)
    phases = Phases(model)
    batches = bench.stream(len(rows), a.batch, 1 + a.steps, seed=1)

    def set_levers(pin, gqa, vision, patch, pixels):  # vision: the vision cache (training.vision_cache), "epoch2"
        for name, on in (("pin", pin), ("gqa", gqa), ("patch", patch)):
            _toggle(model, name, on)
        samples.cache = bf16 if pixels == "bf16" else fp32

    # one packed row's loss with each lever vs the stock step (no grad; bf16 rounding only)
    p_idx = batches[0][:8]
    losses = {}
    for name, lv in (
        ("before", (False, False, False, False, "fp32")),
        ("bf16_pixels", (False, False, False, False, "bf16")),
        ("gqa", (False, True, False, False, "fp32")),
        ("patch", (False, False, False, True, "fp32")),
    ):
        set_levers(*lv)
        p = samples.packed(p_idx)
        labels = p.pop("labels")
        p = {k: v.cuda() if hasattr(v, "cuda") else v for k, v in p.items()}
        with torch.no_grad(), packing_mod.packed_attention(model, p, varlen=True):
            losses[name] = float(labelled_token_loss(model, p, labels)[0])
    out["checks"]["loss_one_pack"] = {k: v for k, v in losses.items()}
    out["checks"]["loss_max_rel_vs_before"] = max(
        abs(v - losses["before"]) / abs(losses["before"]) for v in losses.values()
    )
    print(json.dumps(out["checks"]), file=sys.stderr)

    plan = [
        ("before", (False, False, False, False, "fp32")),
        ("+bf16_pixels", (False, False, False, False, "bf16")),
        ("+pinned", (True, False, False, False, "bf16")),
        ("+gqa_native", (True, True, False, False, "bf16")),
        ("+linear_patch", (True, True, False, True, "bf16")),
    ]
    out["variants"] = {}
    for name, lv in plan:
        set_levers(*lv)
        prof = a.out / f"trace_{name.strip('+')}.json.gz" if name in ("before", "+linear_patch") else None
        try:
            out["variants"][name] = run_variant(model, samples, weights, opt, batches, s, counts["total"], phases, prof)
        except Exception as e:  # noqa: BLE001
            out["variants"][name] = {"error": f"{type(e).__name__}: {e}"[:800]}
        v = out["variants"][name]
        (a.out / "profile.json").write_text(json.dumps(out, indent=1))  # so far: a run stopped at its limit keeps it
        print(
            name,
            json.dumps({k: v.get(k) for k in ("tokens_per_s", "mfu", "peak_mem_gib", "split_s", "error")}),
            file=sys.stderr,
        )
    # fused AdamW (one kernel over all parameters) in place of the foreach default
    set_levers(True, True, False, True, "bf16")
    opt_f = torch.optim.AdamW(weights.opt_params, lr=1e-5, betas=(0.9, 0.98), weight_decay=0.01, fused=True)
    try:
        out["variants"]["+fused_adamw"] = run_variant(
            model, samples, weights, opt_f, batches, s, counts["total"], phases
        )
    except Exception as e:  # noqa: BLE001
        out["variants"]["+fused_adamw"] = {"error": f"{type(e).__name__}: {e}"[:800]}
    print(
        "+fused_adamw",
        json.dumps(out["variants"]["+fused_adamw"].get("split_s")),
        out["variants"]["+fused_adamw"].get("tokens_per_s"),
        file=sys.stderr,
    )
    # the vision cache after one epoch: every sample's features kept, the tower does not run
    from training.vision_cache import VisionFeatures

    samples.cache = {i: dict(e) for i, e in bf16.items()}
    samples.vision = VisionFeatures(model, samples)
    bench.prefill(model, samples, s, len(rows))
    out["variants"]["+vision_cache_epoch2"] = run_variant(
        model, samples, weights, opt_f, batches, s, counts["total"], phases, a.out / "trace_vision_cache.json.gz"
    )
    (a.out / "profile.json").write_text(json.dumps(out, indent=1))
    if a.compile:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        torch._dynamo.config.cache_size_limit = 64
        for layer in base.model.language_model.layers:
            layer.compile(dynamic=True)
        t1 = time.time()
        try:
            out["variants"]["+compile_text_layers"] = run_variant(
                model, samples, weights, opt_f, batches, s, counts["total"], phases
            )
        except Exception as e:  # noqa: BLE001
            out["variants"]["+compile_text_layers"] = {"error": f"{type(e).__name__}: {e}"[:800]}
        out["variants"]["+compile_text_layers"]["wall_with_compile_s"] = round(time.time() - t1, 1)
    out["params"] = counts
    print(json.dumps(out, indent=1))
    (a.out / "profile.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
