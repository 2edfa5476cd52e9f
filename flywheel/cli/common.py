"""What every `flywheel` command shares: the --config/--lake options, config and lake lookup, consoles, tables.

cfg = load_cfg(config)                 # the validated config (ConfigError: one line, exit 2)
use_lake(lake)                         # --lake -> $FLYWHEEL_LAKE for this process and every one it starts
lk = open_lake(lake, config)           # a Lake for commands that only read it
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True, soft_wrap=True)  # one error = one line, never wrapped

CONFIG_OPT = typer.Option(None, "--config", "-c", help="YAML config (default: configs/local.yaml).")
LAKE_OPT = typer.Option(
    None,
    "--lake",
    help="Lake root (default: $FLYWHEEL_LAKE, else the config's lake.root). "
    "Commands that start other processes pass it on to them as $FLYWHEEL_LAKE.",
)


def load_cfg(config: Optional[Path], overrides: dict | None = None):
    from configs.loading import default_config_path, load_config

    return load_config(config or default_config_path(), overrides)


def _lake_arg(lake: str | Path) -> str:
    """A --lake value as the lake takes it: an s3:// URI as given, a folder made absolute."""
    from storage.objstore import is_object_uri

    return str(lake) if is_object_uri(lake) else str(Path(lake).expanduser().resolve())


def use_lake(lake: Optional[str]) -> None:
    """Apply `--lake` for a command that runs stages: it becomes this process's $FLYWHEEL_LAKE.

    The stages find their lake through $FLYWHEEL_LAKE first (flywheel.specs.lake_for), and rollout workers,
    Prefect flow runs and the workers `flywheel up` starts inherit the environment, so one setting reaches
    every process the command starts, with the precedence --lake > $FLYWHEEL_LAKE > lake.root. (A config
    override would change the config hash on every row and lose to an inherited $FLYWHEEL_LAKE.)"""
    import os

    if lake is not None:
        os.environ["FLYWHEEL_LAKE"] = _lake_arg(lake)


def open_lake(lake: Optional[str], config: Optional[Path] = None, *, create: bool = False):
    """The Lake of a command that reads it (see lake_root); an s3:// one takes its endpoint from
    $FLYWHEEL_S3_ENDPOINT, else the config's lake.s3_endpoint, and a --config's lake its lake.catalog
    (storage.lake.open_lake)."""
    from storage.lake import open_lake as open_lake_at
    from storage.objstore import is_object_uri

    root = lake_root(lake, config)
    if not is_object_uri(root) and config is None:
        return open_lake_at(root, create=create)
    return open_lake_at(load_cfg(config).lake, root=root, create=create)


def lake_root(lake: Optional[str], config: Optional[Path] = None) -> str:
    """The lake root for commands that only read it: --lake, else $FLYWHEEL_LAKE, else the config's lake.root."""
    import os

    if lake:
        return str(lake)
    if os.environ.get("FLYWHEEL_LAKE"):
        return os.environ["FLYWHEEL_LAKE"]
    return load_cfg(config).lake.root


# ---------------------------------------------------------------------------- tables
def cell_text(v) -> str:
    if isinstance(v, (bytes, bytearray)):
        kind = "png" if bytes(v[:8]) == b"\x89PNG\r\n\x1a\n" else "blob"
        return f"<{kind} {len(v) / 1024:.1f} KB>"
    if isinstance(v, float):
        return f"{v:.4g}"
    if v is None:
        return "∅"
    s = str(v)
    return s if len(s) <= 80 else s[:77] + "..."


def print_arrow_table(t, title: str | None = None, max_rows: int = 50) -> None:
    table = Table(title=title, show_lines=False, header_style="bold cyan")
    for name in t.column_names:
        table.add_column(name, overflow="fold")
    rows = t.slice(0, max_rows).to_pylist()
    for r in rows:
        table.add_row(*[cell_text(r[c]) for c in t.column_names])
    console.print(table)
    more = f" (showing {max_rows})" if t.num_rows > max_rows else ""
    console.print(f"[dim]{t.num_rows} row(s){more}[/dim]")
