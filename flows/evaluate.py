"""Flow `evaluate`: a checkpoint on held-out seeds (and held-out tasks) -> `evals`, a table and a plot.

python -m flows.evaluate --config configs/tiny.yaml --iteration 0 --checkpoint scripted
prefect deployment run evaluate/cpu -p iteration=0 -p checkpoint=...
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="evaluate", flow_run_name="evaluate-it{iteration}", **FLOW_OPTS)
def evaluate(
    checkpoint: str, config: ConfigRef = ConfigRef(), iteration: int = 0, refresh: bool = False
) -> dict[str, Any]:
    """Evaluation: success rate with a 95% interval per task, on seeds never trained on.

    Args:
        checkpoint: Model folder to evaluate, or 'scripted' for the teacher (the ceiling).
        config: Flywheel config file and dotted-key overrides.
        iteration: Flywheel iteration the eval rows are written under.
        refresh: Evaluate again even if this iteration already finished (rows are replaced, not duplicated).
    """
    return run_stage(t.evaluate, "evaluate", config, iteration, refresh, checkpoint=checkpoint)


if __name__ == "__main__":
    main(evaluate)
