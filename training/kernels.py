"""Optional fused GPU kernels for training (Liger's RMSNorm, RoPE and SwiGLU), behind an import guard.

    applied = apply_fused_kernels("qwen3-vl")   # SFT: before building/loading the model; [] when unavailable
    applied = fuse_model(model)                 # RL: into a model already built (its own modules); [] when unavailable
    unfuse_model(model)                         # back to the stock forwards
    linear_patch_embed(model)                   # the vision patch embedding as one matrix product (CPU and CUDA)

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
    """Undo `fuse_model`: the modules' own class forwards again, and the stock RoPE function (for every model)."""
    for mod in model.modules():
        fwd = mod.__dict__.get("forward")
        if fwd is not None and getattr(fwd, "__func__", None) in (_rms_forward, _swiglu_forward):
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
