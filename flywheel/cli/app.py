"""The `flywheel` typer app: every command group mounted in one place (flywheel.cli.main runs it).

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
from rich.table import Table

from flywheel.cli import commands, env, export, imports, lake, model, stage, view
from flywheel.cli.common import CONFIG_OPT, console, err_console, load_cfg
from flywheel.errors import USER_ERRORS

app = typer.Typer(
    help="Train computer-use agents with a data flywheel over a Parquet lake.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
config_app = typer.Typer(help="Show and validate YAML configs.", no_args_is_help=True)

# the order `flywheel --help` lists them in: commands, then groups
app.command()(lake.query)
app.command("view")(view.view_cmd)
app.command()(commands.up)
app.command()(commands.down)
app.command()(commands.rollout)
app.command()(commands.run)
app.add_typer(lake.lake_app, name="lake")
app.add_typer(config_app, name="config")
app.add_typer(stage.stage_app(), name="stage")  # one command per registered stage
app.add_typer(model.model_app, name="model")
app.add_typer(imports.import_app, name="import")
app.add_typer(export.export_app, name="export")
app.add_typer(env.env_app, name="env")


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


def _say_interrupted() -> None:
    """The one line of an interrupted command. A second Ctrl-C (or a late copy of the first) while it exits must
    neither raise KeyboardInterrupt in the middle of the exit nor kill it once Python has put the default SIGINT
    action back (exit -2 instead of 130): a no-op handler takes what is pending, then SIGINT is ignored."""
    import signal

    signal.signal(signal.SIGINT, lambda *_: None)
    err_console.print("[yellow]interrupted (Ctrl-C)[/yellow]; rerun the same command to continue", highlight=False)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def main() -> None:
    """Console entry point: user errors become one red line and exit code 2; Ctrl-C one yellow line and 130."""
    from training.progress import show_on_console

    show_on_console()  # progress lines where no bar draws (`flywheel run > log.txt`): training/progress.py
    try:
        app()
    except SystemExit as e:
        if e.code == 130:  # typer turns Ctrl-C (KeyboardInterrupt) into a silent Exit(130): say so in one line
            _say_interrupted()
        raise
    except USER_ERRORS as e:
        err_console.print(f"[red]error:[/red] {e}", highlight=False, markup=True)
        sys.exit(2)
    except KeyboardInterrupt:
        _say_interrupted()
        sys.exit(130)
    except RuntimeError as e:
        # a Ctrl-C that lands while DuckDB runs a query (curate's export reads, a lake write) is taken by DuckDB,
        # which raises this instead of KeyboardInterrupt (typer then lets it through as a traceback)
        if str(e) != "Query interrupted":
            raise
        _say_interrupted()
        sys.exit(130)
