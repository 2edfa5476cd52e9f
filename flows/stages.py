"""The stage flows: one Prefect flow per registered stage (flywheel/pipeline.py), built from the registry.

    python -m flows.stages curate --config configs/tiny.yaml --iteration 0     # one stage, no server needed
    python -m flows.stages sft --config configs/tiny.yaml --dataset-id curate-it0-...
    prefect deployment run sft/gpu -p iteration=0 -p dataset_id=...           # on its pool (flywheel up)
    from flows.stages import stage_flow; stage_flow("rollouts")(config=ref, iteration=1)

Each flow is importable as `flows.stages:<name>` (prefect.yaml's entrypoints) and takes the stage's task
parameters (config, iteration, the stage's inputs) plus `refresh`; its docstring's `Args:` (the UI's parameter
descriptions) come from the stage's descriptions. The body is flows.common.run_stage: tags, the one-line log, the
stats artifact and the StageResult. A user error (a bad config key, a missing model folder) ends
`python -m flows.stages` with one line and exit code 2, as the `flywheel` CLI does.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from prefect import Flow, flow

from flows.common import FLOW_OPTS, main, run_stage
from flywheel.pipeline import Stage, StageResult, get_stage, stage_names
from tasks.common import ConfigRef
from tasks.stages import stage_parameters

_FLOWS: dict[str, tuple[Stage, Flow]] = {}  # built on first use; rebuilt when the registry's stage changes

CONFIG_HELP = "Flywheel config file and dotted-key overrides."
REFRESH_HELP = "Run again even if a finished result is cached (the lake keeps no duplicates)."


def flow_signature(stage: Stage) -> inspect.Signature:
    """Required inputs first (a Python signature needs them before defaults), then config, iteration, the optional
    inputs and refresh: the order the hand-written stage flows had."""
    params = stage_parameters(stage)
    config, iteration, inputs = params[0].replace(default=ConfigRef()), params[1].replace(default=0), params[2:]
    kw = inspect.Parameter.POSITIONAL_OR_KEYWORD
    refresh = inspect.Parameter("refresh", kw, default=False, annotation=bool)
    required = [p for p in inputs if p.default is p.empty]
    optional = [p for p in inputs if p.default is not p.empty]
    return inspect.Signature([*required, config, iteration, *optional, refresh], return_annotation=StageResult)


def flow_doc(stage: Stage, sig: inspect.Signature) -> str:
    """The flow's docstring: the stage's description, then Google-style Args (Prefect shows them in the UI)."""
    helps = {p.name: p.description for p in stage.parameters()}
    helps |= {"config": CONFIG_HELP, "iteration": stage.iteration_help(), "refresh": REFRESH_HELP}
    args = "\n".join(f"        {n}: {helps.get(n) or n.replace('_', ' ').capitalize() + '.'}" for n in sig.parameters)
    return f"{stage.description or stage.name}\n\n    Args:\n{args}\n    "


def stage_flow(name: str) -> Flow:
    """The flow of a registered stage (named after it; flow run name `<name>-it<iteration>`, or `<name>` for a
    stage that takes no iteration)."""
    stage = get_stage(name)
    hit = _FLOWS.get(name)
    if hit is not None and hit[0] is stage:
        return hit[1]
    sig = flow_signature(stage)

    def body(*args: Any, **kwargs: Any) -> StageResult:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        a = dict(bound.arguments)
        return run_stage(name, a.pop("config"), a.pop("iteration"), a.pop("refresh"), **a)

    body.__signature__ = sig  # what Prefect builds the parameter schema (and validates parameters) from
    body.__name__ = body.__qualname__ = name.replace("-", "_")
    body.__module__ = "flows.stages"  # also when this file runs as __main__
    body.__doc__ = flow_doc(stage, sig)
    run_name = f"{name}-it{{iteration}}" if stage.takes_iteration else name
    fl = flow(name=name, flow_run_name=run_name, **FLOW_OPTS)(body)
    _FLOWS[name] = (stage, fl)
    return fl


def __getattr__(name: str) -> Flow:
    """`flows.stages.<stage>`: prefect.yaml's entrypoints (`flows.stages:sft`) load the flows by attribute."""
    if name in stage_names():
        return stage_flow(name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cli(argv: list[str] | None = None) -> Any:
    """`python -m flows.stages <stage> [--config FILE] [--set key=value ...] [--<input> VALUE ...]`."""
    argv = list(sys.argv[1:] if argv is None else argv)
    names = stage_names()
    if not argv or argv[0] not in names:
        print(f"usage: python -m flows.stages {{{','.join(names)}}} [--config FILE] [...]", file=sys.stderr)
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: no stage {argv[0]!r}; the registered stages: {', '.join(names)}", file=sys.stderr)
            sys.exit(2)
        sys.exit(0 if argv else 2)
    return main(stage_flow(argv[0]), argv[1:], prog=f"python -m flows.stages {argv[0]}")


if __name__ == "__main__":
    cli()
