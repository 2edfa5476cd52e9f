"""The one body every stage flow shares, and the `python -m flows.<stage>` entry point.

    result = run_stage(tasks.curate, "curate", config, iteration, refresh)   # inside a stage flow
    python -m flows.curate --config configs/tiny.yaml --iteration 0         # one stage, no server needed

A stage flow runs its task under `stage:<name>` / `iteration:<n>` tags, logs one line (what it
produced, or why it failed), publishes the stage's stats artifact, and returns the stage's small
result dict plus an `orchestration` entry (cached or not, wall seconds, end time) for the iteration report.
While the task runs, the stage's progress lines (training.progress: SFT steps, RL rounds, rollout episodes, every
30 s) go to the flow run's logger, so they show in the run's log (UI, API, worker output) and on the console.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import time
from pathlib import Path
from typing import Any

import yaml
from prefect import Flow, get_run_logger, tags
from prefect.tasks import Task

from tasks.artifacts import publish_stage
from tasks.common import ConfigRef
from training.progress import forward_to

# Flow results are persisted so a parent that started the stage through `run_deployment` can read
# the returned dict from the child's final state (Prefect only keeps persisted results).
FLOW_OPTS: dict[str, Any] = {"persist_result": True, "validate_parameters": True}


def one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def summary(stage: str, r: dict[str, Any]) -> str:
    """What a stage produced, in one log line."""
    if "ran" in r and "run_key" in r and stage != "evaluate":
        return (
            f"run {r['run_key']}: ran {r['ran']} episodes ({r.get('skipped', 0)} already in the lake), "
            f"{r.get('successes', 0)} successes"
        )
    if stage == "curate":
        return f"dataset {r.get('dataset_id')}: {r.get('n_episodes')} episodes, {r.get('n_steps')} steps"
    if stage in ("sft", "rl"):
        return (
            "skipped"
            if r.get("skipped")
            else f"checkpoint {r.get('checkpoint_id')} at {r.get('model_path') or r.get('path')}"
        )
    if stage == "midtrain":
        skills = r.get("skills") or {}
        return (
            (
                f"base {r.get('checkpoint_id')} at {r.get('model_path')} from {r.get('n_samples')} samples; held-out "
                f"synthetic pages {skills.get('success_rate', float('nan')):.1%}"
            )
            if not r.get("reason")
            else r["reason"]
        )
    if stage == "evaluate":
        return (
            f"{r.get('checkpoint')}: success {r.get('success_rate', 0):.1%} "
            f"(95% CI {r.get('ci_low', 0):.1%}-{r.get('ci_high', 0):.1%})"
        )
    return json.dumps(r, default=str)[:200]


def output_id(stage: str, r: dict[str, Any]) -> str:
    """What a stage produced, as the iteration table shows it: run key, dataset id, eval id, or for a training
    stage the checkpoint it made (id and the model folder the next stage gets) or passed on unchanged."""
    if stage in ("sft", "rl", "midtrain"):
        path = r.get("model_path") or r.get("path") or r.get("checkpoint")
        if r.get("checkpoint_id"):
            return f"{r['checkpoint_id']} ({path})" if path else str(r["checkpoint_id"])
        return str(path or "")
    key = {"curate": "dataset_id", "evaluate": "eval_id"}.get(stage, "run_key")
    return str(r.get(key) or r.get("checkpoint") or "")


def run_stage(
    stage_task: Task, stage: str, config: ConfigRef, iteration: int, refresh: bool, **inputs: Any
) -> dict[str, Any]:
    """Run one stage task (cached unless `refresh`), log the outcome in one line, publish its stats."""
    log = get_run_logger()
    cfg = config.load()
    t = stage_task.with_options(refresh_cache=True) if refresh else stage_task
    t0 = time.monotonic()
    with tags(f"stage:{stage}", f"iteration:{iteration}"), forward_to(log):
        state = t(config, iteration, return_state=True, **inputs)
    wall = time.monotonic() - t0
    if not state.is_completed():
        exc = state.result(raise_on_failure=False)
        cause = one_line(exc) if isinstance(exc, BaseException) else (state.message or state.name)
        log.error(f"{stage} failed (iteration {iteration}): {cause}")
        state.result()  # re-raises the stage's own exception, so the flow run fails with it
    result = dict(state.result())
    cached = state.name == "Cached"
    log.info(f"{stage} {'(cached) ' if cached else ''}{summary(stage, result)}")
    publish_stage(cfg, stage, result, iteration=iteration, wall_s=wall, cached=cached)
    result["orchestration"] = {"cached": cached, "wall_s": round(wall, 3), "finished_at": time.time()}
    return result


def stage_status(result: dict[str, Any], attempt_started: float, stage: str | None = None) -> str:
    """'skipped' (the stage chose to do nothing, e.g. rl with rl.enabled false), 'cached' (the task found a
    finished result), 'reused' (a retried parent got the stage's earlier, finished subflow run back without
    running it at all), else 'ran'.

    Only rl's `skipped` means that: sft's is True when it found its checkpoint already trained (it still ran and
    recorded it) and the rollout stages' is a count of episodes already in the lake."""
    orch = result.get("orchestration") or {}
    if result.get("skipped") is True and (stage == "rl" or result.get("reason")):  # reason: a curriculum skip
        return "skipped"
    if orch.get("cached"):
        return "cached"
    return "reused" if orch.get("finished_at", attempt_started) < attempt_started else "ran"


def stage_row(stage: str, result: dict[str, Any], attempt_started: float) -> dict[str, Any]:
    """One stage's line of the iteration report (`flywheel run`'s table and the Prefect artifact)."""
    orch = result.get("orchestration") or {}
    return {
        "stage": stage,
        "status": stage_status(result, attempt_started, stage),
        "wall_s": orch.get("wall_s", 0.0),
        "output": output_id(stage, result),
    }


def _value(text: str) -> Any:
    return yaml.safe_load(text)  # numbers, booleans, null, lists and dicts as YAML; anything else a string


def main(fl: Flow, argv: list[str] | None = None) -> dict[str, Any]:
    """`python -m flows.<stage> [--config FILE] [--set key=value ...] [--<parameter> VALUE ...]`:
    run one flow in this process against the ephemeral (or $PREFECT_API_URL) Prefect API."""
    from flows.orchestrate import local_settings

    p = argparse.ArgumentParser(prog=f"python -m flows.{fl.name}", description=(fl.description or "").split("\n")[0])
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
    with local_settings():
        result = fl(config=ref, **a)
    print(json.dumps(result, indent=2, default=str))
    return result
