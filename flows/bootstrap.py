"""Flow `bootstrap`: teacher demonstrations on the train split into the lake (stage 'bootstrap').

python -m flows.bootstrap --config configs/tiny.yaml --iteration 0
prefect deployment run bootstrap/cpu -p iteration=0          # on the `cpu` pool (flywheel up)
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="bootstrap", flow_run_name="bootstrap-it{iteration}", **FLOW_OPTS)
def bootstrap(config: ConfigRef = ConfigRef(), iteration: int = 0, refresh: bool = False) -> dict[str, Any]:
    """Teacher demonstrations (the config's bootstrap policy) on the train split.

    Args:
        config: Flywheel config file and dotted-key overrides.
        iteration: Flywheel iteration the episodes are written under.
        refresh: Run again even if this iteration already finished (the lake keeps no duplicates).
    """
    return run_stage(t.bootstrap, "bootstrap", config, iteration, refresh)


if __name__ == "__main__":
    main(bootstrap)
