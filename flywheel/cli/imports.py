"""`flywheel import ...`: existing demonstrations into the lake (stage 'import').

    flywheel import osworld-results results/ --lake lake     # OSWorld result folders (traj.jsonl, PNGs, result.txt)
    flywheel import agentnet agentnet.jsonl --images imgs/    # OpenCUA AgentNet records (normalised coordinates)
    flywheel import slime osworld_reasoning_sft_v1.jsonl      # slime cookbook SFT records (--coords: their space)
    flywheel import osworld-tasks evaluation_examples/       # OSWorld task JSON into the `tasks` table

Each import is idempotent (a rerun adds nothing), prints its counts, and prints one line per rejected input
naming the file and row (exit code 1 when any was rejected).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from flywheel.cli.common import CONFIG_OPT, LAKE_OPT, console, err_console, lake_root, open_lake
from flywheel.errors import UserError

import_app = typer.Typer(help="Import existing demonstrations into the lake.", no_args_is_help=True)


def _report(res, source: str) -> None:
    typer.echo(
        f"{source}: imported {res.episodes} episodes ({res.steps} steps, {res.unparsed_steps} kept "
        f"unparsed with a reason"
        + (f", {res.flagged_steps} parsed but flagged unfit for SFT" if res.flagged_steps else "")
        + f"), {res.skipped} already in the lake, "
        + (f"{len(res.passed_over)} passed over (no episode in them), " if res.passed_over else "")
        + f"{len(res.rejected)} rejected"
    )
    for line in res.passed_over:
        typer.echo(f"passed over {line}")
    for line in res.rejected:
        err_console.print(f"[red]rejected[/red] {line}", highlight=False)
    if res.rejected:
        raise typer.Exit(1)


@import_app.command("osworld-results")
def osworld_results(
    folder: Path = typer.Argument(
        ..., help="An OSWorld results folder (<action_space>/<obs>/<model>/<domain>/<id>/ below it)."
    ),
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration the episodes are filed under."),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """OSWorld result folders -> episodes and steps; pyautogui code is parsed into the action schema, never run."""
    from flywheel.interop.osworld import ImportError_, import_osworld
    from flywheel.runtime.rollout import git_sha

    try:
        res = import_osworld(folder, open_lake(lake, config, create=True), iteration=iteration, git_sha=git_sha())
    except ImportError_ as e:
        raise UserError(str(e)) from None
    _report(res, str(folder))


@import_app.command("agentnet")
def agentnet(
    path: Path = typer.Argument(..., help="AgentNet records: a JSON Lines file (or a JSON list) of task records."),
    images: Optional[Path] = typer.Option(
        None, "--images", help="Folder of the step screenshots (default: the file's folder)."
    ),
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration the episodes are filed under."),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """OpenCUA AgentNet records -> episodes and steps; normalised 0..1 coordinates become screen pixels."""
    from flywheel.interop.agentnet import import_agentnet
    from flywheel.interop.osworld import ImportError_
    from flywheel.runtime.rollout import git_sha

    try:
        res = import_agentnet(
            path, open_lake(lake, config, create=True), images=images, iteration=iteration, git_sha=git_sha()
        )
    except ImportError_ as e:
        raise UserError(str(e)) from None
    _report(res, str(path))


@import_app.command("slime")
def slime(
    path: Path = typer.Argument(
        ..., help="slime OSWorld SFT records: a JSON Lines file of {messages, images, reward, task_id}."
    ),
    coords: str = typer.Option(
        "image",
        "--coords",
        help="Space of the records' coordinates: image (pixels of the image "
        "the turn shows), relative1000 (0..1000), or WxH (pixels of a WxH screen, e.g. 1920x1080).",
    ),
    iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration the episodes are filed under."),
    lake: Optional[str] = LAKE_OPT,
    config: Optional[Path] = CONFIG_OPT,
):
    """slime cookbook SFT records -> episodes and steps; tool calls read by the strict JSON parser, points mapped
    into each step's image pixels (never used unscaled on another screen size)."""
    from flywheel.interop.common import ImportError_
    from flywheel.interop.slime import import_slime, parse_coords
    from flywheel.runtime.rollout import git_sha

    try:
        res = import_slime(
            path,
            open_lake(lake, config, create=True),
            coords=parse_coords(coords),
            iteration=iteration,
            git_sha=git_sha(),
        )
    except ImportError_ as e:
        raise UserError(str(e)) from None
    _report(res, str(path))


@import_app.command("osworld-tasks")
def import_osworld_tasks(
    folder: Path = typer.Argument(..., help="OSWorld evaluation_examples folder (examples/<domain>/<id>.json)."),
    include_excluded: bool = typer.Option(
        False, "--include-excluded", help="Also load tasks needing Google Drive or a proxy."
    ),
    lake: Optional[Path] = typer.Option(
        None, "--lake", help="Lake root (default: $FLYWHEEL_LAKE, else the config's lake.root)."
    ),
    config: Optional[Path] = typer.Option(None, "--config", "-c", help="YAML config (default: configs/local.yaml)."),
):
    """Load OSWorld task JSON files into the `tasks` table (env 'osworld'); a rerun replaces them. Every file is
    loaded, skipped (named, with the reason) or rejected (named, with the reason; exit code 1)."""
    from envs.osworld_tasks import scan_tasks, task_rows
    from flywheel.runtime.rollout import git_sha
    from storage.lake import open_lake

    try:
        scan = scan_tasks(folder, include_excluded=include_excluded)
    except ValueError as e:
        raise UserError(str(e)) from None
    rows = [dict(r, run_key="osworld", git_sha=git_sha(), config_hash=None) for r in task_rows(scan.tasks)]
    if rows:
        open_lake(lake_root(lake, config)).replace_run(
            "tasks", [rows], iteration=0, stage="registry", run_key="osworld"
        )
    console.print(
        f"[green]ok[/green] {len(rows)} OSWorld tasks into `tasks`; skipped {len(scan.skipped)}, "
        f"rejected {len(scan.rejected)}",
        highlight=False,
    )
    for task_id, why in scan.skipped:
        console.print(f"  skipped {task_id}: {why}", highlight=False, soft_wrap=True)
    for name, why in scan.rejected:
        err_console.print(f"[red]rejected[/red] {name}: {why}", highlight=False, soft_wrap=True)
    if scan.rejected:
        raise typer.Exit(1)
