"""Optional fused GPU kernels for training (Liger's RMSNorm, RoPE and SwiGLU), behind an import guard.

    applied = apply_fused_kernels("qwen3-vl")   # before building/loading the model; [] when unavailable

Only on CUDA with `liger-kernel` installed (its kernels are Triton). We swap the transformers
module-level pieces ourselves from Liger's public components rather than calling its
`apply_liger_kernel_to_*` helpers, which in liger-kernel 0.8.5 fail to import for Qwen3-VL
(a missing output class). The loss side needs no kernel: the SFT loss projects only labelled
positions (training.losses.labelled_token_loss).
"""

from __future__ import annotations


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
