"""The flywheel's run/rollout/stage/up/down commands (registered on flywheel.cli.app)."""

from __future__ import annotations

from typing import Optional

import typer

from flywheel.cli import CONFIG_OPT, app, stage_app
from flywheel.errors import UserError


def _not_yet(what: str, issue: int) -> None:
    raise UserError(f"{what} is not implemented yet (tracked in issue #{issue})")


for _name, _issue, _help in [
    ("curate", 5, "Select successful episodes into an SFT dataset manifest."),
    ("sft", 5, "Fine-tune the student on the latest dataset."),
    ("rl", 7, "GRPO / SDPO on the latest student rollouts."),
    ("evaluate", 5, "Evaluate a checkpoint on held-out seeds and tasks."),
]:
    def _make(name=_name, issue=_issue):
        def cmd(iteration: int = typer.Option(0, "--iteration", "-i", help="Flywheel iteration."),
                config: Optional[str] = CONFIG_OPT):
            _not_yet(f"stage {name}", issue)
        cmd.__doc__ = _help
        return cmd
    stage_app.command(_name, help=_help)(_make())


@app.command()
def up():
    """Start a local Prefect server, work pools, deployments and workers."""
    _not_yet("flywheel up", 6)


@app.command()
def down():
    """Stop what `flywheel up` started."""
    _not_yet("flywheel down", 6)
