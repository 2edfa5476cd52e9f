"""SFT losses as pure functions: the LM head only where there are labels.

GUI-agent samples are mostly prompt and image tokens; only the assistant reply is trained on
(often 5-15% of the sequence). The stock forward computes the vocabulary projection for every
position (a [tokens x vocab] matrix: 1482 x 151936 floats per 2B-shape sample) and then masks
most of it away. `labelled_token_loss` runs the backbone, gathers the hidden states at the
labelled positions, and projects and scores only those, in chunks, so neither the compute nor
the memory of the full logits is spent.

    loss_sum, n = labelled_token_loss(model, batch, labels)      # same value as the full-logits loss
    loss_sum, n = token_loss_sum(model(**batch).logits, labels)  # reference / fallback
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def token_loss_sum(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over labelled positions (labels -100 elsewhere) and their count."""
    shift_labels = labels[:, 1:]
    sel = shift_labels != -100
    picked = logits[:, :-1][sel.to(logits.device)].float()
    loss = F.cross_entropy(picked, shift_labels[sel].to(logits.device), reduction="sum")
    return loss, int(sel.sum())


def chunked_head_loss(hidden: torch.Tensor, head: torch.nn.Module, targets: torch.Tensor,
                      chunk: int = 4096) -> torch.Tensor:
    """Sum of CE(head(hidden[i]), targets[i]) over rows, projecting `chunk` rows at a time."""
    total = hidden.new_zeros((), dtype=torch.float32)
    for i in range(0, hidden.shape[0], chunk):
        logits = head(hidden[i:i + chunk]).float()
        total = total + F.cross_entropy(logits, targets[i:i + chunk], reduction="sum")
    return total


def _backbone_and_head(model):
    """(backbone returning hidden states, lm_head) of a plain or PEFT-wrapped Qwen-VL model."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.model, base.lm_head


def labelled_token_loss(model, batch: dict, labels: torch.Tensor, chunk: int = 4096) -> tuple[torch.Tensor, int]:
    """Like `token_loss_sum(model(**batch).logits, labels)`, without materialising unlabelled logits.

    LoRA layers live inside the backbone's modules, so a PEFT model's adapters are used as usual."""
    backbone, head = _backbone_and_head(model)
    hidden = backbone(**batch).last_hidden_state  # [B, T, H]
    shift_labels = labels[:, 1:].to(hidden.device)
    sel = shift_labels != -100
    picked = hidden[:, :-1][sel]  # [n_labelled, H]: the positions that predict a label
    return chunked_head_loss(picked, head, shift_labels[sel], chunk), int(sel.sum())
