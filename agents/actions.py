"""The one closed action schema every policy emits and every environment executes.

Coordinates in an `Action` are **screen pixels of the environment** (after the
model-space -> screen-space transform in `agents.coords`). Policies never hand an env
anything else: model text is parsed into these models (`agents.parsing`) and compiled
to an env's native form (`agents.compile`), never executed as code.

    >>> Click(x=10, y=20).model_dump()
    {'action': 'click', 'x': 10.0, 'y': 20.0, 'button': 'left', 'clicks': 1}
"""

from __future__ import annotations

from enum import Enum
from typing import Annotated, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter


class ActionType(str, Enum):
    CLICK = "click"
    DOUBLE_CLICK = "double_click"
    RIGHT_CLICK = "right_click"
    MOVE = "move"
    DRAG = "drag"
    SCROLL = "scroll"
    TYPE = "type"
    KEY = "key"
    WAIT = "wait"
    DONE = "done"
    FAIL = "fail"


# Actions whose fields carry screen coordinates (the transform applies to these).
POINT_ACTIONS = frozenset(
    {ActionType.CLICK, ActionType.DOUBLE_CLICK, ActionType.RIGHT_CLICK, ActionType.MOVE, ActionType.SCROLL}
)
TERMINAL_ACTIONS = frozenset({ActionType.DONE, ActionType.FAIL})

MAX_TYPE_CHARS = 512  # longer "type" payloads are almost always a runaway generation
MAX_KEYS = 4  # a chord longer than ctrl+alt+shift+<key> is not a real hotkey

Coord = Annotated[float, Field(ge=-1e5, le=1e5, allow_inf_nan=False)]


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    @property
    def type(self) -> ActionType:
        return ActionType(self.action)  # type: ignore[attr-defined]


class Click(_Action):
    action: Literal["click"] = "click"
    x: Coord
    y: Coord
    button: Literal["left", "right", "middle"] = "left"
    clicks: int = Field(1, ge=1, le=3)


class DoubleClick(_Action):
    action: Literal["double_click"] = "double_click"
    x: Coord
    y: Coord


class RightClick(_Action):
    action: Literal["right_click"] = "right_click"
    x: Coord
    y: Coord


class Move(_Action):
    action: Literal["move"] = "move"
    x: Coord
    y: Coord


class Drag(_Action):
    action: Literal["drag"] = "drag"
    x1: Coord
    y1: Coord
    x2: Coord
    y2: Coord


class Scroll(_Action):
    action: Literal["scroll"] = "scroll"
    x: Coord
    y: Coord
    dx: int = Field(0, ge=-50, le=50)  # wheel clicks; positive = right
    dy: int = Field(0, ge=-50, le=50)  # wheel clicks; positive = down


class Type(_Action):
    action: Literal["type"] = "type"
    text: str = Field(min_length=1, max_length=MAX_TYPE_CHARS)


class Key(_Action):
    action: Literal["key"] = "key"
    # e.g. ["enter"], ["ctrl", "a"]; names are normalised by agents.compile.normalize_keys
    keys: list[Annotated[str, Field(min_length=1, max_length=24)]] = Field(min_length=1, max_length=MAX_KEYS)


class Wait(_Action):
    action: Literal["wait"] = "wait"
    seconds: float = Field(1.0, ge=0, le=60, allow_inf_nan=False)


class Done(_Action):
    action: Literal["done"] = "done"


class Fail(_Action):
    action: Literal["fail"] = "fail"


Action = Annotated[
    Union[Click, DoubleClick, RightClick, Move, Drag, Scroll, Type, Key, Wait, Done, Fail],
    Field(discriminator="action"),
]
ACTION_ADAPTER: TypeAdapter[Action] = TypeAdapter(Action)


def action_from_dict(d: dict) -> Action:
    """Validate a plain dict (e.g. a lake row's `action` JSON) into an Action; raises pydantic.ValidationError."""
    return ACTION_ADAPTER.validate_python(d)


def action_to_json(a: Action) -> str:
    return a.model_dump_json()
