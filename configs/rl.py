"""The rl section of a flywheel config (RLConfig) and RL_STAGE_FIELDS, the fields the RL stage reads itself; every
other field is a training.rl_settings.RLSettings setting. configs.models.FlywheelConfig holds it as `rl`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from configs.algorithms import ALGORITHM_NAMES
from configs.algorithms import describe as describe_algorithms
from configs.base import _Cfg, nproc_field
from configs.runkeys import KEYED_IF_SET, RUNTIME


class RLConfig(_Cfg):
    enabled: bool = Field(False, description="Run the RL stage in each iteration")
    algorithm: Literal[ALGORITHM_NAMES] = Field(  # configs/algorithms.py names them
        "grpo", description="RL objective: " + describe_algorithms()
    )
    rounds: int = Field(4, ge=1, le=1000, description="Sample -> update -> reload rounds per RL stage run")
    source: Literal["sample", "lake"] = Field(
        "sample",
        description=(
            "sample: each round samples fresh groups with the current weights (needs "
            "the env here); lake: each round trains on the iteration's stored "
            "student rollout groups (stage 'rollouts', e.g. collected on CPU "
            "machines), so a GPU worker without browsers can run RL; rounds after "
            "the first are off-policy, corrected by truncated importance sampling "
            "against the stored logprobs"
        ),
    )
    group_size: int = Field(
        4,
        ge=1,
        le=64,
        description=(
            "Episodes sampled per task instance (the group G); a group needs 2+ "
            "members with different rewards, or a replayed success, to give a signal"
        ),
    )
    seeds_per_task_per_round: int = Field(4, ge=1, description="Task instances (seeds) per task sampled in each round")
    lr: float = Field(1e-4, gt=0, description="AdamW learning rate (constant)")
    epochs: int = Field(
        1,
        ge=1,
        le=100,
        description=(
            "Passes over a round's step rows (more than 1 makes later minibatches off-policy: the PPO clip bounds them)"
        ),
    )
    batch_size: int = Field(16, ge=1, description="Step rows per optimizer step (minibatch)")
    micro_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "Rows per forward/backward within a minibatch (null = the whole "
            "minibatch); the same update with less memory"
        ),
    )
    eps_low: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="PPO clip below 1 (ratio >= 1 - eps_low); null = 0.2 (gspo: 3e-4, its sequence-level range)",
    )
    eps_high: float | None = Field(
        None, gt=0, description="PPO clip above 1 (ratio <= 1 + eps_high); null = 0.28, DAPO clip-higher (gspo: 4e-4)"
    )
    adv_mode: Literal["zscore", "mean"] | None = Field(
        None,
        description=(
            "Group advantage: zscore (r - mean) / std or mean r - mean (Dr.GRPO); "
            "null = mean for dr_grpo, zscore otherwise"
        ),
    )
    aggregation: Literal["constant", "token_mean", "seq_mean_token_mean"] = Field(
        "constant",
        description=(
            "Loss normaliser: constant (Dr.GRPO: student.max_new_tokens x rows), "
            "token_mean (DAPO) or seq_mean_token_mean (GRPO)"
        ),
    )
    drop_zero_variance: bool = Field(
        True,
        description=(
            "Drop groups whose episodes all got the same reward (no GRPO signal; "
            "DAPO); with SDPO, rows that have a teacher context stay for the SDPO "
            "term; with GiGPO, rows with a nonzero step advantage stay"
        ),
    )
    replay: bool = Field(
        True,
        description=(
            "Join a stored success of the same task (teacher demo or earlier student "
            "success) to each all-failed group with reward 1 (ARPO/DART replay)"
        ),
    )
    is_cap: float = Field(
        2.0,
        gt=0,
        description="Cap of the truncated importance weight exp(old - behaviour) for rows sampled by an older policy",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the k3 KL penalty to the frozen start policy (0 = no reference model is built)",
    )
    sdpo_weight: float | None = Field(
        None,
        ge=0,
        le=1,
        description="Blend (1 - w) GRPO + w SDPO on rows with a teacher context; null = 1.0 for sdpo, 0.0 otherwise",
    )
    sdpo_teacher: Literal["ema", "frozen"] = Field(
        "ema",
        description=(
            "SDPO teacher weights: an EMA of the student (updated after every optimizer step) or the frozen start"
        ),
    )
    sdpo_ema_rate: float = Field(
        0.05, gt=0, le=1, description="EMA rate of the SDPO teacher: theta_T <- (1 - rate) theta_T + rate theta_S"
    )
    sdpo_context: Literal["sibling", "feedback", "both"] = Field(
        "both",
        description=(
            "SDPO teacher's privileged context: a successful sibling's action "
            "sequence, the failed attempt's feedback, or both"
        ),
    )
    sdpo_hint: Literal["screen", "episode"] = Field(
        "screen",
        description=(
            "SDPO sibling block: screen = the one step a successful sibling took on the row's very screen, "
            "numbered as the row's step (the block sft.hint_fraction teaches); episode = the sibling's whole "
            "action sequence (a small student shown it predicted </tool_call> first and collapsed)"
        ),
        json_schema_extra=KEYED_IF_SET,
    )
    sdpo_is_clip: float = Field(
        2.0, gt=0, description="SDPO: cap of the importance weight exp(student - old) on the distillation term"
    )
    sdpo_teacher_check: float | None = Field(
        -0.2,
        description=(
            "SDPO: before each update the teacher scores the student's own tokens on up to 64 successful rows "
            "with a sibling's solution; a mean log pT - log pS below this stops the stage (the teacher does not "
            "read its privileged block, e.g. a student never trained on it: set sft.hint_fraction). null = no check"
        ),
        json_schema_extra=KEYED_IF_SET,
    )
    sdpo_mode: Literal["sampled", "topk"] = Field(
        "sampled",
        description=(
            "SDPO term: sampled (reverse KL on the sampled tokens, as a per-token "
            "advantage log pT - log pS) or topk (logit level: a divergence between "
            "student and teacher over the student's top sdpo_topk tokens plus a tail "
            "bucket at every response token)"
        ),
    )
    sdpo_topk: int = Field(
        20,
        ge=1,
        description=(
            "SDPO topk: vocabulary entries per response token the divergence "
            "compares (the student's top k; the rest is one tail bucket)"
        ),
    )
    sdpo_alpha: float = Field(
        0.5,
        ge=0,
        le=1,
        description=(
            "SDPO topk divergence: 0 forward KL(teacher||student), 1 reverse "
            "KL(student||teacher), in between the generalized JSD with mixture (1 - "
            "alpha) student + alpha teacher"
        ),
    )
    gigpo_omega: float = Field(
        0.0,
        ge=0,
        description=(
            "GiGPO step-level advantage weight: advantage = episode group advantage "
            "+ omega x step advantage, the step advantage taken among the group's "
            "rows that saw the same screen (0 = off; verl-agent's default is 1.0); "
            "with it on, rows with a nonzero step advantage survive "
            "drop_zero_variance"
        ),
    )
    step_weight: Literal["episode", "step"] = Field(
        "episode",
        description=(
            "How an episode's step rows share its advantage: episode = each row gets "
            "advantage / n_rows, so every episode weighs the same (a long failure "
            "does not outweigh a one-step success on the reply format they share); "
            "step = every row gets it in full (verl-agent)"
        ),
    )
    gigpo_gamma: float = Field(
        0.95,
        gt=0,
        le=1,
        description=(
            "GiGPO discount of the step return: a step T-1-t steps before the "
            "episode's end has return gamma^(T-1-t) x the episode reward"
        ),
    )
    parse_error_penalty: float = Field(
        0.0,
        ge=0,
        description=(
            "Subtracted from the advantage of each row whose response did not parse "
            "(advantages only; rewards stay binary)"
        ),
    )
    fused_kernels: bool = Field(
        True,
        description=(
            "On CUDA with liger-kernel installed: fused RMSNorm/SwiGLU/RoPE forwards "
            "bound onto the RL model, its SDPO teacher and KL reference (the same "
            "math; no effect on CPU)"
        ),
    )
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    warmup_steps: int = Field(
        20,
        ge=0,
        description=(
            "Linear learning-rate warmup over the first N optimizer steps of the run "
            "(0 = none): Adam's first steps move every weight by ~lr whatever its "
            "gradient, which knocked a small SFT'd student's success from 34% to 11% "
            "in one round (docs/LOG.md)"
        ),
    )
    max_minutes: float | None = Field(
        None,
        gt=0,
        description="Wall-clock cap on the RL updates (summed over rounds); an update stops cleanly when reached",
    )
    seed: int = Field(
        0,
        ge=0,
        description=(
            "Seed of the run: minibatch order and which task instances each round samples (sampling itself is unseeded)"
        ),
    )
    guide: Literal["off", "failed", "all"] = Field(
        "off",
        description=(
            "Teacher guidance in the loop (DAgger / LUFFY-style mixed-policy GRPO): "
            "after each round's sampling, the bootstrap teacher (bootstrap.policy: "
            "scripted or Claude) solves that round's task instances, and its success "
            "joins the instance's group as a replayed member (reward 1, weighted as "
            "replay). failed: only instances whose group all failed; all: every "
            "instance whose group has a failure. Its episodes land in the lake "
            "(stage rl, the teacher's policy, a run key of their own), so later "
            "iterations curate them too. Needs rl.source sample"
        ),
    )
    demo_nll: float = Field(
        0.0,
        ge=0,
        description=(
            "DAPG-style behaviour cloning: weight of the token-mean NLL of each "
            "minibatch's replayed rows (the teacher's guidance episodes, stored "
            "successes) added to its loss, on top of their policy-gradient term (0 = "
            "off); a teacher's correct reply to the screen the student failed is "
            "then learnt at SFT strength, where the PG term alone weights it by one "
            "group advantage over the whole round's tokens"
        ),
    )
    pg_weight: float = Field(
        1.0,
        ge=0,
        description=(
            "Weight of the clipped policy-gradient term in the loss (1 = GRPO as "
            "usual; 0 = an ablation that keeps only the other terms: rl.demo_nll, "
            "SDPO, the KL penalty)"
        ),
    )
    clone_steps: int = Field(
        0,
        ge=0,
        le=10000,
        description=(
            "Behaviour-cloning steps interleaved with RL (ReLIFT / SRFT-style): "
            "after each round's policy update, this many optimizer steps of the "
            "token-mean NLL (SFT's loss) on stored successes from the lake -- the "
            "teacher's demos and rl.guide answers, with rl.clone_source all the "
            "student's own successes too (training/rl_clone.py); logged as "
            "rl_metrics rows with algo 'clone'. 0 = off. The 6M CPU student learnt "
            "click-button's copy skill only from SFT-strength steps on teacher demos "
            "(docs/LOG.md)"
        ),
    )
    clone_batch: int = Field(
        16, ge=1, description="Step rows per clone step (drawn with replacement, seeded by rl.seed and the round)"
    )
    clone_lr: float = Field(
        5e-4, gt=0, description="Learning rate of the clone steps (the policy update's AdamW and state)"
    )
    clone_focus: float = Field(
        0.5,
        ge=0,
        le=1,
        description=(
            "Fraction of each clone batch drawn from the successes of the RL tasks "
            "(rl.tasks); the rest rehearses the other rl.clone_tasks so they stay "
            "learnt"
        ),
    )
    clone_hard: float = Field(
        0.0,
        ge=0,
        le=1,
        description=(
            "Fraction of the RL tasks' clone draws taken from the answers to "
            "instances a round's student group failed entirely (every sample "
            "failed): the instances the policy cannot solve yet, ReLIFT's hardest "
            "questions, which a random draw rarely meets when the policy solves most "
            "instances. The answers are rl.guide's teacher episodes, so it needs "
            "rl.guide and rl.clone_steps (0 = off: draws ignore which instances the "
            "student failed)"
        ),
    )
    clone_source: Literal["teacher", "all"] = Field(
        "teacher",
        description=(
            "Which stored successes the clone steps learn: teacher (every policy but "
            "the student: the bootstrap's demos and the rl.guide episodes) or all "
            "(the student's own successes too, rejection-sampling style). A sampled "
            "success can carry a garbled Action line before a tool call that "
            "happened to hit (measured: cloning them made 89% of greedy click-button "
            "replies unparseable in 4 rounds, docs/LOG.md)"
        ),
    )
    clone_warmup: int = Field(
        10,
        ge=0,
        description=(
            "Linear warmup of rl.clone_lr over the run's first N clone steps (Adam's "
            "first steps move every weight by ~lr)"
        ),
    )
    clone_schedule: Literal["cosine", "constant"] = Field(
        "cosine",
        description=(
            "The clone steps' learning rate after warmup: cosine (from rl.clone_lr "
            "to 0 over the run's rl.rounds x rl.clone_steps, as SFT's schedule: the "
            "last rounds settle the weights the run ends with) or constant"
        ),
    )
    clone_fresh: int = Field(
        0,
        ge=0,
        le=4000,
        description=(
            "Per round, the bootstrap teacher (bootstrap.policy) also solves this "
            "many fresh train instances of each RL task, instances no round samples "
            "(seeds 1000-4999, shifted by round and rl.seed), into the lake as "
            "rl.guide's episodes are (stage rl, a run key of their own): new demos "
            "for the clone steps, so they learn from more instances instead of "
            "repeating a few hundred (0 = off; needs rl.clone_steps and rl.source "
            "sample)"
        ),
    )
    clone_tasks: list[str] | None = Field(
        None,
        description=(
            "Tasks whose stored successes the clone steps draw from besides rl.tasks "
            "(train tasks only); null = rollouts.selection.tasks"
        ),
    )
    stored_same_seed: bool = Field(
        False,
        description=(
            "Replay and the SDPO teacher's stored context take only a stored success "
            "of the same task instance (seed), never one of another instance of the "
            "task: on a single-screen task another instance's solution names other "
            "coordinates"
        ),
    )
    old_logp: Literal["recompute", "rollout"] = Field(
        "recompute",
        description=(
            "Old-policy log-probs of the PPO ratio: recompute (a no-grad forward "
            "over the round's rows with the weights the update starts from) or "
            "rollout (the sampler's stored log-probs for the rows these weights just "
            "sampled: one forward over the round fewer, ~15% of a CPU round; "
            "replayed rows are still recomputed, and so is everything at "
            "rl.temperature != 1). Needs rl.source sample: stored rollouts were "
            "sampled by other weights"
        ),
    )
    temperature: float | None = Field(
        None,
        gt=0,
        le=5,
        description=(
            "Sampling temperature of the RL rollouts; null = student.temperature. "
            "The update scores log-probs of logits / temperature, so the ratio, KL, "
            "entropy and SDPO terms are of the policy that sampled (as verl does); "
            "the truncated IS weight of a stale row still compares temperature-1 "
            "log-probs, the sampler's stored kind. Below 1, fewer samples break the "
            "reply format and the policy trained is closer to the greedy one "
            "evaluation runs"
        ),
    )
    end_on_parse_error: bool = Field(
        True,
        description=(
            "RL rollouts end an episode at a reply that does not parse (a failure, "
            "one row) instead of following rollout.on_parse_error: a wandering "
            "failure repeats the same signal for up to the step cap and costs that "
            "many rollout steps and rows"
        ),
    )
    tasks: list[str] | None = Field(
        None, description="Tasks RL samples (train tasks only); null = rollouts.selection.tasks"
    )
    distributed: Literal["none", "ddp"] = Field(
        "none",
        description=(
            "ddp: the update runs data-parallel over the local GPUs (torchrun + "
            "PyTorch DDP, one process per GPU): each rank takes its token-balanced "
            "share of every minibatch and the old-log-prob pass, the same "
            "normalisers, steps and resume as one device; rank 0 writes the lake and "
            "the rounds. Needs rl.source lake (the ranks do not sample)"
        ),
        json_schema_extra=RUNTIME,
    )
    nproc: int | None = nproc_field()


# RLConfig fields the RL stage (flywheel/rl_stage.py, flywheel.stages.rl) reads itself; every other field is a
# training.rl_settings.RLSettings field (settings_from rejects a field that is neither)
RL_STAGE_FIELDS = frozenset(
    {
        "enabled",  # whether the stage runs
        "source",  # sample fresh groups, or train on the stored rollouts
        "group_size",  # what each round samples...
        "seeds_per_task_per_round",
        "clone_fresh",  # ...and the teacher's fresh instances next to it
        "end_on_parse_error",  # how the round's episodes end
        "tasks",  # the tasks RL samples (the trainer gets them resolved, as focus_tasks)
        "distributed",  # how the update is launched (torchrun processes)
        "nproc",
    }
)
