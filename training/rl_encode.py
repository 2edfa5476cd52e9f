"""Encoding for the RL update: the SDPO teacher's re-prompt, rows -> model inputs, response log-probs.

    enc = RowEncoder(processor)
    batch, pos, mask = enc.pad([enc.encode(row["messages"], row["images"], enc.response_ids(row))], device)
    logp, ent = response_logprobs(model, batch, pos, mask, entropy=True)    # [B, R] each
    logp, ent, (bk, ids) = response_logprobs(model, batch, pos, mask, topk=20)  # + top-k buckets [B, R, 21]
    hinted = teacher_messages(row["messages"], solution="Step 1: ...", feedback="...")

training.rl documents how the update uses them.
"""

from __future__ import annotations

import copy
from typing import Any, Callable

from training.data import (  # noqa: F401 - the SDPO teacher's re-prompt, importable from here as before
    FEEDBACK_BLOCK,
    REPROMPT_TAIL,
    SOLUTION_BLOCK,
    SFTCollator,
    _pil,
    teacher_messages,
)

VISION_TOKENS = ("<|image_pad|>", "<|video_pad|>", "<|vision_start|>", "<|vision_end|>")


# ------------------------------------------------------------------------------------------------ encoding
class RowEncoder:
    """Rows -> model inputs: [chat template + generation prompt, with the row's images] + response ids."""

    def __init__(self, processor):
        self.processor = processor
        self.tok = getattr(processor, "tokenizer", processor)
        self.collator = SFTCollator(processor)
        vocab = self.tok.get_vocab() if hasattr(self.tok, "get_vocab") else {}
        # placeholders the model expands into image features / finds to build mRoPE positions: a sampled reply
        # that contains one cannot be teacher-forced (the image-feature count and the positions break)
        self.vision_ids = {vocab[t] for t in VISION_TOKENS if t in vocab}

    def scorable(self, ids: list[int]) -> bool:
        """False when the response holds a vision placeholder token (a random or early policy samples them)."""
        return not self.vision_ids.intersection(ids)

    def response_ids(self, row: dict[str, Any]) -> list[int]:
        """The row's sampled token ids, or its target text tokenised as SFT labels it (text + <|im_end|>)."""
        if row.get("response_ids"):
            return [int(x) for x in row["response_ids"]]
        if row.get("target_text"):
            return self.tok(row["target_text"] + "<|im_end|>", add_special_tokens=False)["input_ids"]
        raise ValueError(f"row {row.get('episode_id')}/{row.get('step_idx')} has no response ids or target text")

    def encode(self, messages: list[dict[str, Any]], images: list[Any], response: list[int]) -> dict[str, Any]:
        import torch

        text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        kw: dict[str, Any] = {"text": [text], "return_tensors": "pt"}
        if images:
            kw["images"] = [_pil(i) for i in images]
        enc = dict(self.processor(**kw))
        n_prompt, resp = enc["input_ids"].shape[1], torch.tensor([response], dtype=enc["input_ids"].dtype)
        for key, v in list(enc.items()):
            if key == "input_ids":
                enc[key] = torch.cat([v, resp], dim=1)
            elif torch.is_tensor(v) and v.dim() == 2 and v.shape == (1, n_prompt):  # attention mask, mm token types
                fill = 1 if key == "attention_mask" else 0
                enc[key] = torch.cat([v, torch.full((1, len(response)), fill, dtype=v.dtype)], dim=1)
        enc["labels"] = torch.cat([torch.full((1, n_prompt), -100, dtype=resp.dtype), resp], dim=1)
        return enc

    def place(self, enc: dict[str, Any], device, dtype=None) -> dict[str, Any]:
        """One encoded row's tensors on `device`; floating ones (pixel_values) cast first to `dtype` when given (the
        dtype the vision tower casts them to: the same values, half the bytes to copy for bf16)."""
        return {
            k: (v.to(dtype) if dtype is not None and v.is_floating_point() else v).to(device) for k, v in enc.items()
        }

    def resident(self, enc: list[dict[str, Any]], tenc: dict[int, dict[str, Any]], device, dtype, budget: int):
        """An update's encoded rows (and SDPO teacher rows by index) on `device` (pixel_values in `dtype`) up to
        `budget` bytes, so a step only pads them there; the rest stay on the host and are placed at every use. A
        teacher row shares its student row's pixel_values (the same images, so the same tensor)."""
        import torch

        out, used = [], 0
        for e in enc:
            size = sum(
                v.numel() * (dtype or v.dtype).itemsize if v.is_floating_point() else v.numel() * v.element_size()
                for v in e.values()
            )
            keep = used + size <= budget
            used += size if keep else 0
            out.append(self.place(e, device, dtype) if keep else e)
        for i, t in tenc.items():
            if out[i] is enc[i]:
                continue  # the student's row stays on the host: so does the teacher's
            pv, spv = t.get("pixel_values"), enc[i].get("pixel_values")
            if pv is not None and spv is not None and pv.shape == spv.shape and torch.equal(pv, spv):
                t = dict(t, pixel_values=out[i]["pixel_values"])
            tenc[i] = self.place(t, device, dtype)
        return out, tenc

    def pad(self, encoded: list[dict[str, Any]], device, dtype=None) -> tuple[dict[str, Any], Any, Any]:
        """(batch on device, positions [B, R] that predict each response token, response mask [B, R]). Rows already on
        `device` (RLTrainer keeps an update's rows there) are padded there; others are placed first (`place`)."""
        import torch

        batch = self.collator.pad([self.place(e, device, dtype) for e in encoded])
        labels = batch.pop("labels")
        counts = (labels != -100).sum(1)
        starts = (labels != -100).int().argmax(1)
        width = int(counts.max()) if len(counts) else 0
        j = torch.arange(width, device=labels.device)[None, :]
        mask = j < counts[:, None]
        pos = torch.where(mask, starts[:, None] - 1 + j, torch.zeros_like(j))
        return batch, pos, mask


def length_batches(idx, enc: list[dict[str, Any]] | Callable[[int], int], size: int) -> list[list[int]]:
    """Micro-batches of `size` rows of `idx` taken in order of sequence length: they pad to similar lengths (a
    random order pads ~24% of a click-button round's tokens, this order ~2%). A minibatch's loss is the sum of its
    micro-batches' terms over the minibatch's own normaliser, so the grouping changes nothing but the float order.
    `enc`: the encoded rows, or a row's length by index (SFT's EncodedSamples.length)."""
    length = enc if callable(enc) else lambda i: enc[i]["input_ids"].shape[-1]
    order = sorted(idx, key=length)
    return [order[k : k + size] for k in range(0, len(order), size)]


NO_PAD_MASK = True  # response_logprobs leaves the (right-)padding mask out; benchmarks switch it off to compare


def response_logprobs(
    model,
    batch: dict[str, Any],
    pos,
    mask,
    *,
    entropy: bool = False,
    chunk: int = 1024,
    topk: int = 0,
    at=None,
    temperature: float = 1.0,
):
    """(log-probs [B, R] of the response tokens, entropies [B, R] or None): one backbone forward, the LM head
    only at the positions that predict a response token (the full-logits values, without [T x vocab]).
    `temperature`: the policy is softmax(logits / temperature), the distribution a sampler at that temperature
    draws from (1 = the raw logits; everything below, entropies and buckets included, reads the tempered one).

    Top-k SDPO: with `topk` k > 0 (this model's own top-k ids at each position) or `at` (vocabulary ids
    [B, R, k], e.g. the student's, for the teacher) a third value (buckets [B, R, K], ids [B, R, k]) is
    returned: the full-vocabulary log-softmax gathered at those ids plus a tail bucket log(1 - sum p) when
    k < vocab (losses._topk_buckets; K = k + 1, else K = k = vocab). Memory stays at one [chunk x vocab] logits
    block at a time plus [R x K] values: a row's top-k distribution is what losses.sdpo_topk_loss reads of the
    full logits, so sdpo_topk_loss(buckets_S, buckets_T, k=K, tail=False) equals it on the full logits (tested),
    gradient included (the bucket log-probs keep the softmax normaliser's dependence on every logit)."""
    import torch

    from training.losses import _backbone_and_head, _topk_buckets, entropy_from_logprobs

    backbone, head = _backbone_and_head(model)
    # Rows are right-padded (SFTCollator.pad): under causal attention no real token sees a pad, and the mRoPE
    # positions of the real tokens do not depend on the pads after them, so without the padding mask every value
    # read below is the same, and attention runs on the causal flash kernels instead of SDPA over a [B, 1, T, T]
    # mask (which computes every block).
    drop = "attention_mask" if NO_PAD_MASK else None
    hidden = backbone(**{k: v for k, v in batch.items() if k != drop}).last_hidden_state
    rows = torch.arange(pos.shape[0], device=pos.device)[:, None].expand_as(pos)[mask]
    at_pos = pos[mask]
    sel, tgt = hidden[rows, at_pos], batch["input_ids"][rows, at_pos + 1]
    want = at[mask] if at is not None else None
    lps, ents, bks, ids = [], [], [], []
    for i in range(0, sel.shape[0], chunk):
        logits = head(sel[i : i + chunk]).float()
        lp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, -1)  # serves all read below
        lps.append(lp.gather(-1, tgt[i : i + chunk, None]).squeeze(-1))
        if topk or want is not None:
            ix = want[i : i + chunk] if want is not None else lp.detach().topk(min(topk, lp.shape[-1]), dim=-1).indices
            bks.append(_topk_buckets(lp, ix, ix.shape[-1] < lp.shape[-1]))
            ids.append(ix)
        if entropy:  # a metric: from the same log-softmax, no gradient
            with torch.no_grad():
                ents.append(entropy_from_logprobs(lp.detach()))
    zero = torch.zeros(pos.shape, dtype=torch.float32, device=pos.device)
    logp = zero.masked_scatter(mask, torch.cat(lps)) if lps else zero
    ent = (zero.masked_scatter(mask, torch.cat(ents)) if ents else zero) if entropy else None
    if not (topk or want is not None):
        return logp, ent
    return logp, ent, (_per_position(bks, mask, torch.float32), _per_position(ids, mask, torch.long))


def _per_position(chunks: list[Any], mask, dtype):
    """[N, K] values of the masked positions -> [B, R, K] (0 elsewhere)."""
    import torch

    k = chunks[0].shape[-1] if chunks else 1
    out = torch.zeros((*mask.shape, k), dtype=dtype, device=mask.device)
    return out.masked_scatter(mask[..., None].expand_as(out), torch.cat(chunks).to(dtype)) if chunks else out


def pixel_dtype(model):
    """The dtype a (PEFT-wrapped or plain) Qwen-VL model's vision tower casts pixel_values to: its patch
    embedding's weight dtype (bf16 on GPU, fp32 on CPU); None when the model has no such module."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    visual = getattr(getattr(base, "model", base), "visual", None)
    weight = getattr(getattr(getattr(visual, "patch_embed", None), "proj", None), "weight", None)
    return weight.dtype if weight is not None else None


def frozen_copy(model):
    twin = copy.deepcopy(model)
    twin.requires_grad_(False)
    return twin.eval()


def rows_tensor(values: list[Any], width: int, device, fill: float = 0.0):
    import torch

    out = torch.full((len(values), width), fill, dtype=torch.float32)
    for i, v in enumerate(values):
        out[i, : len(v)] = v[:width]
    return out.to(device)
