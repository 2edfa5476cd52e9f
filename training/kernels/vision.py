"""The frozen vision tower's no-grad forwards (Qwen3-VL) and the linear patch embedding.

linear_patch_embed(model)        # the vision patch embedding as one matrix product (CPU and CUDA)
applied = fast_vision(model)     # the tower's no-grad forward in fewer passes (CUDA); VISION_LEVERS switch parts
q, k = vision_rope(q, k, cos, sin)
out = image_attention(q, k, v, lengths, scale)   # SDPA backends in the order of training.kernels.VISION_SDPA
"""

from __future__ import annotations

from types import MethodType

from training.kernels.common import _no_grad_needed, _rms_blocks, next_power_of_2, triton_cdiv

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
            from training.kernels.triton_ops import rope as kernel
        except ImportError:
            ok = False
    if not ok:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import apply_rotary_pos_emb_vision

        return apply_rotary_pos_emb_vision(q, k, cos, sin)
    cos, sin = cos.contiguous(), sin.contiguous()
    qo, ko = (torch.empty((t, h, d), dtype=x.dtype, device=x.device) for x in (q, k))
    if t:
        kernel[(t,)](
            q, k, qo, ko, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos.stride(0),
            sin.stride(0), h, HEADS=next_power_of_2(h), HALF=half,
        )  # fmt: skip
    return qo, ko


VISION_SDPA = (
    "cudnn",
    "flash",
    "efficient",
)  # SDPA backends tried in this order (set training.kernels.vision.VISION_SDPA)


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
def _ln_ok(norm, x) -> bool:
    import torch

    w, b = norm.weight, norm.bias
    return not (
        not x.is_cuda
        or w is None
        or b is None
        or len(norm.normalized_shape) != 1
        or x.shape[-1] > 16384
        or not _no_grad_needed(x, w)
        or (b.requires_grad and torch.is_grad_enabled())
    )


def _ln(norm, x, add=None):
    """(LayerNorm(x [+ add]), x + add or None) by the Triton kernel; raises ImportError without Triton."""
    import torch

    from training.kernels.triton_ops import ln as kernel

    n = x.shape[-1]
    x2 = x.reshape(-1, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    a2 = None if add is None else add.reshape(-1, n).contiguous()
    m = x2.shape[0]
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    s = None if add is None else torch.empty_like(x2)
    block_n, block_m, warps = _rms_blocks(n)
    if m:
        a_, s_ = (a2, s) if add is not None else (x2, y)
        kernel[(triton_cdiv(m, block_m),)](
            x2, norm.weight, norm.bias, y, a_, s_, m, n, norm.eps, x2.stride(0), y.stride(0), a_.stride(0),
            s_.stride(0), HAS_ADD=add is not None, BLOCK_M=block_m, BLOCK_N=block_n, num_warps=warps,
        )  # fmt: skip
    return y.view(x.shape), (None if s is None else s.view(x.shape))


def _layer_norm_forward(self, x):
    if not VISION_LEVERS["layer_norm"] or not _ln_ok(self, x):
        return type(self).forward(self, x)
    try:
        return _ln(self, x)[0]
    except ImportError:
        return type(self).forward(self, x)


# The tower's blocks (session 21, no-grad, CUDA): each residual add and the LayerNorm after it as one kernel (the
# add's output is written once and normed in the same pass, not read back by a separate LayerNorm). Within a block:
# x + attn -> norm2; across blocks: the block's output (s + mlp) and the next block's norm1, handed to the next block
# with the output it belongs to (used only when that block is called with that very tensor).
_VISION_BLOCK_CLASSES = ("Qwen3VLVisionBlock",)


def _block_ok(self, x) -> bool:
    return (
        VISION_LEVERS["add_layer_norm"]
        and type(self.norm1).__name__ == type(self.norm2).__name__ == "LayerNorm"
        and _ln_ok(self.norm1, x)
        and _ln_ok(self.norm2, x)
        and not getattr(self, "gradient_checkpointing", False)
    )


def _vision_block_forward(self, hidden_states, cu_seqlens, position_embeddings=None, **kwargs):
    pend = self.__dict__.pop("_flywheel_pending", None)
    if not _block_ok(self, hidden_states):
        return type(self).forward(self, hidden_states, cu_seqlens, position_embeddings=position_embeddings, **kwargs)
    try:
        normed = pend[1] if pend is not None and pend[0] is hidden_states else self.norm1(hidden_states)
        a = self.attn(normed, cu_seqlens=cu_seqlens, position_embeddings=position_embeddings, **kwargs)
        n2, s = _ln(self.norm2, hidden_states, a)
        m = self.mlp(n2)
        nxt = self.__dict__.get("_flywheel_next")
        if nxt is not None and _block_ok(nxt, s):
            n1, out = _ln(nxt.norm1, s, m)
            nxt.__dict__["_flywheel_pending"] = (out, n1)
            return out
        return s + m
    except ImportError:
        return type(self).forward(self, hidden_states, cu_seqlens, position_embeddings=position_embeddings, **kwargs)


VISION_LEVERS = {
    "rope_attention": True,
    "gelu_epilogue": True,
    "grid_cache": True,
    "layer_norm": True,
    "add_layer_norm": True,
}
SESSION21_VISION_LEVERS = ("add_layer_norm",)


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
    for v in visual:  # session 21: the blocks' residual adds fused with the LayerNorms after them
        blocks = [m for m in v.modules() if type(m).__name__ in _VISION_BLOCK_CLASSES]
        for i, blk in enumerate(blocks):
            blk.forward = MethodType(_vision_block_forward, blk)
            blk.__dict__["_flywheel_next"] = blocks[i + 1] if i + 1 < len(blocks) else None
            applied.add("vision_add_layer_norm")
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
