"""What every config section shares: ConfigError and the strict pydantic base (unknown keys are errors)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from configs.runkeys import RUNTIME


class ConfigError(Exception):
    """A config file is missing, malformed or invalid; the message names file, key and expectation."""


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def nproc_field() -> Any:
    """The sft and rl sections' `nproc`: processes for distributed ddp (a runtime setting, in no run key)."""
    return Field(
        None,
        ge=1,
        le=64,
        description="Processes for distributed: ddp (null = every visible GPU)",
        json_schema_extra=RUNTIME,
    )
