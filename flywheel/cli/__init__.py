"""`flywheel`: the command line of the GUI-agent data flywheel.

    flywheel run                          # one flywheel iteration on the embedded default (configs/local.yaml)
    flywheel rollout --policy scripted --tasks click-test,focus-text --seeds 0-9 --envs 2
    flywheel query "SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1"
    flywheel lake stats | flywheel lake verify [--quarantine]
    flywheel stage <name> -i N            # one stage of the registry (flywheel/pipeline.py) on its own
    flywheel config show [--config FILE]

User errors (bad config, bad SQL, unreadable lake files) print one line and exit 2. The typer app is
flywheel/cli/app.py; one module per command group: lake.py (query, lake), commands.py (run, rollout, up,
down), stage.py, view.py, model.py, imports.py, export.py, env.py; common.py holds what they share.
"""

from __future__ import annotations


def main() -> None:
    """Console entry point (`flywheel = "flywheel.cli:main"`): builds the app only when called."""
    from flywheel.cli.app import main as run

    run()
