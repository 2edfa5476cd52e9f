"""Flow `rollouts`: the current student, G episodes per task instance on the train split.

python -m flows.rollouts --config configs/tiny.yaml --iteration 0 [--checkpoint lake/_checkpoints/sft-it0/merged]
prefect deployment run rollouts/cpu -p iteration=1
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="rollouts", flow_run_name="rollouts-it{iteration}", **FLOW_OPTS)
def rollouts(
    config: ConfigRef = ConfigRef(), iteration: int = 0, checkpoint: str | None = None, refresh: bool = False
) -> dict[str, Any]:
    """Student rollouts: G episodes per (task, seed), the RL groups, written to the lake.

    Args:
        config: Flywheel config file and dotted-key overrides.
        iteration: Flywheel iteration (selects fresh train seeds and the lake partition).
        checkpoint: Student model folder; empty means the config's student.model.
        refresh: Run again even if this iteration already finished (existing episodes are kept, not duplicated).
    """
    return run_stage(t.rollouts, "rollouts", config, iteration, refresh, checkpoint=checkpoint)


if __name__ == "__main__":
    main(rollouts)
