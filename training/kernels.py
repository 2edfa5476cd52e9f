"""Optional fused GPU kernels for training (Liger's RMSNorm, RoPE and SwiGLU), behind an import guard.

    applied = apply_fused_kernels("qwen3-vl")   # SFT: before building/loading the model; [] when unavailable
    applied = fuse_model(model)                 # RL: into a model already built (its own modules); [] when unavailable
    unfuse_model(model)                         # back to the stock forwards
    linear_patch_embed(model)                   # the vision patch embedding as one matrix product (CPU and CUDA)
    applied = fast_vision(model)                # the frozen vision tower's no-grad forward in fewer passes (CUDA)

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

        m.Qwen3VLTextRMSNorm, m.Qwen3VLTextMLP = LigerRMSNorm, LigerSwiGLUMLP
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
    from liger_kernel.ops import LigerRMSNormFunction

    # (X, W, eps, offset, casting_mode, in_place, row_mode): LigerRMSNorm's defaults, as SFT's class swap uses
    return LigerRMSNormFunction.apply(hidden_states, self.weight, self.variance_epsilon, 0.0, "llama", True, None)


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
        ):
            del mod.forward
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


VISION_LEVERS = {"rope_attention": True, "gelu_epilogue": True}  # benchmarks switch each off to measure it


def fast_vision(model) -> list[str]:
    """Bind the no-grad vision forwards above onto `model`'s own vision attention and MLP modules (Qwen3-VL; same
    parameters and names); returns what was bound: [] unless the weights are on CUDA. Idempotent; `unfuse_model`
    takes them off again."""
    params = next(model.parameters(), None)
    if params is None or not params.is_cuda:
        return []
    applied: set[str] = set()
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
