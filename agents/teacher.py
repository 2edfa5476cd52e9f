"""The scripted MiniWoB teacher: reads the DOM, acts only through pixel-level actions.

    teacher = ScriptedTeacher()
    obs = env.reset("click-button", seed=3)
    teacher.reset("click-button", 3)
    d = teacher.act(obs, history=[])    # Decision(action=Click(x=18, y=84), thought=..., response_text=...)

Each task has a recipe (agents/teacher_recipes.py): a generator that looks at the current
observation's DOM (`obs.extra["dom_elements"]`, CSS px) and yields one step at a time:
a click at screen coordinates, typed text, a key or a short wait. Nothing is clicked
by element reference, so every demonstration can be imitated from the screenshot
alone. The teacher writes the same text format the student is trained on
(`agents.parsing.format_response`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Iterator

from agents.actions import Done
from agents.base import Decision, Policy, StepRecord
from agents.teacher_recipes import RECIPES, Ctx, Step, TeacherError
from envs.base import Observation

if TYPE_CHECKING:
    from agents.coords import CoordTransform


class UnknownTask(ValueError):
    """The teacher has no recipe for this task."""


def supported_tasks() -> list[str]:
    return sorted(RECIPES)


class ScriptedTeacher(Policy):
    """Per-task DOM recipes -> pixel actions; keeps per-episode state between `reset` calls."""

    name = "scripted"
    version = "1"

    def __init__(self, tasks: list[str] | None = None, transform: "CoordTransform | None" = None):
        """tasks: optionally check up front that these have recipes. transform: write the response
        text (tool call and the "at (x,y)" in thoughts) in a model's coordinate space; the
        Decision's `action` stays in screen pixels either way."""
        self.transform = transform
        if tasks is not None:
            missing = [t for t in tasks if t not in RECIPES]
            if missing:
                raise UnknownTask(f"no teacher recipe for {missing}; supported: {', '.join(supported_tasks())}")
        self.task_id: str | None = None
        self._gen: Iterator[Step] | None = None
        self._ctx: Ctx | None = None

    def reset(self, task_id: str, seed: int) -> None:
        if task_id not in RECIPES:
            raise UnknownTask(
                f"ScriptedTeacher has no recipe for task {task_id!r}; supported: {', '.join(supported_tasks())}"
            )
        self.task_id, self._gen, self._ctx = task_id, None, None

    def act(self, obs: Observation, history: list[StepRecord]) -> Decision:
        if "dom_elements" not in obs.extra:
            raise TeacherError("ScriptedTeacher reads the MiniWoB DOM (obs.extra['dom_elements']); this env has none")
        if self._gen is None or not history:  # first step of an episode
            if self.task_id is None:
                self.reset(obs.extra.get("task_id"), 0)
            self._ctx = Ctx(obs, self.task_id)
            self._gen = RECIPES[self.task_id](self._ctx)
        else:
            self._ctx.update(obs)
        step = next(self._gen, None)
        if step is None:  # the recipe has nothing left to do, but the task did not end
            step = Step(Done(), "Everything the task asks for is done.", "Finish the task")
        return _decision(step, self.transform)


_AT = re.compile(r"(at|@) \((-?\d+),(-?\d+)\)")


def points_in_model_space(text: str, transform: "CoordTransform | None") -> str:
    """Rewrite the screen points a teacher's text mentions ("... is at (80,120).", a cited UI line's
    `@ (80,120)`) into model space."""
    if transform is None:
        return text

    def sub(m: re.Match) -> str:
        x, y = transform.to_model(float(m.group(2)), float(m.group(3)))
        return f"{m.group(1)} ({round(x)},{round(y)})"

    return _AT.sub(sub, text)


def _decision(step: Step, transform: "CoordTransform | None" = None) -> Decision:
    from agents.parsing import action_arguments, format_response

    thought = points_in_model_space(step.thought, transform)
    desc = points_in_model_space(step.desc, transform)  # a cited UI line's point
    return Decision(
        response_text=format_response(thought, desc, step.action, transform),
        action=step.action,
        thought=thought,
        action_desc=desc,
        raw_action=action_arguments(step.action, transform),
    )
