"""Benchmark (GPU): MFU of the packed SFT step that runs the vision tower, the last commit's step vs now (session
21: "before" = the session-20 commit's step, session 21's text levers off; --prev s19: session 20's levers off too,
as session 20 compared), side by side in one process; the attention kernels probed first.

    python benchmarks/sft_mfu.py --data EXPORT.parquet [--batch 24] [--pack 24576] [--steps 4] [--pairs 2]
                                 [--out DIR] [--lora] [--dump DIR [--dump-big]] [--no-probe] [--rms-sweep]
                                 [--profile after b4_after] [--groups checks variants b4]
    OUT=DIR bash benchmarks/mfu_gpu.sh        # issue #33's run: this and rl_gpu.py (UNSLOTH=1: sft_unsloth.py too)

Data, model and step are benchmarks/sft_packing.py's: the curate export's screenshots resized to 1280x704 (880 image
tokens each), every sample encoded once before timing, Qwen3-VL with the released 2B shape (random init, bf16, no
gradient checkpointing), full fine-tuning with the vision tower frozen, the fused kernels (training.kernels:
RMSNorm, Liger's SwiGLU/RoPE), `training.sft.train_step` + `optimizer_step` with fused AdamW, --batch samples a
step in packs of at most --pack tokens (varlen flash attention, no pads). The vision cache is off: the tower runs in
every step, as in a first epoch. Prints JSON (also written to --out/sft_mfu.json as it goes):
- `probe`: the text model's causal GQA attention over one pack (16 q / 8 kv heads, head dim 128), fwd and fwd+bwd by
  CUDA events, median of 5: our flash varlen vs cuDNN SDPA one call per sample and on the samples right-padded into
  batches (one, or by length in groups of 4 / 2; native GQA or K/V repeated), and the padded path's differences from
  flash; `probe(..., vision=True)` also the images' attention (session 18);
- `checks`: the fused vision RoPE against the stock function, the tower's outputs with the fast forwards vs stock,
  one pack's loss both ways; `rms_check`: training.kernels.rms_norm and Liger's against an fp32 reference at the
  text model's two widths, with --rms-sweep the backward's launch configurations; `text_check`: one pack's loss and
  gradients with session 20's levers off and on;
- `variants`: tokens/s, MFU = 6 * N * tokens/s / 989 TFLOP/s (N = all parameters, the tower's included, as in every
  earlier SFT row), peak memory and a CUDA-event split (vision forward / text forward / rest = loss + backward /
  optimizer) of, after an untimed `warmup` side, --pairs pairs of `before` (--prev s20: session 21's levers off,
  training.kernels.SESSION21_LEVERS; s19: session 20's off too: Liger's RMSNorm, the stock tower preamble /
  LayerNorm / DeepStack / linears, pageable micro-batch copies, the loss read before the optimizer step) and `after`
  (all on: what the stage runs now); `summary`: mean tokens/s and median step time of each side type, with their
  MFU; --ablate: then `after_no_<lever>` for each of session 21's levers (all on but that one) and `after_last`;
  `s21_check`: one pack's loss and gradients with session 21's levers off and on;
- `profile_after` (`--profile`): torch.profiler's top kernels of one step and `gpu_gaps`, where the GPU idles;
- `b4`: the same step at 4 samples a step (one pack) before/after twice (--groups b4);
- `lora` (--lora): LoRA r16 (bf16 adapters, fp32 masters, no dropout) before/after pairs, `lora_summary`;
- --dump DIR: the random-init model folder and the 4-sample padded batches (SFTCollator.pad) of the B4 stream, for
  benchmarks/sft_unsloth.py (Unsloth and Trainer + Liger on the image's transformers).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

PEAK_BF16 = 989e12


def vision_levers(model, rope_attention: bool = True, gelu: bool = True, sdpa: tuple[str, ...] | None = None):
    """The fast_vision forwards taken off the model, then bound again with the chosen levers."""
    import training.kernels as K

    for mod in model.modules():
        f = mod.__dict__.get("forward")
        if f is not None and getattr(f, "__func__", None) in (K._vision_attn_forward, K._vision_mlp_forward):
            del mod.forward
    if sdpa:
        K.vision.VISION_SDPA = tuple(sdpa)
    K.VISION_LEVERS.update(rope_attention=rope_attention, gelu_epilogue=gelu)
    try:
        return K.fast_vision(model)
    finally:
        K.VISION_LEVERS.update(rope_attention=True, gelu_epilogue=True)


def _events_ms(fn, reps: int = 5, warm: int = 2) -> float:
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return round(sorted(times)[len(times) // 2], 3)


def _try(fn):
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - a backend that cannot run is a result
        return {"error": f"{type(e).__name__}: {e}"[:300]}


def padded_text_attention(q, k, v, lengths: list[int], group: int, gqa: bool):
    """Causal attention of the packed samples on cuDNN SDPA, the samples right-padded into batches of `group`
    (sorted by length; 0 = one batch): a real query never sees a pad key (the pads come after it), so no mask is
    needed; the pads' outputs are dropped. q [T, Hq, D], k/v [T, Hk, D] -> [T, Hq, D]."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    size = group or len(order)
    outs, inv = [], torch.empty(sum(lengths), dtype=torch.long)
    base = 0
    hq, hk = q.shape[1], k.shape[1]
    for g0 in range(0, len(order), size):
        grp = order[g0 : g0 + size]
        lmax = lengths[grp[0]]
        src = torch.zeros(len(grp) * lmax, dtype=torch.long)
        for j, i in enumerate(grp):
            src[j * lmax : j * lmax + lengths[i]] = torch.arange(starts[i], starts[i] + lengths[i])
            inv[starts[i] : starts[i] + lengths[i]] = torch.arange(lengths[i]) + base + j * lmax
        src = src.to(q.device, non_blocking=True)
        qp, kp, vp = (x.index_select(0, src).view(len(grp), lmax, x.shape[1], -1).transpose(1, 2) for x in (q, k, v))
        if not gqa and hq != hk:
            kp, vp = (x.repeat_interleave(hq // hk, dim=1) for x in (kp, vp))
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=gqa and hq != hk)
        outs.append(o.transpose(1, 2).reshape(len(grp) * lmax, hq, -1))
        base += len(grp) * lmax
    return torch.cat(outs).index_select(0, inv.to(q.device, non_blocking=True))


def probe(n_images: int, text_lengths: list[int], vision: bool = False) -> dict:
    """Attention kernels at the run's shapes (random bf16 inputs); the images' part only with `vision` (session 18
    measured it)."""
    import torch.nn.functional as F

    import training.kernels as K

    out: dict = {"vision": {"images": n_images, "tokens_per_image": 3520, "heads": 16, "head_dim": 64}}
    if not vision:
        return probe_text(text_lengths, out)
    t, h, d = n_images * 3520, 16, 64
    q, k, v = (torch.randn(t, h, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    lengths = [3520] * n_images
    flops = 4 * n_images * 3520**2 * h * d

    def per_image():
        qs, ks, vs = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # as the stock tower lays them out
        splits = [torch.split(x, lengths, dim=2) for x in (qs, ks, vs)]
        return torch.cat([F.scaled_dot_product_attention(a, b, c) for a, b, c in zip(*splits)], dim=2)

    ms = _events_ms(per_image)
    out["vision"]["per_image_default_ms"] = ms
    out["vision"]["per_image_default_tflops"] = round(flops / ms / 1e9, 1)
    for name in ("cudnn", "flash", "efficient"):
        K.vision.VISION_SDPA = (name,)
        r = _try(lambda: _events_ms(lambda: K.image_attention(q, k, v, lengths, d**-0.5)))
        out["vision"][f"batched_{name}_ms"] = r
        if isinstance(r, float):
            out["vision"][f"batched_{name}_tflops"] = round(flops / r / 1e9, 1)
    K.vision.VISION_SDPA = ("cudnn", "flash", "efficient")
    return probe_text(text_lengths, out)


def probe_text(text_lengths: list[int], out: dict) -> dict:
    """The text model's causal GQA attention over one pack: our flash varlen (FA2) vs cuDNN SDPA one call per sample
    and on right-padded batches of samples (pad/unpad copies included), fwd and fwd+bwd; the largest output and
    gradient differences against FA2 for the padded cuDNN ones."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from training.packing import _FlashVarlen

    tt = sum(text_lengths)
    cu = torch.tensor([0] + text_lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32).cuda()
    mx = max(text_lengths)
    q = torch.randn(tt, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(tt, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    g = torch.randn(tt, 16, 128, device="cuda", dtype=torch.bfloat16)
    tflops_fwd = sum(2 * n * n * 16 * 128 for n in text_lengths)  # causal: half of 4 n^2 h d

    def fa2(bwd: bool):
        o = _FlashVarlen.apply(q, k, v, cu, cu, mx, mx, True, 128**-0.5)
        if bwd:
            o.backward(g)

    def cudnn(bwd: bool):
        outs, a = [], 0
        with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
            for n in text_lengths:
                qs = q[a : a + n].transpose(0, 1)[None]
                ks, vs = (x[a : a + n].repeat_interleave(2, dim=1).transpose(0, 1)[None] for x in (k, v))
                outs.append(F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)[0].transpose(0, 1))
                a += n
        o = torch.cat(outs)
        if bwd:
            o.backward(g)

    def padded(group: int, gqa: bool):
        def fn(bwd: bool):
            o = padded_text_attention(q, k, v, text_lengths, group, gqa)
            if bwd:
                o.backward(g)
            return o

        return fn

    out["text"] = {"pack_tokens": tt, "samples": len(text_lengths), "lengths": text_lengths}
    runs = [("fa2_varlen", fa2), ("cudnn_per_sample", cudnn)]
    runs += [
        (f"cudnn_padded_g{n}{'' if gqa else '_repeat'}", padded(n, gqa)) for n in (0, 4, 2) for gqa in (True, False)
    ]
    for name, fn in runs:
        f = _try(lambda: _events_ms(lambda: fn(False)))
        fb = _try(lambda: _events_ms(lambda: fn(True)))
        out["text"][f"{name}_fwd_ms"] = f
        out["text"][f"{name}_fwd_bwd_ms"] = fb
        if isinstance(f, float):
            out["text"][f"{name}_fwd_tflops"] = round(tflops_fwd / f / 1e9, 1)
        if isinstance(fb, float):
            out["text"][f"{name}_fwd_bwd_tflops"] = round(3.5 * tflops_fwd / fb / 1e9, 1)  # bwd ~2.5x fwd

    def check() -> list[float]:  # the padded cuDNN path against FA2: output, dq, dk, dv (max |diff| / max |ref|)
        res = []
        for fn in (
            lambda: _FlashVarlen.apply(q, k, v, cu, cu, mx, mx, True, 128**-0.5),
            lambda: padded_text_attention(q, k, v, text_lengths, 4, True),
        ):
            q.grad = k.grad = v.grad = None
            o = fn()
            o.backward(g)
            res.append([o.detach().float()] + [x.grad.float() for x in (q, k, v)])
        return [round(float((x - y).abs().max() / y.abs().max()), 5) for x, y in zip(res[1], res[0])]

    out["text"]["cudnn_padded_g4_vs_fa2_max_rel"] = _try(check)
    return out


def _flat(x) -> list:
    if torch.is_tensor(x):
        return [x]
    if hasattr(x, "values") and not isinstance(x, dict):
        x = list(x.values())
    elif isinstance(x, dict):
        x = list(x.values())
    if isinstance(x, (list, tuple)):
        return [t for y in x for t in _flat(y)]
    return []


def checks(model, samples, idx: list[int]) -> dict:
    """The fast vision forwards against the stock ones, on the GPU (bf16)."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

    import training.packing as packing_mod
    from training.kernels import vision_rope
    from training.losses import labelled_token_loss

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    out: dict = {}
    g = torch.Generator(device="cuda").manual_seed(0)
    qkv = torch.randn(7040, 3, 16, 64, device="cuda", dtype=torch.bfloat16, generator=g) * 3
    ang = torch.rand(7040, 32, device="cuda", generator=g) * 50
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
    fq, fk = vision_rope(qkv[:, 0], qkv[:, 1], cos, sin)
    rq, rk = apply_rotary_pos_emb_vision(qkv[:, 0], qkv[:, 1], cos, sin)
    out["rope_bitwise_equal_share"] = round(float(((fq == rq).float().mean() + (fk == rk).float().mean()) / 2), 6)
    out["rope_max_abs_diff"] = float(torch.maximum((fq.float() - rq.float()).abs().max(), (fk - rk).abs().max()))
    pp = samples.packed(idx, pin=True)["pixel_values"]  # the kept pixel_values are page-locked here
    ref = torch.cat([samples.unpinned[i]["pixel_values"] for i in idx])
    out["pinned_rows"] = type(pp).__name__
    out["pinned_rows_equal"] = bool(torch.equal(pp.to("cuda", non_blocking=True).cpu(), ref))
    p = samples.packed(idx)
    labels = p.pop("labels")
    p = {k: v.cuda() if hasattr(v, "cuda") else v for k, v in p.items()}
    res = {}
    import training.kernels as K

    for name, on in (("stock", False), ("fast", True)):
        vision_levers(model, on, on)
        K.VISION_LEVERS["add_layer_norm"] = on  # session 21's block fusion: off on the stock side too
        with torch.no_grad():
            res[name] = [
                t.float()
                for t in _flat(base.model.visual(p["pixel_values"], grid_thw=p["image_grid_thw"]))
                if t.is_floating_point()
            ]
            with packing_mod.packed_attention(model, p, varlen=True):
                out[f"loss_one_pack_{name}"] = float(labelled_token_loss(model, p, labels)[0])
    K.VISION_LEVERS["add_layer_norm"] = True
    out["tower_outputs_rel_l2"] = [
        round(float((a - b).norm() / b.norm().clamp_min(1e-12)), 6) for a, b in zip(res["fast"], res["stock"])
    ]
    out["tower_output_shapes"] = [list(t.shape) for t in res["stock"]]
    out["loss_rel_diff"] = abs(out["loss_one_pack_fast"] - out["loss_one_pack_stock"]) / abs(out["loss_one_pack_stock"])
    return out


def rms_check(sweep: bool = False) -> dict:
    """training.kernels.rms_norm (ours) and Liger's against an fp32 reference of the stock math, bf16 inputs at the
    text model's two shapes (hidden norms over a 24,576-token pack; q_norm over its 16 heads x 128): max |diff| over
    max |ref| of y, dx, dw, and fwd+bwd time (CUDA events, median of 5)."""
    import training.kernels as K

    out: dict = {}
    for shape, (m, n) in {"hidden": (24576, 2048), "q_norm": (24576 * 16, 128)}.items():
        g = torch.Generator(device="cuda").manual_seed(0)
        x = (torch.randn(m, n, device="cuda", generator=g) * 2).to(torch.bfloat16)
        w = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
        xr, wr = x.float().requires_grad_(), w.float().requires_grad_()
        (wr * (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6))).backward(dy.float())
        ref = {"dx": xr.grad, "dw": wr.grad}
        with torch.no_grad():
            ref["y"] = wr * (xr * torch.rsqrt(xr.pow(2).mean(-1, keepdim=True) + 1e-6))
        del xr, wr
        out[shape] = {}
        for impl in ("ours", "liger"):
            K.TEXT_LEVERS["rms_norm"] = impl == "ours"
            xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = K.rms_norm(xi, wi, 1e-6)
            y.backward(dy.clone())  # Liger writes dx into dy's buffer
            got = {"y": y.detach(), "dx": xi.grad, "dw": wi.grad}
            r = {k: round(float((got[k].float() - ref[k]).abs().max() / ref[k].abs().max()), 6) for k in ref}

            def step(xi=xi, wi=wi):
                xi.grad = wi.grad = None
                K.rms_norm(xi, wi, 1e-6).backward(dy.clone())

            r["fwd_bwd_ms"] = _events_ms(step)
            out[shape][impl] = r
            del y, got
        K.TEXT_LEVERS["rms_norm"] = True
        if sweep:  # the backward's launch configurations at this width (training.kernels.RMS_BWD_CONFIG)
            block_n = K._rms_blocks(n)[0]
            keep = K.RMS_BWD_CONFIG.get(block_n)
            xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
            y = K.rms_norm(xi, wi, 1e-6)
            res = []

            def bwd_once(y=y, xi=xi, wi=wi):
                return torch.autograd.grad(y, (xi, wi), dy, retain_graph=True)

            for bm in (1, 2, 4, 8, 16, 32, 64, 128):
                if not 1024 <= bm * block_n <= 16384 and bm != 1:
                    continue
                for per_sm in (2, 4, 8):
                    for warps in (4, 8, 16):
                        for acc2d in (False, True):
                            K.RMS_BWD_CONFIG[block_n] = (bm, per_sm, warps, acc2d)
                            ms = _try(lambda: _events_ms(bwd_once))
                            res.append([bm, per_sm, warps, acc2d, ms])
            if keep is None:
                K.RMS_BWD_CONFIG.pop(block_n, None)
            else:
                K.RMS_BWD_CONFIG[block_n] = keep
            ok = sorted((r for r in res if isinstance(r[-1], float)), key=lambda r: r[-1])
            out[shape]["bwd_sweep_best"] = ok[:8]
            out[shape]["bwd_current_ms"] = next((r[-1] for r in res if tuple(r[:4]) == tuple(keep or ())), None)
            del y, xi, wi
    return out


def text_check(model, samples, idx: list[int], which: str = "s20") -> dict:
    """One pack's loss and a few parameters' gradients with the text levers off (Liger's RMSNorm) and on (ours):
    relative loss difference, and per parameter the cosine and the norm ratio of the gradients. `which` "s21":
    session 21's levers off and on, session 20's on in both."""
    import training.packing as packing_mod
    from training.losses import labelled_token_loss

    names = [n for n, p in model.named_parameters() if p.requires_grad and ("norm" in n or "layers.0." in n)]
    names = names[:12] + [n for n, p in model.named_parameters() if p.requires_grad and "layers.27.mlp" in n]
    names += [n for n, p in model.named_parameters() if p.requires_grad and "layers.27.self_attn" in n]
    params = dict(model.named_parameters())
    p = samples.packed(idx)
    labels = p.pop("labels")
    p = {k: v.cuda() if hasattr(v, "cuda") else v for k, v in p.items()}
    got = {}
    for on in (False, True):
        use(model, samples, True, True, text=on if which == "s20" else True, s21=on)
        model.zero_grad(set_to_none=True)
        with packing_mod.packed_attention(model, p, varlen=True):
            loss = labelled_token_loss(model, p, labels)[0]
        loss.backward()
        got[on] = (float(loss), {n: params[n].grad.float().clone() for n in names if params[n].grad is not None})
    model.zero_grad(set_to_none=True)
    use(model, samples, True, True, text=True)
    (l0, g0), (l1, g1) = got[False], got[True]
    cos = {
        n: round(float(torch.nn.functional.cosine_similarity(g0[n].flatten(), g1[n].flatten(), dim=0)), 6) for n in g0
    }
    ratio = {n: round(float(g1[n].norm() / g0[n].norm().clamp_min(1e-30)), 6) for n in g0}
    return {
        "loss_text_off": l0,
        "loss_text_on": l1,
        "loss_rel_diff": abs(l1 - l0) / abs(l0),
        "grad_cos_min": min(cos.values()) if cos else None,
        "grad_norm_ratio_range": [min(ratio.values()), max(ratio.values())] if ratio else None,
        "grad_cos": cos,
    }


def make_samples(model, proc, rows, encoded):
    """EncodedSamples with every sample kept, as the stage keeps them on CUDA (bf16 pixel_values in page-locked
    slabs); `samples.unpinned` holds the same encodings with pageable pixel_values, as the last commit kept them."""
    import training.packing as packing_mod
    from training.data import SFTCollator
    from training.sft import EncodedSamples

    positions = packing_mod.rope_positions_fn(model)
    samples = EncodedSamples(rows, SFTCollator(proc), positions=positions, max_bytes=1 << 40, pin=True)
    samples.unpinned = {
        i: dict(e, pixel_values=e["pixel_values"].to(torch.bfloat16), position_ids=positions(e))
        for i, e in enumerate(encoded)
    }
    samples.pinned_cache = {i: samples.pinned(dict(e)) for i, e in samples.unpinned.items()}
    samples.cache = samples.pinned_cache
    return samples


def use(
    model,
    samples,
    levers: bool,
    pinned: bool,
    rope_attention: bool | None = None,
    gelu: bool | None = None,
    text: bool | None = None,
    s21: bool | str | None = None,
):
    """The step before issue #33 (levers False, pinned False), with its levers (both True), or a mix; `text`
    (default: `levers`) switches session 20's text-model levers (training.kernels.TEXT_LEVERS: our RMSNorm kernels
    instead of Liger's, the fused LoRA linear, ...), `s21` (default: `text`) session 21's (SESSION21_LEVERS: the q/k
    norm + RoPE kernel, the input norm keeping the residual, Liger's MLP as a shared-input group, ...); a lever's
    name for `s21`: all of session 21's on but that one."""
    import training.kernels as K
    import training.losses as losses_mod
    import training.sft as sft_mod

    on = levers if text is None else text
    on21 = on if s21 is None else bool(s21)
    K.TEXT_LEVERS.update(rms_norm=on, lora=on, deepstack=on, shared_input=on, add_norm=on)
    K.TEXT_LEVERS.update({k: on21 and k != s21 for k in K.SESSION21_LEVERS})
    K.VISION_LEVERS.update({k: on21 and k != s21 for k in K.SESSION21_VISION_LEVERS})
    K.VISION_LEVERS.update(grid_cache=on, layer_norm=on)
    losses_mod.HOST_INDEX = sft_mod.PIN_BATCH = sft_mod.DEFER_LOSS = on
    samples.cache = samples.pinned_cache if pinned else samples.unpinned
    got = vision_levers(model, levers if rope_attention is None else rope_attention, levers if gelu is None else gelu)
    s20 = ["s20_rms_norm", "s20_lora", "s20_deepstack", "s20_shared_input", "s20_grid_cache", "s20_layer_norm"]
    s20 += ["s20_add_rms_norm", "s20_host_loss_index"]
    s21_names = [f"s21_{k}" for k in K.SESSION21_LEVERS + K.SESSION21_VISION_LEVERS if on21 and k != s21]
    return got + (s20 + ["s20_pinned_batch", "s20_deferred_loss_read"] if on else []) + s21_names


def _sides(v: dict, k: str) -> list[dict]:
    """The `k` sides ("before" / "after") of every pair: k, k_again, k_3, ..."""
    names = [k, f"{k}_again"] + sorted(n for n in v if n.startswith(f"{k}_") and n[len(k) + 1 :].isdigit())
    return [v[n] for n in names if "tokens_per_s" in v.get(n, {})]


def summarize(v: dict, n_params: int) -> dict:
    """Before vs after over the pairs: mean tokens/s (sum of tokens over sum of step times per side, averaged over
    the sides) and the median step time over all sides' timed steps, with the MFU of each."""
    mean = {k: sum(x["tokens_per_s"] for x in _sides(v, k)) / len(_sides(v, k)) for k in ("before", "after")}
    out = {
        "tokens_per_s_before": round(mean["before"], 1),
        "tokens_per_s_after": round(mean["after"], 1),
        "speedup": round(mean["after"] / mean["before"], 3),
        "mfu_before": round(6 * n_params * mean["before"] / PEAK_BF16, 3),
        "mfu_after": round(6 * n_params * mean["after"] / PEAK_BF16, 3),
    }
    for k in ("before", "after"):
        sides = _sides(v, k)
        steps = sorted(t for x in sides for t in x["step_times"])
        med = (steps[(len(steps) - 1) // 2] + steps[len(steps) // 2]) / 2
        tok = sum(x["tokens_per_step"] for x in sides) / len(sides)
        out[f"median_step_s_{k}"] = round(med, 4)
        out[f"mfu_median_step_{k}"] = round(6 * n_params * tok / med / PEAK_BF16, 3)
        out[f"timed_steps_{k}"] = len(steps)
    return out


def run_side(model, samples, batches, s, n_params, phases, profile: Path | None = None) -> dict:
    from benchmarks.sft_profile import run_variant
    from training.core import TrainableWeights
    from training.sft import _optimizer

    weights = TrainableWeights(model, master=s.method == "lora")
    opt = _optimizer(weights, s)
    try:
        return run_variant(model, samples, weights, opt, batches, s, n_params, phases, profile)
    finally:
        del opt, weights
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--size", default="2b")
    ap.add_argument("--batch", type=int, default=24)
    ap.add_argument("--pack", type=int, default=24576)
    ap.add_argument("--steps", type=int, default=4, help="timed steps a side (after one untimed)")
    ap.add_argument("--b4-steps", type=int, default=8)
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--lora", action="store_true", help="also LoRA r16 before/after")
    ap.add_argument("--profile", nargs="*", default=["before", "after"], help="torch.profiler of one step of these")
    ap.add_argument("--probe", action=argparse.BooleanOptionalAction, default=True, help="attention kernel probes")
    ap.add_argument("--dump", type=Path, default=None, help="model folder + B4 padded batches for sft_unsloth.py")
    ap.add_argument("--dump-big", action="store_true", help="--dump also the --batch stream padded (b24.pt)")
    ap.add_argument(
        "--groups", nargs="+", default=["checks", "variants", "b4"], help="what to run (checks variants b4)"
    )
    ap.add_argument("--pairs", type=int, default=2, help="before/after pairs in `variants` (and `lora`)")
    ap.add_argument("--rms-sweep", action="store_true", help="checks: time the RMSNorm backward's launch configs")
    ap.add_argument("--ablate", action="store_true", help="variants: also all on but one of session 21's levers")
    ap.add_argument(
        "--prev",
        choices=("s20", "s19"),
        default="s20",
        help="the 'before' sides: s20 = the session-20 commit's step (session 21's levers off); s19 = session 20's "
        "text levers off too",
    )
    ap.add_argument("--out", type=Path, default=Path("."))
    a = ap.parse_args()
    import dataclasses

    import transformers

    import benchmarks.sft_packing as bench
    from benchmarks.sft_profile import Phases
    from training.kernels import apply_fused_kernels, linear_patch_embed
    from training.sft import TrainSettings

    a.out.mkdir(parents=True, exist_ok=True)
    dest = a.out / "sft_mfu.json"
    t0 = time.time()
    rows, encoded = bench.encode_all(a.data, a.size, (1280, 704), a.workers)
    lengths = sorted(int(e["input_ids"].shape[1]) for e in encoded)
    n_img = [int(e["image_grid_thw"].shape[0]) for e in encoded]
    out: dict = {
        "benchmark": "sft_mfu",
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "encode_s": round(time.time() - t0, 1),
        "data": {
            "samples": len(rows),
            "tokens_min": lengths[0],
            "tokens_median": lengths[len(lengths) // 2],
            "tokens_max": lengths[-1],
            "tokens_mean": round(sum(lengths) / len(lengths), 1),
            "images_per_sample": {str(k): n_img.count(k) for k in sorted(set(n_img))},
        },
        "batch": a.batch,
        "pack": a.pack,
        "steps": a.steps,
    }

    def save():
        dest.write_text(json.dumps(out, indent=1))

    def log(*x):
        print(f"[{time.time() - t0:6.0f}s]", *x, file=sys.stderr, flush=True)

    batches = bench.stream(len(rows), a.batch, 1 + a.steps, seed=1)
    b4 = bench.stream(len(rows), 4, 1 + a.b4_steps, seed=0)
    from training.packing import plan_packs

    lens0 = [int(encoded[i]["input_ids"].shape[1]) for i in batches[0]]
    first = [batches[0][j] for j in sorted(plan_packs(lens0, a.pack)[0])]  # the first step's first pack
    pack_lengths = [int(encoded[i]["input_ids"].shape[1]) for i in first]
    pack_images = sum(int(encoded[i]["image_grid_thw"].shape[0]) for i in first)
    if a.probe:
        out["probe"] = _try(lambda: probe(pack_images, pack_lengths))
        log("probe", json.dumps(out["probe"]))
        save()

    out["kernels"] = apply_fused_kernels("qwen3-vl")
    model, proc, counts = bench.build(a.size, "full", peft_default=False)
    out["params"] = counts
    if a.dump:
        a.dump.mkdir(parents=True, exist_ok=True)
        t1 = time.time()
        model.save_pretrained(a.dump / "model")
        proc.save_pretrained(a.dump / "model")
        from training.data import SFTCollator

        col = SFTCollator(proc)
        for name, stream_ in (("b4", b4), ("b24", batches if a.dump_big else [])):
            padded = []
            for idx in stream_:
                b = col.pad([encoded[i] for i in idx])
                b["pixel_values"] = b["pixel_values"].to(torch.bfloat16)
                padded.append(b)
            if padded:
                torch.save(padded, a.dump / f"{name}.pt")
        out["dump_s"] = round(time.time() - t1, 1)
        log("dumped", out["dump_s"])
    linear_patch_embed(model)
    from training.kernels import fast_lora, fast_text

    out["text_bound"] = fast_lora(model) + fast_text(model)  # as training.sft binds them on CUDA
    samples = make_samples(model, proc, rows, encoded)
    phases = Phases(model)
    s = TrainSettings(method="full", batch_size=a.batch, packing=True, pack_tokens=a.pack, lora_dropout=0.0, lr=1e-5)
    if "checks" in a.groups:
        out["checks"] = _try(lambda: checks(model, samples, first[:8]))
        log("checks", json.dumps(out["checks"]))
        out["rms_check"] = _try(lambda: rms_check(a.rms_sweep))
        log("rms_check", json.dumps(out["rms_check"]))
        vision_levers(model, True, True)
        out["text_check"] = _try(lambda: text_check(model, samples, first))
        log("text_check", json.dumps({k: v for k, v in out["text_check"].items() if k != "grad_cos"}))
        out["s21_check"] = _try(lambda: text_check(model, samples, first, which="s21"))
        log("s21_check", json.dumps(out["s21_check"]))
        save()
    use(model, samples, True, True)

    # (name, fast_vision levers, pinned pixel parts, rope+attention / GELU override, text levers, session-21
    # levers): session 21 compares the last commit (session 20's levers on, session 21's off) with all on
    # (--prev s19: session 20's text levers off in "before" too, as session 20 compared)
    text_prev = a.prev == "s20"
    plan = [
        ("warmup", True, True, None, True, True),  # untimed: clocks, cuDNN plans, the allocator's pools
        ("before", True, True, None, text_prev, False),
        ("after", True, True, None, True, True),
        ("before_again", True, True, None, text_prev, False),
        ("after_again", True, True, None, True, True),
    ]
    for k in range(3, a.pairs + 1):
        plan += [(f"before_{k}", True, True, None, text_prev, False), (f"after_{k}", True, True, None, True, True)]
    if a.ablate:  # all on but one of session 21's levers, after the pairs
        import training.kernels as K

        plan += [(f"after_no_{k}", True, True, None, True, k) for k in K.SESSION21_LEVERS + K.SESSION21_VISION_LEVERS]
        plan += [("after_last", True, True, None, True, True)]
    out["prev"] = a.prev
    out["variants"] = {}
    for name, lev, pin, over, text, s21 in plan if "variants" in a.groups else []:
        out["variants"][name] = res = _try(
            lambda: dict(
                levers=use(model, samples, lev, pin, *(over or (None, None)), text=text, s21=s21),
                pinned_pixels=pin,
                **run_side(model, samples, batches, s, counts["total"], phases),
            )
        )
        log(name, json.dumps({k: res.get(k) for k in ("tokens_per_s", "mfu", "peak_mem_gib", "split_s", "error")}))
        save()
    s4 = dataclasses.replace(s, batch_size=4)
    for name in a.profile:  # "after", "before", "b4_after" (4 samples a step)
        use(model, samples, name.endswith("after"), name.endswith("after"))
        bs, ss = (b4, s4) if name.startswith("b4") else (batches, s)
        out[f"profile_{name}"] = _try(
            lambda: run_side(model, samples, bs[:2], ss, counts["total"], phases, Path(f"/tmp/trace_{name}.json.gz"))[
                "profile"
            ]
        )
        p = out[f"profile_{name}"]
        log(f"profile_{name}", json.dumps({k: p.get(k) for k in ("wall_s", "gpu_kernel_s", "gpu_busy_fraction")}))
        save()
    out["b4"] = {}
    b4_plan = (("before", False), ("after", True), ("before_again", False), ("after_again", True))
    for name, on in b4_plan if "b4" in a.groups else []:
        use(model, samples, on, on)
        out["b4"][name] = r = _try(lambda: run_side(model, samples, b4, s4, counts["total"], phases))
        log("b4", name, json.dumps({k: r.get(k) for k in ("tokens_per_s", "mfu", "peak_mem_gib", "error")}))
        save()
    if a.lora:
        del model, samples
        torch.cuda.empty_cache()
        model, proc, lcounts = bench.build(a.size, "lora", peft_default=False)  # bf16 adapters, fp32 masters
        linear_patch_embed(model)
        out["lora_bound"] = fast_lora(model) + fast_text(model)  # as training.sft binds them on CUDA
        samples = make_samples(model, proc, rows, encoded)
        phases = Phases(model)
        sl = dataclasses.replace(s, method="lora")
        out["lora"] = {"params": lcounts}
        lplan = [("before", False), ("after", True), ("before_again", False), ("after_again", True)]
        for k in range(3, a.pairs + 1):
            lplan += [(f"before_{k}", False), (f"after_{k}", True)]
        for name, on in lplan:
            bs, ss = batches, sl
            use(model, samples, True, True, text=on or text_prev, s21=on)
            out["lora"][name] = r = _try(lambda: run_side(model, samples, bs, ss, lcounts["total"], phases))
            log("lora", name, json.dumps({k: r.get(k) for k in ("tokens_per_s", "mfu", "peak_mem_gib", "error")}))
            save()
    for key, v, n in (("summary", out["variants"], counts["total"]), ("lora_summary", out.get("lora", {}), None)):
        if all("tokens_per_s" in v.get(k, {}) for k in ("before", "after", "before_again", "after_again")):
            out[key] = summarize(v, n or out["lora"]["params"]["total"])
    out["target"] = {"mfu": 0.5}
    save()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
