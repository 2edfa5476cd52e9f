"""What a scripted-teacher recipe sees and builds (agents/teacher_recipes.py holds the per-task recipes).

`Ctx` wraps the current observation's DOM (CSS px boxes) and turns elements into pixel-level `Step`s: `Ctx.click`
picks a screen point of the element that no later element covers (`* scale`) and cites the element's UI-text line
in the Action line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable

from agents.actions import Action, Click, Key, Type, Wait
from envs.base import Observation
from envs.miniwob_dom import element_line

TASK_W, TASK_H = 160, 210
El = dict[str, Any]
_CITED = re.compile(r".*? @ \(-?\d+,-?\d+\)")
_COVER_TAGS = frozenset({"button", "select", "textarea", "a", "label", "svg"})


class TeacherError(RuntimeError):
    """The page is not what the recipe expects (a recipe bug or a changed task)."""


@dataclass(frozen=True)
class Step:
    action: Action
    thought: str
    desc: str  # the "Action:" line


def cap(s: str) -> str:
    return s[:1].upper() + s[1:]


def norm(s: str | None) -> str:
    return " ".join((s or "").split())


class Ctx:
    """What a recipe sees: the current observation's DOM, fields and helpers that build steps."""

    def __init__(self, obs: Observation, task_id: str):
        self.task_id = task_id
        self.prev: list[El] | None = None
        self.elems: list[El] = []
        self.update(obs)

    def update(self, obs: Observation) -> None:
        self.prev = self.elems or None
        self.obs = obs
        self.elems = list(obs.extra.get("dom_elements") or [])
        self.scale = int(obs.extra.get("scale", 1))
        self.fields: dict[str, str] = dict(obs.extra.get("fields") or [])
        self.index = {e["ref"]: i for i, e in enumerate(self.elems)}

    # ---------------------------------------------------------------- queries
    def find(
        self,
        tag: str | None = None,
        text: str | None = None,
        id: str | None = None,
        cls: str | None = None,
        pred: Callable[[El], bool] | None = None,
    ) -> list[El]:
        out = []
        for e in self.elems:
            if tag is not None and e["tag"] != tag:
                continue
            if text is not None and norm(e["text"]) != text:
                continue
            if id is not None and e["id"] != id:
                continue
            if cls is not None and cls not in e["classes"].split():
                continue
            if pred is not None and not pred(e):
                continue
            out.append(e)
        return out

    def one(self, what: str, **kw) -> El:
        found = self.find(**kw)
        if not found:
            raise TeacherError(f"{self.task_id}: no {what} on the page ({kw})")
        return found[0]

    def parent(self, e: El) -> El | None:
        i = self.index.get(e["parent"])
        return self.elems[i] if i is not None else None

    def ancestors(self, e: El) -> list[El]:
        out, p = [], self.parent(e)
        while p is not None and len(out) < 64:  # bounded: a malformed tree must not loop
            out.append(p)
            p = self.parent(p)
        return out

    def subtree(self, e: El) -> list[El]:
        """e and its descendants (a contiguous block of the pre-order list)."""
        i = self.index[e["ref"]]
        j = i + 1
        while j < len(self.elems) and self.elems[j]["depth"] > e["depth"]:
            j += 1
        return self.elems[i:j]

    def children(self, e: El) -> list[El]:
        return [c for c in self.subtree(e)[1:] if c["parent"] == e["ref"]]

    def visible(self, e: El) -> bool:
        return e["left"] < TASK_W and e["top"] < TASK_H and e["left"] + e["width"] > 0 and e["top"] + e["height"] > 0

    # ---------------------------------------------------------------- geometry
    def point(self, e: El, dx: float | None = None) -> tuple[int, int]:
        """Screen point inside e: the centre (or left + dx), else the most central point no later
        element covers (overlapping buttons, dialogs), clipped to the visible task area."""
        left, top = max(e["left"], 0.0), max(e["top"], 0.0)
        right, bottom = min(e["left"] + e["width"], TASK_W - 1), min(e["top"] + e["height"], TASK_H - 1)
        if right <= left or bottom <= top:
            raise TeacherError(f"{self.task_id}: element {e['tag']} {e['text']!r} is outside the visible area")
        cx = left + dx if dx is not None else (left + right) / 2
        cy = (top + bottom) / 2
        sub = self.subtree(e)
        later = self.elems[self.index[e["ref"]] + len(sub) :]
        covers = [o for o in later if o["leaf"] or o["tag"] in _COVER_TAGS or o["tag"].startswith("input_")]

        def covered(x: float, y: float) -> bool:
            return any(
                o["left"] <= x <= o["left"] + o["width"] and o["top"] <= y <= o["top"] + o["height"] for o in covers
            )

        cands = [(cx, cy)] + sorted(
            (
                (left + (right - left) * (i + 0.5) / 8, top + (bottom - top) * (j + 0.5) / 8)
                for i in range(8)
                for j in range(8)
            ),
            key=lambda p: (p[0] - cx) ** 2 + (p[1] - cy) ** 2,
        )
        x, y = next((p for p in cands if not covered(*p)), (cx, cy))
        return int(round(x * self.scale)), int(round(y * self.scale))

    # ---------------------------------------------------------------- steps
    def cite(self, e: El) -> str:
        """The element as its line of the UI text shows it, up to its centre: `button "no" @ (53,141)`."""
        return _CITED.match(element_line(e, self.scale)).group(0)  # element_line always writes the centre

    def click(self, e: El, name: str, why: str = "", dx: float | None = None) -> Step:
        """A click on e. The Action line cites e's UI-text line (`Click button "no" @ (53,141)`): a reply that
        first quotes the matching line and then copies its numbers is what a small student learns to ground
        by (docs/LOG.md: click-button); the thought names it in words."""
        x, y = self.point(e, dx)
        thought = f"{why} {cap(name)} is at ({x},{y}).".strip()
        return Step(Click(x=x, y=y), thought, f"Click {self.cite(e)}")

    def type(self, text: str, why: str) -> Step:
        return Step(Type(text=text), why, f'Type "{text}"')

    def key(self, keys: list[str], desc: str, why: str) -> Step:
        return Step(Key(keys=keys), why, desc)

    def wait(self, seconds: float, why: str) -> Step:
        return Step(Wait(seconds=seconds), why, f"Wait {seconds:g} s")
