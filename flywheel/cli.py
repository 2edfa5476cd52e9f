"""`flywheel`: the command line of the GUI-agent data flywheel.

    flywheel run                          # one flywheel iteration on the embedded default (configs/local.yaml)
    flywheel rollout --policy scripted --tasks click-test,focus-text --seeds 0-9 --envs 2
    flywheel query "SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1"
    flywheel lake stats | flywheel lake verify [--quarantine]
    flywheel config show [--config FILE]

User errors (bad config, bad SQL, unreadable lake files) print one line and exit 2.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from flywheel.errors import USER_ERRORS, UserError

app = typer.Typer(
    help="Train computer-use agents with a data flywheel over a Parquet lake.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
lake_app = typer.Typer(help="Inspect and repair the trajectory lake.", no_args_is_help=True)
config_app = typer.Typer(help="Show and validate YAML configs.", no_args_is_help=True)
stage_app = typer.Typer(help="Run one flywheel stage on its own.", no_args_is_help=True)
app.add_typer(lake_app, name="lake")
app.add_typer(config_app, name="config")
app.add_typer(stage_app, name="stage")

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
    from configs.models import default_config_path, load_config

    return load_config(config or default_config_path(), overrides)


def _lake_arg(lake: str | Path) -> str:
    """A --lake value as the lake takes it: an s3:// URI as given, a folder made absolute."""
    from storage.objstore import is_object_uri

    return str(lake) if is_object_uri(lake) else str(Path(lake).expanduser().resolve())


def use_lake(lake: Optional[str]) -> None:
    """Apply `--lake` for a command that runs stages: it becomes this process's $FLYWHEEL_LAKE.

    The stages find their lake through $FLYWHEEL_LAKE first (flywheel.stages.lake_for), and rollout workers,
    Prefect flow runs and the workers `flywheel up` starts inherit the environment, so one setting reaches
    every process the command starts, with the precedence --lake > $FLYWHEEL_LAKE > lake.root. (A config
    override would change the config hash on every row and lose to an inherited $FLYWHEEL_LAKE.)"""
    import os

    if lake is not None:
        os.environ["FLYWHEEL_LAKE"] = _lake_arg(lake)


def open_lake(lake: Optional[str], config: Optional[Path] = None, *, create: bool = False):
    """The Lake of a command that reads it (see lake_root); an s3:// one takes its endpoint from
    $FLYWHEEL_S3_ENDPOINT, else the config's lake.s3_endpoint (storage.lake.open_lake)."""
    from storage.lake import open_lake as open_lake_at
    from storage.objstore import is_object_uri

    root = lake_root(lake, config)
    if not is_object_uri(root):
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


# ---------------------------------------------------------------------------- query
def _cell(v) -> str:
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
        table.add_row(*[_cell(r[c]) for c in t.column_names])
    console.print(table)
    more = f" (showing {max_rows})" if t.num_rows > max_rows else ""
    console.print(f"[dim]{t.num_rows} row(s){more}[/dim]")


@app.command()
def query(
    sql: str = typer.Argument(..., help="SQL over the views tasks, episodes, steps, checkpoints, datasets, evals."),
    fmt: str = typer.Option("table", "--format", "-f", help="table | csv | json | parquet"),
    out: Optional[Path] = typer.Option(
        None, "--out", "-o", help="Write the result to this file (required for parquet)."
    ),
    max_rows: int = typer.Option(50, "--max-rows", help="Rows shown in table format."),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """Run SQL against the lake with DuckDB and print or export the result."""
    from storage.catalog import connect, export_query, run_query

    lk = open_lake(lake, config)
    con = connect(lk)
    if fmt not in ("table", "csv", "json", "parquet"):
        raise UserError(f"unknown --format {fmt!r}; use table, csv, json or parquet")
    if out is not None:
        if fmt == "table":
            raise UserError("--out needs --format csv, json or parquet")
        export_query(con, sql, out, fmt, lk)
        err_console.print(f"wrote {out}")
        return
    if fmt == "parquet":
        raise UserError("--format parquet needs --out FILE")
    t = run_query(con, sql, lk)
    if fmt == "table":
        print_arrow_table(t, max_rows=max_rows)
    elif fmt == "csv":
        import pyarrow.csv as pacsv

        buf = __import__("io").BytesIO()
        pacsv.write_csv(_csv_ready(t), buf)
        sys.stdout.write(buf.getvalue().decode())
    else:
        rows = [
            {k: (_cell(v) if isinstance(v, (bytes, bytearray)) else v) for k, v in r.items()} for r in t.to_pylist()
        ]
        sys.stdout.write(json.dumps(rows, default=str, indent=1) + "\n")


def _csv_ready(t):
    """CSV holds no nested values: list/struct/map columns become JSON text (as --format json writes them);
    binary columns (screenshots) are left out."""
    import pyarrow as pa

    t = t.drop_columns([c for c in t.column_names if pa.types.is_binary(t.schema.field(c).type)])
    for i, f in enumerate(t.schema):
        if pa.types.is_nested(f.type):
            t = t.set_column(
                i,
                f.name,
                pa.array(
                    [None if v is None else json.dumps(v, default=str) for v in t.column(i).to_pylist()], pa.string()
                ),
            )
    return t


# ---------------------------------------------------------------------------- lake
def _human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if n < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


@lake_app.command("stats")
def lake_stats_cmd(
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
):
    """Rows, bytes, files and partitions per table (reads Parquet footers only)."""
    from storage.inspect import lake_stats

    lk = open_lake(lake, config)
    stats = lake_stats(lk)
    if as_json:
        print(
            json.dumps(
                {
                    t: {
                        "rows": s.rows,
                        "bytes": s.bytes,
                        "files": s.files,
                        "partitions": len(s.partitions),
                        "unreadable": s.unreadable,
                    }
                    for t, s in stats.items()
                },
                indent=1,
            )
        )
        return
    table = Table(title=f"lake {lk.location}", header_style="bold cyan")
    for c in ("table", "rows", "size", "files", "partitions", "unreadable"):
        table.add_column(c, justify="left" if c == "table" else "right")
    for t, s in stats.items():
        table.add_row(
            t,
            f"{s.rows:,}",
            _human(s.bytes),
            str(s.files),
            str(len(s.partitions)),
            f"[red]{s.unreadable}[/red]" if s.unreadable else "0",
        )
    console.print(table)


@lake_app.command("verify")
def lake_verify_cmd(
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
    quarantine: bool = typer.Option(
        False, "--quarantine", help="Move bad files to <lake>/_quarantine (kept, not deleted)."
    ),
    quick: bool = typer.Option(False, "--quick", help="Check footers and schemas only, not every data page."),
):
    """Find unreadable or schema-mismatched files and name them; exit 1 if any."""
    from storage.inspect import verify_lake

    lk = open_lake(lake, config)
    rep = verify_lake(lk, full=not quick)
    for b in rep.bad:
        rel = b.path if lk.remote else lk.key(b.path)  # an object by its full s3:// URI
        moved = ""
        if quarantine:
            dest = lk.quarantine(b.path)
            moved = f" -> moved to {dest if lk.remote else lk.key(dest)}"
        err_console.print(f"[red]BAD[/red] {rel}: {b.problem}{moved}")
    older = f", {rep.older_version} from an older schema version (readable)" if rep.older_version else ""
    console.print(f"checked {rep.checked} file(s): {len(rep.bad)} bad{older}")
    if rep.bad:
        raise typer.Exit(1)


@lake_app.command("schema")
def lake_schema_cmd():
    """Print the lake's table schemas (markdown, one row per column)."""
    from storage.schema import schema_markdown

    print(schema_markdown())


# ---------------------------------------------------------------------------- config
@config_app.command("show")
def config_show(config: Optional[Path] = CONFIG_OPT):
    """Validate a config and print every key with its value and description."""
    cfg = load_cfg(config)
    table = Table(title=str(config or "configs/local.yaml"), header_style="bold cyan")
    for c in ("key", "value", "description"):
        table.add_column(c)

    def walk(model, prefix=""):
        for name, field in type(model).model_fields.items():
            v = getattr(model, name)
            if hasattr(v, "model_fields"):
                walk(v, f"{prefix}{name}.")
            else:
                table.add_row(prefix + name, json.dumps(v, default=str), field.description or "")

    walk(cfg)
    console.print(table)


@config_app.command("validate")
def config_validate(config: Path = typer.Argument(..., help="YAML file to check.")):
    """Check a config file; exit 2 with file, key and expectation on the first problem."""
    cfg = load_cfg(config)
    console.print(f"[green]ok[/green] {config} (hash {cfg.config_hash()})")


def main() -> None:
    """Console entry point: user errors become one red line and exit code 2."""
    from training.progress import show_on_console

    show_on_console()  # progress lines where no bar draws (`flywheel run > log.txt`): training/progress.py
    try:
        _mount_optional()
        app()
    except USER_ERRORS as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, markup=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err_console.print("[yellow]interrupted[/yellow]")
        sys.exit(130)


def _mount_optional() -> None:
    """Mount command groups implemented in their own modules."""
    from flywheel import (
        cli_view,  # noqa: F401 - registers `view`
        commands,  # noqa: F401 - registers run/rollout/stage commands on `app`
    )

    try:
        from flywheel.cli_model import model_app

        app.add_typer(model_app, name="model")
    except ImportError:
        pass
    from flywheel.cli_import import import_app

    app.add_typer(import_app, name="import")
    from flywheel.cli_export import export_app

    app.add_typer(export_app, name="export")
    from flywheel.cli_env import env_app  # also adds `import osworld-tasks` to import_app

    app.add_typer(env_app, name="env")


if __name__ == "__main__":
    main()
