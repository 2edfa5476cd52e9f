"""The training core shared by SFT (training/sft.py) and RL (training/rl.py): pure torch, no Prefect.

    model, proc = load_for_training(base, settings)          # LoRA on the LM or full, vision frozen
    weights = TrainableWeights(model, master=True)           # what the optimizer updates (fp32 masters for bf16 LoRA)
    opt = make_optimizer(weights, lr=1e-3, weight_decay=0.01)
    grad_norm = optimizer_step(weights, opt, grad_clip=1.0)  # after backward: masters, clip, step, copy back
    save_state(out, weights, opt, st) / load_state(latest_state(out), weights, opt)   # exact resume
    save_model(model, proc, out, metrics, merge=True, result_file="sft_result.json")  # loadable folder + result
    row = checkpoint_row(lake, ckpt_id=..., out=out, method="sft", ...)            # `checkpoints` lineage row

What lives here: the data-order cursor (`sample_at`, a seeded permutation per epoch), the lr schedule
(`lr_factor`: linear warmup + cosine) and wall-clock budget (`fit_budget`), the resumable state (weights,
optimizer, RNG and `TrainState`, written to a temp folder and renamed into place), the progress bar, the
final model save, and where a lake's checkpoints live and how their rows record lineage (`output_root`,
`resolve_base`, `checkpoint_row`). Settings objects are duck-typed: any object with the named attributes works
(training.sft.TrainSettings, training.rl.RLSettings).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

STATE_DIR = "state"
MERGED_DIR = "merged"
EXTRA_FILE = "extra.safetensors"
# ---- where a lake's checkpoints live. Everything a lake's rows point to lives under that lake (two lakes in one
# folder must never share a checkpoint folder), and rows store those paths relative to the lake root
# (storage.lake.Lake.rel / resolve), so a copied or moved lake still finds them.
CHECKPOINTS_DIR = "_checkpoints"  # an underscore folder: not a table, so the views, stats and verify skip it


# ------------------------------------------------------------------------------------------------ data order
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


def fit_budget(st: TrainState, s: Any, step_s: float) -> None:
    """Set the cosine schedule's length to the steps that fit the remaining wall-clock budget at `step_s`
    seconds per step (never beyond what epochs / max_steps allow). Called every few steps, so a box whose load
    changes mid-run still ends its decay near the budget. `s`: max_minutes, warmup_ratio."""
    remaining = s.max_minutes * 60 - st.elapsed_s
    st.planned_steps = min(st.total_steps, st.step + max(int(remaining / max(step_s, 1e-6)), 1))
    st.warmup_steps = min(st.warmup_steps, math.ceil(s.warmup_ratio * st.planned_steps))


# ------------------------------------------------------------------------------------------------ model
def load_for_training(base: str, s: Any):
    """(model, processor) ready to train: LoRA on the LM or full, vision frozen, seeded adapter init.
    `s`: seed, method, unsloth, lora_r, lora_alpha, lora_dropout, lora_fp32_adapters."""
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
        return load_model(
            base,
            lora=LoraSpec(r=s.lora_r, alpha=s.lora_alpha, dropout=s.lora_dropout, fp32_adapters=s.lora_fp32_adapters),
        )
    model, proc = load_model(base)
    freeze_vision(model)
    return model, proc


def _unsloth_model(base: str, s: Any):
    """Unsloth FastVisionModel with LoRA on the language layers only; None when Unsloth is not installed."""
    import importlib.util

    if importlib.util.find_spec("unsloth") is None:
        return None
    from unsloth import FastVisionModel  # GPU-only import: it refuses CPU-only machines

    from training.models import freeze_vision
    from training.tokenizer import load_processor

    model, _ = FastVisionModel.from_pretrained(base, load_in_4bit=False)
    model = FastVisionModel.get_peft_model(
        model,
        finetune_vision_layers=False,
        finetune_language_layers=True,
        r=s.lora_r,
        lora_alpha=s.lora_alpha,
        lora_dropout=s.lora_dropout,
        random_state=s.seed,
    )
    freeze_vision(model)
    return model, load_processor(base)  # our processor: the same chat template and collator as the torch path


def fused_kernels(base: str) -> list[str]:
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


def trainable(model) -> dict[str, Any]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


class TrainableWeights:
    """The weights the optimizer updates: the model's trainable parameters, or fp32 master copies of them.

    With `master` (LoRA on a bf16 model: adapters kept in bf16 so each adapted projection runs in bf16 without
    an fp32 copy of its input), the optimizer steps fp32 copies and the model's bf16 adapters are refreshed
    from them after every step, so small updates are not rounded away. Resumable state saves the fp32 copies."""

    def __init__(self, model, master: bool = False):
        import torch

        self.params = trainable(model)
        if not self.params:
            raise ValueError("the model has no trainable parameters")
        self.master = (
            {n: p.detach().float().clone().requires_grad_(True) for n, p in self.params.items()}
            if master and any(p.dtype != torch.float32 for p in self.params.values())
            else None
        )

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


def make_optimizer(weights: TrainableWeights, lr: float, weight_decay: float, fused: bool = False):
    """AdamW over the trainable weights (betas 0.9 / 0.98); `fused`: torch's fused CUDA kernel (one launch over all
    tensors; the same update and state_dict layout)."""
    import torch

    return torch.optim.AdamW(
        weights.opt_params, lr=lr, betas=(0.9, 0.98), weight_decay=weight_decay, fused=True if fused else None
    )


def optimizer_step(weights: TrainableWeights, opt, grad_clip: float) -> float:
    """After backward: gradients onto the masters, global-norm clip, step, zero, copy back. Returns the
    pre-clip gradient norm."""
    import torch

    weights.grads_ready()
    norm = torch.nn.utils.clip_grad_norm_(weights.opt_params, grad_clip)
    opt.step()
    opt.zero_grad(set_to_none=True)
    weights.stepped()
    return float(norm)


# ------------------------------------------------------------------------------------------------ state
def rng_state() -> dict[str, Any]:
    import torch

    rng = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng["cuda"] = torch.cuda.get_rng_state_all()
    return rng


def set_rng_state(rng: dict[str, Any]) -> None:
    import torch

    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


def latest_state(out: Path) -> Path | None:
    d = out / STATE_DIR
    done = sorted(p for p in d.glob("step-*") if (p / "trainer_state.json").exists()) if d.exists() else []
    return done[-1] if done else None


def save_state(
    out: Path,
    weights: TrainableWeights,
    opt,
    st: TrainState,
    keep: int = 2,
    extra: dict[str, Any] | None = None,
    rng: dict[str, Any] | None = None,
) -> Path:
    """Write a resumable checkpoint to a temp folder and rename it into place (never half-written).
    `extra`: more named tensors to keep (e.g. an RL teacher's EMA weights), read back with `load_extra`.
    `rng`: the RNG state to keep (default this process's; DDP: {"ranks": [each rank's]})."""
    import torch
    from safetensors.torch import save_file

    root = out / STATE_DIR
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    save_file({n: p.detach().cpu().contiguous() for n, p in weights.named().items()}, tmp / "trainable.safetensors")
    if extra:
        save_file({n: t.detach().cpu().contiguous() for n, t in extra.items()}, tmp / EXTRA_FILE)
    torch.save(opt.state_dict(), tmp / "optimizer.pt")
    torch.save(rng if rng is not None else rng_state(), tmp / "rng.pt")
    (tmp / "trainer_state.json").write_text(json.dumps(asdict(st)))
    final = root / f"step-{st.step:07d}"
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    older = sorted(p for p in root.glob("step-*") if p != final)
    for old in older[: max(len(older) - (keep - 1), 0)]:  # keep the newest `keep`, this one included
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(path: Path, weights: TrainableWeights, opt, rank: int = 0) -> TrainState:
    """Restore `save_state`'s folder; `rank`: whose RNG state to take when it holds one per DDP rank (a rank the
    saving run did not have takes rank 0's)."""
    import torch
    from safetensors.torch import load_file

    weights.load(load_file(str(path / "trainable.safetensors")), source=str(path))
    opt.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    rng = torch.load(path / "rng.pt", weights_only=True)
    ranks = rng.get("ranks")
    set_rng_state(ranks[rank if rank < len(ranks) else 0] if ranks else rng)
    return TrainState(**json.loads((path / "trainer_state.json").read_text()))


def load_extra(path: Path) -> dict[str, Any]:
    """The `extra` tensors a state folder holds ({} when none)."""
    from safetensors.torch import load_file

    f = Path(path) / EXTRA_FILE
    return load_file(str(f)) if f.exists() else {}


# ------------------------------------------------------------------------------------------------ output
def save_model(
    model,
    proc,
    out: Path,
    metrics: dict[str, Any],
    *,
    merge: bool,
    adapter: bool,
    result_file: str,
    keep_state: bool = False,
) -> dict[str, Any]:
    """Save the adapter/full model + processor (+ a merged model for an adapter when `merge`), then `result_file`
    (the metrics JSON) last, as the completion mark; `<out>/state` is removed unless `keep_state`."""
    model.eval()
    model.save_pretrained(out)
    proc.save_pretrained(out)
    merged = None
    if adapter and merge:
        from training.models import _quiet_peft

        with _quiet_peft():
            full = model.merge_and_unload()
        full.save_pretrained(out / MERGED_DIR)
        proc.save_pretrained(out / MERGED_DIR)
        merged = str(out / MERGED_DIR)
    metrics = dict(metrics, adapter=adapter, merged_path=merged, model_path=merged or str(out))
    tmp = out / f".{result_file}.tmp"
    tmp.write_text(json.dumps(metrics, indent=1))
    os.replace(tmp, out / result_file)
    if not keep_state:
        shutil.rmtree(out / STATE_DIR, ignore_errors=True)
    return metrics


class Bar:
    """Rich progress: optimizer step / planned, and a stats text (loss, tokens per second, ...)."""

    def __init__(self, total: int, done: int, label: str = "sft"):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.p = Progress(
            TextColumn(f"[bold]{label}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
        )
        self.task = self.p.add_task(label, total=total, completed=done, stats="")
        self.p.start()

    def total(self, n: int) -> None:
        self.p.update(self.task, total=n)

    def update(self, st: TrainState, elapsed: float) -> None:
        self.p.update(
            self.task,
            completed=st.step,
            stats=f"loss {st.losses[-1]:.4f} | {st.tokens / max(st.elapsed_s, 1e-9):,.0f} tok/s",
        )

    def show(self, done: int, stats: str) -> None:
        self.p.update(self.task, completed=done, stats=stats)

    def stop(self) -> None:
        self.p.stop()


# ------------------------------------------------------------------------------------------------ lineage
def output_root(cfg: Any, lake_root: Path) -> Path:
    """Where checkpoints go: `<lake>/_checkpoints`, or cfg.sft.output_root (a relative one is under the lake root;
    an absolute one outside the lake is the user's choice, and is stored absolute)."""
    if not cfg.sft.output_root:
        return lake_root / CHECKPOINTS_DIR
    root = Path(cfg.sft.output_root).expanduser()
    return root.resolve() if root.is_absolute() else (lake_root / root).resolve()


def lake_key(path: str, root: Path | None) -> str:
    """A base model as a checkpoint id hashes it: lake-relative when it lies inside the lake (a moved lake keeps
    its ids, so its finished checkpoints are still found), else as given."""
    p = Path(path).expanduser()
    if root is None or not p.exists() or not p.resolve().is_relative_to(root):
        return path
    return p.resolve().relative_to(root).as_posix()


def reusable(con, ckpt_id: str, out: Path, root: Path, result_file: str) -> bool:
    """Whether `out` holds a finished checkpoint this lake may reuse: only when its row is in this lake.

    A finished folder without one is stale (a crash between the final save and the row write): inside this lake
    it is removed and trained again. Outside it (an absolute sft.output_root) it may be another lake's: it is
    left alone and the stage fails, rather than overwrite what another lake's row points to."""
    if not (out / result_file).exists():
        return False
    if con.execute("SELECT count(*) FROM checkpoints WHERE checkpoint_id = ?", [ckpt_id]).fetchone()[0]:
        return True
    if not out.resolve().is_relative_to(root):
        raise FileExistsError(
            f"{out} holds a finished checkpoint that the lake at {root} has no row for (another "
            f"lake's?): set sft.output_root to a folder of this lake (default: <lake>/"
            f"{CHECKPOINTS_DIR}), or remove that folder"
        )
    shutil.rmtree(out)
    return False


def model_path_of(row: dict[str, Any], root: Path | None = None) -> str:
    """The full-model folder of a checkpoints row (its merged model when it is a LoRA adapter); a relative row
    path is under the lake `root`."""
    path = Path(row["path"]) if root is None or Path(row["path"]).is_absolute() else root / row["path"]
    if row.get("adapter"):
        if not (path / MERGED_DIR).exists():
            from training.models import ModelError

            raise ModelError(
                f"checkpoint {row['checkpoint_id']} is an adapter without {MERGED_DIR}/: train it with "
                f"sft.merge: true to continue from it"
            )
        return str(path / MERGED_DIR)
    return str(path)


# A condition on `checkpoints` rows: an iteration's own checkpoints, not the mid-trained base (flywheel/midtrain.py
# writes it with method 'midtrain' under iteration 0), which only the first SFT takes, and only by name.
ITERATION_CHECKPOINTS = "method <> 'midtrain'"


def resolve_base(cfg: Any, con, iteration: int, base: str | None, root: Path | None = None) -> tuple[str, str | None]:
    """(base model folder or Hub id, parent checkpoint id). `base` may be a checkpoint id or a folder (a known
    checkpoint's folder or merged folder keeps the lineage); default: the newest checkpoint of an earlier
    iteration, else cfg.student.model. `root`: the lake's root, against which relative row paths resolve."""
    if base is not None:
        folder = str(Path(base).expanduser().resolve()) if Path(base).exists() else base
        stored = lake_key(folder, root)  # how the row names it: relative when inside the lake
        rows = (
            con.sql(
                f"SELECT * FROM checkpoints WHERE checkpoint_id = ? OR path IN (?, ?) "
                f"OR path || '/{MERGED_DIR}' IN (?, ?) ORDER BY created_at DESC LIMIT 1",
                params=[base, folder, stored, folder, stored],
            )
            .to_arrow_table()
            .to_pylist()
        )
        if not rows:
            return base, None
        return (model_path_of(rows[0], root) if rows[0]["checkpoint_id"] == base else folder), rows[0]["checkpoint_id"]
    rows = (
        con.sql(
            f"SELECT * FROM checkpoints WHERE iteration < ? AND {ITERATION_CHECKPOINTS} "
            "ORDER BY iteration DESC, created_at DESC LIMIT 1",
            params=[iteration],
        )
        .to_arrow_table()
        .to_pylist()
    )
    return (model_path_of(rows[0], root), rows[0]["checkpoint_id"]) if rows else (cfg.student.model, None)


def checkpoint_row(
    lake: Any,
    *,
    ckpt_id: str,
    out: Path,
    method: str,
    base_model: str,
    parent: str | None,
    dataset_id: str | None,
    adapter: bool,
    metrics: dict[str, Any],
    git_sha: str | None,
    config_hash: str | None,
) -> dict[str, Any]:
    """A `checkpoints` row: paths inside the lake stored relative to its root, `metrics` as JSON (no settings)."""
    from datetime import datetime, timezone

    if Path(base_model).exists():
        base_model = lake.rel(base_model)
    return dict(
        checkpoint_id=ckpt_id,
        path=lake.rel(out),
        method=method,
        base_model=base_model,
        parent_checkpoint=parent,
        dataset_id=dataset_id,
        adapter=adapter,
        metrics=json.dumps({k: v for k, v in metrics.items() if k != "settings"}, default=str),
        created_at=datetime.now(timezone.utc),
        run_key=ckpt_id,
        git_sha=git_sha,
        config_hash=config_hash,
    )
