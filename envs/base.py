"""The one environment interface the flywheel drives (MiniWoB here, OSWorld through the env server).

env = make_env("miniwob", ...)
obs = env.reset("click-test", seed=3)
res = env.step(Click(x=80, y=105))   # an agents.actions.Action in screen pixels
reward = env.evaluate()              # binary task reward in [0, 1]
env.close()
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

from agents.actions import Action


@dataclass
class Observation:
    screenshot_png: bytes  # what the policy sees, PNG encoded
    width: int  # screen size in the coordinate space actions use
    height: int
    instruction: str
    # Compact text view of the UI (DOM / accessibility tree) with element boxes, one element
    # per line; None where the env has none.
    ui_text: str | None = None
    # Structured extras for scripted teachers (e.g. MiniWoB dom_elements, fields); never
    # shown to a model and never written to the lake.
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class StepResult:
    observation: Observation
    done: bool  # the env ended the episode (task finished, or done/fail reached it)
    exec_error: str | None = None  # the action could not be executed (bad key, off-screen...)
    info: dict[str, Any] = field(default_factory=dict)
    executed: dict[str, Any] | None = None  # the env-native form actually sent (JSON-able)


class EnvError(RuntimeError):
    """The environment itself broke (browser crashed, server down): the episode ends with status=error."""


def offscreen_error(action: Action, width: int, height: int) -> str | None:
    """Why a pointer action cannot run on a width x height screen (a point outside it), or None."""
    from agents.actions import ActionType

    pts = (
        [(action.x1, action.y1), (action.x2, action.y2)]
        if action.type == ActionType.DRAG
        else [(getattr(action, "x", None), getattr(action, "y", None))]
    )
    for x, y in pts:
        if x is not None and not (0 <= x < width and 0 <= y < height):
            return f"off-screen: ({x:g},{y:g}) is outside the {width}x{height} screen"
    return None


class GuiEnv(ABC):
    name: str = "base"

    @abstractmethod
    def reset(self, task_id: str, seed: int) -> Observation: ...

    @abstractmethod
    def step(self, action: Action) -> StepResult: ...

    @abstractmethod
    def evaluate(self) -> float:
        """Binary task reward of the current episode, in [0, 1]."""

    @abstractmethod
    def close(self) -> None: ...

    def healthy(self) -> bool:
        """A cheap liveness probe between episodes (the env server restarts a slot that fails it)."""
        return True

    def __enter__(self) -> "GuiEnv":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
