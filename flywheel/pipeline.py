"""The flywheel's stages: one registry in pipeline order, and the one typed result every stage returns.

    from flywheel.pipeline import STAGES, get_stage, register, stage_result
    get_stage("curate")(cfg, iteration=0)          # run a stage (no Prefect): a StageResult
    res["dataset_id"], res.checkpoint, res.skipped # its outputs (a read-only Mapping) and typed fields

    @register("toy", description="A toy stage.")   # a new stage: its module, its test, and this one line
    def toy(cfg, iteration: int, checkpoint: str | None = None, *, progress: bool = True) -> StageResult:
        return stage_result("toy", iteration, {"run_key": f"toy-it{iteration}"})

Everything else is derived from `STAGES`: the Prefect task of a stage (tasks/stages.py: stage_task), its flow
(flows/stages.py: `flows.stages:<name>`, `python -m flows.stages <name>`), the parent's table of flows and
deployments (flows/flywheel.py), its stats artifact and lake links (tasks/artifacts.py), its deployment in
prefect.yaml (flows/deployments.py writes the file) and `flywheel stage <name>` (flywheel/cli/stage.py: the
stage's own command when it names one, else one built from its parameters).

A stage function takes the config first, then `iteration` (optional: mid-training's base belongs to the lake),
then its inputs (what the flow and the CLI ask for: lake ids and paths, never tensors), then keyword-only run
options it may accept (`progress`, `on_result`). No Prefect here: the core stays importable without it.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import time
import typing
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Callable, Literal

# ------------------------------------------------------------------------------------------------ the result


@dataclass(frozen=True)
class StageResult(Mapping[str, Any]):
    """What a stage returns: typed fields plus its outputs (lake ids, paths, counts), readable as a Mapping
    (`res["dataset_id"]`, `res.get("run_key")`, `dict(res)`). Picklable, so Prefect persists it like a dict.

    A rollout-type stage's outputs hold its RolloutSummary, whose `skipped` counts the episodes already in the
    lake: that count is `res["skipped"]`; `res.skipped` is why the stage itself did nothing."""

    stage: str
    iteration: int
    outputs: Mapping[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None  # the model folder the next stage takes (what a training stage trained or kept)
    rows: int = 0  # rows the stage wrote to its lake table (Stage.table)
    skipped: str | None = None  # None, or why the stage did nothing (rl.enabled false, a curriculum decision, ...)
    reused: bool = False  # the stage found its finished result in the lake (a checkpoint of the same inputs)
    cached: bool = False  # Prefect returned the finished task from its cache (flows.common.run_stage sets it)
    wall_s: float = 0.0
    finished_at: float | None = None  # time.time() when it returned (the orchestration's, under Prefect)

    def __post_init__(self) -> None:
        object.__setattr__(self, "outputs", dict(self.outputs))  # a private copy: read-only through the Mapping

    def __getitem__(self, key: str) -> Any:
        return self.outputs[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def summary(self) -> str:
        """What the stage produced, in one line (the flow's log line, the generic CLI command's output)."""
        if self.skipped:
            return f"skipped: {self.skipped}"
        if "success_rate" in self and "ci_low" in self:
            return (
                f"{self.get('checkpoint')}: success {self['success_rate']:.1%} "
                f"(95% CI {self['ci_low']:.1%}-{self.get('ci_high', 0):.1%})"
            )
        if self.checkpoint and self.get("checkpoint_id"):
            return f"checkpoint {self['checkpoint_id']} at {self.checkpoint}{' (reused)' if self.reused else ''}"
        if "ran" in self and "run_key" in self:
            return (
                f"run {self['run_key']}: ran {self['ran']} episodes ({self.get('skipped', 0)} already in the lake), "
                f"{self.get('successes', 0)} successes"
            )
        if "dataset_id" in self and "n_episodes" in self:
            return f"dataset {self['dataset_id']}: {self['n_episodes']} episodes, {self.get('n_steps')} steps"
        return json.dumps(self.outputs, default=str)[:200]

    def to_dict(self) -> dict[str, Any]:
        """The typed fields and the outputs as plain JSON-able data (`python -m flows.stages` prints this)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "outputs"} | {
            "outputs": dict(self.outputs)
        }

    def timed(self, wall_s: float, *, cached: bool | None = None, finished_at: float | None = None) -> StageResult:
        """A copy with the run's timing (and, under Prefect, whether the task came from the cache)."""
        return replace(
            self,
            wall_s=round(wall_s, 3),
            finished_at=time.time() if finished_at is None else finished_at,
            cached=self.cached if cached is None else cached,
        )


def stage_result(
    stage: str,
    iteration: int,
    outputs: Mapping[str, Any],
    *,
    checkpoint: str | None = None,
    rows: int = 0,
    reused: bool = False,
) -> StageResult:
    """Any stage's result: its outputs plus what the typed fields say."""
    return StageResult(stage, iteration, outputs, checkpoint=checkpoint, rows=rows, reused=reused)


def episodes_result(stage: str, iteration: int, run_key: str, summary: Any, /, **outputs: Any) -> StageResult:
    """A rollout-type stage's result: its run key and RolloutSummary (rows: the episodes it ran)."""
    s = asdict(summary) if not isinstance(summary, Mapping) else dict(summary)
    out = {"run_key": run_key, "iteration": iteration, "stage": stage, **s, **outputs}
    return StageResult(stage, iteration, out, rows=int(s.get("ran") or 0))


def trained_result(stage: str, iteration: int, outputs: Mapping[str, Any], /) -> StageResult:
    """A training stage's result from the trainer's dict (training.sft_stage.sft_stage, flywheel.rl_stage): its
    checkpoint is the model folder (`model_path`: a LoRA run's merged model), its legacy `skipped` flag (a
    finished checkpoint of the same inputs was found in this lake) becomes `reused`; one `checkpoints` row."""
    out = {k: v for k, v in outputs.items() if k != "skipped"}
    ck = out.get("model_path") or out.get("path")
    return StageResult(
        stage, iteration, out, checkpoint=str(ck) if ck else None, rows=1, reused=bool(outputs.get("skipped"))
    )


def skipped_result(stage: str, iteration: int, why: str, /, **outputs: Any) -> StageResult:
    """A stage that chose to do nothing, and why. A training stage hands on the checkpoint it was given
    (`checkpoint=...` in outputs), so the next stage starts from it."""
    ck = outputs.get("checkpoint")
    return StageResult(stage, iteration, outputs, checkpoint=str(ck) if ck else None, skipped=why)


# ------------------------------------------------------------------------------------------------ the registry


@dataclass(frozen=True)
class Input:
    """One input of a stage (beyond the config and the iteration): a flow parameter and a CLI option."""

    name: str
    annotation: Any = Any
    default: Any = inspect.Parameter.empty
    description: str = ""

    @property
    def required(self) -> bool:
        return self.default is inspect.Parameter.empty

    @property
    def optional_type(self) -> Any:
        """The annotation without its `| None` (what a CLI option parses), and whether None was allowed."""
        args = typing.get_args(self.annotation)
        if args and type(None) in args:
            rest = [a for a in args if a is not type(None)]
            return rest[0] if len(rest) == 1 else Any
        return self.annotation


ITERATION_HELP = "Flywheel iteration the stage's rows are written under."
RUN_OPTIONS = ("progress", "on_result")  # keyword-only options a stage may accept: not inputs


@dataclass(frozen=True)
class Stage:
    """A registered stage.

    name: the stage partition, flow, Prefect task, deployment (`<name>/<pool>`) and `flywheel stage <name>`.
    function: the stage function, or "module:attr" (imported on first use, so the registry imports no stage).
    pool: the work pool its deployment runs on: 'cpu' (browsers, DuckDB) or 'gpu' (training).
    description: one line: the flow's description in the Prefect UI and the CLI command's help.
    inputs: one-line descriptions of its parameters (the flow form, the CLI help); may also describe `iteration`.
    table: the lake table it writes (its artifact links there; 'episodes' also gets per-task stats and a progress
        artifact); None: no table link.
    cli: its hand-written `flywheel stage <name>` command ("module:attr" or a function); None: one is built from
        its parameters.
    run_after: run it in every `flywheel run` iteration right after this stage (its inputs named `checkpoint`,
        `dataset_id` or `base` get the iteration's current ones); None: the parent does not run it (the built-in
        stages have their own place in flows/flywheel.py).
    """

    name: str
    function: Callable[..., StageResult] | str
    pool: Literal["cpu", "gpu"] = "cpu"
    description: str = ""
    inputs: Mapping[str, str] = field(default_factory=dict)
    table: str | None = None
    cli: Callable[..., Any] | str | None = None
    run_after: str | None = None

    def fn(self) -> Callable[..., StageResult]:
        return _resolve(self.function)

    def command(self) -> Callable[..., Any] | None:
        return _resolve(self.cli) if self.cli is not None else None

    def signature(self) -> inspect.Signature:
        return inspect.signature(self.fn(), eval_str=True)

    @property
    def takes_iteration(self) -> bool:
        return "iteration" in self.signature().parameters

    def parameters(self) -> list[Input]:
        """Its inputs, from the function's signature: every parameter after the config and `iteration` that is
        not keyword-only (those are run options), with its type, default and description."""
        out = []
        for i, p in enumerate(self.signature().parameters.values()):
            if i == 0 or p.name == "iteration" or p.kind not in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY):
                continue
            ann = Any if p.annotation is p.empty else p.annotation
            out.append(Input(p.name, ann, p.default, self.inputs.get(p.name, "")))
        return out

    def iteration_help(self) -> str:
        return self.inputs.get("iteration", ITERATION_HELP)

    def __call__(self, cfg: Any, iteration: int = 0, /, **kwargs: Any) -> StageResult:
        """Run the stage: its inputs by name, plus any run option (`progress`, `on_result`) it accepts."""
        fn, sig = self.fn(), self.signature()
        names = {p.name for p in self.parameters()}
        unknown = set(kwargs) - names - set(RUN_OPTIONS)
        if unknown:
            raise TypeError(f"stage {self.name} has no input {sorted(unknown)}; its inputs: {sorted(names)}")
        kw = {k: v for k, v in kwargs.items() if k in names or k in sig.parameters}
        t0 = time.monotonic()
        res = fn(cfg, iteration, **kw) if self.takes_iteration else fn(cfg, **kw)
        if not isinstance(res, StageResult):
            raise TypeError(
                f"stage {self.name} returned {type(res).__name__}, not a StageResult: build it with "
                "flywheel.pipeline.stage_result / episodes_result / trained_result / skipped_result"
            )
        _compact(cfg, self.name)
        return res.timed(time.monotonic() - t0)


def _compact(cfg: Any, stage: str) -> None:
    """After a stage: the lake's inlined rows to Parquet and small files merged (no small files pile up)."""
    if getattr(cfg, "lake", None) is None:
        return
    from storage.lake import LakeError, open_lake

    try:
        open_lake(cfg, create=False).compact()
    except LakeError as e:  # the stage's rows are committed; compaction can run again later
        logging.getLogger(__name__).warning("compaction after %s skipped: %s", stage, e)


def _resolve(ref: Any) -> Any:
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


STAGES: list[Stage] = []


def register(name: str, function: Callable[..., Any] | str | None = None, /, **settings: Any) -> Any:
    """Add a stage (or replace the one of that name in place); new stages go last. As a call,
    `register("toy", toy, pool="cpu")` returns the Stage; as a decorator, `@register("toy", ...)` returns the
    function unchanged."""

    def add(fn: Callable[..., Any] | str) -> Stage:
        stage = Stage(name, fn, **settings)
        if stage.pool not in ("cpu", "gpu"):
            raise ValueError(f"stage {name}: pool must be 'cpu' or 'gpu', got {stage.pool!r}")
        at = next((i for i, s in enumerate(STAGES) if s.name == name), None)
        if at is None:
            STAGES.append(stage)
        else:
            STAGES[at] = stage
        return stage

    if function is None:

        def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
            add(fn)
            return fn

        return decorator
    return add(function)


def get_stage(name: str) -> Stage:
    for s in STAGES:
        if s.name == name:
            return s
    raise KeyError(f"no stage {name!r}; the registered stages: {', '.join(stage_names())}")


def stage_names() -> list[str]:
    return [s.name for s in STAGES]


# ------------------------------------------------------------------------------------------------ the stages
# Pipeline order. Each stage: its function, pool, table, descriptions and (optionally) its own CLI command.
register(
    "midtrain",
    "flywheel.midtrain:midtrain",  # pool cpu: its corpus needs Chromium; on a GPU machine give it pool="gpu"
    description="Mid-training: an oracle corpus on synthetic pages, its dataset, the base checkpoint, its skills.",
    inputs={"iteration": "Unused by the stage (the base belongs to the lake); every stage flow takes it."},
    table="checkpoints",
    cli="flywheel.cli.stage:stage_midtrain",
)
register(
    "bootstrap",
    "flywheel.stages:bootstrap",
    description="Teacher demonstrations (the config's bootstrap policy) on the train split.",
    inputs={"iteration": "Flywheel iteration the episodes are written under."},
    table="episodes",
    cli="flywheel.cli.stage:stage_bootstrap",
)
register(
    "rollouts",
    "flywheel.stages:student_rollouts",
    description="Student rollouts: G episodes per (task, seed), the RL groups, written to the lake.",
    inputs={
        "iteration": "Flywheel iteration (selects fresh train seeds and the lake partition).",
        "checkpoint": "Student model folder; empty means the config's student.model.",
    },
    table="episodes",
)
register(
    "curate",
    "flywheel.stages:curate",
    description="Success filtering: successful, cleanly parsed episodes into a dataset manifest and export.",
    inputs={"iteration": "Flywheel iteration; episodes of this and earlier iterations are eligible."},
    table="datasets",
    cli="flywheel.cli.stage:stage_curate",
)
register(
    "sft",
    "flywheel.stages:sft",
    pool="gpu",
    description="Supervised fine-tuning (LoRA or full, vision tower frozen) on a dataset manifest.",
    inputs={
        "iteration": "Flywheel iteration the checkpoint belongs to.",
        "dataset_id": "Dataset manifest id from the curate stage (the `datasets` table).",
        "base": "Model to start from; empty means the latest earlier checkpoint, else the config's student.model.",
    },
    table="checkpoints",
    cli="flywheel.cli.stage:stage_sft",
)
register(
    "rl",
    "flywheel.stages:rl",
    pool="gpu",
    description="Reinforcement learning (GRPO family, SDPO) from a checkpoint on fresh student groups.",
    inputs={
        "iteration": "Flywheel iteration whose rollouts are trained on.",
        "checkpoint": "Model folder to start from (usually the SFT stage's output); empty means this iteration's "
        "newest checkpoint.",
    },
    table="checkpoints",
    cli="flywheel.cli.stage:stage_rl",
)
register(
    "evaluate",
    "flywheel.stages:evaluate",
    description="Evaluation: success rate with a 95% interval per task, on seeds never trained on.",
    inputs={
        "iteration": "Flywheel iteration the eval rows are written under.",
        "checkpoint": "Model folder to evaluate, or 'scripted' for the teacher (the ceiling).",
    },
    table="evals",
    cli="flywheel.cli.stage:stage_evaluate",
)
