"""What the CPU RL diagnostics share: the lake / checkpoint / targets arguments and the model loaded as RL uses it."""

from __future__ import annotations

import argparse
from typing import Any


def add_model_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lake", required=True)
    ap.add_argument("--checkpoint", required=True, help="weights (lake-relative or absolute)")
    ap.add_argument("--targets", default="action", help="sft.targets: how replayed demos are tokenised")


def load_for_rl(a: argparse.Namespace) -> tuple[Any, Any, Any, Any]:
    """(lake, model in eval mode with the vision tower frozen as in RL, processor, RowEncoder)."""
    from storage.lake import open_lake
    from training.models import freeze_vision, load_model
    from training.rl_encode import RowEncoder

    lake = open_lake(a.lake, create=False)
    model, proc = load_model(str(lake.resolve(a.checkpoint)))
    freeze_vision(model)
    model.eval()
    return lake, model, proc, RowEncoder(proc)
