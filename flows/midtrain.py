"""Flow `midtrain`: the student's base skills from synthetic pages (flywheel/midtrain.py), before the first SFT.

python -m flows.midtrain --config configs/local.yaml
prefect deployment run midtrain/cpu
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="midtrain", flow_run_name="midtrain", **FLOW_OPTS)
def midtrain(config: ConfigRef = ConfigRef(), iteration: int = 0, refresh: bool = False) -> dict[str, Any]:
    """Mid-training: an oracle corpus on synthetic pages, its dataset, the base checkpoint and its skill report.

    Args:
        config: Flywheel config file and dotted-key overrides.
        iteration: Unused by the stage (the base belongs to the lake); kept so every stage flow takes the same inputs.
        refresh: Run again even if a finished result is cached (every step is idempotent in the lake).
    """
    return run_stage(t.midtrain, "midtrain", config, iteration, refresh)


if __name__ == "__main__":
    main(midtrain)
