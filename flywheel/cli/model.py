"""`flywheel model ...`: build and inspect student models (a typer sub-app; the main CLI mounts it).

    flywheel model init --arch qwen3-vl --size small --out models/small-qwen3vl [--seed 0]
    flywheel model info models/small-qwen3vl
    flywheel model sizes                          # every named shape with its parameter count (no allocation)

Mounted by flywheel/cli/app.py as `app.add_typer(model_app, name="model")`. Bad input (unknown arch or size, a
non-empty --out, a missing folder, an unreachable Hub) prints one line and exits 2.
"""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

model_app = typer.Typer(
    help="Build (random init) and inspect Qwen3-VL / Qwen2.5-VL student models.", no_args_is_help=True
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)


def _fail(e: Exception) -> typer.Exit:
    err_console.print(f"[red]error:[/red] {e}", markup=True, highlight=False)
    return typer.Exit(2)


def _quiet_transformers() -> None:
    # Progress bars for a 1-shard save/load are noise on a terminal.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def _counts_table(title: str, rows: list[tuple[str, str]]) -> Table:
    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column(style="bold")
    table.add_column(justify="right")
    for k, v in rows:
        table.add_row(k, v)
    return table


@model_app.command("init")
def init(
    arch: str = typer.Option("qwen3-vl", "--arch", help="Architecture: qwen3-vl or qwen2.5-vl."),
    size: str = typer.Option(
        "small",
        "--size",
        help="Shape: tiny (~0.5M, tests), small (~20M, CPU default); released shapes "
        "2b/4b/8b (qwen3-vl) or 3b/7b (qwen2.5-vl) for GPU benchmarks.",
    ),
    out: Path = typer.Option(..., "--out", help="Folder to create (must not exist or be empty)."),
    seed: int = typer.Option(0, "--seed", help="Random-init seed (same seed, same weights)."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bf16 on CUDA, fp32 on CPU), float32 or bfloat16."),
    device: str = typer.Option("auto", "--device", help="auto (CUDA when available), cpu or cuda."),
) -> None:
    """Build a randomly initialised model with a locally trained tokenizer and save the whole folder."""
    from training.models import ModelError, init_model, param_counts

    _quiet_transformers()
    try:
        path = init_model(arch, size, out, seed=seed, dtype=dtype, device=device)
        c = param_counts(arch, size)  # the built model's counts, without loading it back
    except ModelError as e:
        raise _fail(e) from None
    console.print(
        _counts_table(
            f"{arch} {size} (seed {seed}) -> {path}",
            [
                ("total params", f"{c['total']:,}"),
                ("vision params", f"{c['vision']:,}"),
                ("language params", f"{c['total'] - c['vision']:,}"),
            ],
        )
    )


@model_app.command("info")
def info(
    path: str = typer.Argument(..., help="Model folder (or Hub id, where the Hub is reachable)."),
) -> None:
    """Show arch, parameter counts (total, vision, trainable under LoRA), vocabulary and image tokens per
    160x210 screenshot. Reads only configs and the processor: no weights are loaded."""
    from training.models import ModelError, describe

    try:
        i = describe(path)
    except ModelError as e:
        raise _fail(e) from None
    console.print(
        _counts_table(
            f"{path}",
            [
                ("arch", f"{i['arch']} ({i['class']})"),
                ("params", f"{i['total']:,}"),
                ("trainable (full fine-tune, vision frozen)", f"{i['total'] - i['vision']:,}"),
                (f"trainable (LoRA r={i['lora_r']})", f"{i['lora_trainable']:,}"),
                ("vision params", f"{i['vision']:,}"),
                ("text hidden x layers", f"{i['hidden_size']} x {i['layers']}"),
                ("vocab (model / tokenizer)", f"{i['vocab_size']:,} / {i['tokenizer_size']:,}"),
                ("image tokens, 160x210 screenshot", str(i["image_tokens_160x210"])),
                ("dtype", i["dtype"]),
            ],
        )
    )


@model_app.command("sizes")
def sizes() -> None:
    """List every named shape and its parameter count (counted on the meta device: nothing is allocated)."""
    from training.models import SIZES, param_counts

    table = Table(title="Named shapes")
    for col in ("arch", "size", "params", "vision", "text hidden x layers"):
        table.add_column(col, justify="right" if col in ("params", "vision") else "left")
    for arch, shapes in SIZES.items():
        for size, shape in shapes.items():
            c = param_counts(arch, size)
            t = shape["text"]
            table.add_row(
                arch, size, f"{c['total']:,}", f"{c['vision']:,}", f"{t['hidden_size']} x {t['num_hidden_layers']}"
            )
    console.print(table)
