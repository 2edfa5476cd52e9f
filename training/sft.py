"""Supervised fine-tuning of the student on a curated dataset: a lean, resumable torch loop.

    metrics = train("models/small-qwen3vl", "lake/_datasets/<id>/train.parquet", Path("lake/_checkpoints/x"),
                    TrainSettings(method="lora", lr=1e-3, epochs=3, batch_size=8, max_minutes=5))
    res = training.sft_stage.sft_stage(cfg, 1, "curate-it1-...")  # the flywheel stage (checkpoints row)
    $ python -m training.sft --base models/tiny --data train.parquet --out ckpt --settings '{"epochs": 1}'

Why a lean loop and not TRL's SFTTrainer: resume must be exact (data-order position, schedule, RNG and
optimizer state restored mid-epoch, so a SIGKILLed run ends with the same weights as an uninterrupted one);
the loss is summed per target token and divided by the target tokens of the whole optimizer step, so
batch 1 x accum 4 is the same update as batch 4 x accum 1 (a mean per micro-batch is not); the collator is
ours (training.data.SFTCollator: the rollouts' chat template, assistant-only labels, right padding); and on a
2-core CPU the loop has no accelerate/Trainer overhead.

- LoRA (default; training.models.apply_lora) or full fine-tune; the vision tower is frozen in both.
- bf16 on CUDA, fp32 on CPU (training.models.load_model's "auto"); AdamW; linear warmup + cosine decay;
  global-norm gradient clipping; an optional wall-clock budget (stop cleanly, save) that can shorten the
  cosine schedule to the steps that fit (`schedule_to_budget`).
- Every `save_every` steps `<out>/state/step-N/` holds the trainable weights, optimizer, RNG and trainer state
  (step, samples consumed, loss curve); `train` resumes from the newest one.
- Output `<out>/`: the adapter (or full model) with the processor beside it, loadable by
  training.models.load_model; for LoRA also `<out>/merged/` (merge_and_unload); `sft_result.json` last.
- Unsloth's FastVisionModel is used only when asked, installed and on CUDA (never on CPU); same data/outputs.
- The optimizer, TrainableWeights, resumable state, lr schedule, budget, progress bar, model save and
  checkpoint lineage are training.core's, shared with RL (training/rl.py); the loop's names stay importable from
  here. The run's bookkeeping (where it starts, the state it saves, the step clock, the metrics and the final save)
  is training/sft_run.py; the stage's lake side (checkpoint id, reuse, adopt, the `checkpoints` row) is
  training/sft_stage.py.
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from configs.models import SFT_STAGE_FIELDS, SFTConfig, choices, settings_from
from configs.runkeys import RUNTIME
from training.adopt import file_digest, weights_digest
from training.core import (  # noqa: F401
    CHECKPOINTS_DIR,
    STATE_DIR,
    Bar,
    TrainableWeights,  # noqa: F401 (re-exported)
    TrainState,
    _perm,
    _unsloth_model,
    fit_budget,
    latest_state,
    load_for_training,
    load_state,
    lr_factor,
    make_optimizer,
    optimizer_step,
    rng_state,
    sample_at,
    save_model,
    save_state,
)

# the private names this module had before training.core existed
from training.core import Bar as _Bar  # noqa: F401
from training.core import fused_kernels as _fused_kernels
from training.core import model_path_of as _model_path_of  # noqa: F401
from training.core import trainable as _trainable  # noqa: F401
from training.distributed import (
    Context,
    balanced_share,
    ddp_wrap,
    exit_worker,
    global_float,
    global_sum,
    launch,
    setup,
    teardown,
    wants_launch,
)
from training.progress import ProgressLog, draws_bar
from training.samples import EncodedSamples, Prefetch  # noqa: F401 (EncodedSamples: the tests import it here)
from training.sft_run import StepClock, finish, save_run_state, start_state


@dataclass
class TrainSettings:
    """What one SFT run needs, read from configs.models.SFTConfig (which documents each knob; the defaults are its
    own, tests/test_config_settings.py checks it) plus three fields of the trainer's own for tests and benchmarks."""

    CONFIG_MODEL: ClassVar[type] = SFTConfig  # the config section these settings are read from

    method: str = "lora"  # lora | full
    lr: float = 1e-3
    epochs: float = 3.0
    batch_size: int = 8
    grad_accum: int = 1
    max_minutes: float | None = None
    max_steps: int | None = None
    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_fp32_adapters: bool = False  # True = PEFT's default; False = adapters in the model dtype + fp32 masters
    warmup_ratio: float = 0.05
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    save_every: int = 50
    seed: int = 0
    schedule_to_budget: bool = True
    merge: bool = True
    unsloth: bool = False
    targets: str = "full"  # full | action | tool_call (training.data.retarget)
    fused_kernels: bool = True  # Liger RMSNorm/SwiGLU/RoPE on CUDA when installed
    # not in the checkpoint id (RUNTIME): what a run keeps and how slowly it goes change nothing it trains
    keep_state: bool = field(default=False, metadata=RUNTIME)  # keep <out>/state after success (tests inspect it)
    step_sleep_s: float = field(default=0.0, metadata=RUNTIME)  # delay per step: the kill/resume test lands mid-run
    distributed: str = "none"  # none | ddp (training.distributed: torchrun + PyTorch DDP over the local GPUs)
    nproc: int | None = None  # DDP processes (None = every visible GPU)
    record_step_times: bool = field(default=False, metadata=RUNTIME)  # benchmarks: per-step times into the result
    hint_fraction: float = 0.0  # hint-aware SFT: this fraction of samples added again with the SDPO solution block
    packing: bool = False  # micro-batches as packed rows of whole samples (training.packing), not padded batches
    pack_tokens: int = 16384  # with packing: at most this many tokens a micro-batch (a longer sample goes alone)
    encode_cache_gib: float = 4.0  # encoded samples kept in host memory (past it: re-encoded on every use)
    encode_workers: int | None = None  # CUDA: Prefetch processes (None: the cores over the DDP processes, at most 8)
    vision_cache: bool | None = None  # frozen tower, epochs > 1: image features kept (None: on CUDA, off on CPU)
    micro_batch: int | None = None  # rows a forward (length-sorted within the step; None: batch_size, in order)

    @classmethod
    def from_config(cls, sft_cfg: Any) -> "TrainSettings":
        """From an SFTConfig (cfg.sft, cfg.midtrain.sft). A field that is neither a setting nor in SFT_STAGE_FIELDS
        is a ConfigError (configs.models.settings_from)."""
        return settings_from(sft_cfg, cls, SFT_STAGE_FIELDS)

    def __post_init__(self):
        if self.method not in choices(SFTConfig, "method"):
            raise ValueError(f"sft method must be 'lora' or 'full', got {self.method!r}")
        from training.data import TARGET_FORMATS

        if self.targets not in TARGET_FORMATS:
            raise ValueError(f"sft targets must be one of {', '.join(TARGET_FORMATS)}, got {self.targets!r}")
        if self.batch_size < 1 or self.grad_accum < 1 or self.epochs <= 0:
            raise ValueError("batch_size and grad_accum must be >= 1 and epochs > 0")
        if self.distributed not in choices(SFTConfig, "distributed"):
            raise ValueError(f"sft distributed must be 'none' or 'ddp', got {self.distributed!r}")
        if not 0.0 <= self.hint_fraction <= 1.0:
            raise ValueError(f"sft hint_fraction must be in [0, 1], got {self.hint_fraction}")
        if self.pack_tokens < 1:
            raise ValueError(f"sft pack_tokens must be >= 1, got {self.pack_tokens}")
        if self.encode_cache_gib < 0:
            raise ValueError(f"sft encode_cache_gib must be >= 0, got {self.encode_cache_gib}")


# ------------------------------------------------------------------------------------------------ pieces
def read_samples(data_files: str | Path) -> list[dict[str, Any]]:
    """Rows (messages, images, step_idx when the file has it) of an exported SFT Parquet file (training.export's
    layout)."""
    import pyarrow.parquet as pq

    path = Path(data_files)
    if not path.exists():
        raise FileNotFoundError(f"no SFT dataset at {path}: run the curate stage first")
    cols = ["messages", "images"] + (["step_idx"] if "step_idx" in pq.read_schema(path).names else [])
    rows = pq.read_table(path, columns=cols).to_pylist()
    if not rows:
        raise ValueError(f"{path} holds no samples")
    return rows


# ------------------------------------------------------------------------------------------------ loop
def train_step(
    model,
    samples: EncodedSamples,
    idx: list[int],
    s: TrainSettings,
    device,
    ddp=None,
    ctx: Context = Context(),
    defer: bool = False,
) -> tuple["float | DeferredLoss", int, int]:
    """Forward/backward over grad_accum micro-batches; the loss is normalised by the step's target tokens.

    The loss projects only the labelled positions through the LM head (training.losses.labelled_token_loss:
    the same value as the full-logits loss, without the [tokens x vocab] matrix). Under DDP (`ddp` wraps
    `_loss_sum`) this rank takes its token-balanced share of the step's samples, and the normaliser is the step's
    target tokens over all ranks times the world size over DDP's gradient average: the same objective as one
    device. With `defer` (one process, CUDA) the loss is not read here: it comes back as a DeferredLoss that
    float() reads later, so the host can queue the optimizer step while the GPU still runs the backward pass (the
    read waits for the whole queue)."""
    from contextlib import nullcontext

    from training.losses import labelled_token_loss
    from training.packing import packed_attention, plan_packs
    from training.rl_encode import length_batches

    mine = balanced_share(idx, [samples.length(i) for i in idx], ctx) if ctx.active else idx
    if s.packing:  # the same samples as packed rows: same loss sum and normaliser, no pad tokens
        lengths = [samples.length(i) for i in mine]
        groups = [[mine[j] for j in sorted(p)] for p in plan_packs(lengths, s.pack_tokens)]
    elif s.micro_batch and s.micro_batch < len(mine):  # neighbours in length share a forward: little padding
        groups = length_batches(mine, samples.length, s.micro_batch)
    else:
        groups = [mine[k : k + s.batch_size] for k in range(0, len(mine), s.batch_size)]
    n_target = global_sum(ctx, sum(samples.targets(i) for i in mine))  # CPU ints (gloo under NCCL): no GPU wait
    total, tokens, varlen, pin = None, 0, _varlen(device), device.type == "cuda"
    for i, g in enumerate(groups):
        # built here, while the GPU still runs the previous micro-batch; images into pinned memory, copied async
        encs = [samples.get(j) for j in g]
        b = samples.packed(g, pin, encs) if s.packing else samples.batch(g, pin, encs)
        labels = b.pop("labels")
        tokens += int(b["attention_mask"].sum()) if "attention_mask" in b else int(b["input_ids"].numel())
        b = {k: _to_device(v, device) if hasattr(v, "to") else v for k, v in b.items()}
        if samples.vision is not None:  # training.vision_cache: the kept image features, or the tower now
            b = samples.vision.attach(g, encs, b, device)
        with packed_attention(model, b, varlen=varlen) if s.packing else nullcontext():
            if ddp is None:
                loss_sum, _ = labelled_token_loss(model, b, labels)
            else:  # gradients are all-reduced once, after the step's last micro-batch
                with ddp.no_sync() if i < len(groups) - 1 else nullcontext():
                    loss_sum = ddp(b, labels)
        (loss_sum * ctx.world / n_target).backward()
        total = loss_sum.detach() if total is None else total + loss_sum.detach()  # read once, after the step
    if defer and not ctx.active and total is not None and total.is_cuda:
        return DeferredLoss(total, n_target), n_target, tokens
    total = float(total)
    if ctx.active:
        total, tokens = global_float(ctx, total), global_sum(ctx, tokens)
    return total / n_target, n_target, tokens


class DeferredLoss:
    """A step's loss (summed on the GPU) over its target tokens, read when float() is called."""

    __slots__ = ("total", "n")

    def __init__(self, total, n: int):
        self.total, self.n = total, n

    def __float__(self) -> float:
        return float(self.total) / self.n


DEFER_LOSS = True  # the stage reads a step's loss after queueing its optimizer step (benchmarks switch it off)
PIN_BATCH = True  # CUDA: a micro-batch's host tensors go through page-locked memory (benchmarks switch it off)


def _to_device(v, device):
    """`v` on `device` without blocking: a host tensor is first put in page-locked memory on CUDA, since a copy
    from pageable memory waits for the GPU to finish all the work queued before it."""
    import torch

    if PIN_BATCH and device.type == "cuda" and isinstance(v, torch.Tensor) and v.device.type == "cpu":
        if not v.is_pinned():
            v = v.pin_memory()
    return v.to(device, non_blocking=True)


def _varlen(device) -> bool:
    """Packed rows use torch's varlen flash attention on CUDA when this torch has it (else SDPA with a mask)."""
    from training.packing import varlen_available

    return device.type == "cuda" and varlen_available()


def _loss_sum(model, batch: dict, labels):
    """The summed labelled-token loss: what DDP wraps (training.distributed.ddp_wrap) for the SFT step."""
    from training.losses import labelled_token_loss

    return labelled_token_loss(model, batch, labels)[0]


def _optimizer(weights: TrainableWeights, s: TrainSettings):
    """training.core's AdamW, fused when every trainable tensor is on CUDA."""
    cuda = bool(weights.opt_params) and all(p.is_cuda for p in weights.opt_params)
    return make_optimizer(weights, s.lr, s.weight_decay, fused=cuda)


def _encoded_samples(model, proc, rows: list[dict[str, Any]], s: TrainSettings, device) -> "EncodedSamples":
    """The run's encoded samples: pixel_values kept in the vision tower's dtype within sft.encode_cache_gib, each
    sample's mRoPE positions with packing, and with sft.vision_cache (epochs > 1) the frozen tower's features;
    on CUDA the patch embedding runs as the matrix product it is (kernels.linear_patch_embed), the frozen vision
    tower's forward takes kernels.fast_vision's fused RoPE, batched image attention, GELU epilogue, cached grid
    inputs and LayerNorm kernel, LoRA linears kernels.fast_lora and DeepStack kernels.fast_text."""
    from training.data import SFTCollator
    from training.rl_encode import pixel_dtype

    positions = None
    if s.packing:
        from training.packing import rope_positions_fn

        positions = rope_positions_fn(model)
    if device.type == "cuda" and s.fused_kernels:  # the frozen tower's no-grad forward in fewer passes (kernels.vision)
        from training.kernels import fast_lora, fast_text, fast_vision, linear_patch_embed

        linear_patch_embed(model)
        fast_vision(model)
        fast_lora(model)  # LoRA linears as one autograd function each
        fast_text(model)  # DeepStack's adds without host syncs
    samples = EncodedSamples(
        rows,
        SFTCollator(proc),
        positions=positions,
        pixel_dtype=pixel_dtype(model),
        max_bytes=int(s.encode_cache_gib * 2**30),
        pin=device.type == "cuda",
    )
    cache = s.vision_cache if s.vision_cache is not None else device.type == "cuda"  # CPU: the main job's measure
    if cache and s.epochs > 1:  # a sample seen once gains nothing
        from training.vision_cache import VisionFeatures

        samples.vision = VisionFeatures(model, samples) if VisionFeatures.supported(model) else None
    return samples


def _encode_workers(s: TrainSettings, ctx: Context) -> int:
    """sft.encode_workers, else this machine's cores shared by the DDP processes, at most 8."""
    import os

    return s.encode_workers or max(1, min(8, (os.cpu_count() or 2) // ctx.world - 1))


def train(
    base: str | Path,
    data_files: str | Path,
    out: Path,
    s: TrainSettings,
    *,
    progress: bool = True,
    model_and_processor: tuple | None = None,
) -> dict[str, Any]:
    """Train (or resume) and save the result into `out`; returns the metrics (also in out/sft_result.json).

    `model_and_processor` trains a model already in memory (tests); with LoRA and `merge`, it ends merged."""
    out = Path(out)
    base = str(Path(base).resolve()) if Path(base).exists() else str(base)  # adapters record an absolute base
    if model_and_processor is None and wants_launch(s):
        return launch(base, data_files, out, s, progress=progress)
    ctx = setup()
    try:
        return _train(
            base, data_files, out, s, progress=progress and ctx.main, model_and_processor=model_and_processor, ctx=ctx
        )
    finally:
        teardown(ctx)


def _train(
    base: str,
    data_files: str | Path,
    out: Path,
    s: TrainSettings,
    *,
    progress: bool,
    model_and_processor: tuple | None,
    ctx: Context,
) -> dict[str, Any]:
    from training.data import hinted_samples, retarget_sample

    raw = read_samples(data_files)  # hints quote the full stored reply (its Action line and tool call)
    rows = [retarget_sample(r, s.targets) for r in raw + hinted_samples(raw, s.hint_fraction, s.seed)]
    kernels = _fused_kernels(base) if s.fused_kernels and model_and_processor is None else []
    model, proc = model_and_processor or load_for_training(base, s)
    # fp32 masters only for low-precision LoRA adapters (a bf16 full fine-tune would double its memory)
    weights = TrainableWeights(model, master=s.method == "lora")
    opt = _optimizer(weights, s)
    st = start_state(out, len(rows), weights, opt, s, ctx.rank)
    resumed_from = st.step
    samples = _encoded_samples(model, proc, rows, s, next(model.parameters()).device)
    per_step = s.batch_size * s.grad_accum
    if per_step < ctx.world:  # a rank without a sample would skip the gradient all-reduce the others wait in
        raise ValueError(f"sft.batch_size x sft.grad_accum ({per_step}) must be >= the DDP processes ({ctx.world})")
    clock = StepClock(s, ctx)
    _steps(model, weights, opt, samples, st, s, out, ctx, clock, progress)
    st.stopped = st.stopped or "done"
    save_run_state(out, weights, opt, st, ctx)  # a crash while saving the final model resumes here and only re-saves
    if not ctx.main:  # rank 0 saves; the others wait for it (teardown's barrier) and report nothing
        return {}
    # what it trained on, so a run on another machine can be adopted into a lake (training.adopt)
    extra = dict(
        clock.report(), data_sha256=file_digest(data_files), base_sha256=weights_digest(base), n_samples=len(raw)
    )
    return finish(model, proc, out, s, st, base, resumed_from, kernels, world_size=ctx.world, **extra)


def _steps(model, weights, opt, samples, st: TrainState, s: TrainSettings, out: Path, ctx: Context, clock, progress):
    """Optimizer steps until the plan is done or the time budget is spent (`st.stopped = "budget"`), saving the
    resumable state every save_every steps; a progress bar on a terminal, progress lines elsewhere."""
    device = next(model.parameters()).device
    bar = Bar(st.planned_steps, st.step, "sft") if draws_bar(progress) else None
    plog = ProgressLog("sft", st.planned_steps, st.step, quiet=bar is not None or not ctx.main)  # lines: no bar
    ddp = ddp_wrap(_loss_sum, model, device) if ctx.active else None
    ahead = Prefetch(samples, _encode_workers(s, ctx)) if device.type == "cuda" else None  # CPU: the cores train
    model.train()
    t_run = time.monotonic()
    try:
        while st.step < st.planned_steps:
            if s.max_minutes and st.elapsed_s >= s.max_minutes * 60:
                st.stopped = "budget"
                break
            t0 = time.monotonic()
            tokens = _one_step(model, weights, opt, samples, st, s, ctx, device, ddp, ahead)
            if s.step_sleep_s:
                time.sleep(s.step_sleep_s)
            if clock.tick(st, time.monotonic() - t0, tokens):
                plog.total = st.planned_steps
                if bar:
                    bar.total(st.planned_steps)
            if bar:
                bar.update(st, time.monotonic() - t_run)
            plog.update(st.step, loss=st.losses[-1])
            if st.step % s.save_every == 0 and st.step < st.planned_steps:
                save_run_state(out, weights, opt, st, ctx)
    finally:
        if ahead:
            ahead.close()
        if bar:
            bar.stop()
        plog.stop()


def _one_step(model, weights, opt, samples, st: TrainState, s: TrainSettings, ctx: Context, device, ddp, ahead) -> int:
    """One optimizer step on the stream's next batch_size x grad_accum samples; advances `st` and returns the
    step's tokens."""
    per_step, n = s.batch_size * s.grad_accum, st.n_samples
    idx = [sample_at(st.samples_seen + k, n, s.seed) for k in range(per_step)]
    if ahead:  # the next step's samples (this rank's share) are encoded while this step runs on the GPU
        nxt = [sample_at(st.samples_seen + per_step + k, n, s.seed) for k in range(per_step)]
        ahead.start(balanced_share(nxt, [samples.length(i) for i in nxt], ctx))
    for g in opt.param_groups:
        g["lr"] = s.lr * lr_factor(st.step + 1, st.planned_steps, st.warmup_steps)
    loss, n_target, tokens = train_step(model, samples, idx, s, device, ddp, ctx, defer=DEFER_LOSS)
    optimizer_step(weights, opt, s.grad_clip)
    st.step, st.samples_seen = st.step + 1, st.samples_seen + per_step
    st.tokens, st.target_tokens = st.tokens + tokens, st.target_tokens + n_target
    st.losses.append(round(float(loss), 6))  # read after the optimizer step is queued (DeferredLoss)
    return tokens


# ------------------------------------------------------------------------------------------------ CLI
def main(argv: list[str] | None = None) -> None:
    """`python -m training.sft`: one training run outside the flywheel (and the kill/resume test's subprocess)."""
    ap = argparse.ArgumentParser(description="SFT a Qwen-VL student on an exported SFT Parquet file.")
    ap.add_argument("--base", required=True, help="Base model folder (or Hub id)")
    ap.add_argument("--data", required=True, help="train.parquet exported by the curate stage")
    ap.add_argument("--out", required=True, help="Output folder (resumes from its state/ if present)")
    ap.add_argument("--settings", default="{}", help="JSON of TrainSettings fields, e.g. '{\"epochs\": 1}'")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    ap.add_argument("--no-progress", action="store_true", help="No progress bar")
    a = ap.parse_args(argv)
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    m = train(a.base, a.data, Path(a.out), TrainSettings(**json.loads(a.settings)), progress=not a.no_progress)
    if m:  # DDP ranks other than 0 return nothing: rank 0 reports
        print(json.dumps({k: m[k] for k in ("final_loss", "steps", "tokens_per_s", "model_path")}))
    exit_worker()  # a torchrun rank ends here, skipping the shutdown that could abort it (training.distributed)


if __name__ == "__main__":
    main()
