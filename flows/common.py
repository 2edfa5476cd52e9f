"""The one body every stage flow shares, and the `python -m flows.<module>` entry point.

    result = run_stage("curate", config, iteration, refresh)              # inside a stage flow: a StageResult
    python -m flows.stages curate --config configs/tiny.yaml --iteration 0  # one stage, no server needed

A stage flow runs its stage's task (tasks/stages.py) under `stage:<name>` / `iteration:<n>` tags, logs one line
(what it produced, or why it failed), publishes the stage's stats artifact, and returns the stage's StageResult with
the orchestration's timing (cached or not, wall seconds, end time) for the iteration report. While the task runs,
the stage's progress lines (training.progress: SFT steps, RL rounds, rollout episodes, every 30 s) go to the flow
run's logger, so they show in the run's log (UI, API, worker output) and on the console.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from prefect import Flow, get_run_logger, tags

from flywheel.errors import USER_ERRORS
from flywheel.pipeline import StageResult, get_stage, skipped_result, stage_result, trained_result
from tasks.artifacts import publish_stage
from tasks.common import ConfigRef
from tasks.stages import stage_task
from training.progress import forward_to

# Flow results are persisted so a parent that started the stage through `run_deployment` can read
# the returned result from the child's final state (Prefect only keeps persisted results).
FLOW_OPTS: dict[str, Any] = {"persist_result": True, "validate_parameters": True}


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def output_id(r: StageResult) -> str:
    """What a stage produced, as the iteration table shows it: for a training stage the checkpoint it made (id and
    the model folder the next stage gets) or handed on, else its eval id, dataset id or run key."""
    if r.get("checkpoint_id"):
        return f"{r['checkpoint_id']} ({r.checkpoint})" if r.checkpoint else str(r["checkpoint_id"])
    for key in ("eval_id", "dataset_id", "run_key"):
        if r.get(key):
            return str(r[key])
    return str(r.checkpoint or r.get("checkpoint") or "")


def legacy_result(stage: str, iteration: int, value: Any) -> StageResult:
    """A stage's result as cached by Prefect before stages returned a StageResult (a plain dict), read back: a
    training stage's model folder becomes its checkpoint, a `skipped: True` with a `reason` (or rl's) a skip."""
    if isinstance(value, StageResult):
        return value
    d = dict(value or {})
    if d.get("skipped") is True and (stage == "rl" or "reason" in d) and "checkpoint_id" not in d:
        d.pop("skipped")
        return skipped_result(stage, iteration, d.pop("reason", None) or "skipped", **d)
    if get_stage(stage).table == "checkpoints":
        return trained_result(stage, iteration, d)
    return stage_result(stage, iteration, d)


def run_stage(stage: str, config: ConfigRef, iteration: int, refresh: bool, **inputs: Any) -> StageResult:
    """Run one stage's task (cached unless `refresh`), log the outcome in one line, publish its stats."""
    log = get_run_logger()
    cfg = config.load()
    task = stage_task(stage)
    t = task.with_options(refresh_cache=True) if refresh else task
    t0 = time.monotonic()
    with tags(f"stage:{stage}", f"iteration:{iteration}"), forward_to(log):
        state = t(config, iteration, return_state=True, **inputs)
    wall = time.monotonic() - t0
    if not state.is_completed():
        exc = state.result(raise_on_failure=False)
        cause = one_line(exc) if isinstance(exc, BaseException) else (state.message or state.name)
        log.error(f"{stage} failed (iteration {iteration}): {cause}")
        state.result()  # re-raises the stage's own exception, so the flow run fails with it
    cached = state.name == "Cached"
    result = legacy_result(stage, iteration, state.result()).timed(wall, cached=cached)
    log.info(f"{stage} {'(cached) ' if cached else ''}{result.summary()}")
    publish_stage(cfg, stage, result, iteration=iteration)
    return result


def stage_status(result: StageResult, attempt_started: float) -> str:
    """'skipped' (the stage chose to do nothing: `result.skipped` says why), 'cached' (the task found a finished
    result), 'reused' (a retried parent got the stage's earlier, finished subflow run back without running it at
    all), else 'ran' (a training stage that found its checkpoint in the lake ran too: `result.reused`)."""
    if result.skipped:
        return "skipped"
    if result.cached:
        return "cached"
    finished = result.finished_at if result.finished_at is not None else attempt_started
    return "reused" if finished < attempt_started else "ran"


def stage_row(stage: str, result: StageResult, attempt_started: float) -> dict[str, Any]:
    """One stage's line of the iteration report (`flywheel run`'s table and the Prefect artifact)."""
    return {
        "stage": stage,
        "status": stage_status(result, attempt_started),
        "wall_s": result.wall_s,
        "output": output_id(result),
    }


def _value(text: str) -> Any:
    return yaml.safe_load(text)  # numbers, booleans, null, lists and dicts as YAML; anything else a string


def as_json(value: Any) -> Any:
    """A flow's return value as JSON-able data (StageResults as their to_dict())."""
    return json.loads(json.dumps(value, default=lambda o: o.to_dict() if isinstance(o, StageResult) else str(o)))


class _OneLine(logging.Filter):
    """Drops the traceback Prefect's engine logs with a user error: the entry point prints it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], USER_ERRORS):
            record.exc_info, record.exc_text = None, None
        return True


def main(fl: Flow, argv: list[str] | None = None, prog: str | None = None) -> Any:
    """`python -m flows.<module> [--config FILE] [--set key=value ...] [--<parameter> VALUE ...]`: run one flow in
    this process against the ephemeral (or $PREFECT_API_URL) Prefect API and print its result as JSON. A user error
    (a bad config key, a missing model folder, ...) prints one line and exits 2, as the `flywheel` CLI does."""
    from flows.orchestrate import local_settings

    p = argparse.ArgumentParser(
        prog=prog or f"python -m flows.{fl.name}", description=(fl.description or "").split("\n")[0]
    )
    p.add_argument("--config", default="configs/local.yaml", help="YAML config")
    p.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="config override, e.g. rollout.envs=1"
    )
    p.add_argument("--lake", default=None, help="lake root (default: $FLYWHEEL_LAKE, else the config's lake.root)")
    for name, param in inspect.signature(fl.fn).parameters.items():
        if name != "config":
            p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=_value, default=param.default)
    a = vars(p.parse_args(argv))
    bad = [kv for kv in a["set"] if "=" not in kv]
    if bad:
        p.error(f"--set needs KEY=VALUE, got {bad[0]!r}")
    ref = ConfigRef(
        path=a.pop("config"), overrides={k: _value(v) for k, v in (kv.split("=", 1) for kv in a.pop("set"))}
    )
    lake = a.pop("lake")
    if lake:  # as the CLI's --lake: $FLYWHEEL_LAKE, which the stages read first and rollout workers inherit
        os.environ["FLYWHEEL_LAKE"] = (
            lake if lake.startswith(("s3://", "s3a://")) else str(Path(lake).expanduser().resolve())
        )
    one_line_filter = _OneLine()
    for name in ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine"):
        logging.getLogger(name).addFilter(one_line_filter)
    try:
        ref.load()  # a bad config fails here, before Prefect starts
        with local_settings():
            result = fl(config=ref, **a)
    except USER_ERRORS as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    print(json.dumps(as_json(result), indent=2))
    return result
