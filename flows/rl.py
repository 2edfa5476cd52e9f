"""Flow `rl`: GRPO / SDPO on the iteration's student rollouts (skipped unless rl.enabled; `gpu` pool).

python -m flows.rl --config configs/tiny.yaml --iteration 0 --checkpoint lake/_checkpoints/sft-it0/merged
prefect deployment run rl/gpu -p iteration=0 -p checkpoint=...
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.common import FLOW_OPTS, main, run_stage
from tasks import stages as t
from tasks.common import ConfigRef


@flow(name="rl", flow_run_name="rl-it{iteration}", **FLOW_OPTS)
def rl(checkpoint: str, config: ConfigRef = ConfigRef(), iteration: int = 0, refresh: bool = False) -> dict[str, Any]:
    """Reinforcement learning from the iteration's rollout groups.

    Args:
        checkpoint: Model folder to start from (usually the SFT stage's output).
        config: Flywheel config file and dotted-key overrides.
        iteration: Flywheel iteration whose rollouts are trained on.
        refresh: Train again even if this iteration already finished.
    """
    return run_stage(t.rl, "rl", config, iteration, refresh, checkpoint=checkpoint)


if __name__ == "__main__":
    main(rl)
