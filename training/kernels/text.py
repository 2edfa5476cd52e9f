"""Levers for the trained text model (Qwen3-VL), bound onto a built model's own modules; TEXT_LEVERS switches each
at call time (benchmarks turn them off to measure them; the off path is the stock / earlier one).

    applied = fast_lora(model)   # PEFT's LoRA linears as one autograd function each (CUDA)
    applied = fast_text(model)   # DeepStack without host syncs, shared-input linears, the decoder layer's fused
                                 # norms, the attention's fused q/k norm + RoPE (CUDA)

Session 20 (issue #33 on the H100, where the step's non-matmul share is larger than on the H200):
- `rms_norm`: the llama-style RMSNorm as Triton kernels that take a block of rows per program (training.kernels.norms).
- `lora`: PEFT's LoRA linear (dropout off or inactive) as one autograd function: base GEMM, then the adapter's
  product added into the output in the GEMM (addmm_, alpha = scaling), and in backward the adapter's input gradient
  added into the base GEMM's output the same way. PEFT's forward makes the adapter output, scales it and adds it as
  three more passes over the [tokens, out] activation, and its backward adds two input gradients (with the adapter's
  dropout active that last add stays).
- `deepstack`, `shared_input`, `add_norm`: below.

Session 21 (the same step, more margin):
- `qk_norm_rope`: the attention's q/k RMSNorm over the head dim and the RoPE after it as one kernel each way
  (norms.qk_norm_rope) instead of a norm kernel and Liger's RoPE kernel, each a pass over q and k.
- `input_norm_residual`: the decoder layer's input norm through ResidualRMSNormFn, so the residual's gradient is
  added inside the norm's backward kernel instead of by autograd's separate add (one [tokens, hidden] add a layer).
- `liger_mlp_shared_input`: the gate/up linears of Liger's SwiGLU MLP (the class SFT swaps in) as a shared-input
  group too; session 20's group matched only the stock MLP class, so in SFT autograd still summed the two input
  gradients with a separate add.
- `cross_layer_norm`: a decoder layer's output add (s + mlp) and the next layer's input norm as one AddRMSNormFn
  (the layers after DeepStack's, whose input DeepStack replaces, keep their own norm); the next layer takes the
  normed tensor when it is called with that very output.
"""

from __future__ import annotations

from types import MethodType

from training.kernels.common import SESSION21_LEVERS, TEXT_LEVERS  # noqa: F401 - their home is common (norms reads them)
from training.kernels.norms import _add_rms_fn, _residual_rms_fn

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

    def __init__(self, mods, lever: str = "shared_input"):
        self.mods, self.x, self.outs, self.lever = list(mods), None, {}, lever


def _shared_input_forward(self, x):
    g = self.__dict__.get("_flywheel_group")
    if (
        g is None
        or not TEXT_LEVERS["shared_input"]
        or not TEXT_LEVERS.get(g.lever, True)
        or not (x.is_cuda or g.__dict__.get("any_device"))
    ):
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
    pre = self.input_layernorm
    pend = self.__dict__.pop("_flywheel_pending", None)
    if pend is not None and pend[0] is hidden_states:  # session 21: the previous layer's output add normed with it
        residual, normed = hidden_states, pend[1]
    elif TEXT_LEVERS["input_norm_residual"] and _llama_rms(pre):  # session 21: the residual's gradient in the kernel
        residual, normed = _residual_rms_fn().apply(hidden_states, pre.weight, pre.variance_epsilon)
    else:
        residual, normed = hidden_states, pre(hidden_states)
    h, _ = self.self_attn(hidden_states=normed, **kwargs)
    hidden_states, h = fn.apply(residual, h, post.weight, post.variance_epsilon)
    m = self.mlp(h)
    nxt = self.__dict__.get("_flywheel_next")
    if (
        nxt is not None
        and TEXT_LEVERS["cross_layer_norm"]
        and not getattr(self, "gradient_checkpointing", False)
        and getattr(nxt.forward, "__func__", None) is _decoder_layer_forward
        and _llama_rms(nxt.input_layernorm)
    ):  # the output add and the next layer's input norm as one AddRMSNormFn; the next layer takes both
        ln = nxt.input_layernorm
        out, n_next = fn.apply(hidden_states, m, ln.weight, ln.variance_epsilon)
        nxt.__dict__["_flywheel_pending"] = (out, n_next)
        return out
    return hidden_states + m


def _llama_rms(norm) -> bool:
    """A norm module whose forward is the llama-style RMSNorm of its `weight` (ours, the stock Qwen class, Liger's
    with its default offset and casting mode)."""
    return (
        isinstance(getattr(norm, "variance_epsilon", None), float)
        and getattr(norm, "weight", None) is not None
        and getattr(norm, "offset", 0.0) == 0.0
        and getattr(norm, "casting_mode", "llama") == "llama"
        and type(norm).__name__ in ("FlywheelRMSNorm", "Qwen3VLTextRMSNorm", "LigerRMSNorm")
    )


# The attention's q/k path (session 21): q_norm / k_norm (RMSNorm over the head dim) and the RoPE after them as one
# Triton kernel each way (norms.qk_norm_rope). The rest is the stock forward's: the same projections (a shared-input
# group when bound), the same attention function and arguments, o_proj.
_TEXT_ATTN_CLASSES = ("Qwen3VLTextAttention",)
_ANY_DEVICE = False  # tests: run the bound forward on CPU tensors too (with a torch stand-in for the kernel)


def _text_attn_forward(self, hidden_states, position_embeddings=None, attention_mask=None, *args, **kwargs):
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    qn, kn = self.q_norm, self.k_norm
    if (
        args
        or cache is not None
        or position_embeddings is None
        or not TEXT_LEVERS["qk_norm_rope"]
        or not (hidden_states.is_cuda or _ANY_DEVICE)
        or not (_llama_rms(qn) and _llama_rms(kn))
        or qn.variance_epsilon != kn.variance_epsilon
    ):
        return type(self).forward(self, hidden_states, position_embeddings, attention_mask, *args, **kwargs)
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from training.kernels.norms import qk_norm_rope, qk_norm_rope_supported

    shape = hidden_states.shape[:-1]
    d = self.head_dim
    q = self.q_proj(hidden_states).view(*shape, -1, d)
    k = self.k_proj(hidden_states).view(*shape, -1, d)
    v = self.v_proj(hidden_states).view(*shape, -1, d).transpose(1, 2)
    cos, sin = position_embeddings
    if not (qk_norm_rope_supported(q, qn.weight, cos, sin) and qk_norm_rope_supported(k, kn.weight, cos, sin)):
        from transformers.models.qwen3_vl import modeling_qwen3_vl as m

        q, k = m.apply_rotary_pos_emb(qn(q).transpose(1, 2), kn(k).transpose(1, 2), cos, sin)  # the stock steps
    else:
        try:
            q = qk_norm_rope(q, qn.weight, cos, sin, qn.variance_epsilon).transpose(1, 2)
            k = qk_norm_rope(k, kn.weight, cos, sin, kn.variance_epsilon).transpose(1, 2)
        except ImportError:
            from transformers.models.qwen3_vl import modeling_qwen3_vl as m

            q, k = m.apply_rotary_pos_emb(qn(q).transpose(1, 2), kn(k).transpose(1, 2), cos, sin)
    kwargs.pop("cache", None)
    kwargs.pop("past_key_values", None)
    from transformers.models.qwen3_vl.modeling_qwen3_vl import eager_attention_forward

    attention = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, eager_attention_forward)
    out, weights = attention(
        self,
        q,
        k,
        v,
        attention_mask,
        dropout=0.0 if not self.training else self.attention_dropout,
        scaling=self.scaling,
        **kwargs,
    )
    return self.o_proj(out.reshape(*shape, -1).contiguous()), weights


_SHARED_GROUPS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _shared_input_groups(model):
    """(linears, lever) for each group: the stock Qwen3-VL text classes' under TEXT_LEVERS["shared_input"], Liger's
    SwiGLU MLP's (SFT swaps it in for the stock MLP class) also under "liger_mlp_shared_input"."""
    import torch

    for mod in model.modules():
        name = type(mod).__name__
        if not (name.startswith("Qwen3VLText") or name == "LigerSwiGLUMLP"):
            continue
        for names in _SHARED_GROUPS:
            lins = [getattr(mod, n, None) for n in names]
            if all(type(m) is torch.nn.Linear and m.bias is None for m in lins):
                yield lins, ("liger_mlp_shared_input" if name == "LigerSwiGLUMLP" else "shared_input")


def fast_text(model, force: bool = False) -> list[str]:
    """Bind `_deepstack_process` onto `model`'s Qwen3-VL text model (same math, no host syncs),
    `_decoder_layer_forward` onto its decoder layers (the mid residual add fused with the post-attention RMSNorm, the
    input norm keeping the residual), `_text_attn_forward` onto its attention modules (q/k norm + RoPE in one kernel)
    and `_shared_input_forward` onto its q/k/v and gate/up linears (plain nn.Linear: full fine-tuning); returns what was
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
    deepstack = max((len(getattr(m, "deepstack_visual_indexes", ())) for m in model.modules()), default=0)
    for mod in model.modules():
        if params.is_cuda and type(mod).__name__ in _TEXT_MODEL_CLASSES and hasattr(mod, "layers"):
            layers = [m for m in mod.layers if type(m).__name__ in _DECODER_CLASSES]
            for i, layer in enumerate(layers):  # DeepStack adds to layers < deepstack's outputs: no hand-over there
                nxt = layers[i + 1] if i + 1 < len(layers) and i >= deepstack else None
                layer.__dict__["_flywheel_next"] = nxt
    for mod in model.modules():
        if params.is_cuda and type(mod).__name__ in _DECODER_CLASSES and hasattr(mod, "post_attention_layernorm"):
            mod.forward = MethodType(_decoder_layer_forward, mod)
            applied.add("add_rms_norm")
    for mod in model.modules():
        if params.is_cuda and type(mod).__name__ in _TEXT_ATTN_CLASSES and hasattr(mod, "q_norm"):
            mod.forward = MethodType(_text_attn_forward, mod)
            applied.add("qk_norm_rope")
    for lins, lever in _shared_input_groups(model):
        g = _SharedInput(lins, lever)
        g.any_device = force
        for m in lins:
            m.__dict__["_flywheel_group"] = g
            m.forward = MethodType(_shared_input_forward, m)
        applied.add("shared_input_linears")
    return sorted(applied)
