"""Optional fused GPU kernels for training, behind import guards (CPU paths are the stock math).

    applied = apply_fused_kernels("qwen3-vl")   # SFT: before building/loading the model; [] when unavailable
    applied = fuse_model(model)                 # RL: into a model already built (its own modules); [] when unavailable
    unfuse_model(model)                         # back to the stock forwards
    linear_patch_embed(model)                   # the vision patch embedding as one matrix product (CPU and CUDA)
    applied = fast_vision(model)                # the frozen vision tower's no-grad forward in fewer passes (CUDA)
    applied = fast_lora(model)                  # PEFT's LoRA linears as one autograd function each (CUDA)
    applied = fast_text(model)                  # the text model's levers (CUDA): DeepStack without host syncs,
                                                # shared-input linears, fused norms, q/k norm + RoPE in one kernel
    y = rms_norm(x, weight, eps)                # RMSNorm: our Triton kernels on CUDA, else Liger's / torch

Modules, by concern:
- `liger`: Liger's RMSNorm / SwiGLU / RoPE swapped into transformers' Qwen modules (SFT) or bound onto a built
  model (RL, `fuse_model`), and `unfuse_model`, which takes every binding of this package off.
- `norms`: RMSNorm as autograd functions over our Triton kernels (plain, with the residual add before it, keeping
  the residual, and the attention's q/k norm fused with the RoPE), `rms_norm`, `rms_norm_class`, RMS_BWD_CONFIG.
- `vision`: the frozen tower's no-grad forwards (fused RoPE, batched image attention, GELU epilogue, cached grid
  inputs, LayerNorm kernel; VISION_LEVERS) and the linear patch embedding.
- `text`: the LoRA linear, DeepStack, shared-input linears, the decoder layer and attention forwards (TEXT_LEVERS).
- `triton_ops`: every Triton kernel (imported only when a kernel runs: Triton is optional).
- `common`: small helpers.

`fuse_model` is for a model that exists before the trainer does (the RL stage loads its checkpoint first): it
binds fused forwards onto that model's own RMSNorm and MLP modules (same parameters, same names, PEFT's LoRA
wrappers inside the MLP untouched) and routes the module's RoPE function to Liger's for CUDA tensors (CPU
tensors keep the stock function). The math is the stock modules' (llama-style RMSNorm: fp32 inverse RMS, cast,
times the weight; silu(gate) * up; rotate-half RoPE); only the rounding of fused ops can differ. The loss side needs
no kernel: the SFT loss projects only labelled positions (training.losses.labelled_token_loss).
"""

from __future__ import annotations

from training.kernels.common import _no_grad_needed, _rms_blocks, _rows, _sm_count, triton_cdiv
from training.kernels.liger import (
    _MLP_CLASSES,
    _RMS_CLASSES,
    _STOCK_ROPE,
    _fuse_rope,
    _rms_forward,
    _rope,
    _swiglu_forward,
    apply_fused_kernels,
    fuse_model,
    unfuse_model,
)
from training.kernels.norms import (
    RMS_BWD_CONFIG,
    _add_rms_fn,
    _residual_rms_fn,
    _rms_bwd,
    _rms_bwd_config,
    _rms_fn,
    _rms_fwd,
    qk_norm_rope,
    qk_norm_rope_supported,
    rms_norm,
    rms_norm_class,
)
from training.kernels.text import (
    SESSION21_LEVERS,
    TEXT_LEVERS,
    _decoder_layer_forward,
    _deepstack_process,
    _lora_forward,
    _shared_input_forward,
    _text_attn_forward,
    fast_lora,
    fast_text,
)
from training.kernels.vision import (
    SESSION21_VISION_LEVERS,
    VISION_LEVERS,
    _layer_norm_forward,
    _patch_linear_forward,
    _vision_attn_forward,
    _vision_block_forward,
    _vision_mlp_forward,
    _vision_model_forward,
    fast_vision,
    image_attention,
    linear_patch_embed,
    vision_rope,
)

__all__ = [
    "RMS_BWD_CONFIG",
    "SESSION21_LEVERS",
    "SESSION21_VISION_LEVERS",
    "TEXT_LEVERS",
    "VISION_LEVERS",
    "apply_fused_kernels",
    "fast_lora",
    "fast_text",
    "fast_vision",
    "fuse_model",
    "image_attention",
    "linear_patch_embed",
    "qk_norm_rope",
    "qk_norm_rope_supported",
    "rms_norm",
    "rms_norm_class",
    "triton_cdiv",
    "unfuse_model",
    "vision_rope",
    "_MLP_CLASSES",
    "_RMS_CLASSES",
    "_STOCK_ROPE",
    "_add_rms_fn",
    "_decoder_layer_forward",
    "_deepstack_process",
    "_fuse_rope",
    "_layer_norm_forward",
    "_lora_forward",
    "_no_grad_needed",
    "_patch_linear_forward",
    "_residual_rms_fn",
    "_rms_blocks",
    "_rms_bwd",
    "_rms_bwd_config",
    "_rms_fn",
    "_rms_fwd",
    "_rms_forward",
    "_rope",
    "_rows",
    "_shared_input_forward",
    "_sm_count",
    "_swiglu_forward",
    "_text_attn_forward",
    "_vision_attn_forward",
    "_vision_block_forward",
    "_vision_mlp_forward",
    "_vision_model_forward",
]
