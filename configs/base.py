"""What every config section shares: ConfigError and the strict pydantic base (unknown keys are errors)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(Exception):
    """A config file is missing, malformed or invalid; the message names file, key and expectation."""


class _Cfg(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)
