"""Optional fused GPU kernels for training (Liger's RMSNorm, RoPE and SwiGLU), behind an import guard.

    applied = apply_fused_kernels("qwen3-vl")   # SFT: before building/loading the model; [] when unavailable
    applied = fuse_model(model)                 # RL: into a model already built (its own modules); [] when unavailable
    unfuse_model(model)                         # back to the stock forwards
    linear_patch_embed(model)                   # the vision patch embedding as one matrix product (CPU and CUDA)
    applied = fast_vision(model)                # the frozen vision tower's no-grad forward in fewer passes (CUDA)
    applied = fast_lora(model)                  # PEFT's LoRA linears as one autograd function each (CUDA)
    applied = fast_text(model)                  # DeepStack's adds without host syncs, shared-input linears (CUDA)
    y = rms_norm(x, weight, eps)                # RMSNorm: this module's Triton kernels on CUDA, else Liger's / torch

Only on CUDA with `liger-kernel` installed (its kernels are Triton). We swap the transformers
module-level pieces ourselves from Liger's public components rather than calling its
`apply_liger_kernel_to_*` helpers, which in liger-kernel 0.8.5 fail to import for Qwen3-VL
(a missing output class). The loss side needs no kernel: the SFT loss projects only labelled
positions (training.losses.labelled_token_loss).

`fuse_model` is for a model that exists before the trainer does (the RL stage loads its checkpoint first): it
binds fused forwards onto that model's own RMSNorm and MLP modules (same parameters, same names, PEFT's LoRA
wrappers inside the MLP untouched) and routes the module's RoPE function to Liger's for CUDA tensors (CPU
tensors keep the stock function). The math is the stock modules' (llama-style RMSNorm: fp32 inverse RMS, cast,
times the weight; silu(gate) * up; rotate-half RoPE); only the rounding of fused ops can differ.
"""

from __future__ import annotations

from types import MethodType

_RMS_CLASSES = ("Qwen3VLTextRMSNorm", "Qwen2RMSNorm", "Qwen2_5_VLRMSNorm")  # the stock classes SFT swaps too
_MLP_CLASSES = ("Qwen3VLTextMLP", "Qwen2MLP")
_STOCK_ROPE: dict[str, object] = {}  # transformers module name -> its own apply_rotary_pos_emb


def apply_fused_kernels(arch: str) -> list[str]:
    """Patch the transformers modules of `arch` with fused kernels; returns what was applied."""
    import torch

    if not torch.cuda.is_available():
        return []
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
        from liger_kernel.transformers.rope import liger_rotary_pos_emb
        from liger_kernel.transformers.swiglu import LigerSwiGLUMLP
    except ImportError:
        return []
    if arch == "qwen3-vl":
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m

        m.Qwen3VLTextRMSNorm, m.Qwen3VLTextMLP = rms_norm_class(), LigerSwiGLUMLP  # rms_norm: ours, else Liger's
    elif arch == "qwen2.5-vl":
        from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as m

        m.Qwen2_5_VLRMSNorm, m.Qwen2MLP = LigerRMSNorm, LigerSwiGLUMLP  # vision norms too: same op
        return ["rms_norm", "swiglu"]  # Qwen2.5-VL's multimodal RoPE has its own signature
    else:
        return []
    m.apply_rotary_pos_emb = liger_rotary_pos_emb
    return ["rms_norm", "swiglu", "rope"]


# ------------------------------------------------------------------------------------------------ built models
def _rms_forward(self, hidden_states):
    return rms_norm(hidden_states, self.weight, self.variance_epsilon)  # this module's kernels, else Liger's


def _swiglu_forward(self, x):
    from liger_kernel.ops import LigerSiLUMulFunction

    return self.down_proj(LigerSiLUMulFunction.apply(self.gate_proj(x), self.up_proj(x), 1.0, 1.0))


def _rope(q, k, cos, sin, unsqueeze_dim=1):
    """Qwen3-VL's apply_rotary_pos_emb: Liger's kernel on CUDA tensors, the stock function otherwise."""
    if q.is_cuda:
        from liger_kernel.transformers.rope import liger_rotary_pos_emb

        return liger_rotary_pos_emb(q, k, cos, sin, None, unsqueeze_dim)
    return _STOCK_ROPE["transformers.models.qwen3_vl.modeling_qwen3_vl"](q, k, cos, sin, unsqueeze_dim=unsqueeze_dim)


def fuse_model(model) -> list[str]:
    """Fused RMSNorm / SwiGLU forwards bound onto `model`'s own modules (and Qwen3-VL's RoPE routed to Liger for
    CUDA tensors); returns what was applied: [] unless the model's weights are on CUDA and liger-kernel imports.
    Idempotent; deep copies (an RL teacher) keep the fused forwards."""
    params = next(model.parameters(), None)
    if params is None or not params.is_cuda:
        return []
    try:
        import liger_kernel.ops  # noqa: F401
        from liger_kernel.transformers.rope import liger_rotary_pos_emb  # noqa: F401
    except ImportError:
        return []
    applied: set[str] = set()
    for mod in model.modules():
        name = type(mod).__name__
        if name in _RMS_CLASSES and hasattr(mod, "variance_epsilon"):
            mod.forward = MethodType(_rms_forward, mod)
            applied.add("rms_norm")
        elif (
            name in _MLP_CLASSES
            and getattr(getattr(mod, "config", None), "hidden_act", None) in ("silu", "swish")
            and all(hasattr(mod, p) for p in ("gate_proj", "up_proj", "down_proj"))
        ):
            mod.forward = MethodType(_swiglu_forward, mod)
            applied.add("swiglu")
        if name.startswith("Qwen3VL"):
            applied |= _fuse_rope()
    return sorted(applied)


def _fuse_rope() -> set[str]:
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    if m.apply_rotary_pos_emb is not _rope:
        _STOCK_ROPE[m.__name__] = m.apply_rotary_pos_emb
        m.apply_rotary_pos_emb = _rope
    return {"rope"}


def unfuse_model(model) -> None:
    """Undo `fuse_model`, `fast_vision` and `linear_patch_embed`: the modules' own class forwards again, and the
    stock RoPE function (for every model)."""
    for mod in model.modules():
        fwd = mod.__dict__.get("forward")
        if fwd is not None and getattr(fwd, "__func__", None) in (
            _rms_forward,
            _swiglu_forward,
            _vision_attn_forward,
            _vision_mlp_forward,
            _patch_linear_forward,
            _lora_forward,
            _vision_model_forward,
            _layer_norm_forward,
            _deepstack_process,
            _shared_input_forward,
            _decoder_layer_forward,
        ):
            del mod.forward
        mod.__dict__.pop("_flywheel_group", None)
        ds = mod.__dict__.get("_deepstack_process")
        if ds is not None and getattr(ds, "__func__", None) is _deepstack_process:
            del mod._deepstack_process
    if _STOCK_ROPE:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m

        if m.apply_rotary_pos_emb is _rope:
            m.apply_rotary_pos_emb = _STOCK_ROPE[m.__name__]


# ------------------------------------------------------------------------------------------------ patch embedding
_PATCH_CLASSES = ("Qwen3VLVisionPatchEmbed", "Qwen2_5_VisionPatchEmbed", "PatchEmbed")


def _patch_linear_forward(self, hidden_states):
    import torch.nn.functional as F

    w = self.proj.weight  # [E, C, T, P, P]: the Conv3d's kernel covers one whole patch, with stride = kernel
    return F.linear(hidden_states.reshape(-1, w[0].numel()).to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


def linear_patch_embed(model) -> bool:
    """The vision tower's patch embedding (a Conv3d whose kernel and stride are one whole patch, fed one patch a
    row) as the matrix product it is: each output is the dot product of the patch's C*T*P*P values, in the same
    (C, T, P, P) order, with the kernel. Same weights and parameter names; bf16 Conv3d on cuDNN can be many
    times slower than the GEMM. Returns whether a patch embedding was found."""
    found = False
    for mod in model.modules():
        proj = getattr(mod, "proj", None)
        if (
            type(mod).__name__ in _PATCH_CLASSES
            and type(proj).__name__ == "Conv3d"
            and tuple(proj.kernel_size) == tuple(proj.stride)
            and proj.padding in ((0, 0, 0), 0)
            and proj.groups == 1
        ):
            mod.forward = MethodType(_patch_linear_forward, mod)
            found = True
    return found


# ------------------------------------------------------------------------------------------------ vision tower
# The frozen vision tower's forward (SFT and RL run it without gradients) spends as much time on memory-bound
# elementwise work as on its matrix products at 1280x704 screenshots: its RoPE upcasts q and k to fp32 and makes
# seven full-size temporaries, its tanh-GELU is a separate pass over the 4x-wide MLP activation, and its attention
# runs one SDPA call per image, each after a host sync. `fast_vision` binds no-grad forwards that do the same math
# in fewer passes; with gradients enabled for the tower (never in this project) the stock forwards run.
_VISION_ATTN_CLASSES = ("Qwen3VLVisionAttention",)
_VISION_MLP_CLASSES = ("Qwen3VLVisionMLP",)
_TANH_GELU = ("GELUTanh", "PytorchGELUTanh")
VISION_SDPA = ("cudnn", "flash", "efficient")  # SDPA backends tried in this order for the images' attention
_ROPE_KERNEL: list = []  # the Triton kernel, compiled on first use


def _rope_kernel():
    if not _ROPE_KERNEL:
        import triton
        import triton.language as tl

        @triton.jit
        def rope(q, k, qo, ko, cos, sin, sq, sqh, sk, skh, sc, ss, n_heads, HEADS: tl.constexpr, HALF: tl.constexpr):
            # one program per token: every head's q and k, rotate-half RoPE in fp32, rounded once to the output dtype
            t = tl.program_id(0).to(tl.int64)
            h = tl.arange(0, HEADS)[:, None]
            d = tl.arange(0, HALF)[None, :]
            m = h < n_heads
            c1 = tl.load(cos + t * sc + d).to(tl.float32)
            c2 = tl.load(cos + t * sc + HALF + d).to(tl.float32)
            s1 = tl.load(sin + t * ss + d).to(tl.float32)
            s2 = tl.load(sin + t * ss + HALF + d).to(tl.float32)
            out = t * n_heads * 2 * HALF + h * 2 * HALF + d
            x1 = tl.load(q + t * sq + h * sqh + d, mask=m).to(tl.float32)
            x2 = tl.load(q + t * sq + h * sqh + HALF + d, mask=m).to(tl.float32)
            tl.store(qo + out, (x1 * c1 - x2 * s1).to(qo.dtype.element_ty), mask=m)
            tl.store(qo + out + HALF, (x2 * c2 + x1 * s2).to(qo.dtype.element_ty), mask=m)
            x1 = tl.load(k + t * sk + h * skh + d, mask=m).to(tl.float32)
            x2 = tl.load(k + t * sk + h * skh + HALF + d, mask=m).to(tl.float32)
            tl.store(ko + out, (x1 * c1 - x2 * s1).to(ko.dtype.element_ty), mask=m)
            tl.store(ko + out + HALF, (x2 * c2 + x1 * s2).to(ko.dtype.element_ty), mask=m)

        _ROPE_KERNEL.append(rope)
    return _ROPE_KERNEL[0]


def vision_rope(q, k, cos, sin):
    """Qwen-VL's vision RoPE (`apply_rotary_pos_emb_vision`: rotate-half, fp32 math, outputs in q's dtype) as one
    Triton kernel over q and k [tokens, heads, head_dim] (strided views of the qkv projection are fine), cos/sin
    [tokens, head_dim]. Returns new contiguous (q, k). Falls back to the stock function off CUDA or without Triton."""
    import torch

    t, h, d = q.shape
    half = d // 2
    ok = q.is_cuda and d % 2 == 0 and half & (half - 1) == 0 and q.stride(-1) == 1 and k.stride(-1) == 1
    if ok:
        try:
            kernel = _rope_kernel()
        except ImportError:
            ok = False
    if not ok:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

        return apply_rotary_pos_emb_vision(q, k, cos, sin)
    import triton

    cos, sin = cos.contiguous(), sin.contiguous()
    qo, ko = (torch.empty((t, h, d), dtype=x.dtype, device=x.device) for x in (q, k))
    if t:
        kernel[(t,)](
            q, k, qo, ko, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
            sin.stride(0), h, HEADS=triton.next_power_of_2(h), HALF=half,
        )  # fmt: skip
    return qo, ko


def _sdpa_backends():
    from torch.nn.attention import SDPBackend

    names = {"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION", "math": "MATH"}
    return [getattr(SDPBackend, names[n]) for n in VISION_SDPA if hasattr(SDPBackend, names.get(n, ""))]


def image_attention(q, k, v, lengths: list[int], scale: float):
    """Full (non-causal) attention within each image of a vision sequence: q/k/v [tokens, heads, head_dim], the
    images back to back with `lengths` tokens each. Each run of equally sized images is one batched SDPA call
    ([images, heads, length, head_dim]; a batch of screenshots of one size is one call per layer, not one per
    image); returns [tokens, heads * head_dim]."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import sdpa_kernel

    t, h, d = q.shape
    outs, a, i = [], 0, 0
    with sdpa_kernel(_sdpa_backends(), set_priority=True):
        while i < len(lengths):
            j = i
            while j < len(lengths) and lengths[j] == lengths[i]:
                j += 1
            n, size = j - i, lengths[i]
            b = a + n * size
            qb, kb, vb = (x[a:b].view(n, size, h, d).transpose(1, 2) for x in (q, k, v))
            o = F.scaled_dot_product_attention(qb, kb, vb, scale=scale)
            outs.append(o.transpose(1, 2).reshape(n * size, h * d))
            a, i = b, j
    return outs[0] if len(outs) == 1 else torch.cat(outs)


def _image_lengths(cu_seqlens) -> list[int]:
    """The images' token counts from cu_seqlens, read once per tower forward (the stock attention reads them with
    a host sync in every layer): kept on the tensor, which every layer of one forward shares."""
    cached = getattr(cu_seqlens, "_flywheel_lengths", None)
    if cached is None:
        cached = (cu_seqlens[1:] - cu_seqlens[:-1]).tolist()
        cu_seqlens._flywheel_lengths = cached
    return cached


def _no_grad_needed(x, weight) -> bool:
    import torch

    return not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad))


def _vision_attn_forward(self, hidden_states, cu_seqlens, position_embeddings=None, max_seqlen=None, **kwargs):
    if position_embeddings is None or not hidden_states.is_cuda or not _no_grad_needed(hidden_states, self.qkv.weight):
        return type(self).forward(self, hidden_states, cu_seqlens, position_embeddings, max_seqlen=max_seqlen, **kwargs)
    t = hidden_states.shape[0]
    qkv = self.qkv(hidden_states).view(t, 3, self.num_heads, -1)
    cos, sin = position_embeddings
    q, k = vision_rope(qkv[:, 0], qkv[:, 1], cos, sin)
    out = image_attention(q, k, qkv[:, 2], _image_lengths(cu_seqlens), self.scaling)
    return self.proj(out)


def _vision_mlp_forward(self, hidden_state):
    """fc2(tanh-GELU(fc1(x))) with the GELU in fc1's cuBLASLt epilogue (torch._addmm_activation): no separate pass
    over the [tokens, 4 x hidden] activation."""
    import torch

    fc1 = self.linear_fc1
    if fc1.bias is None or not hidden_state.is_cuda or not _no_grad_needed(hidden_state, fc1.weight):
        return type(self).forward(self, hidden_state)
    x = hidden_state.reshape(-1, hidden_state.shape[-1])
    act = torch._addmm_activation(fc1.bias, x, fc1.weight.t(), use_gelu=True)
    return self.linear_fc2(act.view(*hidden_state.shape[:-1], -1))


# The tower's per-forward preamble (session 20): transformers computes the position-embedding interpolation taps, the
# rotary position ids (a Python loop of small kernels per image) and the attention boundaries from grid_thw on every
# call, with host syncs between them; the GPU idles while the host runs it. Its forward takes them precomputed
# (`interp_indices`/`interp_weights`, `position_ids`, `cu_seqlens`, `max_seqlen`), so `_vision_model_forward` computes
# them once per distinct set of image grids (the same transformers helpers) and passes them in: the same values.
_VISION_MODEL_CLASSES = ("Qwen3VLVisionModel",)
_GRID_CACHE_SIZE = 64


def _grid_inputs_supported() -> bool:
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    names = ("get_vision_interpolation_indices_and_weights", "get_vision_position_ids", "get_vision_attention_seqlens")
    return all(hasattr(m, n) for n in names)


def _grid_inputs(self, grid_thw) -> dict:
    from transformers.models.qwen3_vl import modeling_qwen3_vl as m

    grids = tuple(tuple(int(v) for v in r) for r in grid_thw.tolist())  # the one host read of the grids
    key = (str(grid_thw.device), grids)
    cache = self.__dict__.setdefault("_flywheel_grid_inputs", {})
    hit = cache.get(key)
    if hit is None:
        idx, w = m.get_vision_interpolation_indices_and_weights(
            grid_thw,
            num_grid_per_side=self.num_grid_per_side,
            mode=self.interpolation_mode,
            align_corners=self.interpolation_align_corners,
            spatial_merge_size=self.config.spatial_merge_size,
        )
        pos = m.get_vision_position_ids(grid_thw, self.spatial_merge_size)
        cu, mx = m.get_vision_attention_seqlens(grid_thw, self.config)
        cu._flywheel_lengths = [h * w_ for t, h, w_ in grids for _ in range(t)]  # what _image_lengths reads
        hit = {"interp_indices": idx, "interp_weights": w, "position_ids": pos, "cu_seqlens": cu}
        if mx is not None:
            hit["max_seqlen"] = mx
        if len(cache) >= _GRID_CACHE_SIZE:
            cache.pop(next(iter(cache)))
        cache[key] = hit
    return dict(hit)


def _vision_model_forward(self, hidden_states, grid_thw=None, **kwargs):
    precomputed = ("interp_indices", "interp_weights", "position_ids", "cu_seqlens", "max_seqlen")
    if grid_thw is None or not VISION_LEVERS["grid_cache"] or any(k in kwargs for k in precomputed):
        return type(self).forward(self, hidden_states, grid_thw=grid_thw, **kwargs)
    return type(self).forward(self, hidden_states, grid_thw=grid_thw, **_grid_inputs(self, grid_thw), **kwargs)


# The tower's LayerNorms (no-grad, CUDA): one Triton program per block of rows, fp32 statistics, one rounding.
_LN_KERNEL: list = []


def _ln_kernel():
    if not _LN_KERNEL:
        import triton
        import triton.language as tl

        @triton.jit
        def ln(X, W, B, Y, M, N, eps, sx, sy, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
            rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tl.arange(0, BLOCK_N)
            rm, cm = rows < M, cols < N
            mask = rm[:, None] & cm[None, :]
            r64 = rows.to(tl.int64)[:, None]
            x = tl.load(X + r64 * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            mean = tl.sum(x, axis=1) / N
            xc = tl.where(mask, x - mean[:, None], 0.0)
            rstd = tl.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
            w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
            b = tl.load(B + cols, mask=cm, other=0.0).to(tl.float32)
            y = xc * rstd[:, None] * w[None, :] + b[None, :]
            tl.store(Y + r64 * sy + cols[None, :], y.to(Y.dtype.element_ty), mask=mask)

        _LN_KERNEL.append(ln)
    return _LN_KERNEL[0]


def _layer_norm_forward(self, x):
    import torch

    w, b = self.weight, self.bias
    if (
        not VISION_LEVERS["layer_norm"]
        or not x.is_cuda
        or w is None
        or b is None
        or len(self.normalized_shape) != 1
        or x.shape[-1] > 16384
        or not _no_grad_needed(x, w)
        or (b.requires_grad and torch.is_grad_enabled())
    ):
        return type(self).forward(self, x)
    try:
        kernel = _ln_kernel()
    except ImportError:
        return type(self).forward(self, x)
    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    block_n, block_m, warps = _rms_blocks(n)
    if m:
        kernel[(triton_cdiv(m, block_m),)](
            x2, w, b, y, m, n, self.eps, x2.stride(0), y.stride(0), BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps
        )
    return y.view(x.shape)


VISION_LEVERS = {"rope_attention": True, "gelu_epilogue": True, "grid_cache": True, "layer_norm": True}


def fast_vision(model) -> list[str]:
    """Bind the no-grad vision forwards above onto `model`'s own vision attention and MLP modules (Qwen3-VL; same
    parameters and names); returns what was bound: [] unless the weights are on CUDA. Idempotent; `unfuse_model`
    takes them off again."""
    params = next(model.parameters(), None)
    if params is None or not params.is_cuda:
        return []
    applied: set[str] = set()
    visual = [m for m in model.modules() if type(m).__name__ in _VISION_MODEL_CLASSES]
    if VISION_LEVERS["grid_cache"] and visual and _grid_inputs_supported():
        for mod in visual:
            mod.forward = MethodType(_vision_model_forward, mod)
        applied.add("vision_grid_cache")
    if VISION_LEVERS["layer_norm"]:
        import torch

        for mod in (m for v in visual for m in v.modules()):
            if type(mod) is torch.nn.LayerNorm and mod.elementwise_affine and mod.bias is not None:
                mod.forward = MethodType(_layer_norm_forward, mod)
                applied.add("vision_layer_norm")
    for mod in model.modules():
        name = type(mod).__name__
        if VISION_LEVERS["rope_attention"] and name in _VISION_ATTN_CLASSES and hasattr(mod, "qkv"):
            mod.forward = MethodType(_vision_attn_forward, mod)
            applied.add("vision_rope_attention")
        elif (
            VISION_LEVERS["gelu_epilogue"]
            and name in _VISION_MLP_CLASSES
            and type(getattr(mod, "act_fn", None)).__name__ in _TANH_GELU
            and hasattr(mod, "linear_fc1")
        ):
            mod.forward = MethodType(_vision_mlp_forward, mod)
            applied.add("vision_gelu_epilogue")
    return sorted(applied)


# ------------------------------------------------------------------------------------------------ text model
# Two levers for the trained text model (session 20, issue #33 on the H100, where the step's non-matmul share is
# larger than on the H200):
# - `rms_norm`: the llama-style RMSNorm (fp32 inverse RMS, rounded to the input dtype, times the weight) as Triton
#   kernels that take a block of rows per program. Liger's backward walks one row at a time per SM, a latency-bound
#   loop: on the H100 its backward took 46 ms of a 1.25 s packed step, ~2.5x the memory-traffic bound.
# - `fast_lora`: PEFT's LoRA linear (dropout off or inactive) as one autograd function: base GEMM, then the adapter's
#   product added into the output in the GEMM (addmm_, alpha = scaling), and in backward the adapter's input
#   gradient added into the base GEMM's output the same way. PEFT's forward makes the adapter output, scales it and
#   adds it as three more passes over the [tokens, out] activation, and its backward adds two input gradients
#   (with the adapter's dropout active that last add stays).
# benchmarks switch each off to measure it
TEXT_LEVERS = {"rms_norm": True, "lora": True, "deepstack": True, "shared_input": True, "add_norm": True}
_RMS_KERNELS: list = []


def _rms_kernels():
    if not _RMS_KERNELS:
        import triton
        import triton.language as tl

        @triton.jit
        def fwd(
            X, W, Y, RSTD, B, S, M, N, eps, sx, sy, sb, ss,
            HAS_ADD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
        ):  # fmt: skip
            # HAS_ADD: the input is X + B (rounded to the input dtype, as a separate add), also stored to S
            rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
            cols = tl.arange(0, BLOCK_N)
            rm, cm = rows < M, cols < N
            mask = rm[:, None] & cm[None, :]
            r64 = rows.to(tl.int64)[:, None]
            x = tl.load(X + r64 * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            if HAS_ADD:
                b = tl.load(B + r64 * sb + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                xs = (x + b).to(X.dtype.element_ty)
                tl.store(S + r64 * ss + cols[None, :], xs, mask=mask)
                x = xs.to(tl.float32)
            rstd = tl.rsqrt(tl.sum(x * x, axis=1) / N + eps)
            w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
            n = (x * rstd[:, None]).to(X.dtype.element_ty).to(tl.float32)  # rounded to the input dtype, as stock
            tl.store(Y + r64 * sy + cols[None, :], (n * w[None, :]).to(Y.dtype.element_ty), mask=mask)
            tl.store(RSTD + rows, rstd, mask=rm)

        @triton.jit
        def bwd(
            DY, X, W, RSTD, DX, DW, DS, M, N, sdy, sx, sdx, sds, per_prog,
            HAS_DW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ACC2D: tl.constexpr,
            HAS_DS: tl.constexpr,
        ):  # fmt: skip
            # HAS_DS: DS (the gradient reaching the input by another path: the residual) is added to dx
            # one program per `per_prog` rows, BLOCK_M rows at a time; dW partial sums per program in fp32, summed
            # over the rows every block (ACC2D False) or once at the end (True: wide blocks of narrow rows)
            pid = tl.program_id(0)
            cols = tl.arange(0, BLOCK_N)
            cm = cols < N
            w = tl.load(W + cols, mask=cm, other=0.0).to(tl.float32)
            if ACC2D:
                acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            else:
                acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            start = pid * per_prog
            end = tl.minimum(start + per_prog, M)
            for i in range(0, per_prog, BLOCK_M):
                rows = start + i + tl.arange(0, BLOCK_M)
                rm = rows < end
                mask = rm[:, None] & cm[None, :]
                r64 = rows.to(tl.int64)[:, None]
                x = tl.load(X + r64 * sx + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                dy = tl.load(DY + r64 * sdy + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                rstd = tl.load(RSTD + rows, mask=rm, other=0.0)
                xh = x * rstd[:, None]
                if HAS_DW:
                    if ACC2D:
                        acc += dy * xh.to(X.dtype.element_ty).to(tl.float32)
                    else:
                        acc += tl.sum(dy * xh.to(X.dtype.element_ty).to(tl.float32), axis=0)
                dn = dy * w[None, :]
                c = tl.sum(dn * xh, axis=1) / N
                dx = (dn - xh * c[:, None]) * rstd[:, None]
                if HAS_DS:
                    dx += tl.load(DS + r64 * sds + cols[None, :], mask=mask, other=0.0).to(tl.float32)
                tl.store(DX + r64 * sdx + cols[None, :], dx.to(DX.dtype.element_ty), mask=mask)
            if HAS_DW:
                if ACC2D:
                    tl.store(DW + pid.to(tl.int64) * N + cols, tl.sum(acc, axis=0), mask=cm)
                else:
                    tl.store(DW + pid.to(tl.int64) * N + cols, acc, mask=cm)

        _RMS_KERNELS.extend([fwd, bwd])
    return _RMS_KERNELS


def _rms_blocks(n: int) -> tuple[int, int, int]:
    import triton

    block_n = triton.next_power_of_2(n)
    block_m = max(1, min(64, 8192 // block_n))
    return block_n, block_m, 8 if block_n * block_m >= 8192 else 4


# The backward's launch per row width (block_n): (rows a block, programs per SM, warps, dW summed once at the end).
# Measured on an H100 (session 20, benchmarks/sft_mfu.py rms_check --rms-sweep); other widths: _rms_blocks.
RMS_BWD_CONFIG: dict[int, tuple[int, int, int, bool]] = {2048: (1, 4, 4, False), 128: (64, 8, 8, True)}


def _rms_bwd_config(n: int) -> tuple[int, int, int, int, bool]:
    block_n, block_m, warps = _rms_blocks(n)
    bm, per_sm, w, acc2d = RMS_BWD_CONFIG.get(block_n, (block_m, 4, warps, block_m >= 16))
    return block_n, bm, per_sm, w, acc2d


_RMS_FN: list = []


def _rows(t, n: int):
    t2 = t.reshape(-1, n)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _rms_fwd(x2, weight, eps: float, add=None):
    """(y, rstd, s): the norm of x2 (+ add, stored to s) as [M, N] rows."""
    import torch

    fwd, _ = _rms_kernels()
    m, n = x2.shape
    y = torch.empty((m, n), dtype=torch.promote_types(x2.dtype, weight.dtype), device=x2.device)
    rstd = torch.empty(m, dtype=torch.float32, device=x2.device)
    s = torch.empty_like(x2) if add is not None else None
    b = add if add is not None else x2
    block_n, block_m, warps = _rms_blocks(n)
    if m:
        fwd[(triton_cdiv(m, block_m),)](
            x2, weight, y, rstd, b, s if s is not None else y, m, n, eps, x2.stride(0), y.stride(0), b.stride(0),
            (s if s is not None else y).stride(0), HAS_ADD=add is not None, BLOCK_M=block_m, BLOCK_N=block_n,
            num_warps=warps,
        )  # fmt: skip
    return y, rstd, s


def _rms_bwd(dy2, x2, weight, rstd, has_dw: bool, ds2=None):
    """(dx, dw) for rows x2 (+ ds2 added to dx)."""
    import torch

    _, bwd = _rms_kernels()
    m, n = x2.shape
    dx = torch.empty_like(x2)
    block_n, block_m, per_sm, warps, acc2d = _rms_bwd_config(n)
    progs = max(1, min(triton_cdiv(m, block_m), per_sm * _sm_count(x2.device)))
    per_prog = triton_cdiv(triton_cdiv(m, progs), block_m) * block_m
    progs = max(1, triton_cdiv(m, per_prog))
    part = torch.empty((progs, n) if has_dw else (1, n), dtype=torch.float32, device=x2.device)
    d = ds2 if ds2 is not None else dy2
    if m:
        bwd[(progs,)](
            dy2, x2, weight, rstd, dx, part, d, m, n, dy2.stride(0), x2.stride(0), dx.stride(0), d.stride(0), per_prog,
            HAS_DW=has_dw, BLOCK_M=block_m, BLOCK_N=block_n, ACC2D=acc2d, HAS_DS=ds2 is not None, num_warps=warps,
        )  # fmt: skip
    return dx, (part.sum(0).to(weight.dtype) if has_dw else None)


def _rms_fn():
    if not _RMS_FN:
        import torch

        class RMSNormFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, weight, eps):
                x2 = _rows(x, x.shape[-1])
                y, rstd, _ = _rms_fwd(x2, weight, eps)
                ctx.save_for_backward(x2, weight, rstd)
                ctx.shape = x.shape
                return y.view(x.shape)

            @staticmethod
            def backward(ctx, dy):
                x2, weight, rstd = ctx.saved_tensors
                dx, dw = _rms_bwd(_rows(dy, x2.shape[1]), x2, weight, rstd, ctx.needs_input_grad[1])
                return dx.view(ctx.shape), dw, None

        class AddRMSNormFn(torch.autograd.Function):
            """(s, y) = (a + b, rms_norm(a + b)): the residual add and the norm after it in one pass each way."""

            @staticmethod
            def forward(ctx, a, b, weight, eps):
                n = a.shape[-1]
                y, rstd, s = _rms_fwd(_rows(a, n), weight, eps, add=_rows(b, n))
                ctx.save_for_backward(s, weight, rstd)
                ctx.shape = a.shape
                return s.view(a.shape), y.view(a.shape)

            @staticmethod
            def backward(ctx, ds, dy):
                s, weight, rstd = ctx.saved_tensors
                n = s.shape[1]
                ds2 = None if ds is None else _rows(ds, n)
                if dy is None:
                    dx, dw = ds2, None
                else:
                    dx, dw = _rms_bwd(_rows(dy, n), s, weight, rstd, ctx.needs_input_grad[2], ds2)
                dx = None if dx is None else dx.view(ctx.shape)
                return dx, dx, dw, None

        _RMS_FN.extend([RMSNormFn, AddRMSNormFn])
    return _RMS_FN[0]


def _add_rms_fn():
    _rms_fn()
    return _RMS_FN[1]


def triton_cdiv(a: int, b: int) -> int:
    return -(-a // b)


_SM: dict = {}


def _sm_count(device) -> int:
    import torch

    i = device.index if device.index is not None else torch.cuda.current_device()
    if i not in _SM:
        _SM[i] = torch.cuda.get_device_properties(i).multi_processor_count
    return _SM[i]


def rms_norm(x, weight, eps: float):
    """Llama-style RMSNorm, `weight * (x * rsqrt(mean(x^2) + eps)).to(x.dtype)` with the statistics in fp32 (the
    Qwen/Llama RMSNorm modules' math). CUDA with Triton and TEXT_LEVERS["rms_norm"]: this module's kernels (one
    rounding per output; the backward in fp32, dW summed in fp32 per block of rows); else Liger's kernel on CUDA when
    installed, else the torch ops."""
    import torch

    if x.is_cuda and x.shape[-1] <= 65536:
        if TEXT_LEVERS["rms_norm"]:
            try:
                return _rms_fn().apply(x, weight, eps)
            except ImportError:
                pass
        try:
            from liger_kernel.ops import LigerRMSNormFunction

            # (X, W, eps, offset, casting_mode, in_place, row_mode): LigerRMSNorm's defaults
            return LigerRMSNormFunction.apply(x, weight, eps, 0.0, "llama", True, None)
        except ImportError:
            pass
    dtype = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(dtype)


_RMS_CLASS: list = []


def rms_norm_class():
    """An RMSNorm module (parameter `weight`, attribute `variance_epsilon`, as the Qwen classes) whose forward is
    `rms_norm`: what apply_fused_kernels puts in place of the stock class for SFT."""
    if not _RMS_CLASS:
        import torch

        class FlywheelRMSNorm(torch.nn.Module):
            def __init__(self, hidden_size, eps: float = 1e-6, **_):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(hidden_size))
                self.variance_epsilon = eps

            def forward(self, hidden_states):
                return rms_norm(hidden_states, self.weight, self.variance_epsilon)

            def extra_repr(self):
                return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"

        _RMS_CLASS.append(FlywheelRMSNorm)
    return _RMS_CLASS[0]


_LORA_FN: list = []


def _lora_fn():
    if not _LORA_FN:
        import torch

        class LoraLinearFn(torch.autograd.Function):
            """y = x W^T + b + s (xd A^T) B^T with W, b frozen, xd = x or the adapter's dropout of x (None: x); the
            adapter's product added in the GEMM, and with xd = x its input gradient too."""

            @staticmethod
            def forward(ctx, x, xd, w, bias, a, b, scaling):
                shape = x.shape
                x2 = x.reshape(-1, shape[-1])
                xd2 = x2 if xd is None else xd.reshape(-1, shape[-1])
                h = torch.mm(xd2, a.t())
                y = torch.mm(x2, w.t()) if bias is None else torch.addmm(bias, x2, w.t())
                y.addmm_(h, b.t(), alpha=scaling)
                ctx.save_for_backward(xd2, w, a, b, h)
                ctx.scaling, ctx.shape, ctx.same = scaling, shape, xd is None
                return y.view(*shape[:-1], y.shape[-1])

            @staticmethod
            def backward(ctx, dy):
                xd2, w, a, b, h = ctx.saved_tensors
                s = ctx.scaling
                dy2 = dy.reshape(-1, dy.shape[-1])
                dh = torch.mm(dy2, b).mul_(s)  # [tokens, r]
                dx = dxd = None
                if ctx.needs_input_grad[0]:
                    dx = torch.mm(dy2, w)
                    if ctx.same:
                        dx.addmm_(dh, a)
                    dx = dx.view(ctx.shape)
                if not ctx.same and ctx.needs_input_grad[1]:
                    dxd = torch.mm(dh, a).view(ctx.shape)
                da = torch.mm(dh.t(), xd2) if ctx.needs_input_grad[4] else None
                db = torch.mm(dy2.t(), h).mul_(s) if ctx.needs_input_grad[5] else None
                return dx, dxd, None, None, da, db, None

        _LORA_FN.append(LoraLinearFn)
    return _LORA_FN[0]


def _lora_forward(self, x, *args, **kwargs):
    """PEFT lora.Linear's forward for one active vanilla adapter with the base weights frozen: LoraLinearFn (an
    active dropout is applied to the adapter's input as PEFT does: same module, same random stream). Anything else
    (merged, disabled, several adapters, DoRA, a base weight with gradients, extra arguments, TEXT_LEVERS["lora"]
    off) takes PEFT's own forward."""
    import torch

    cls_forward = type(self).forward
    if args or kwargs or not TEXT_LEVERS["lora"] or self.disable_adapters or self.merged:
        return cls_forward(self, x, *args, **kwargs)
    active = self.active_adapters
    if len(active) != 1 or active[0] not in self.lora_A or active[0] in getattr(self, "lora_variant", {}):
        return cls_forward(self, x, *args, **kwargs)
    name = active[0]
    drop, base = self.lora_dropout[name], self.base_layer
    la, lb = self.lora_A[name], self.lora_B[name]
    if (
        not isinstance(drop, (torch.nn.Dropout, torch.nn.Identity))
        or type(base) is not torch.nn.Linear
        or base.weight.requires_grad
        or (base.bias is not None and base.bias.requires_grad)
        or la.bias is not None
        or lb.bias is not None
        or not (x.dtype == base.weight.dtype == la.weight.dtype == lb.weight.dtype)
        or getattr(self, "use_dora", {}).get(name, False)
    ):
        return cls_forward(self, x, *args, **kwargs)
    xd = drop(x) if isinstance(drop, torch.nn.Dropout) and drop.training and drop.p > 0 else None
    return _lora_fn().apply(x, xd, base.weight, base.bias, la.weight, lb.weight, float(self.scaling[name]))


def fast_lora(model, force: bool = False) -> list[str]:
    """Bind `_lora_forward` onto `model`'s PEFT LoRA Linear modules (same parameters and names); returns ["lora"]
    when any was bound: only with the model's weights on CUDA (or `force`, for tests). Idempotent; `unfuse_model`
    takes it off again."""
    params = next(model.parameters(), None)
    if params is None or not (params.is_cuda or force):
        return []
    try:
        from peft.tuners.lora.layer import Linear as LoraLinear
    except ImportError:
        return []
    found = False
    for mod in model.modules():
        if isinstance(mod, LoraLinear) and hasattr(mod, "base_layer"):
            mod.forward = MethodType(_lora_forward, mod)
            found = True
    return ["lora"] if found else []


# DeepStack (Qwen3-VL adds three vision layers' features to the first text layers' hidden states at the image
# tokens): the stock `_deepstack_process` clones the hidden states and indexes them with the boolean image mask
# twice, so each call is two host syncs (nonzero) forward and two backward, six calls a micro-batch. Here the mask's
# positions are found once per forward without a host read (nonzero_static: their count is the features' rows)
# and the features are added with index_add, whose backward is a gather. Same sums (one bf16 rounding each).
_TEXT_MODEL_CLASSES = ("Qwen3VLTextModel",)


def _deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds):
    import torch

    if not TEXT_LEVERS["deepstack"] or not hidden_states.is_cuda or not hasattr(torch, "nonzero_static"):
        return type(self)._deepstack_process(self, hidden_states, visual_pos_masks, visual_embeds)
    visual_embeds = visual_embeds.to(hidden_states.device, hidden_states.dtype)
    idx = getattr(visual_pos_masks, "_flywheel_idx", None)
    if idx is None or idx.device != hidden_states.device or idx.numel() != visual_embeds.shape[0]:
        mask = visual_pos_masks.to(hidden_states.device).reshape(-1)
        idx = torch.nonzero_static(mask, size=visual_embeds.shape[0]).squeeze(1)
        visual_pos_masks._flywheel_idx = idx  # the same mask object serves the three DeepStack layers
    flat = hidden_states.reshape(-1, hidden_states.shape[-1])
    return flat.index_add(0, idx, visual_embeds).view(hidden_states.shape)


# Linears that read the same input (q/k/v_proj, gate/up_proj): in backward, autograd sums their input gradients
# with separate adds over the [tokens, hidden] activation (two for q/k/v, one for gate/up, every layer and
# micro-batch). `_shared_input_forward` runs the group through one autograd function whose backward accumulates the
# input gradient in the GEMMs (addmm_, beta 1); the forward products are the stock ones.
_MULTI_FN: list = []


def _multi_linear_fn():
    if not _MULTI_FN:
        import torch

        class MultiLinearFn(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x, *weights):
                x2 = x.reshape(-1, x.shape[-1])
                ctx.save_for_backward(x2, *weights)
                ctx.shape = x.shape
                return tuple(torch.mm(x2, w.t()).view(*x.shape[:-1], w.shape[0]) for w in weights)

            @staticmethod
            def backward(ctx, *dys):
                x2, *weights = ctx.saved_tensors
                dx, dws = None, []
                for i, (dy, w) in enumerate(zip(dys, weights)):
                    dy2 = dy.reshape(-1, dy.shape[-1])
                    if ctx.needs_input_grad[0]:
                        dx = torch.mm(dy2, w) if dx is None else dx.addmm_(dy2, w)
                    dws.append(torch.mm(dy2.t(), x2) if ctx.needs_input_grad[i + 1] else None)
                return (None if dx is None else dx.view(ctx.shape), *dws)

        _MULTI_FN.append(MultiLinearFn)
    return _MULTI_FN[0]


class _SharedInput:
    """A group of linears reading one input; the first one's call computes all, the others take their outputs."""

    def __init__(self, mods):
        self.mods, self.x, self.outs = list(mods), None, {}


def _shared_input_forward(self, x):
    g = self.__dict__.get("_flywheel_group")
    if g is None or not TEXT_LEVERS["shared_input"] or not (x.is_cuda or g.__dict__.get("any_device")):
        return type(self).forward(self, x)
    if g.x is x and self in g.outs:
        out = g.outs.pop(self)
        if not g.outs:
            g.x = None
        return out
    if self is not g.mods[0]:
        return type(self).forward(self, x)
    outs = _multi_linear_fn().apply(x, *(m.weight for m in g.mods))
    g.x, g.outs = x, dict(zip(g.mods[1:], outs[1:]))
    return outs[0]


# The decoder layer's mid residual add and the post-attention RMSNorm after it as one function (AddRMSNormFn): one
# pass forward instead of two, and in backward the residual's gradient is added inside the norm's backward kernel
# instead of by a separate add. The layer's other steps are its own modules, called as its stock forward does.
_DECODER_CLASSES = ("Qwen3VLTextDecoderLayer",)


def _decoder_layer_forward(self, hidden_states, *args, **kwargs):
    post = self.post_attention_layernorm
    if (
        args
        or "past_key_values" in kwargs
        or not TEXT_LEVERS["add_norm"]
        or not TEXT_LEVERS["rms_norm"]
        or not hidden_states.is_cuda
        or not isinstance(getattr(post, "variance_epsilon", None), float)
        or getattr(post, "offset", 0.0) != 0.0
        or getattr(post, "casting_mode", "llama") != "llama"
    ):
        return type(self).forward(self, hidden_states, *args, **kwargs)
    try:
        fn = _add_rms_fn()
    except ImportError:
        return type(self).forward(self, hidden_states, *args, **kwargs)
    residual = hidden_states
    h, _ = self.self_attn(hidden_states=self.input_layernorm(hidden_states), **kwargs)
    hidden_states, h = fn.apply(residual, h, post.weight, post.variance_epsilon)
    return hidden_states + self.mlp(h)


_SHARED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _shared_input_groups(model):
    import torch

    for mod in model.modules():
        if not type(mod).__name__.startswith("Qwen3VLText"):
            continue
        for names in _SHARED_GROUPS:
            lins = [getattr(mod, n, None) for n in names]
            if all(type(m) is torch.nn.Linear and m.bias is None for m in lins):
                yield lins


def fast_text(model, force: bool = False) -> list[str]:
    """Bind `_deepstack_process` onto `model`'s Qwen3-VL text model (same math, no host syncs),
    `_decoder_layer_forward` onto its decoder layers (the mid residual add fused with the post-attention RMSNorm) and
    `_shared_input_forward` onto its q/k/v and gate/up linears (plain nn.Linear: full fine-tuning); returns what was
    bound: only with the weights on CUDA (or `force`, for tests: the shared-input groups only). Idempotent;
    `unfuse_model` takes them off."""
    params = next(model.parameters(), None)
    if params is None or not (params.is_cuda or force):
        return []
    applied: set[str] = set()
    for mod in model.modules():
        if params.is_cuda and type(mod).__name__ in _TEXT_MODEL_CLASSES and hasattr(type(mod), "_deepstack_process"):
            mod._deepstack_process = MethodType(_deepstack_process, mod)
            applied.add("deepstack_index")
    for mod in model.modules():
        if params.is_cuda and type(mod).__name__ in _DECODER_CLASSES and hasattr(mod, "post_attention_layernorm"):
            mod.forward = MethodType(_decoder_layer_forward, mod)
            applied.add("add_rms_norm")
    for lins in _shared_input_groups(model):
        g = _SharedInput(lins)
        g.any_device = force
        for m in lins:
            m.__dict__["_flywheel_group"] = g
            m.forward = MethodType(_shared_input_forward, m)
        applied.add("shared_input_linears")
    return sorted(applied)
