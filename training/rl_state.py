"""Exact resume of an RL trainer: its trainable weights (fp32 masters), optimizer, step counters, RNG, and the SDPO
teacher's and KL reference's copies of the trained weights (an EMA teacher drifts from the student)."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from training.core import TrainState, load_extra, rng_state, set_rng_state
from training.core import load_state as core_load_state
from training.core import save_state as core_save_state


class ResumableTrainer:
    """Mixed into training.rl.RLTrainer, which sets weights, opt, state, teacher and ref."""

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs besides the model folder: trainable weights (fp32 masters), optimizer,
        the teacher's and reference's copies of them, step counters and RNG (torch.save-able, weights_only)."""
        return {
            "weights": {n: p.detach().cpu().clone() for n, p in self.weights.named().items()},
            "optimizer": self.opt.state_dict(),
            "train_state": asdict(self.state),
            "rng": rng_state(),
            "twins": self._twins(),
        }

    def load_state(self, src: str | Path | dict[str, Any]) -> None:
        """Restore `state_dict()` (a dict or a torch.save file) or a `save_state` folder."""
        import torch

        if not isinstance(src, dict) and Path(src).is_dir():
            self.state = core_load_state(Path(src), self.weights, self.opt)
            self._load_twins(load_extra(Path(src)))
            return
        d = src if isinstance(src, dict) else torch.load(src, weights_only=True)
        self.weights.load(d["weights"], source="rl state")
        self.opt.load_state_dict(d["optimizer"])
        self.state = TrainState(**d["train_state"])
        set_rng_state(d["rng"])
        self._load_twins(d.get("twins") or {})

    def save_state(self, out: Path, keep: int = 2) -> Path:
        """A resumable state folder `<out>/state/step-N` through training.core (teacher/ref weights as extra)."""
        return core_save_state(Path(out), self.weights, self.opt, self.state, keep=keep, extra=self._twins() or None)

    def _twins(self) -> dict[str, Any]:
        """The SDPO teacher's and KL reference's values of the trainable weights ("teacher.<name>", "ref.<name>"):
        an EMA teacher drifts from the student, and both differ from the weights a resumed run loads."""
        out = {}
        for tag, twin in (("teacher", self.teacher), ("ref", self.ref)):
            if twin is not None:
                tp = dict(twin.named_parameters())
                out.update({f"{tag}.{n}": tp[n].detach().cpu().clone() for n in self.weights.params})
        return out

    def _load_twins(self, saved: dict[str, Any]) -> None:
        import torch

        for tag, twin in (("teacher", self.teacher), ("ref", self.ref)):
            if twin is None:
                continue
            tp = dict(twin.named_parameters())
            with torch.no_grad():
                for k, t in saved.items():
                    if k.startswith(tag + "."):
                        n = k[len(tag) + 1 :]
                        tp[n].copy_(t.to(tp[n].device, tp[n].dtype))
