"""Flow `sft`: fine-tune the student on a curated dataset (runs on the `gpu` pool when deployed).

python -m flows.sft --config configs/tiny.yaml --iteration 0 --dataset-id ds-...
prefect deployment run sft/gpu -p iteration=0 -p dataset_id=ds-...
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="sft", flow_run_name="sft-it{iteration}", **FLOW_OPTS)
def sft(
    dataset_id: str, config: ConfigRef = ConfigRef(), iteration: int = 0, base: str | None = None, refresh: bool = False
) -> dict[str, Any]:
    """Supervised fine-tuning (LoRA or full, vision tower frozen) on a dataset manifest.

    Args:
        dataset_id: Dataset manifest id from the curate stage (the `datasets` table).
        config: Flywheel config file and dotted-key overrides.
        iteration: Flywheel iteration the checkpoint belongs to.
        base: Model to start from; empty means the latest earlier checkpoint, else the config's student.model.
        refresh: Train again even if this iteration already finished (a finished checkpoint is reused by the stage).
    """
    return run_stage(t.sft, "sft", config, iteration, refresh, dataset_id=dataset_id, base=base)


if __name__ == "__main__":
    main(sft)
