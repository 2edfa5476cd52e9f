"""The RL algorithms, named once: the config's choices (RLConfig.algorithm), the trainer's check (training.rl_settings),
the CLI's `--algo` help, and their one-line descriptions (`flywheel config show`).

    from configs.algorithms import ALGORITHMS
    "gspo" in ALGORITHMS, ALGORITHMS["gspo"], " | ".join(ALGORITHMS)

How each one trains is training.rl_settings.RLSettings' properties (clip, level, advantage_mode, distill_weight).
"""

from __future__ import annotations

# name -> what it does, in the order the docs list them
ALGORITHMS: dict[str, str] = {
    "grpo": "token-level clipped PG, z-score group advantages",
    "dr_grpo": "mean-centred advantages",
    "gspo": "sequence-level ratio and clip",
    "sdpo": "self-distillation from the model re-prompted with a sibling's success / feedback, blended with GRPO by "
    "sdpo_weight",
}
ALGORITHM_NAMES: tuple[str, ...] = tuple(ALGORITHMS)  # for Literal[...] in the config model


def describe() -> str:
    """'grpo (...), dr_grpo (...), ...': each name with its description."""
    return ", ".join(f"{name} ({text})" for name, text in ALGORITHMS.items())
