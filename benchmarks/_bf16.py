"""Benchmarks only: run the SFT step's forward under torch.autocast(bfloat16) without a trainer option.

    set_autocast = patch_loss_autocast()   # once, before training.sft is used
    set_autocast(torch.bfloat16)           # the next train() runs its forwards under autocast; None switches it off

training.sft.train_step looks `labelled_token_loss` up in training.losses on every call, so wrapping that function
puts the whole model forward (and the loss) under autocast; the weights, gradients and optimizer stay float32.
Measured on the main job (docs/LOG.md, session 34): no faster on 2 CPU cores with micro-batches of 4, and seed 1 of
the GPU sweep fell to 89%, so the trainer has no such option.
"""

from __future__ import annotations


def patch_loss_autocast():
    import torch

    import training.losses as losses

    plain, state = losses.labelled_token_loss, {"dtype": None}

    def loss_under_autocast(model, batch, labels, *a, **k):
        if state["dtype"] is None:
            return plain(model, batch, labels, *a, **k)
        with torch.autocast(model.device.type, dtype=state["dtype"]):
            return plain(model, batch, labels, *a, **k)

    losses.labelled_token_loss = loss_under_autocast

    def set_autocast(dtype) -> None:
        state["dtype"] = dtype

    return set_autocast
