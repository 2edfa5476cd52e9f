"""Liger's kernels swapped into transformers' Qwen modules (SFT, before the model is built) or bound onto a built
model's own modules (RL), and `unfuse_model`, which takes every binding of this package off again.

    applied = apply_fused_kernels("qwen3-vl")   # SFT: before building/loading the model; [] when unavailable
    applied = fuse_model(model)                 # RL: into a model already built (its own modules); [] when unavailable
    unfuse_model(model)                         # back to the stock forwards

We swap the transformers module-level pieces ourselves from Liger's public components rather than calling its
`apply_liger_kernel_to_*` helpers, which in liger-kernel 0.8.5 fail to import for Qwen3-VL (a missing output class).
"""

from __future__ import annotations

from types import MethodType

from training.kernels.norms import rms_norm, rms_norm_class

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


def _bound_forwards() -> tuple:
    from training.kernels import text, vision

    return (
        _rms_forward,
        _swiglu_forward,
        vision._vision_attn_forward,
        vision._vision_mlp_forward,
        vision._patch_linear_forward,
        text._lora_forward,
        vision._vision_model_forward,
        vision._layer_norm_forward,
        text._deepstack_process,
        text._shared_input_forward,
        text._decoder_layer_forward,
        text._text_attn_forward,
        vision._vision_block_forward,
    )


def unfuse_model(model) -> None:
    """Undo `fuse_model`, `fast_vision`, `fast_lora`, `fast_text` and `linear_patch_embed`: the modules' own class
    forwards again, and the stock RoPE function (for every model)."""
    from training.kernels import text

    bound = _bound_forwards()
    for mod in model.modules():
        fwd = mod.__dict__.get("forward")
        if fwd is not None and getattr(fwd, "__func__", None) in bound:
            del mod.forward
        for key in ("_flywheel_group", "_flywheel_next", "_flywheel_pending"):
            mod.__dict__.pop(key, None)
        ds = mod.__dict__.get("_deepstack_process")
        if ds is not None and getattr(ds, "__func__", None) is text._deepstack_process:
            del mod._deepstack_process
    if _STOCK_ROPE:
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m

        if m.apply_rotary_pos_emb is _rope:
            m.apply_rotary_pos_emb = _STOCK_ROPE[m.__name__]
