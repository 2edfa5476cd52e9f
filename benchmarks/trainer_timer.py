"""A `transformers.Trainer` callback that times each optimizer step (GPU work included) for the SFT benchmarks."""

from __future__ import annotations

import time

import torch
from transformers import TrainerCallback


def _sync() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


class StepTimer(TrainerCallback):
    """`times`: seconds per step, from step begin to step end, with the GPU's queued work finished at both ends."""

    def __init__(self):
        self.times: list[float] = []
        self.t0 = 0.0

    def on_step_begin(self, args, state, control, **kw):
        _sync()
        self.t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        _sync()
        self.times.append(time.perf_counter() - self.t0)
