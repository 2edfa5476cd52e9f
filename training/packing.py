"""Sequence packing for SFT (`sft.packing: true`): a micro-batch is one row holding whole samples back to back, no pads.

    samples = EncodedSamples(rows, SFTCollator(proc), positions=rope_positions_fn(model))
    for group in plan_packs([samples.length(i) for i in idx], max_tokens=16384):
        batch = samples.packed(group)                  # input_ids [1, T], labels, position_ids [4, 1, T], ...
        with packed_attention(model, batch):           # CUDA: varlen flash attention over the samples
            loss_sum, n = labelled_token_loss(model, batch, labels)

GUI samples vary in length (one or several screenshots, short or long UI text), so a padded batch spends compute
on pads; a packed row spends none. Two things keep a packed sample's loss equal to its loss alone:
- positions: `position_ids` has 4 rows, as Qwen3-VL's text model reads them: row 0 the text positions, restarting
  at 0 for every sample, rows 1-3 the sample's own multimodal RoPE positions (the model's `get_rope_index` on the
  sample alone, so each sample's t/h/w positions start where they would unpacked);
- isolation: no sample attends to another. Without an attention mask, transformers reads the restarts of row 0
  (masking_utils.find_packed_sequence_indices) and builds a block-diagonal causal mask for SDPA (CPU, and CUDA
  without varlen). On CUDA with torch's `torch.nn.attention.varlen.varlen_attn` (flash attention over cumulative
  sequence lengths), `packed_attention` routes the text model's attention through it instead, so the cost is
  each sample's own causal attention and not the whole row's.
The first token of every sample is never a target (labels -100), so no sample is trained to predict the next
sample's first token. The vision tower needs nothing: it already encodes each image on its own (cu_seqlens).
"""

from __future__ import annotations

import inspect
from contextlib import contextmanager
from typing import Any, Callable, Sequence

from training.data import IGNORE_INDEX

VARLEN = "flywheel_varlen"  # the attention implementation name registered with transformers
_VARLEN_SIG: dict[str, bool] | None = None


def plan_packs(lengths: Sequence[int], max_tokens: int) -> list[list[int]]:
    """Positions (into `lengths`) grouped into packs of at most `max_tokens` tokens: first-fit over the samples
    longest first. A sample longer than `max_tokens` gets a pack of its own. Deterministic for the same input."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    packs: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for p, free in enumerate(room):
            if lengths[i] <= free:
                packs[p].append(i)
                room[p] -= lengths[i]
                break
        else:
            packs.append([i])
            room.append(max_tokens - lengths[i])
    return packs


def rope_positions_fn(model) -> Callable[[dict[str, Any]], Any]:
    """enc -> [3, 1, L] multimodal RoPE positions of one encoded sample alone (what the model computes for it in a
    batch of one). Raises a one-line ValueError for a model without Qwen3-VL's `get_rope_index`."""
    import torch

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    inner = getattr(base, "model", None)
    sig = inspect.signature(inner.get_rope_index).parameters if hasattr(inner, "get_rope_index") else {}
    if "mm_token_type_ids" not in sig:
        raise ValueError(f"sft.packing supports Qwen3-VL students only (this model is {type(base).__name__})")

    def positions(enc: dict[str, Any]):
        ids = enc["input_ids"]
        if "image_grid_thw" not in enc:
            return torch.arange(ids.shape[1]).view(1, 1, -1).expand(3, 1, -1).clone()
        with torch.no_grad():
            pos, _ = inner.get_rope_index(
                ids, mm_token_type_ids=enc["mm_token_type_ids"], image_grid_thw=enc["image_grid_thw"]
            )
        return pos.cpu()

    return positions


def pack(encoded: Sequence[dict[str, Any]], pin: bool = False) -> dict[str, Any]:
    """One packed row from per-sample encodings (each with `position_ids` [3, 1, L] from `rope_positions_fn`).

    Returns input_ids / labels / mm_token_type_ids [1, T], position_ids [4, 1, T], the images concatenated in
    sample order (into page-locked memory with `pin`, so the copy to the GPU is asynchronous), the varlen keys
    (`cu_seq_lens_q/k` int32 [n + 1], `max_length_q/k`) and use_cache False; no attention_mask."""
    import torch

    from training.data import cat_rows

    lengths = [int(e["input_ids"].shape[1]) for e in encoded]
    labels = torch.cat([e["labels"] for e in encoded], dim=1).clone()
    starts = [0]
    for n in lengths[:-1]:
        starts.append(starts[-1] + n)
    labels[0, starts] = IGNORE_INDEX  # never predict a sample's first token from the previous sample
    text = torch.cat([torch.arange(n) for n in lengths]).view(1, 1, -1)
    out: dict[str, Any] = {
        "input_ids": torch.cat([e["input_ids"] for e in encoded], dim=1),
        "labels": labels,
        "position_ids": torch.cat([text, torch.cat([e["position_ids"] for e in encoded], dim=2)], dim=0),
    }
    for key in ("mm_token_type_ids",):
        if all(key in e for e in encoded):
            out[key] = torch.cat([e[key] for e in encoded], dim=1)
    for key in ("pixel_values", "image_grid_thw"):
        parts = [e[key] for e in encoded if key in e]
        if parts:
            out[key] = cat_rows(parts, pin=pin and key == "pixel_values")
    cu = torch.tensor([0] + lengths, dtype=torch.int32).cumsum(0, dtype=torch.int32)
    out.update(cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=max(lengths), max_length_k=max(lengths))
    out["use_cache"] = False  # with a cache object transformers skips the packed-sequence mask: SDPA would mix samples
    return out


VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")  # pack()'s keys for varlen


# ------------------------------------------------------------------------------------------------ attention
def varlen_available() -> bool:
    """torch's varlen flash attention on a CUDA device (torch >= 2.10)."""
    import torch

    if not torch.cuda.is_available():
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return True


def _varlen_signature() -> dict[str, bool]:
    global _VARLEN_SIG
    if _VARLEN_SIG is None:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        _VARLEN_SIG = {
            "is_causal": "is_causal" in params,
            "window_size": "window_size" in params,
            "enable_gqa": "enable_gqa" in params,
        }
    return _VARLEN_SIG


class _FlashVarlen:
    """Flash attention over cumulative sequence lengths straight from aten (`_flash_attention_forward/_backward`,
    the kernels torch's varlen_attn calls), built lazily as a torch.autograd.Function. Unlike torch 2.11's
    varlen_attn it takes K/V with fewer heads than Q (GQA: the flash kernel reads each K/V head for its group of
    query heads, and its backward sums their gradients), so no repeated K/V copies are made or kept for backward."""

    fn = None

    @classmethod
    def apply(cls, q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool, scale: float | None):
        if cls.fn is None:
            import torch

            class Fn(torch.autograd.Function):
                @staticmethod
                def forward(ctx, q, k, v, cu_q, cu_k, max_q, max_k, causal, scale):
                    out, lse, seed, offset, _ = torch.ops.aten._flash_attention_forward(
                        q, k, v, cu_q, cu_k, max_q, max_k, 0.0, causal, False, scale=scale
                    )
                    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, seed, offset)
                    ctx.args = (max_q, max_k, causal, scale)
                    return out

                @staticmethod
                def backward(ctx, grad):
                    q, k, v, out, lse, cu_q, cu_k, seed, offset = ctx.saved_tensors
                    max_q, max_k, causal, scale = ctx.args
                    dq, dk, dv = torch.ops.aten._flash_attention_backward(
                        grad.contiguous(),
                        q,
                        k,
                        v,
                        out,
                        lse,
                        cu_q,
                        cu_k,
                        max_q,
                        max_k,
                        0.0,
                        causal,
                        seed,
                        offset,
                        scale=scale,
                    )
                    return dq, dk, dv, None, None, None, None, None, None

            cls.fn = Fn
        return cls.fn.apply(q, k, v, cu_q, cu_k, max_q, max_k, causal, scale)


GQA_NATIVE = True  # False: torch's varlen_attn with K/V repeated to the query heads when it lacks enable_gqa


def varlen_attention(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    cu_seq_lens_q=None,
    cu_seq_lens_k=None,
    max_length_q=None,
    max_length_k=None,
    **kwargs,
):
    """A transformers attention function: attention within each packed sequence on flash varlen kernels; causal
    unless the caller says `is_causal=False`.

    query [B, Hq, T, D], key/value [B, Hkv, T, D] with B * T tokens split by `cu_seq_lens_q`; returns
    ([B, T, Hq, D], None) like transformers' sdpa_attention_forward. Without cu_seq_lens it is plain SDPA."""
    if cu_seq_lens_q is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    b, hq, t, d = query.shape
    hk = key.shape[1]
    causal = getattr(module, "is_causal", True) if is_causal is None else bool(is_causal)
    q = query.transpose(1, 2).reshape(b * t, hq, d)
    k = key.transpose(1, 2).reshape(b * t, hk, d)
    v = value.transpose(1, 2).reshape(b * t, hk, d)
    cu_k = cu_seq_lens_k if cu_seq_lens_k is not None else cu_seq_lens_q
    max_q, max_k = int(max_length_q), int(max_length_k or max_length_q)
    if GQA_NATIVE:
        out = _FlashVarlen.apply(q, k, v, cu_seq_lens_q, cu_k, max_q, max_k, causal, scaling)
        return out.reshape(b, t, hq, d), None
    from torch.nn.attention.varlen import varlen_attn

    sig = _varlen_signature()
    extra: dict[str, Any] = {}
    if hq != hk:
        if sig["enable_gqa"]:
            extra["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
    if sig["window_size"]:
        extra["window_size"] = (-1, 0) if causal else (-1, -1)
    elif sig["is_causal"]:
        extra["is_causal"] = causal
    else:
        raise RuntimeError("this torch's varlen_attn takes neither is_causal nor window_size: cannot make it causal")
    out = varlen_attn(q, k, v, cu_seq_lens_q, cu_k, max_q, max_k, scale=scaling, **extra)
    return out.reshape(b, t, hq, d), None


def _register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(VARLEN, varlen_attention)


def _text_attention_configs(model) -> list[Any]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    lm = base.model.language_model
    seen: dict[int, Any] = {}
    for mod in lm.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation"):
            seen[id(cfg)] = cfg
    return list(seen.values())


@contextmanager
def packed_attention(model, batch: dict[str, Any], varlen: bool):
    """Run the forward inside this block with the text model's attention on varlen (when `varlen`), else as
    configured; without varlen the varlen keys are dropped from `batch` and SDPA isolates the samples through the
    mask transformers builds from the position restarts. The vision tower's attention is left as it is (its
    per-image cuDNN attention measured faster than one flash varlen call over the images: docs/LOG.md)."""
    if not varlen:
        for k in VARLEN_KEYS:
            batch.pop(k, None)
        yield batch
        return
    _register()
    cfgs = _text_attention_configs(model)
    before = [c._attn_implementation for c in cfgs]
    for c in cfgs:
        c._attn_implementation = VARLEN
    try:
        yield batch
    finally:
        for c, name in zip(cfgs, before):
            c._attn_implementation = name
