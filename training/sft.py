"""Supervised fine-tuning of the student on a curated dataset: a lean, resumable torch loop.

    metrics = train("models/small-qwen3vl", "lake/_datasets/<id>/train.parquet", Path("lake/_checkpoints/x"),
                    TrainSettings(method="lora", lr=1e-3, epochs=3, batch_size=8, max_minutes=5))
    res = sft_stage(cfg, iteration=1, dataset_id="curate-it1-...")   # the flywheel stage (checkpoints row)
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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

RESULT_FILE = "sft_result.json"
STATE_DIR = "state"
MERGED_DIR = "merged"


@dataclass
class TrainSettings:
    """What one SFT run needs (configs.models.SFTConfig holds the same knobs, documented)."""

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
    keep_state: bool = False  # keep <out>/state after success (tests inspect it)
    step_sleep_s: float = 0.0  # artificial delay per step: lets the kill/resume test land mid-run

    @classmethod
    def from_config(cls, sft_cfg: Any) -> "TrainSettings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in sft_cfg.model_dump().items() if k in names})

    def __post_init__(self):
        if self.method not in ("lora", "full"):
            raise ValueError(f"sft method must be 'lora' or 'full', got {self.method!r}")
        from training.data import TARGET_FORMATS

        if self.targets not in TARGET_FORMATS:
            raise ValueError(f"sft targets must be one of {', '.join(TARGET_FORMATS)}, got {self.targets!r}")
        if self.batch_size < 1 or self.grad_accum < 1 or self.epochs <= 0:
            raise ValueError("batch_size and grad_accum must be >= 1 and epochs > 0")


# ------------------------------------------------------------------------------------------------ pieces
def read_samples(data_files: str | Path) -> list[dict[str, Any]]:
    """Rows (messages, images) of an exported SFT Parquet file (storage.curate's layout)."""
    import pyarrow.parquet as pq

    path = Path(data_files)
    if not path.exists():
        raise FileNotFoundError(f"no SFT dataset at {path}: run the curate stage first")
    rows = pq.read_table(path, columns=["messages", "images"]).to_pylist()
    if not rows:
        raise ValueError(f"{path} holds no samples")
    return rows


def sample_at(i: int, n: int, seed: int) -> int:
    """Index of the i-th sample of the training stream: epoch after epoch, each a seeded permutation."""
    return int(_perm(n, seed, i // n)[i % n])


_PERMS: dict[tuple[int, int, int], Any] = {}


def _perm(n: int, seed: int, epoch: int):
    import numpy as np

    key = (n, seed, epoch)
    if key not in _PERMS:
        _PERMS.clear()  # one epoch at a time is all the loop needs
        _PERMS[key] = np.random.default_rng([seed, epoch]).permutation(n)
    return _PERMS[key]


def lr_factor(step: int, total: int, warmup: int) -> float:
    """Multiplier of the peak lr for update number `step` (1-based): linear warmup, then cosine to 0."""
    if warmup > 0 and step <= warmup:
        return step / warmup
    span = max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * min(step - warmup, span) / span))


class EncodedSamples:
    """Samples encoded once (chat template + image processor) and kept, so later epochs only pad and stack.

    Bounded by `max_bytes`: past it, samples are encoded on every use (same tensors, just slower)."""

    def __init__(self, rows: list[dict[str, Any]], collator, max_bytes: int = 4 << 30):
        self.rows, self.collator, self.max_bytes = rows, collator, max_bytes
        self.cache: dict[int, dict[str, Any]] = {}
        self.bytes = 0

    def batch(self, idx: list[int]) -> dict[str, Any]:
        return self.collator.pad([self._get(i) for i in idx])

    def _get(self, i: int) -> dict[str, Any]:
        got = self.cache.get(i)
        if got is None:
            got = self.collator.encode(self.rows[i])
            size = sum(t.numel() * t.element_size() for t in got.values())
            if self.bytes + size <= self.max_bytes:
                self.cache[i], self.bytes = got, self.bytes + size
        return got


@dataclass
class TrainState:
    step: int = 0  # optimizer updates done
    samples_seen: int = 0  # position in the sample stream (the data-order cursor)
    planned_steps: int = 0  # length of the cosine schedule (a budget can shorten it)
    total_steps: int = 0  # what epochs / max_steps allow
    warmup_steps: int = 0
    elapsed_s: float = 0.0  # training wall time, summed over resumed runs
    tokens: int = 0  # input tokens processed (prompt + target, image pads included)
    target_tokens: int = 0
    losses: list = None  # per-step mean target-token loss
    stopped: str = ""  # "done" | "budget"
    n_samples: int = 0  # dataset size the data order was drawn for (a resume must see the same data)

    def __post_init__(self):
        self.losses = self.losses or []


# ------------------------------------------------------------------------------------------------ model
def load_for_training(base: str, s: TrainSettings):
    """(model, processor) ready to train: LoRA on the LM or full, vision frozen, seeded adapter init."""
    import torch

    from training.models import LoraSpec, freeze_vision, load_model

    torch.manual_seed(s.seed)
    if s.unsloth and s.method == "lora" and torch.cuda.is_available():
        got = _unsloth_model(base, s)
        if got is not None:
            return got
    if s.method == "lora":
        # adapters in the model's dtype (bf16 on GPU: no fp32 copy of every projection's input); the optimizer
        # keeps fp32 masters of them (TrainableWeights)
        return load_model(base, lora=LoraSpec(r=s.lora_r, alpha=s.lora_alpha, dropout=s.lora_dropout,
                                              fp32_adapters=s.lora_fp32_adapters))
    model, proc = load_model(base)
    freeze_vision(model)
    return model, proc


def _unsloth_model(base: str, s: TrainSettings):
    """Unsloth FastVisionModel with LoRA on the language layers only; None when Unsloth is not installed."""
    import importlib.util

    if importlib.util.find_spec("unsloth") is None:
        return None
    from unsloth import FastVisionModel  # GPU-only import: it refuses CPU-only machines

    from training.models import freeze_vision
    from training.tokenizer import load_processor

    model, _ = FastVisionModel.from_pretrained(base, load_in_4bit=False)
    model = FastVisionModel.get_peft_model(model, finetune_vision_layers=False, finetune_language_layers=True,
                                           r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=s.lora_dropout,
                                           random_state=s.seed)
    freeze_vision(model)
    return model, load_processor(base)  # our processor: the same chat template and collator as the torch path


def _trainable(model) -> dict[str, Any]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


class TrainableWeights:
    """The weights the optimizer updates: the model's trainable parameters, or fp32 master copies of them.

    With `master` (LoRA on a bf16 model: adapters kept in bf16 so each adapted projection runs in bf16 without
    an fp32 copy of its input), the optimizer steps fp32 copies and the model's bf16 adapters are refreshed
    from them after every step, so small updates are not rounded away. Resumable state saves the fp32 copies."""

    def __init__(self, model, master: bool = False):
        import torch

        self.params = _trainable(model)
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.master = ({n: p.detach().float().clone().requires_grad_(True) for n, p in self.params.items()}
                       if master and any(p.dtype != torch.float32 for p in self.params.values()) else None)

    @property
    def opt_params(self) -> list[Any]:
        return list((self.master or self.params).values())

    def named(self) -> dict[str, Any]:
        return self.master or self.params

    def grads_ready(self) -> None:
        """After backward: move the model's gradients onto the master copies (fp32)."""
        if self.master:
            for n, p in self.params.items():
                self.master[n].grad = None if p.grad is None else p.grad.float()
                p.grad = None

    def stepped(self) -> None:
        """After the optimizer step: copy the master weights into the model."""
        import torch

        if self.master:
            with torch.no_grad():
                for n, p in self.params.items():
                    p.copy_(self.master[n])

    def load(self, saved: dict[str, Any], source: str = "saved weights") -> None:
        import torch

        if set(saved) != set(self.params):
            raise ValueError(f"checkpoint {source} does not match this model's trainable parameters")
        with torch.no_grad():
            for n, t in saved.items():
                self.params[n].copy_(t.to(self.params[n].device, self.params[n].dtype))
                if self.master:
                    self.master[n].copy_(t.to(self.master[n].device, torch.float32))


# ------------------------------------------------------------------------------------------------ state
def latest_state(out: Path) -> Path | None:
    d = out / STATE_DIR
    done = sorted(p for p in d.glob("step-*") if (p / "trainer_state.json").exists()) if d.exists() else []
    return done[-1] if done else None


def save_state(out: Path, weights: TrainableWeights, opt, st: TrainState, keep: int = 2) -> Path:
    """Write a resumable checkpoint to a temp folder and rename it into place (never half-written)."""
    import torch
    from safetensors.torch import save_file

    root = out / STATE_DIR
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    save_file({n: p.detach().cpu().contiguous() for n, p in weights.named().items()}, tmp / "trainable.safetensors")
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng, tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(st)))
    final = root / f"step-{st.step:07d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    older = sorted(p for p in root.glob("step-*") if p != final)
    for old in older[:max(len(older) - (keep - 1), 0)]:  # keep the newest `keep`, this one included
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(path: Path, weights: TrainableWeights, opt) -> TrainState:
    import torch
    from safetensors.torch import load_file

    weights.load(load_file(str(path / "trainable.safetensors")), source=str(path))
    opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    return TrainState(**json.loads((path / "trainer_state.json").read_text()))


# ------------------------------------------------------------------------------------------------ loop
def _plan(n: int, s: TrainSettings) -> tuple[int, int]:
    """(optimizer steps, warmup steps) for n samples: the stream is ceil(epochs * n) samples long."""
    per_step = s.batch_size * s.grad_accum
    steps = math.ceil(math.ceil(s.epochs * n) / per_step)
    if s.max_steps:
        steps = min(steps, s.max_steps)
    return steps, min(math.ceil(s.warmup_ratio * steps), steps)


def train_step(model, samples: EncodedSamples, idx: list[int], s: TrainSettings, device) -> tuple[float, int, int]:
    """Forward/backward over grad_accum micro-batches; the loss is normalised by the step's target tokens.

    The loss projects only the labelled positions through the LM head (training.losses.labelled_token_loss:
    the same value as the full-logits loss, without the [tokens x vocab] matrix)."""
    from training.losses import labelled_token_loss

    batches = [samples.batch(idx[k:k + s.batch_size]) for k in range(0, len(idx), s.batch_size)]
    n_target = sum(int((b["labels"][:, 1:] != -100).sum()) for b in batches)
    total, tokens = 0.0, 0
    for b in batches:
        labels = b.pop("labels")
        tokens += int(b["attention_mask"].sum())
        b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
        loss_sum, _ = labelled_token_loss(model, b, labels)
        (loss_sum / n_target).backward()
        total += float(loss_sum.detach())
    return total / n_target, n_target, tokens


def fit_budget(st: TrainState, s: TrainSettings, step_s: float) -> None:
    """Set the cosine schedule's length to the steps that fit the remaining wall-clock budget at `step_s`
    seconds per step (never beyond what epochs / max_steps allow). Called every few steps, so a box whose load
    changes mid-run still ends its decay near the budget."""
    remaining = s.max_minutes * 60 - st.elapsed_s
    st.planned_steps = min(st.total_steps, st.step + max(int(remaining / max(step_s, 1e-6)), 1))
    st.warmup_steps = min(st.warmup_steps, math.ceil(s.warmup_ratio * st.planned_steps))


def _optimizer(weights: TrainableWeights, s: TrainSettings):
    import torch

    return torch.optim.AdamW(weights.opt_params, lr=s.lr, betas=(0.9, 0.98), weight_decay=s.weight_decay)


def _start_state(out: Path, n: int, weights: TrainableWeights, opt, s: TrainSettings) -> TrainState:
    """The newest checkpoint's state (weights, optimizer and RNG restored), or a fresh plan for n samples."""
    ckpt = latest_state(out)
    if ckpt is None:
        planned, warmup = _plan(n, s)
        return TrainState(planned_steps=planned, total_steps=planned, warmup_steps=warmup, n_samples=n)
    st = load_state(ckpt, weights, opt)
    if st.n_samples != n:
        raise ValueError(f"{ckpt} was trained on {st.n_samples} samples but the dataset has {n}: resume with "
                         f"the same data, or use a new output folder")
    return st


def train(base: str | Path, data_files: str | Path, out: Path, s: TrainSettings, *, progress: bool = True,
          model_and_processor: tuple | None = None) -> dict[str, Any]:
    """Train (or resume) and save the result into `out`; returns the metrics (also in out/sft_result.json).

    `model_and_processor` trains a model already in memory (tests); with LoRA and `merge`, it ends merged."""
    import torch

    from training.data import SFTCollator, retarget_sample

    out = Path(out)
    base = str(Path(base).resolve()) if Path(base).exists() else str(base)  # adapters record an absolute base
    rows = [retarget_sample(r, s.targets) for r in read_samples(data_files)]
    kernels = _fused_kernels(base) if s.fused_kernels and model_and_processor is None else []
    model, proc = model_and_processor or load_for_training(base, s)
    device = next(model.parameters()).device
    # fp32 masters only for low-precision LoRA adapters (a bf16 full fine-tune would double its memory)
    weights = TrainableWeights(model, master=s.method == "lora")
    opt = _optimizer(weights, s)
    st = _start_state(out, len(rows), weights, opt, s)
    resumed_from = st.step
    samples, per_step = EncodedSamples(rows, SFTCollator(proc)), s.batch_size * s.grad_accum
    params = weights.opt_params
    bar = _Bar(st.planned_steps, st.step) if progress else None
    model.train()
    t_run, recent = time.monotonic(), deque(maxlen=10)  # step times: the budget fit follows the current load
    try:
        while st.step < st.planned_steps:
            if s.max_minutes and st.elapsed_s >= s.max_minutes * 60:
                st.stopped = "budget"
                break
            t0 = time.monotonic()
            idx = [sample_at(st.samples_seen + k, len(rows), s.seed) for k in range(per_step)]
            for g in opt.param_groups:
                g["lr"] = s.lr * lr_factor(st.step + 1, st.planned_steps, st.warmup_steps)
            loss, n_target, tokens = train_step(model, samples, idx, s, device)
            weights.grads_ready()
            torch.nn.utils.clip_grad_norm_(params, s.grad_clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            weights.stepped()
            if s.step_sleep_s:
                time.sleep(s.step_sleep_s)
            st.step, st.samples_seen = st.step + 1, st.samples_seen + per_step
            st.tokens, st.target_tokens = st.tokens + tokens, st.target_tokens + n_target
            st.losses.append(round(loss, 6))
            st.elapsed_s += time.monotonic() - t0
            recent.append(time.monotonic() - t0)
            if s.max_minutes and s.schedule_to_budget and len(recent) >= 4 and st.step % 4 == 0:
                # leave out the oldest time in the window: early on that is the first step, which pays
                # one-off costs (allocations, lazy init)
                fit_budget(st, s, sum(list(recent)[1:]) / (len(recent) - 1))
                if bar:
                    bar.total(st.planned_steps)
            if bar:
                bar.update(st, time.monotonic() - t_run)
            if st.step % s.save_every == 0 and st.step < st.planned_steps:
                save_state(out, weights, opt, st)
    finally:
        if bar:
            bar.stop()
    st.stopped = st.stopped or "done"
    save_state(out, weights, opt, st)  # a crash while saving the final model resumes here and only re-saves
    return _finish(model, proc, out, s, st, base, resumed_from, kernels)


def _fused_kernels(base: str) -> list[str]:
    """Liger's fused kernels for the base's architecture, on CUDA with liger-kernel installed (else [])."""
    import torch

    if not torch.cuda.is_available():
        return []
    from transformers import AutoConfig

    from training.kernels import apply_fused_kernels
    from training.models import ModelError, arch_for_model_type

    try:
        arch = arch_for_model_type(AutoConfig.from_pretrained(base).model_type)
    except (OSError, ValueError, ModelError):
        return []  # unknown here: load_for_training reports it in its own words
    return apply_fused_kernels(arch)


def _metrics(st: TrainState, s: TrainSettings, model, base: str) -> dict[str, Any]:
    from training.models import count_parameters

    tail = st.losses[-10:] or [float("nan")]
    curve = st.losses if len(st.losses) <= 200 else st.losses[:: math.ceil(len(st.losses) / 200)]
    wall = max(st.elapsed_s, 1e-9)
    return {"final_loss": sum(tail) / len(tail), "first_loss": st.losses[0] if st.losses else None,
            "steps": st.step, "planned_steps": st.planned_steps, "total_steps": st.total_steps,
            "samples_seen": st.samples_seen,
            "tokens": st.tokens, "target_tokens": st.target_tokens, "wall_s": round(st.elapsed_s, 2),
            "steps_per_s": st.step / wall, "tokens_per_s": st.tokens / wall, "target_tokens_per_s": st.target_tokens / wall,
            "stopped": st.stopped, "loss_curve": curve, "trainable_params": count_parameters(model)["trainable"],
            "method": s.method, "base_model": base, "settings": asdict(s)}


def _finish(model, proc, out: Path, s: TrainSettings, st: TrainState, base: str, resumed_from: int,
            kernels: list[str]) -> dict[str, Any]:
    """Save the adapter/full model + processor (+ merged model), then sft_result.json as the completion mark."""
    metrics = dict(_metrics(st, s, model, base), resumed_from_step=resumed_from, fused_kernels=kernels)
    model.eval()
    model.save_pretrained(out)
    proc.save_pretrained(out)
    merged = None
    if s.method == "lora" and s.merge:
        from training.models import _quiet_peft

        with _quiet_peft():
            full = model.merge_and_unload()
        full.save_pretrained(out / MERGED_DIR)
        proc.save_pretrained(out / MERGED_DIR)
        merged = str(out / MERGED_DIR)
    metrics.update(adapter=s.method == "lora", merged_path=merged, model_path=merged or str(out))
    tmp = out / f".{RESULT_FILE}.tmp"
    tmp.write_text(json.dumps(metrics, indent=1))
    os.replace(tmp, out / RESULT_FILE)
    if not s.keep_state:
        shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    return metrics


class _Bar:
    """Rich progress: optimizer step / planned, loss, input tokens per second."""

    def __init__(self, total: int, done: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(TextColumn("[bold]sft"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[stats]}"),
                          TimeElapsedColumn())
        self.task = self.p.add_task("sft", total=total, completed=done, stats="")
        self.p.start()

    def total(self, n: int) -> None:
        self.p.update(self.task, total=n)

    def update(self, st: TrainState, elapsed: float) -> None:
        self.p.update(self.task, completed=st.step,
                      stats=f"loss {st.losses[-1]:.4f} | {st.tokens / max(st.elapsed_s, 1e-9):,.0f} tok/s")

    def stop(self) -> None:
        self.p.stop()


# ------------------------------------------------------------------------------------------------ stage
# ---- where a lake's checkpoints live. Everything a lake's rows point to lives under that lake (two lakes in one
# folder must never share a checkpoint folder), and rows store those paths relative to the lake root
# (storage.lake.Lake.rel / resolve), so a copied or moved lake still finds them.
CHECKPOINTS_DIR = "_checkpoints"  # an underscore folder: not a table, so the views, stats and verify skip it


def output_root(cfg: Any, lake_root: Path) -> Path:
    """Where checkpoints go: `<lake>/_checkpoints`, or cfg.sft.output_root (a relative one is under the lake root;
    an absolute one outside the lake is the user's choice, and is stored absolute)."""
    if not cfg.sft.output_root:
        return lake_root / CHECKPOINTS_DIR
    root = Path(cfg.sft.output_root).expanduser()
    return root.resolve() if root.is_absolute() else (lake_root / root).resolve()


def _lake_key(path: str, root: Path | None) -> str:
    """A base model as the checkpoint id hashes it: lake-relative when it lies inside the lake (a moved lake keeps
    its ids, so its finished checkpoints are still found), else as given."""
    p = Path(path).expanduser()
    if root is None or not p.exists() or not p.resolve().is_relative_to(root):
        return path
    return p.resolve().relative_to(root).as_posix()


def _reusable(con, ckpt_id: str, out: Path, root: Path) -> bool:
    """Whether `out` holds a finished checkpoint this lake may reuse: only when its row is in this lake.

    A finished folder without one is stale (a crash between the final save and the row write): inside this lake
    it is removed and trained again. Outside it (an absolute sft.output_root) it may be another lake's: it is
    left alone and the stage fails, rather than overwrite what another lake's row points to."""
    if not (out / RESULT_FILE).exists():
        return False
    if con.execute("SELECT count(*) FROM checkpoints WHERE checkpoint_id = ?", [ckpt_id]).fetchone()[0]:
        return True
    if not out.resolve().is_relative_to(root):
        raise FileExistsError(f"{out} holds a finished checkpoint that the lake at {root} has no row for (another "
                              f"lake's?): set sft.output_root to a folder of this lake (default: <lake>/"
                              f"{CHECKPOINTS_DIR}), or remove that folder")
    shutil.rmtree(out)
    return False


def _model_path_of(row: dict[str, Any], root: Path | None = None) -> str:
    """The full-model folder of a checkpoints row (its merged model when it is a LoRA adapter); a relative row
    path is under the lake `root`."""
    path = Path(row["path"]) if root is None or Path(row["path"]).is_absolute() else root / row["path"]
    if row.get("adapter"):
        if not (path / MERGED_DIR).exists():
            from training.models import ModelError
            raise ModelError(f"checkpoint {row['checkpoint_id']} is an adapter without {MERGED_DIR}/: train it with "
                             f"sft.merge: true to continue from it")
        return str(path / MERGED_DIR)
    return str(path)


def resolve_base(cfg: Any, con, iteration: int, base: str | None, root: Path | None = None) -> tuple[str, str | None]:
    """(base model folder or Hub id, parent checkpoint id). `base` may be a checkpoint id or a folder (a known
    checkpoint's folder or merged folder keeps the lineage); default: the newest checkpoint of an earlier
    iteration, else cfg.student.model. `root`: the lake's root, against which relative row paths resolve."""
    if base is not None:
        folder = str(Path(base).expanduser().resolve()) if Path(base).exists() else base
        stored = _lake_key(folder, root)  # how the row names it: relative when inside the lake
        rows = con.sql(f"SELECT * FROM checkpoints WHERE checkpoint_id = ? OR path IN (?, ?) "
                       f"OR path || '/{MERGED_DIR}' IN (?, ?) ORDER BY created_at DESC LIMIT 1",
                       params=[base, folder, stored, folder, stored]).to_arrow_table().to_pylist()
        if not rows:
            return base, None
        return (_model_path_of(rows[0], root) if rows[0]["checkpoint_id"] == base else folder), rows[0]["checkpoint_id"]
    rows = con.sql("SELECT * FROM checkpoints WHERE iteration < ? ORDER BY iteration DESC, created_at DESC LIMIT 1",
                   params=[iteration]).to_arrow_table().to_pylist()
    return (_model_path_of(rows[0], root), rows[0]["checkpoint_id"]) if rows else (cfg.student.model, None)


def checkpoint_id_for(iteration: int, dataset: dict[str, Any], base: str, s: TrainSettings) -> str:
    """Deterministic in the data (the manifest's episodes, not just its id), the base and the settings."""
    knobs = {k: v for k, v in asdict(s).items() if k not in ("keep_state", "step_sleep_s")}
    payload = {"dataset": dataset["dataset_id"], "episodes": sorted(dataset["episode_ids"]),
               "n_steps": dataset["n_steps"], "base": base, "settings": knobs}
    h = hashlib.sha1(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:10]
    return f"sft-it{int(iteration)}-{h}"


def sft_stage(cfg: Any, iteration: int, dataset_id: str, base: str | None = None, *, lake: Any = None,
              progress: bool = True, git_sha: str | None = None) -> dict[str, Any]:
    """Fine-tune on a dataset manifest; a finished checkpoint of this lake (its row is here) is reused, not retrained.
    Writes a `checkpoints` row; the checkpoint folder is under the lake (output_root)."""
    from datetime import datetime, timezone

    from storage.catalog import connect
    from storage.curate import EXPORT_FILE, manifest
    from storage.lake import Lake

    lake = lake or Lake(cfg.lake.root)
    dataset = manifest(lake, dataset_id)
    con = connect(lake)
    base_path, parent = resolve_base(cfg, con, iteration, base, lake.root)
    s = TrainSettings.from_config(cfg.sft)
    ckpt_id = checkpoint_id_for(iteration, dataset, _lake_key(base_path, lake.root), s)
    out = output_root(cfg, lake.root) / ckpt_id
    done = out / RESULT_FILE
    skipped = _reusable(con, ckpt_id, out, lake.root)
    if skipped:
        metrics = json.loads(done.read_text())
    else:
        metrics = train(base_path, lake.resolve(dataset["path"]) / EXPORT_FILE, out, s, progress=progress)
    # sft_result.json holds the absolute paths of when it was trained: the folder may have moved with its lake since
    merged = str(out / MERGED_DIR) if metrics.get("merged_path") else None
    metrics.update(merged_path=merged, model_path=merged or str(out))
    base_model = metrics["base_model"]
    if Path(base_model).exists():
        base_model = lake.rel(base_model)
    row = dict(checkpoint_id=ckpt_id, path=lake.rel(out), method="sft", base_model=base_model,
               parent_checkpoint=parent, dataset_id=dataset_id, adapter=metrics["adapter"],
               metrics=json.dumps({k: v for k, v in metrics.items() if k != "settings"}),
               created_at=datetime.now(timezone.utc), run_key=ckpt_id, git_sha=git_sha,
               config_hash=cfg.config_hash("sft"))
    lake.replace_run("checkpoints", [[row]], iteration=iteration, stage="sft", run_key=ckpt_id)
    return {"checkpoint_id": ckpt_id, "path": str(out), "model_path": metrics["model_path"],
            "merged_path": metrics["merged_path"], "adapter": metrics["adapter"], "dataset_id": dataset_id,
            "base_model": metrics["base_model"], "parent_checkpoint": parent, "skipped": skipped,
            "final_loss": metrics["final_loss"], "steps": metrics["steps"], "tokens_per_s": metrics["tokens_per_s"]}


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
    print(json.dumps({k: m[k] for k in ("final_loss", "steps", "tokens_per_s", "model_path")}))


if __name__ == "__main__":
    main()
