"""RLSettings: what an RL update needs, read from a FlywheelConfig's rl section (configs.rl.RLConfig documents
each knob and lists its allowed values) and the student's prompt options. Re-exported by training.rl.

    s = RLSettings.from_config(cfg)     # every rl field is a setting here or in configs.rl.RL_STAGE_FIELDS
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from agents.prompts import PromptOptions
from configs.algorithms import ALGORITHMS  # noqa: F401  (re-exported: training.rl.ALGORITHMS)
from configs.models import choices, settings_from
from configs.rl import RL_STAGE_FIELDS, RLConfig

# the fields whose allowed values __post_init__ checks: RLConfig's Literal types list them
_CHOICES = (
    "algorithm",
    "aggregation",
    "adv_mode",
    "sdpo_teacher",
    "sdpo_context",
    "sdpo_hint",
    "sdpo_mode",
    "old_logp",
    "clone_source",
    "clone_schedule",
)


class SDPOTeacherError(ValueError):
    """The SDPO teacher fails rl.sdpo_teacher_check (training.rl_teacher.TeacherCheck): one line, no traceback."""


@dataclass
class RLSettings:
    """What an RL update needs (configs.rl.RLConfig documents each knob; None = the algorithm's default).

    The defaults are RLConfig's (tests/test_config_settings.py checks it), but for the fields from_config resolves
    from other sections and rounds (1 here: a bare RLSettings is one round's update)."""

    CONFIG_MODEL: ClassVar[type] = RLConfig  # the config section these settings are read from

    algorithm: str = "grpo"
    lr: float = 1e-4
    epochs: int = 1
    batch_size: int = 16
    micro_batch: int | None = None
    eps_low: float | None = None
    eps_high: float | None = None
    adv_mode: str | None = None
    aggregation: str = "constant"
    drop_zero_variance: bool = True
    replay: bool = True
    stored_same_seed: bool = False
    guide: str = "off"  # rl.guide: how the teacher's episodes in train_round's guide_keys join their groups
    demo_nll: float = 0.0  # rl.demo_nll: weight of the replayed rows' token-mean NLL (DAPG's behaviour cloning term)
    pg_weight: float = 1.0  # rl.pg_weight: weight of the policy-gradient term (0: an ablation without it)
    clone_steps: int = 0  # rl.clone_*: behaviour-cloning steps after each round's update (training.rl_clone)
    clone_batch: int = 16
    clone_lr: float = 5e-4
    clone_focus: float = 0.5
    clone_hard: float = 0.0
    clone_source: str = "teacher"
    clone_warmup: int = 10
    clone_schedule: str = "cosine"
    rounds: int = 1  # rl.rounds: the length of the clone steps' cosine schedule
    clone_tasks: tuple[str, ...] = ()  # set by from_config: rl.clone_tasks, else rollouts.selection.tasks
    focus_tasks: tuple[str, ...] = ()  # set by from_config: rl.tasks, else rollouts.selection.tasks
    is_cap: float = 2.0
    kl_coef: float = 0.0
    sdpo_weight: float | None = None
    sdpo_teacher: str = "ema"
    sdpo_ema_rate: float = 0.05
    sdpo_context: str = "both"
    sdpo_hint: str = "screen"
    sdpo_is_clip: float = 2.0
    sdpo_teacher_check: float | None = -0.2
    sdpo_mode: str = "sampled"
    sdpo_topk: int = 20
    sdpo_alpha: float = 0.5
    gigpo_omega: float = 0.0
    gigpo_gamma: float = 0.95
    step_weight: str = "episode"
    parse_error_penalty: float = 0.0
    fused_kernels: bool = True  # Liger RMSNorm/SwiGLU/RoPE bound onto the model on CUDA when installed
    grad_clip: float = 1.0
    weight_decay: float = 0.0
    max_minutes: float | None = None
    warmup_steps: int = 20
    seed: int = 0
    max_new_tokens: int = 96  # student.max_new_tokens: the per-row length of the constant normaliser
    old_logp: str = "recompute"  # or "rollout": fresh rows take the sampler's log-probs as old (no forward)
    temperature: float = 1.0  # the sampler's (rl.temperature, else student.temperature): log-probs of logits / T
    targets: str = "full"  # sft.targets: how replayed demos are tokenised
    prompt: PromptOptions = field(default_factory=PromptOptions)  # the student's (rows are rebuilt with them)
    config_hash: str | None = None  # provenance on the lake rows

    def __post_init__(self):
        for name in _CHOICES:
            value, allowed = getattr(self, name), choices(RLConfig, name)
            if value not in allowed:
                raise ValueError(f"rl {name} must be one of {', '.join(map(str, allowed))}, got {value!r}")
        if self.batch_size < 1 or self.epochs < 1:
            raise ValueError("rl batch_size and epochs must be >= 1")
        if not self.temperature > 0:
            raise ValueError(f"rl temperature must be > 0, got {self.temperature}")
        if self.sdpo_topk < 1 or not 0.0 <= self.sdpo_alpha <= 1.0:
            raise ValueError(
                f"rl sdpo_topk must be >= 1 and sdpo_alpha in [0, 1], got {self.sdpo_topk}, {self.sdpo_alpha}"
            )
        if self.gigpo_omega < 0 or not 0.0 < self.gigpo_gamma <= 1.0:
            raise ValueError(
                f"rl gigpo_omega must be >= 0 and gigpo_gamma in (0, 1], got {self.gigpo_omega}, {self.gigpo_gamma}"
            )

    @classmethod
    def from_config(cls, cfg: Any, algo: str | None = None) -> "RLSettings":
        """From a FlywheelConfig: cfg.rl's knobs, the student's prompt options and max_new_tokens, cfg.sft.targets.
        An rl field that is neither a setting nor in RL_STAGE_FIELDS is a ConfigError (configs.models.settings_from)."""
        t = cfg.rl_temperature()
        d: dict[str, Any] = dict(
            temperature=t if t > 0 else 1.0,  # a greedy student config: RL still scores the raw policy
            max_new_tokens=cfg.student.max_new_tokens,
            targets=cfg.sft.targets,
            config_hash=cfg.config_hash("rl"),
            prompt=PromptOptions.from_student(cfg.student),
            clone_tasks=tuple(cfg.rl.clone_tasks or cfg.rollouts.selection.tasks),
            focus_tasks=tuple(cfg.rl.tasks or cfg.rollouts.selection.tasks),
        )
        if algo:
            d["algorithm"] = algo
        return settings_from(cfg.rl, cls, RL_STAGE_FIELDS, **d)

    @property
    def level(self) -> str:
        return "sequence" if self.algorithm == "gspo" else "token"

    @property
    def clip(self) -> tuple[float, float]:
        gspo = self.algorithm == "gspo"
        return (
            self.eps_low if self.eps_low is not None else (3e-4 if gspo else 0.2),
            self.eps_high if self.eps_high is not None else (4e-4 if gspo else 0.28),
        )

    @property
    def advantage_mode(self) -> str:
        return self.adv_mode or ("mean" if self.algorithm == "dr_grpo" else "zscore")

    @property
    def distill_weight(self) -> float:
        return self.sdpo_weight if self.sdpo_weight is not None else (1.0 if self.algorithm == "sdpo" else 0.0)

    @property
    def prompt_options(self) -> PromptOptions:
        return self.prompt
