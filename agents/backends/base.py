"""The backend interface: prompts in (agents.prompts.Prompt), generations with token ids and logprobs out.

gens = backend.generate([prompt_a, prompt_b], Sampling(temperature=0.0, max_new_tokens=64))
gens[0].text, gens[0].token_ids, gens[0].logprobs   # logprobs: per generated token (RL needs them)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from agents.prompts import Prompt


class BackendError(RuntimeError):
    """The backend cannot serve (server down, wrong model name, bad response): one clear line."""


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0  # 0 = greedy
    top_p: float = 1.0
    max_new_tokens: int = 96
    seed: int | None = None  # same seed + same prompt => same output (hf backend; servers where supported)
    stop: tuple[str, ...] = ("</tool_call>",)  # generation ends after the tool call (the stop text is kept)


@dataclass
class Generation:
    text: str
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    latency_ms: float | None = None
    finish_reason: str | None = None  # "stop" | "length"
    extra: dict = field(default_factory=dict)


class Backend(ABC):
    name: str = "backend"
    model_id: str = ""

    @abstractmethod
    def generate(self, prompts: list["Prompt"], sampling: Sampling) -> list[Generation]: ...

    def close(self) -> None:
        pass
