"""Flow `curate`: successful episodes up to this iteration -> an SFT dataset manifest (DuckDB over the lake).

python -m flows.curate --config configs/tiny.yaml --iteration 0
prefect deployment run curate/cpu -p iteration=0
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="curate", flow_run_name="curate-it{iteration}", **FLOW_OPTS)
def curate(config: ConfigRef = ConfigRef(), iteration: int = 0, refresh: bool = False) -> dict[str, Any]:
    """Success filtering: successful, cleanly parsed episodes into a dataset manifest and export.

    Args:
        config: Flywheel config file and dotted-key overrides.
        iteration: Flywheel iteration; episodes of this and earlier iterations are eligible.
        refresh: Build the manifest again even if this iteration already has one (it is replaced, not duplicated).
    """
    return run_stage(t.curate, "curate", config, iteration, refresh)


if __name__ == "__main__":
    main(curate)
