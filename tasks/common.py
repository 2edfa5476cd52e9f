"""What every flywheel task and flow shares: the config reference a run is parameterised by, and
the cache key that lets a retried run resume at the stage that failed.

    ref = ConfigRef(path="configs/tiny.yaml", overrides={"rollout.envs": 1})
    cfg = ref.load()                                   # a validated FlywheelConfig
    @task(cache_key_fn=stage_cache_key, persist_result=True) ...

A run's parameters are this small reference, never the loaded config, so the Prefect UI shows
a short form (path + overrides) and a deployment can be rerun with edited overrides.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from configs.loading import load_config
from configs.models import FlywheelConfig
from flywheel.pipeline import StageResult


class ConfigRef(BaseModel):
    """Which flywheel config a run uses: a YAML file plus dotted-key overrides."""

    model_config = ConfigDict(extra="forbid")

    path: str = Field("configs/local.yaml", description="YAML config, relative to the project folder the flow runs in")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description='Dotted keys over the YAML, e.g. {"rollout.envs": 1, "sft.epochs": 1}'
    )

    def load(self) -> FlywheelConfig:
        """The validated config (ConfigError names file, key and expectation)."""
        return load_config(self.path, self.overrides)


def lake_identity(cfg: FlywheelConfig) -> str:
    """The lake a run writes to: its resolved root plus the root folder's inode, so a deleted and
    re-created lake (same path, empty) never matches results cached for the old one."""
    from flywheel.specs import lake_for

    lake = lake_for(cfg)
    if lake.remote:  # an object-store lake is its bucket + prefix, the same from every machine
        return lake.uri
    return f"{lake.root}@{os.stat(lake.root).st_ino}"


def stage_cache_key(context: Any, parameters: dict[str, Any]) -> str:
    """Cache key of a stage task: (stage, iteration, config hash, lake, other inputs).

    Not the run id: a retried or re-triggered flow run with the same inputs finds the finished
    stage's persisted result instead of running it again."""
    ref = parameters["config"]
    ref = ref if isinstance(ref, ConfigRef) else ConfigRef.model_validate(ref)
    cfg = ref.load()
    inputs = {k: v for k, v in parameters.items() if k not in ("config", "iteration")}
    blob = json.dumps([lake_identity(cfg), inputs], sort_keys=True, default=str)
    stage = context.task.name
    it = parameters.get("iteration", "na")
    return f"{stage}-it{it}-{cfg.config_hash()}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}"


def checkpoint_of(result: StageResult | None) -> str | None:
    """The model folder a stage hands on (its typed checkpoint: a training stage's merged full model when there is
    one, or the checkpoint a skipped training stage was given)."""
    return result.checkpoint if result is not None else None
