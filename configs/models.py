"""Pydantic models for the YAML configs in configs/: one model per stage plus the flywheel root.

    cfg = load_config("configs/local.yaml")          # configs.loading; ConfigError names file, key and expectation
    cfg.rollouts.envs, cfg.lake.root, cfg.config_hash("rollouts")

Every field has a type, a default and a one-line description (the `description=`, shown by
`flywheel config show`). Unknown keys are errors: a typo fails before any work starts.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import typing
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from configs.base import ConfigError, _Cfg, nproc_field
from configs.rl import RLConfig
from configs.runkeys import KEYED_IF_SET, RUNTIME, at_default_if_set_only


class LakeConfig(_Cfg):
    root: str = Field(
        "lake",
        description=(
            "Lake root: a folder (relative to the working directory) or an object "
            "store, s3://bucket/prefix; $FLYWHEEL_LAKE and a command's --lake "
            "override it"
        ),
    )
    s3_endpoint: str | None = Field(
        None,
        description=(
            "S3-compatible endpoint URL of an s3:// root (MinIO, Ceph, moto...); "
            "null = AWS; $FLYWHEEL_S3_ENDPOINT overrides it. Credentials come from "
            "the AWS environment/profile, never from here"
        ),
    )
    cache_dir: str | None = Field(
        None,
        description=(
            "Local folder for an s3:// lake's side files (downloaded exports and "
            "checkpoints, reports); null = $FLYWHEEL_LAKE_CACHE/<bucket>/<prefix>, "
            "else ~/.cache/flywheel/lakes/..."
        ),
    )
    catalog: str | None = Field(
        None,
        description=(
            "The DuckLake catalog: a postgresql://user@host:5432/db URL (many machines on one lake; the password "
            "from $PGPASSWORD or ~/.pgpass, never here) or a SQLite file; null = <root>/catalog.sqlite "
            "(an s3:// root: <cache_dir>/catalog.sqlite, one machine)"
        ),
        json_schema_extra=RUNTIME,  # where the lake's catalog lives, not what a run computes: in no key or hash
    )

    @model_validator(mode="after")
    def _check_root(self) -> "LakeConfig":
        from storage.objstore import LakeError, is_object_uri, parse_uri

        if is_object_uri(self.root):
            try:
                parse_uri(self.root)
            except LakeError as e:
                raise ValueError(str(e)) from None
        elif self.root.startswith(("gs://", "gcs://", "az://", "abfs://", "http://", "https://")):
            raise ValueError(
                f"lake.root {self.root!r}: only folders and s3:// (any S3-compatible endpoint) are supported"
            )
        if self.catalog and "://" in self.catalog and not self.catalog.startswith(("postgresql://", "postgres://")):
            raise ValueError(f"lake.catalog {self.catalog!r}: use a postgresql:// URL or a SQLite file path")
        if self.catalog and self.catalog.startswith(("postgresql://", "postgres://")) and "@" in self.catalog:
            if ":" in self.catalog.split("://", 1)[1].split("@", 1)[0]:
                raise ValueError("lake.catalog holds a password: put it in $PGPASSWORD or ~/.pgpass instead")
        if self.s3_endpoint and not self.s3_endpoint.startswith(("http://", "https://")):
            raise ValueError(f"lake.s3_endpoint {self.s3_endpoint!r} must be an http:// or https:// URL")
        return self


class EnvConfig(_Cfg):
    name: Literal["miniwob", "remote"] = Field("miniwob", description="Environment family")
    chrome_binary: str = Field("/usr/bin/chromium", description="Chromium binary for MiniWoB")
    chromedriver: str = Field("/usr/bin/chromedriver", description="ChromeDriver binary for MiniWoB")
    screenshot_scale: int = Field(
        1,
        ge=1,
        le=8,
        description=(
            "Upscale factor of the MiniWoB screenshot the policy sees (8: 1280x1680, which Claude sees downscaled)"
        ),
    )
    max_steps: int | None = Field(
        None,
        ge=1,
        le=200,
        description="Step cap per episode (status 'truncated' when hit); null = each task's own cap from the registry",
    )
    servers: list[str] = Field(
        default_factory=list,
        description="Env server URLs (http://host:port) for env 'remote'; episodes go to the servers with free slots",
    )
    token_env: str = Field(
        "FLYWHEEL_ENV_TOKEN",
        description=(
            "Name of the environment variable holding the env servers' API token "
            "(the token itself never goes in a config or the lake)"
        ),
    )
    error_retries: int = Field(
        2,
        ge=0,
        le=10,
        description=(
            "Reruns, within the run, of an episode that ended in an env error or whose "
            "rollout worker died (a crashed browser or worker is restarted; a dead "
            "server's episodes go to another server)"
        ),
    )
    acquire_timeout_s: float = Field(
        120.0, gt=0, description="Env 'remote': how long a reset waits for a free slot when all are busy"
    )
    ca_file: str | None = Field(
        None,
        description="Env 'remote': PEM CA bundle verifying https env servers (a self-signed one); null = system CAs",
    )

    @field_validator("servers")
    @classmethod
    def _urls(cls, v: list[str]) -> list[str]:
        from envs.remote import check_server_url

        return [check_server_url(u) for u in v]

    @field_validator("token_env")
    @classmethod
    def _env_var_name(cls, v: str) -> str:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", v):
            raise ValueError(
                "token_env is the NAME of an environment variable (e.g. FLYWHEEL_ENV_TOKEN), not the token"
            )
        return v


class TaskSelection(_Cfg):
    tasks: list[str] = Field(
        default_factory=lambda: ["click-test", "click-button", "focus-text", "click-tab"],
        description="Task ids, or ['all'] for every teacher-supported task",
    )
    seeds_per_task: int = Field(10, ge=1, description="Episodes (distinct seeds) per task")
    seed_offset: int = Field(0, ge=0, description="First seed index within the split's seed range")


class RolloutConfig(_Cfg):
    envs: int = Field(2, ge=1, le=64, description="Parallel env worker processes")
    envs_per_worker: int = Field(
        1, ge=1, le=64, description="Envs each worker steps in lockstep with one batched model call (student policies)"
    )
    group_size: int = Field(1, ge=1, le=64, description="Episodes per task instance (the GRPO group G)")
    episode_timeout_s: float = Field(120.0, gt=0, description="Wall-clock limit per episode (status 'timeout')")
    worker_start_timeout_s: float = Field(60.0, gt=0, description="Max time for a worker to start its browser")
    policy_threads: int | None = Field(
        None,
        ge=1,
        le=256,
        description=(
            "Torch intra-op threads per rollout worker for the student (null = 1: on "
            "few cores, N workers x default threads next to Chromium made generate "
            "10x slower)"
        ),
    )
    on_parse_error: Literal["continue", "end"] = Field(
        "continue", description="After unparseable model output: keep going or end the episode"
    )


class BootstrapConfig(_Cfg):
    policy: Literal["scripted", "claude", "auto"] = Field(
        "scripted",
        description=(
            "Teacher producing demonstrations: scripted (DOM recipes), claude "
            "(computer use; needs ANTHROPIC_API_KEY) or auto (claude when "
            "ANTHROPIC_API_KEY is set, else scripted)"
        ),
    )
    budget_usd: float | None = Field(
        None,
        gt=0,
        description=(
            "Dollar budget of one bootstrap run (paid teachers): once the finished "
            "episodes cost this much, no new episode starts (running ones finish and "
            "are kept); null = no limit"
        ),
    )
    selection: TaskSelection = Field(
        default_factory=TaskSelection, description="Tasks and seeds for teacher demos (train split)"
    )
    success_threshold: float = Field(
        0.3, ge=0, le=1, description="Re-bootstrap when the student's success falls below this"
    )
    max_demos_per_task: int | None = Field(
        None,
        ge=0,
        description=(
            "The older name of teacher_budget.max_episodes_per_task (used when that "
            "is null): teacher episodes a task may ever get in this lake, every "
            "stage that runs the teacher counted (bootstrap, curriculum top-ups, "
            "rl.guide, rl.clone_fresh); null = no cap. With curriculum.enabled, only "
            "tasks the student never solves get more"
        ),
    )


class TeacherBudgetConfig(_Cfg):
    """The one teacher budget of a lake (flywheel/teacher_budget.py): every teacher episode counts, whichever stage
    runs it (bootstrap and curriculum top-ups, rl.guide, rl.clone_fresh), counted from the lake's `episodes` rows."""

    max_episodes_per_task: int | None = Field(
        None,
        ge=0,
        description=(
            "Teacher episodes a task may ever get in this lake, whichever stage runs "
            "the teacher (bootstrap, curriculum top-ups, rl.guide, rl.clone_fresh; "
            "imports, evaluate and midtrain are not teacher spend); null = "
            "bootstrap.max_demos_per_task, else no cap"
        ),
    )
    max_episodes: int | None = Field(
        None,
        ge=0,
        description=(
            "Teacher episodes over all tasks in this lake, every stage counted; a "
            "capped run keeps them spread over its tasks; null = no cap"
        ),
    )
    usd: float | None = Field(
        None,
        ge=0,
        description=(
            "Dollars (paid teachers: the episodes' cost) over every stage in this "
            "lake: once spent, no new teacher episode starts (running ones finish "
            "and count); null = no cap. bootstrap.budget_usd still caps each "
            "bootstrap run"
        ),
    )


class ModelPrice(_Cfg):
    input: float = Field(..., ge=0, description="USD per million input tokens")
    output: float = Field(..., ge=0, description="USD per million output tokens (extended thinking included)")
    cache_write: float = Field(0.0, ge=0, description="USD per million prompt-cache write tokens (5-minute TTL)")
    cache_read: float = Field(0.0, ge=0, description="USD per million prompt-cache read tokens")


def _default_prices() -> dict[str, ModelPrice]:
    # Anthropic's pricing page (platform.claude.com/docs/en/about-claude/pricing); keys are model-id prefixes,
    # the longest matching prefix wins. Cache writes are 1.25x input, cache reads 0.1x input.
    table = {
        "claude-opus-4-7": (5, 25),
        "claude-opus-4-6": (5, 25),
        "claude-opus-4-5": (5, 25),
        "claude-opus-4-1": (15, 75),
        "claude-opus-4": (15, 75),
        "claude-sonnet-4": (3, 15),
        "claude-haiku-4-5": (1, 5),
    }
    return {
        k: ModelPrice(input=i, output=o, cache_write=round(i * 1.25, 4), cache_read=round(i * 0.1, 4))
        for k, (i, o) in table.items()
    }


class ClaudeConfig(_Cfg):
    model: str = Field("claude-sonnet-4-6", description="Claude model id for the computer-use teacher")
    tool_version: Literal["auto", "computer_20251124", "computer_20250124"] = Field(
        "auto",
        description="Computer-use tool version (auto: by model, per Anthropic's docs; the beta header follows it)",
    )
    base_url: str | None = Field(
        None,
        description=(
            "API base URL (null: the SDK default, or $ANTHROPIC_BASE_URL); the key always comes from $ANTHROPIC_API_KEY"
        ),
    )
    max_tokens: int = Field(2048, ge=64, le=32000, description="Max output tokens per API call (thinking included)")
    thinking_budget: int | None = Field(
        1024, ge=1024, description="Extended thinking budget in tokens (the step's thought); null = off"
    )
    history_images: int = Field(
        3, ge=1, le=20, description="Screenshots kept in the conversation (older ones are replaced by a note)"
    )
    max_retries: int = Field(
        4, ge=0, le=10, description="SDK retries with exponential backoff on 408/409/429/5xx/overloaded"
    )
    timeout_s: float = Field(120.0, gt=0, description="Timeout of one API request")
    max_long_edge: int = Field(
        1568,
        ge=64,
        description=(
            "Screenshots are scaled so the long edge is at most this (Anthropic's limit; Opus 4.7 accepts 2576)"
        ),
    )
    max_pixels: int = Field(
        1_150_000, ge=4096, description="...and the area at most this many pixels (Anthropic: about 1.15 megapixels)"
    )
    prices: dict[str, ModelPrice] = Field(
        default_factory=_default_prices, description="USD per million tokens by model-id prefix (longest prefix wins)"
    )

    @model_validator(mode="after")
    def _checks(self) -> "ClaudeConfig":
        if self.thinking_budget is not None and self.thinking_budget >= self.max_tokens:
            raise ValueError(
                f"claude.thinking_budget ({self.thinking_budget}) must be below claude.max_tokens "
                f"({self.max_tokens}): raise max_tokens or lower the budget"
            )
        if not any(self.model.startswith(k) for k in self.prices):
            raise ValueError(
                f"claude.prices has no entry for claude.model {self.model!r}: add one (USD per million tokens)"
            )
        return self


class CurriculumConfig(_Cfg):
    enabled: bool = Field(
        False,
        description=(
            "Plan each iteration from the lake (flywheel/curriculum.py): teacher "
            "demos only for tasks the student never solves (within "
            "bootstrap.max_demos_per_task), rollouts and RL for tasks with 0 < "
            "success < solved_threshold, a small check for solved ones; decisions go "
            "to the `curriculum` table"
        ),
    )
    solved_threshold: float = Field(
        0.9, gt=0, le=1, description="Success at or above which a task counts as solved (a check only)"
    )
    check_seeds: int = Field(1, ge=0, description="Rollout seeds for a solved task's check")
    target_successes: int | None = Field(
        None,
        ge=1,
        description=(
            "Size a frontier task's student rollouts (0 < success < solved_threshold) to this many expected "
            "successes: ceil(target / (success x rollouts.attempts)) seeds, at least "
            "rollouts.selection.seeds_per_task and at most max_rollout_seeds; null: every frontier task gets "
            "seeds_per_task"
        ),
    )
    max_rollout_seeds: int = Field(
        64,
        ge=1,
        description=(
            "With target_successes: the most seeds a task's rollouts get in one iteration (also the stride "
            "between iterations' seed ranges, so no two iterations share a task instance)"
        ),
    )
    top_up_demos: int = Field(
        20, ge=0, description="Teacher demos per iteration for a task the student never solves (within its budget)"
    )
    rollout_evidence: bool = Field(
        True,
        description=(
            "A task with held-out success 0 whose student rollouts of that iteration (or a later one) did succeed "
            "stays a frontier task, its rollouts sized by their success rate, instead of getting top-up demos or "
            "being parked: held-out is greedy, the rollouts sample k attempts an instance, and the instances "
            "solved only sometimes are where the student's new data comes from; false: held-out alone decides"
        ),
    )
    sft_every_iteration: bool = Field(
        True,
        description=(
            "Run SFT in every iteration; false: after iteration 0, SFT runs only "
            "when entropulse triggers (else RL continues from the last checkpoint)"
        ),
    )
    entropy_floor: float = Field(
        0.05,
        ge=0,
        description=(
            "Entropulse: SFT runs next iteration when the last RL round's mean "
            "policy entropy (nats/token) fell below this"
        ),
    )
    plateau_points: float = Field(
        2.0,
        ge=0,
        description=(
            "Entropulse: SFT runs next iteration when held-out success moved less "
            "than this many points between the last two iterations"
        ),
    )


class StudentConfig(_Cfg):
    model: str = Field("./models/small-qwen3vl", description="Local model folder or Hub id of the base student")
    arch: Literal["qwen3-vl", "qwen2.5-vl"] = Field(
        "qwen3-vl", description="Architecture family (coordinate convention follows it)"
    )
    size: str = Field("small", description="Size preset used when the model folder must be built")
    backend: Literal["hf", "openai"] = Field("hf", description="Inference backend")
    base_url: str | None = Field(None, description="OpenAI-compatible server URL for backend 'openai'")
    temperature: float = Field(1.0, ge=0, le=5, description="Sampling temperature for rollouts")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling for rollouts")
    max_new_tokens: int = Field(96, ge=1, le=4096, description="Max response tokens per step")
    history_images: int = Field(1, ge=0, le=8, description="Screenshots in the prompt window (K); older steps as text")
    use_ui_text: bool = Field(True, description="Put the DOM / accessibility text view into the prompt")
    coord_space: Literal["native", "screen"] = Field(
        "native",
        description=(
            "Coordinates in prompts and replies: native = the family's own (Qwen3-VL 0-1000, Qwen2.5-VL "
            "resized pixels; what a Hub model was pretrained on); screen = screenshot pixels, the numbers "
            "the UI text shows, so a point is copied, not rescaled (worse for the embedded random-init student: "
            "click-button 13.5/25 against 17, docs/RESULTS.md session 37)"
        ),
        json_schema_extra=KEYED_IF_SET,
    )
    system_prompt: Literal["compact", "full", "none"] = Field(
        "compact",
        description=(
            "The system message: compact = the coordinate convention; full = also the tool's actions and the reply "
            "format (a pretrained model); none = no system message (the random-init student learns the format from "
            "its data; a constant 74 tokens of each ~425-token sample)"
        ),
        json_schema_extra=KEYED_IF_SET,
    )
    ui_sizes: bool = Field(
        True,
        description="Each UI text line's box size '[wxh]' after its centre (false: ~9 tokens a line fewer)",
        json_schema_extra=KEYED_IF_SET,
    )
    ui_marks: bool = Field(
        False,
        description=(
            "Number each UI text line '[k] '; an Action line that cites a line cites its number first, so the "
            "copy of the line's centre keys on a number no other line has (set-of-marks)"
        ),
        json_schema_extra=KEYED_IF_SET,
    )
    snap_to_cited: bool = Field(
        False,
        description=(
            "A click whose point misses the UI text line its Action line cites (its role and label) goes to that "
            "line's centre; when several lines share them, to the one nearest the model's point (a tie is left "
            "alone): the student acts on the element it names, as accessibility-tree agents do. The reply is kept "
            "as written; the step's prompt_context records `snapped` (the line and the model's point) so SQL can "
            "count how often the reply's own numbers missed"
        ),
        json_schema_extra=KEYED_IF_SET,
    )
    lean_decode: bool = Field(
        True,
        description=(
            "hf backend: after one HF prefill, decode with the lean KV-cached loop "
            "(same tokens and logprobs as transformers generate, less per-token "
            "overhead); false = transformers generate"
        ),
    )

    def policy_config(self, **over: Any) -> dict[str, Any]:
        """The config a student PolicySpec carries (rollout run keys hash it), with `over` applied. A KEYED_IF_SET
        field at its default is left out, so the run keys of lakes made before that field still hold."""
        return {**self.model_dump(exclude=at_default_if_set_only(self)), **over}


class RolloutStageConfig(_Cfg):
    selection: TaskSelection = Field(default_factory=TaskSelection, description="Tasks and seeds for student rollouts")
    temperature: float | None = Field(
        None,
        ge=0,
        le=5,
        description=(
            "Sampling temperature of the rollouts stage (data for curate); null = "
            "student.temperature. RL keeps student.temperature: its groups need the "
            "spread"
        ),
    )
    attempts: int | None = Field(
        None,
        ge=1,
        le=64,
        description=(
            "Attempts per task instance in the rollouts stage (pass@k collection: "
            "every success is kept, deduplicated by instance + action sequence); "
            "null = rollout.group_size"
        ),
    )
    openings: int | None = Field(
        None,
        ge=2,
        le=64,
        json_schema_extra=KEYED_IF_SET,
        description=(
            "Branch the attempts of an instance at its first step: draw this many replies to the first screen, "
            "rank their distinct actions (the cited element, not its exact coordinates) by how often they were "
            "drawn, and start attempt j with the j-th (a plain sample once they run out). pass@k then spends its "
            "k attempts on k opening moves instead of repeating the policy's favourite; null = every attempt "
            "samples its own first step"
        ),
    )
    openings_temperature: float | None = Field(
        None,
        ge=0,
        le=5,
        json_schema_extra=KEYED_IF_SET,
        description=(
            "Sampling temperature of the `openings` draws (the first step of each attempt); null = the rollouts' "
            "own. Hotter draws find more distinct moves; every later step samples at the rollouts' temperature"
        ),
    )


class CurateConfig(_Cfg):
    reward_threshold: float = Field(1.0, ge=0, le=1, description="Min binary task reward of a kept episode")
    max_episodes_per_task: int = Field(200, ge=1, description="Cap per task (balance)")
    teacher_ratio: float | None = Field(
        None, ge=0, le=1, description="Fraction of teacher episodes when mixing sources (None = all)"
    )
    drop_loops: bool = Field(
        True,
        description=(
            "Cut the steps between two visits of the same page (UI text + screenshot) from each kept episode, "
            "so SFT learns the short path, not a success's detours (manifest: source_counts.loop_steps_cut)"
        ),
    )
    rebuild_action_lines: bool = Field(
        False,
        description=(
            "Rewrite each student step's Action line from what it did (training.data.cite_what_it_did): a click "
            "cites the UI-text line of the element under its point and clicks its centre, a type quotes its text. "
            'The student\'s own line is a guess that SFT would otherwise teach back (`Click button "DDD2"` over a '
            "text field it did hit)"
        ),
    )
    balance: Literal["none", "task"] = Field(
        "none",
        description=(
            "How the export weighs tasks: none = as selected; task = each task's samples repeated (whole copies) "
            "to about the largest task's count, so a task the student already solves often (its many successes) "
            "does not crowd out the rest (manifest: source_counts.repeats_by_task)"
        ),
    )
    solved_instance_keep: float = Field(
        1.0,
        ge=0,
        le=1,
        description=(
            "Fraction of the student's successes kept from instances it solved on every attempt (>= 2 attempts: "
            "rollouts.attempts, RL groups); 0 keeps only instances it solves sometimes, where its new data is"
        ),
    )
    instance_weight: Literal["none", "inverse_pass_rate"] = Field(
        "none",
        description=(
            "How much each student instance weighs in the export: none = each kept success once; "
            "inverse_pass_rate = an instance solved on w of its n >= 2 attempts counts about n / w times (its "
            "kept successes in whole copies, at least once each), so the instances the student solves only "
            "sometimes are not outnumbered by the ones it always solves and a self-trained student does not "
            "drift toward its easy cases (manifest: source_counts.instance_copies)"
        ),
        json_schema_extra=KEYED_IF_SET,
    )


class SFTConfig(_Cfg):
    method: Literal["lora", "full"] = Field(
        "lora", description="LoRA adapters on the LM, or full fine-tune (vision frozen in both)"
    )
    lr: float = Field(1e-3, gt=0, description="Peak learning rate (cosine schedule)")
    epochs: float = Field(3.0, gt=0, description="Passes over the dataset")
    batch_size: int = Field(8, ge=1, description="Micro-batch size")
    grad_accum: int = Field(1, ge=1, description="Gradient accumulation steps")
    max_minutes: float | None = Field(None, gt=0, description="Wall-clock budget; training stops cleanly when reached")
    lora_r: int = Field(16, ge=1, description="LoRA rank")
    lora_alpha: int = Field(32, ge=1, description="LoRA alpha (scale = alpha / r)")
    lora_dropout: float = Field(0.05, ge=0, lt=1, description="Dropout on the LoRA input")
    lora_fp32_adapters: bool = Field(
        False,
        description=(
            "Keep LoRA adapters in fp32 (PEFT's default: every adapted projection "
            "then casts its input to fp32). Default: adapters in the model's dtype "
            "(bf16 on GPU) with fp32 master copies in the optimizer"
        ),
    )
    max_steps: int | None = Field(None, ge=1, description="Cap on optimizer steps (None = from epochs)")
    warmup_ratio: float = Field(
        0.05, ge=0, le=0.5, description="Linear warmup, as a fraction of the planned optimizer steps"
    )
    weight_decay: float = Field(0.01, ge=0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="Max global gradient norm")
    save_every: int = Field(50, ge=1, description="Optimizer steps between resumable checkpoints")
    seed: int = Field(0, ge=0, description="Seed of data order, LoRA init and dropout")
    schedule_to_budget: bool = Field(
        True,
        description=(
            "With max_minutes: fit the cosine schedule's length to the steps the "
            "budget allows (re-estimated every 4 steps)"
        ),
    )
    merge: bool = Field(
        True,
        description=(
            "LoRA: also save a merged full model in <checkpoint>/merged (for vLLM and the next iteration's base)"
        ),
    )
    output_root: str | None = Field(
        None,
        description=(
            "Folder for checkpoints (None = <lake>/_checkpoints); a relative path is "
            "under the lake root, so the checkpoints move with the lake"
        ),
    )
    unsloth: bool = Field(
        False,
        description=(
            "Load through Unsloth FastVisionModel when it is installed and CUDA is available (ignored otherwise)"
        ),
    )
    targets: Literal["full", "action", "tool_call"] = Field(
        "full",
        description=(
            "Assistant targets: full (thought + Action line + tool call), action (no "
            "thought) or tool_call (the call alone); shorter targets train a small "
            "CPU student faster"
        ),
    )
    fused_kernels: bool = Field(
        True, description="On CUDA with liger-kernel installed: fused RMSNorm/SwiGLU/RoPE kernels"
    )
    distributed: Literal["none", "ddp"] = Field(
        "none",
        description=(
            "ddp: data-parallel over the local GPUs (torchrun + PyTorch DDP, one "
            "process per GPU); the same steps, sample order, loss and exact resume "
            "as one device, the step's samples split across the processes"
        ),
        json_schema_extra=RUNTIME,
    )
    nproc: int | None = nproc_field()
    hint_fraction: float = Field(
        0.0,
        ge=0,
        le=1,
        description=(
            "Hint-aware SFT for SDPO: this fraction of the samples is added again "
            "with the SDPO teacher's privileged block in the prompt (\"Correct "
            "solution:\" holding the sample's own action, as "
            "training.rl_encode.teacher_messages writes it), the target unchanged, "
            "so the student learns to use a solution it is shown; 0 = off. A student "
            "never trained on that block scores its own replies lower when shown one "
            "(docs/LOG.md), which turned SDPO's term negative on most tokens"
        ),
    )
    packing: bool = Field(
        False,
        description=(
            "Micro-batches as packed rows of whole samples instead of padded "
            "batches: no compute on pads, each sample keeps its own positions "
            "(multimodal RoPE) and attends only to itself (CUDA: torch varlen flash "
            "attention; CPU: SDPA with a block-diagonal mask); the same samples, "
            "loss and normaliser per optimizer step as padding (Qwen3-VL students)"
        ),
        json_schema_extra=RUNTIME,
    )
    pack_tokens: int = Field(
        16384,
        ge=1,
        description=(
            "With packing: at most this many tokens in one packed micro-batch (a "
            "longer sample is trained alone); batch_size is then unused within a "
            "step, the step still takes batch_size x grad_accum samples"
        ),
        json_schema_extra=RUNTIME,
    )
    encode_cache_gib: float = Field(
        4.0,
        ge=0,
        description=(
            "Host memory for samples encoded once (chat template + image processor) "
            "and kept across epochs; past it, samples are re-encoded at every use "
            "(pixel_values are kept in the vision tower's dtype: bf16 on GPU)"
        ),
        json_schema_extra=RUNTIME,
    )
    encode_workers: int | None = Field(
        None,
        ge=1,
        le=64,
        description=(
            "CUDA: worker processes that encode the next step's samples while the "
            "current one trains; null = the CPU cores over the DDP processes, at "
            "most 8. One encoding thread could not keep up with an H100 on 1280x704 "
            "screenshots, and threads starve the training thread of the GIL "
            "(docs/LOG.md, session 10)"
        ),
        json_schema_extra=RUNTIME,
    )
    micro_batch: int | None = Field(
        None,
        ge=1,
        description=(
            "Rows per forward pass within a step (unpacked): the step's samples are "
            "sorted by length and run in micro-batches of this many, so a short "
            "sample is not padded to the step's longest; the gradient is the same "
            "sum over the step. null = batch_size rows in sample order. On 2 CPU "
            "cores 4 trains the main job's steps ~20% faster than 16 (less padding, "
            "smaller activations; docs/LOG.md, session 33)"
        ),
        json_schema_extra=RUNTIME,
    )
    vision_cache: bool | None = Field(
        None,
        description=(
            "With the vision tower frozen and epochs > 1: each sample's image "
            "features are computed once (no_grad) and kept instead of its "
            "pixel_values, so later epochs skip the tower (training/vision_cache.py; "
            "the same loss up to float rounding). null = on with CUDA (H100, 2B "
            "shape: later epochs 1.55x, the first no slower; docs/LOG.md, session "
            "10), off on CPU, where the main job's results were measured without it"
        ),
        json_schema_extra=RUNTIME,
    )


# SFTConfig fields the SFT stage reads itself; every other field is a training.sft.TrainSettings field (settings_from
# rejects a field that is neither, so a new knob cannot be dropped on its way to the trainer)
SFT_STAGE_FIELDS = frozenset(
    {
        "output_root",  # where the checkpoint folder goes (training.core.output_root)
    }
)


class EvalConfig(_Cfg):
    selection: TaskSelection = Field(
        default_factory=lambda: TaskSelection(seeds_per_task=20),
        description="Tasks and held-out seeds (eval split) to evaluate on",
    )
    held_out_tasks: bool = Field(
        True, description="Also evaluate the held-out tasks (never trained on), reported apart from the overall rate"
    )
    held_out_seeds_per_task: int | None = Field(
        None,
        ge=1,
        description=(
            "Seeds per held-out task (None = selection.seeds_per_task); a student "
            "that fails them uses every step of each episode"
        ),
    )


class MidtrainConfig(_Cfg):
    enabled: bool = Field(
        False,
        description=(
            "Build a base checkpoint by mid-training on synthetic pages (synth/* "
            "tasks) before the first SFT; cached by corpus + settings"
        ),
    )
    tasks: list[str] = Field(
        default_factory=lambda: ["synth/click", "synth/type", "synth/form", "synth/read", "synth/option"],
        description="Synthetic task kinds of the corpus (envs/synth); only synth/* ids",
    )
    episodes_per_task: int = Field(
        300, ge=1, description="Corpus size: oracle episodes (distinct train seeds) per synthetic kind"
    )
    pages: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Corpus pages for the named kinds instead of episodes_per_task, e.g. {synth/click: 2600, "
            "synth/search: 2000}: more of the kinds that teach the skills the scored tasks lack"
        ),
    )
    seed_offset: int = Field(0, ge=0, description="First train seed of the corpus")
    base: str | None = Field(None, description="Model to mid-train (a folder or Hub id); null = student.model")
    sft: SFTConfig = Field(
        default_factory=lambda: SFTConfig(
            method="full", lr=1e-3, batch_size=16, epochs=100, max_steps=3000, targets="action"
        ),
        description=(
            "Training settings of the mid-training run (same keys as sft). The skills appear late: the small "
            "student points and copies after ~2,800 steps (6 min on one H100, hours on 2 CPU cores) and not at "
            "800; mini does not point at 3,000 (docs/RESULTS.md 'Does mid-training teach?')"
        ),
    )
    eval_seeds_per_task: int = Field(
        10, ge=0, description="Held-out synthetic pages (eval split) per kind for the base's skill report; 0 = none"
    )

    @model_validator(mode="after")
    def _pages_name_corpus_kinds(self) -> "MidtrainConfig":
        unknown = [k for k in self.pages if k not in self.tasks]
        if unknown:
            raise ValueError(f"midtrain.pages names kinds not in midtrain.tasks: {', '.join(unknown)}")
        bad = [k for k, n in self.pages.items() if n < 1]
        if bad:
            raise ValueError(f"midtrain.pages must be >= 1 page a kind: {', '.join(bad)}")
        return self

    def pages_of(self, kind: str) -> int:
        """Corpus pages (oracle episodes) of one synthetic kind."""
        return self.pages.get(kind, self.episodes_per_task)


class FlywheelConfig(_Cfg):
    name: str = Field("local", description="Name of this flywheel (run names, deployment names)")
    iterations: int = Field(1, ge=1, le=1000, description="Iterations per `flywheel run`")
    lake: LakeConfig = Field(default_factory=LakeConfig, description="Where the lake lives")
    env: EnvConfig = Field(default_factory=EnvConfig, description="GUI environment")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="Parallel rollout runner settings")
    bootstrap: BootstrapConfig = Field(default_factory=BootstrapConfig, description="Teacher demonstrations stage")
    teacher_budget: TeacherBudgetConfig = Field(
        default_factory=TeacherBudgetConfig,
        description="The teacher budget across stages (episodes per task, episodes, dollars), counted from the lake",
    )
    claude: ClaudeConfig = Field(
        default_factory=ClaudeConfig, description="The Claude computer-use teacher (bootstrap.policy claude / auto)"
    )
    student: StudentConfig = Field(default_factory=StudentConfig, description="The student policy")
    rollouts: RolloutStageConfig = Field(default_factory=RolloutStageConfig, description="Student rollouts stage")
    curate: CurateConfig = Field(default_factory=CurateConfig, description="Success filtering stage")
    sft: SFTConfig = Field(default_factory=SFTConfig, description="Supervised fine-tuning stage")
    rl: RLConfig = Field(default_factory=RLConfig, description="Reinforcement learning stage")
    evaluate: EvalConfig = Field(default_factory=EvalConfig, description="Evaluation stage")
    curriculum: CurriculumConfig = Field(
        default_factory=CurriculumConfig, description="Failure-driven curriculum and entropulse across iterations"
    )
    midtrain: MidtrainConfig = Field(
        default_factory=MidtrainConfig,
        description="Mid-training on synthetic pages: the student's base skills (point, read, copy, fill)",
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> "FlywheelConfig":
        if self.env.name == "remote" and not self.env.servers:
            raise ValueError(
                (
                    "env.name is 'remote' but env.servers is empty: list the env servers' "
                    "URLs, e.g. [http://127.0.0.1:8100]"
                )
            )
        if self.env.name != "remote" and self.env.servers:
            raise ValueError(
                f"env.servers is set but env.name is {self.env.name!r}: set env.name: remote to use the servers"
            )
        if self.rl.old_logp == "rollout" and self.rl.source != "sample":
            raise ValueError(
                "rl.old_logp 'rollout' needs rl.source 'sample': stored rollout groups were sampled by "
                "other weights than the update starts from; use old_logp: recompute"
            )
        if self.rl.guide != "off" and self.rl.source != "sample":
            raise ValueError(
                f"rl.guide {self.rl.guide!r} needs rl.source 'sample': the teacher solves the instances "
                "each round just sampled, next to the browsers"
            )
        if self.rl.clone_fresh and (not self.rl.clone_steps or self.rl.source != "sample"):
            raise ValueError(
                "rl.clone_fresh needs rl.clone_steps > 0 (its demos feed the clone steps only) and "
                "rl.source 'sample' (the teacher solves them next to the browsers)"
            )
        if self.rl.clone_hard and (not self.rl.clone_steps or self.rl.guide == "off"):
            raise ValueError(
                "rl.clone_hard needs rl.clone_steps > 0 (it shapes their draws) and rl.guide on (the "
                "teacher's answers to the failed instances are what it draws)"
            )
        if self.rl.distributed == "ddp" and self.rl.source != "lake":
            raise ValueError(
                "rl.distributed 'ddp' needs rl.source 'lake': the update's processes train on stored "
                "rollout groups (stage rollouts); sampling runs on the machines with the browsers"
            )
        per_task, old_name = self.teacher_budget.max_episodes_per_task, self.bootstrap.max_demos_per_task
        if per_task is not None and old_name is not None and per_task != old_name:
            raise ValueError(
                f"teacher_budget.max_episodes_per_task ({per_task}) and bootstrap.max_demos_per_task "
                f"({old_name}) are the same budget under two names: set only "
                "teacher_budget.max_episodes_per_task"
            )
        if self.student.backend == "openai" and not self.student.base_url:
            raise ValueError(
                (
                    "student.backend is 'openai' but student.base_url is not set: set it to "
                    "the server URL (e.g. http://host:8000/v1)"
                )
            )
        return self

    def rollout_attempts(self) -> int:
        """Episodes per task instance in the rollouts stage: rollouts.attempts, else rollout.group_size."""
        return self.rollouts.attempts or self.rollout.group_size

    def rl_temperature(self) -> float:
        """The temperature RL rollouts sample at: rl.temperature, else the student's (0 = greedy)."""
        return self.rl.temperature if self.rl.temperature is not None else self.student.temperature

    def config_hash(self, section: str | None = None) -> str:
        """Stable short hash of the whole config or one section (provenance on every lake row)."""
        data = self.model_dump(mode="json") if section is None else getattr(self, section).model_dump(mode="json")
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]


def settings_from(section: BaseModel, settings_cls: type, stage_fields: frozenset[str] = frozenset(), **derived) -> Any:
    """A trainer's settings dataclass read from its config section: each section field the dataclass has, then
    `derived` (values the stage resolves from other sections, e.g. the student's prompt options).

    Every section field has a reader: a settings field, or one of `stage_fields` (the fields the stage reads
    itself, SFT_STAGE_FIELDS / RL_STAGE_FIELDS). A field with neither raises ConfigError naming it, instead of
    being dropped on its way to the trainer."""
    names = {f.name for f in dataclasses.fields(settings_cls)}
    model = type(section).__name__
    unread = [k for k in type(section).model_fields if k not in names and k not in stage_fields]
    if unread:
        raise ConfigError(
            f"{model} field(s) {', '.join(unread)}: nothing reads them; add each to {settings_cls.__name__} (the "
            "trainer reads it) or to the stage's fields next to the config model (the stage reads it)"
        )
    stale = sorted(set(stage_fields) - set(type(section).model_fields))
    if stale:
        raise ConfigError(f"{model} has no field(s) {', '.join(stale)}, which its stage fields list: remove them")
    values = {k: v for k, v in section.model_dump().items() if k in names}
    return settings_cls(**{**values, **derived})


def choices(model: type[BaseModel], name: str) -> tuple[Any, ...]:
    """The values a Literal field of a config model allows (None first when it is optional): the trainers check their
    settings against these, so the allowed values are listed once, in the model."""
    ann = model.model_fields[name].annotation
    args = typing.get_args(ann) if typing.get_origin(ann) is not Literal else (ann,)
    values = [v for a in args if typing.get_origin(a) is Literal for v in typing.get_args(a)]
    if not values:
        raise TypeError(f"{model.__name__}.{name} is not a Literal field")
    return ((None,) if type(None) in args else ()) + tuple(values)
