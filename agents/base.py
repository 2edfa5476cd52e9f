"""The policy interface the rollout runner drives: teachers and students alike.

A policy sees an Observation (plus the episode's earlier steps) and returns a `Decision`:
the text it "wrote" in the model format, and the parsed Action in screen pixels (or a
parse error). Scripted teachers write the same text format the student is trained on.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from agents.actions import Action
from envs.base import Observation


@dataclass
class Decision:
    response_text: str  # full text in the model format (<thinking>/Action:/<tool_call>)
    action: Action | None  # executed action in screen pixels; None when parsing failed
    thought: str | None = None
    action_desc: str | None = None  # the "Action: ..." line
    raw_action: dict[str, Any] | None = None  # as the model wrote it (model-space coords)
    parse_error: str | None = None
    fallback_parse: bool = False  # parsed by a lenient fallback: excluded from SFT data
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    token_ids: list[int] | None = None  # response token ids (RL needs them)
    logprobs: list[float] | None = None  # per response token
    latency_ms: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepRecord:
    """What a policy may see of an earlier step of the same episode."""

    step_idx: int
    thought: str | None
    action_desc: str | None
    action: Action | None
    result: str  # short outcome text, e.g. "ok", "parse error: ...", "exec error: ..."
    screenshot_png: bytes | None = None


class Policy(ABC):
    name: str = "policy"
    version: str = "0"

    @abstractmethod
    def act(self, obs: Observation, history: list[StepRecord]) -> Decision: ...

    def reset(self, task_id: str, seed: int) -> None:
        """Called at the start of each episode (scripted policies keep per-episode state)."""

    def close(self) -> None:
        pass
