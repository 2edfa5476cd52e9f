"""The env server's wire format: observations and step results as JSON (screenshots base64 PNG).

Shared by the server (envs/server.py) and its client (envs/remote.py) so both sides agree on one
encoding. Only data crosses the wire: actions are validated into `agents.actions` models on the
server, never evaluated.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from envs.base import Observation, StepResult

API = "/v1"  # every endpoint lives under this prefix
TOKEN_ENV = "FLYWHEEL_ENV_TOKEN"  # where the server and the client read the API token by default


def _jsonable(v: Any) -> Any:
    """`v` as JSON-ready data: encoded once, by `dumps` (tuples become lists; anything exotic its str)."""
    return v


def dumps(d: dict[str, Any]) -> bytes:
    """One JSON encoding of a response (no framework re-encoding pass over the DOM in `extra`)."""
    return json.dumps(d, default=str, separators=(",", ":")).encode()


def obs_to_json(obs: Observation) -> dict[str, Any]:
    return {
        "screenshot_png": base64.b64encode(obs.screenshot_png).decode("ascii"),
        "width": obs.width,
        "height": obs.height,
        "instruction": obs.instruction,
        "ui_text": obs.ui_text,
        "extra": _jsonable(obs.extra),
    }


def obs_from_json(d: dict[str, Any]) -> Observation:
    return Observation(
        screenshot_png=base64.b64decode(d["screenshot_png"]),
        width=int(d["width"]),
        height=int(d["height"]),
        instruction=str(d["instruction"]),
        ui_text=d.get("ui_text"),
        extra=dict(d.get("extra") or {}),
    )


def step_to_json(res: StepResult) -> dict[str, Any]:
    return {
        "observation": obs_to_json(res.observation),
        "done": bool(res.done),
        "exec_error": res.exec_error,
        "info": _jsonable(res.info),
        "executed": _jsonable(res.executed),
    }


def step_from_json(d: dict[str, Any]) -> StepResult:
    return StepResult(
        observation=obs_from_json(d["observation"]),
        done=bool(d["done"]),
        exec_error=d.get("exec_error"),
        info=dict(d.get("info") or {}),
        executed=d.get("executed"),
    )
