"""The bookkeeping around the SFT loop (training/sft.py): where a run starts, what it saves, how its steps are clocked
against the budget, and what it reports when it ends. `s` is training.sft's TrainSettings, not imported here (sft
imports this module, and the layout test counts even a TYPE_CHECKING import as a cycle).

    st = start_state(out, n_samples, weights, opt, s, rank)     # the newest state/step-N, or a fresh plan
    clock = StepClock(s, ctx)
    clock.tick(st, seconds, tokens)    # True when the budget fit changed the planned steps
    save_run_state(out, weights, opt, st, ctx)                  # every save_every steps, and at the end
    finish(model, proc, out, s, st, base, resumed_from, ...)    # the model, then sft_result.json (the completion mark)

Resume is exact: the state holds the step, the samples consumed (the data-order position), the loss curve, the
optimizer and, under DDP, every rank's RNG state.
"""

from __future__ import annotations

import math
from collections import deque
from pathlib import Path
from typing import Any

from training.core import TrainableWeights, TrainState, fit_budget, latest_state, load_state, rng_state, save_model
from training.core import save_state as _write_state
from training.distributed import RESULT_FILE, Context, gather, global_float


def plan_steps(n: int, s: Any) -> tuple[int, int]:
    """(optimizer steps, warmup steps) for n samples: the stream is ceil(epochs * n) samples long."""
    per_step = s.batch_size * s.grad_accum
    steps = math.ceil(math.ceil(s.epochs * n) / per_step)
    if s.max_steps:
        steps = min(steps, s.max_steps)
    return steps, min(math.ceil(s.warmup_ratio * steps), steps)


def save_run_state(out: Path, weights: TrainableWeights, opt, st: TrainState, ctx: Context) -> None:
    """Rank 0 writes the resumable state; under DDP it holds every rank's RNG state (each rank's dropout draws its
    own numbers), gathered here from all ranks."""
    rng = {"ranks": gather(ctx, rng_state())} if ctx.active else None
    if ctx.main:
        _write_state(out, weights, opt, st, rng=rng)


def start_state(out: Path, n: int, weights: TrainableWeights, opt, s: Any, rank: int = 0) -> TrainState:
    """The newest checkpoint's state (weights, optimizer and RNG restored), or a fresh plan for n samples."""
    ckpt = latest_state(out)
    if ckpt is None:
        planned, warmup = plan_steps(n, s)
        return TrainState(planned_steps=planned, total_steps=planned, warmup_steps=warmup, n_samples=n)
    st = load_state(ckpt, weights, opt, rank=rank)
    if st.n_samples != n:
        raise ValueError(
            f"{ckpt} was trained on {st.n_samples} samples but the dataset has {n}: resume with "
            f"the same data, or use a new output folder"
        )
    return st


class StepClock:
    """Each step's time against the budget. Under DDP a step's time is the ranks' mean, so every rank takes the
    same budget decisions (a rank stopping alone would hang the others)."""

    def __init__(self, s: Any, ctx: Context):
        self.s, self.ctx = s, ctx
        self.log: list[tuple[float, int]] = []  # (seconds, tokens) per step, with s.record_step_times
        self.recent: deque = deque(maxlen=10)  # the budget fit follows the current load

    def tick(self, st: TrainState, seconds: float, tokens: int) -> bool:
        """Account one step; True when the budget fit changed the planned steps."""
        dt = global_float(self.ctx, seconds) / self.ctx.world
        st.elapsed_s += dt
        if self.s.record_step_times:
            self.log.append((round(dt, 5), tokens))
        self.recent.append(dt)
        if self.s.max_minutes and self.s.schedule_to_budget and len(self.recent) >= 4 and st.step % 4 == 0:
            # leave out the oldest time in the window: early on that is the first step, which pays one-off costs
            # (allocations, lazy init)
            fit_budget(st, self.s, sum(list(self.recent)[1:]) / (len(self.recent) - 1))
            return True
        return False

    def report(self) -> dict[str, list]:
        return {"step_times": [t for t, _ in self.log], "step_tokens": [n for _, n in self.log]} if self.log else {}


def metrics(st: TrainState, s: Any, model, base: str) -> dict[str, Any]:
    """sft_result.json's numbers: losses, steps, tokens, rates, the stop reason and where it ran."""
    from dataclasses import asdict

    from training.models import count_parameters

    tail = st.losses[-10:] or [float("nan")]
    curve = st.losses if len(st.losses) <= 200 else st.losses[:: math.ceil(len(st.losses) / 200)]
    wall = max(st.elapsed_s, 1e-9)
    return {
        "final_loss": sum(tail) / len(tail),
        "first_loss": st.losses[0] if st.losses else None,
        "steps": st.step,
        "planned_steps": st.planned_steps,
        "total_steps": st.total_steps,
        "samples_seen": st.samples_seen,
        "tokens": st.tokens,
        "target_tokens": st.target_tokens,
        "wall_s": round(st.elapsed_s, 2),
        "steps_per_s": st.step / wall,
        "tokens_per_s": st.tokens / wall,
        "target_tokens_per_s": st.target_tokens / wall,
        "stopped": st.stopped,
        "loss_curve": curve,
        "trainable_params": count_parameters(model)["trainable"],
        "method": s.method,
        "base_model": base,
        "settings": asdict(s),
        **placement(model),
    }


def placement(model) -> dict[str, Any]:
    """Where training ran and in what precision (picked automatically: CUDA -> bf16, CPU -> fp32)."""
    import torch

    p = next(model.parameters())
    trainable = [q for q in model.parameters() if q.requires_grad]
    return {
        "device": torch.cuda.get_device_name(p.device) if p.device.type == "cuda" else str(p.device),
        "dtype": str(p.dtype).removeprefix("torch."),
        "trainable_dtype": str(trainable[0].dtype).removeprefix("torch.") if trainable else None,
    }


def finish(
    model,
    proc,
    out: Path,
    s: Any,
    st: TrainState,
    base: str,
    resumed_from: int,
    kernels: list[str],
    world_size: int = 1,
    **extra: Any,
) -> dict[str, Any]:
    """Save the adapter/full model + processor (+ merged model), then sft_result.json as the completion mark."""
    m = dict(
        metrics(st, s, model, base),
        resumed_from_step=resumed_from,
        fused_kernels=kernels,
        world_size=world_size,
        **extra,
    )
    return save_model(
        model, proc, out, m, merge=s.merge, adapter=s.method == "lora", result_file=RESULT_FILE, keep_state=s.keep_state
    )
