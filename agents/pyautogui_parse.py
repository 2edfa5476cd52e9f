"""A safe reader of the pyautogui code that OSWorld agents write, into the closed action schema.

    actions, error = parse_pyautogui("pyautogui.click(960, 540)", 1920, 1080)   # ([Click(x=960, y=540)], None)
    parse_pyautogui("WAIT", 1920, 1080)                                       # ([Wait(seconds=1)], None)
    p = read_pyautogui(code, 1920, 1080, pointer)      # ParsedCode: actions, error, thought, notes, flag

OSWorld's `pyautogui` action space (desktop_env) runs each action string on the VM as Python, plus the special
strings WAIT / DONE / FAIL. We never run it: the text is parsed with `ast`, and only a whitelist of statement
shapes is accepted, each argument a literal (`ast.literal_eval`): `import pyautogui` / `import time` (ignored),
`time.sleep(s)`, and calls `pyautogui.<fn>(...)` of click, doubleClick, tripleClick, rightClick, middleClick,
moveTo, dragTo, scroll, hscroll, write/typewrite, press, hotkey (positional keys, or OpenCUA's `keys=[...]`), and
OpenCUA's `computer.wait()`, `computer.terminate(status=...)` and `computer.triple_click(x, y)`. A bare string
statement is the step's thought, not an action (UI-TARS in OSWorld's mm_agents writes an
"Observation ... Thought ..." string before its calls). Anything else (variables, loops, other modules,
mouseDown/keyDown, expressions) makes the whole string an error with a short reason; the importer keeps such
steps with that reason. Coordinates are screen pixels of the VM (pyautogui's space); a click without coordinates
uses the pointer left by an earlier moveTo/click of the same episode (`Pointer`).

What the schema cannot hold exactly is said, never guessed silently:
- `ParsedCode.notes`: a scroll beyond our +-50 wheel clicks is saturated at 50; the note keeps the source magnitude
  and its unit (pyautogui `clicks`), and the importers record it with the step.
- `ParsedCode.flag`: a step whose actions are in the schema but are not fit to be SFT targets. The importers keep
  the step with its action (parse_ok true), set `fallback_parse` (curate's exclusion) and record the flag as the
  step's reason (`parse_error`). Two rules set it:
  - a scroll before any pointer position is known (pyautogui scrolls wherever the mouse is) is placed at the screen
    centre. That guessed centre never becomes the pointer: a scroll without coordinates does not move the mouse,
    so the next one is just as unknown (and flagged) until a click or moveTo;
  - with `off_screen="clamp"` (code that ran through pyautogui on the VM, as OSWorld's result folders record it),
    a point off the screen is kept where the pointer went: onto the screen's nearest edge pixel (X confines the
    pointer to the screen). A note keeps the source point and the one mapped. With the default
    `off_screen="reject"` such a point is an error (a 0..1 field holding pixels is a wrong unit, not an edge).
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agents.actions import Action, Click, Done, DoubleClick, Drag, Fail, Key, Move, RightClick, Scroll, Type, Wait
from agents.compile import UnsupportedAction, normalize_keys

MAX_CODE_CHARS = 5000
MAX_SCROLL = 50  # agents.actions.Scroll bounds dx/dy (wheel clicks) to +-50
SCROLL_UNIT = "pyautogui clicks"
SPECIAL = {"WAIT": Wait(seconds=1.0), "DONE": Done(), "FAIL": Fail()}
# pyautogui's signatures, as far as we read them: positional parameter names per function
_SIGS: dict[str, tuple[str, ...]] = {
    "click": ("x", "y", "clicks", "interval", "button", "duration"),
    "doubleClick": ("x", "y", "interval", "button", "duration"),
    "tripleClick": ("x", "y", "interval", "button", "duration"),
    "rightClick": ("x", "y", "interval", "duration"),
    "middleClick": ("x", "y", "interval", "duration"),
    "moveTo": ("x", "y", "duration"),
    "dragTo": ("x", "y", "duration", "button"),
    "scroll": ("clicks", "x", "y"),
    "hscroll": ("clicks", "x", "y"),
    "write": ("message", "interval"),
    "typewrite": ("message", "interval"),
    "press": ("keys", "presses", "interval"),
    "hotkey": (),  # *keys, or keys=[...] (OpenCUA)
}
_IGNORED_KW = {"interval", "duration", "tween", "_pause", "logScreenshot"}


class PyAutoGUIError(ValueError):
    pass


@dataclass
class Pointer:
    """Where the mouse is, across the steps of one episode (pyautogui's clicks default to it)."""

    x: float | None = None
    y: float | None = None


@dataclass
class ParsedCode:
    """One action string read: its actions (screen pixels) or the reason it was refused (`error`); the thought its
    string statements carry; `notes` on what the schema holds inexactly; `flag`, set with actions, for a step that
    is kept but is not fit for SFT."""

    actions: list[Action] = field(default_factory=list)
    error: str | None = None
    thought: str | None = None
    notes: list[dict[str, Any]] = field(default_factory=list)
    flag: str | None = None


@dataclass
class _Ctx:
    ptr: Pointer
    w: float
    h: float
    clamp: bool = False  # off-screen points: onto the screen edge (flagged) instead of an error
    notes: list[dict[str, Any]] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)

    def on_screen(self, fn: str, x: float, y: float) -> tuple[float, float]:
        """(x, y) if it lies on the screen; else the error, or with `clamp` the nearest edge pixel, noted and
        flagged (pyautogui hands the point to X, which keeps the pointer on the screen)."""
        if 0 <= x < self.w and 0 <= y < self.h:
            return x, y
        where = f"point ({x:g}, {y:g}) is off the {self.w:g}x{self.h:g} screen"
        if not self.clamp:
            raise PyAutoGUIError(where)
        cx, cy = min(max(x, 0.0), float(math.ceil(self.w) - 1)), min(max(y, 0.0), float(math.ceil(self.h) - 1))
        self.notes.append(
            {"note": "point off the screen", "source": [x, y], "mapped": [cx, cy], "unit": "screen pixels"}
        )
        self.flags.append(
            f"{where}: {fn} kept at ({cx:g}, {cy:g}), the screen edge where the pointer stops; not fit for SFT"
        )
        return cx, cy


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise PyAutoGUIError(f"argument is not a literal: {ast.unparse(node)[:40]!r}") from None


def _no_star(name: str, call: ast.Call) -> None:
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        raise PyAutoGUIError(f"{name}: *args/**kwargs are not supported")


def _bind(fn: str, call: ast.Call) -> dict[str, Any]:
    _no_star(fn, call)
    if fn == "hotkey":
        kw = {k.arg: _literal(k.value) for k in call.keywords}
        extra = set(kw) - {"keys"} - _IGNORED_KW
        if extra:
            raise PyAutoGUIError(f"hotkey: unsupported argument {sorted(extra)[0]!r}")
        if "keys" in kw and call.args:
            raise PyAutoGUIError("hotkey: keys given both as arguments and as keys=")
        return {"keys": kw["keys"] if "keys" in kw else [_literal(a) for a in call.args]}
    names = _SIGS[fn]
    if len(call.args) > len(names):
        raise PyAutoGUIError(f"{fn}: too many arguments")
    out = {names[i]: _literal(a) for i, a in enumerate(call.args)}
    for k in call.keywords:
        if k.arg in out:
            raise PyAutoGUIError(f"{fn}: {k.arg} given twice")
        out[k.arg] = _literal(k.value)  # type: ignore[index]
    if fn in ("click", "doubleClick", "tripleClick", "rightClick", "middleClick", "moveTo", "dragTo") and isinstance(
        out.get("x"), (tuple, list)
    ):
        if len(out["x"]) != 2 or "y" in out and out["y"] is not None:
            raise PyAutoGUIError(f"{fn}: a point must be (x, y)")
        out["x"], out["y"] = out["x"]
    return out


def _xy(fn: str, a: dict, ptr: Pointer, ctx: _Ctx | None = None) -> tuple[float, float]:
    x, y = a.get("x"), a.get("y")
    if x is None and y is None:
        if ptr.x is None:
            raise PyAutoGUIError(f"{fn} without coordinates and no known pointer position")
        return ptr.x, ptr.y  # type: ignore[return-value]
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (x, y)):
        raise PyAutoGUIError(f"{fn}: x and y must be numbers")
    if ctx is not None and not all(math.isfinite(v) for v in (x, y)):
        raise PyAutoGUIError(f"{fn}: x and y must be finite")
    return ctx.on_screen(fn, float(x), float(y)) if ctx is not None else (float(x), float(y))


def _keys(v: Any) -> list[str]:
    keys = [v] if isinstance(v, str) else v
    if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) for k in keys):
        raise PyAutoGUIError("keys must be a string or a list of strings")
    try:
        return normalize_keys(list(keys))
    except UnsupportedAction as e:
        raise PyAutoGUIError(str(e)) from None


def _scroll(fn: str, a: dict, ctx: _Ctx) -> list[Action]:
    clicks = a.get("clicks")
    if not isinstance(clicks, int) or isinstance(clicks, bool):
        raise PyAutoGUIError(f"{fn}: clicks must be an integer")
    if a.get("x") is None and a.get("y") is None and ctx.ptr.x is None:
        x, y = ctx.w / 2, ctx.h / 2
        ctx.flags.append(
            f"{fn} before any pointer position is known (pyautogui scrolls wherever the mouse is): "
            "kept at the screen centre, not fit for SFT"
        )
    else:
        x, y = _xy(fn, a, ctx.ptr, ctx)
    n = max(-MAX_SCROLL, min(MAX_SCROLL, clicks))
    if n != clicks:
        ctx.notes.append({"note": "scroll saturated", "source": clicks, "unit": SCROLL_UNIT, "mapped": n})
    # pyautogui: positive scroll = up, positive hscroll = right; ours: dy positive = down
    return [Scroll(x=x, y=y, dy=-n) if fn == "scroll" else Scroll(x=x, y=y, dx=n)]


def _action(fn: str, a: dict, ctx: _Ctx) -> list[Action]:
    ptr = ctx.ptr
    extra = set(a) - set(_SIGS[fn]) - _IGNORED_KW - ({"keys"} if fn == "hotkey" else set())
    if extra:
        raise PyAutoGUIError(f"{fn}: unsupported argument {sorted(extra)[0]!r}")
    if fn in ("write", "typewrite"):
        msg = a.get("message")
        if isinstance(msg, (list, tuple)):  # typewrite(['a', 'enter']) presses keys one by one
            return [Key(keys=[k]) for k in _keys(list(msg))]
        if not isinstance(msg, str) or not msg:
            raise PyAutoGUIError(f"{fn}: message must be a non-empty string")
        return [Type(text=msg)]
    if fn == "press":
        presses = a.get("presses", 1)
        keys = _keys(a.get("keys"))
        if not isinstance(presses, int) or not 1 <= presses <= 20:
            raise PyAutoGUIError("press: presses must be an integer in 1..20")
        return [Key(keys=[k]) for _ in range(presses) for k in keys]
    if fn == "hotkey":
        return [Key(keys=_keys(a["keys"]))]
    if fn in ("scroll", "hscroll"):
        return _scroll(fn, a, ctx)
    if fn == "dragTo":
        if ptr.x is None:
            raise PyAutoGUIError("dragTo without a known start point (no earlier moveTo/click)")
        x, y = _xy(fn, a, ptr, ctx)
        return [Drag(x1=ptr.x, y1=ptr.y, x2=x, y2=y)]
    x, y = _xy(fn, a, ptr, ctx)
    button = a.get("button", "left")
    if fn == "moveTo":
        return [Move(x=x, y=y)]
    if fn == "rightClick" or (fn == "click" and button == "right"):
        return [RightClick(x=x, y=y)]
    if fn == "doubleClick":
        return [DoubleClick(x=x, y=y)]
    if fn == "tripleClick":
        return [Click(x=x, y=y, clicks=3)]
    if fn == "middleClick":
        return [Click(x=x, y=y, button="middle")]
    return [Click(x=x, y=y, button=button, clicks=a.get("clicks", 1))]


def _computer(fn: str, call: ast.Call, ctx: _Ctx) -> list[Action]:
    """OpenCUA's own functions (its action list: wait, terminate, triple_click)."""
    _no_star(f"computer.{fn}", call)
    kw = {k.arg: _literal(k.value) for k in call.keywords}
    if fn == "wait":
        return [Wait(seconds=1.0)]
    if fn == "triple_click":
        pos = dict(zip(("x", "y"), (_literal(a) for a in call.args)))
        if len(call.args) > 2 or set(pos) & set(kw) or set(kw) - {"x", "y"} or len({**pos, **kw}) != 2:
            raise PyAutoGUIError("computer.triple_click takes x and y")
        x, y = _xy("computer.triple_click", {**pos, **kw}, Pointer(), ctx)
        return [Click(x=x, y=y, clicks=3)]
    status = kw.get("status", _literal(call.args[0]) if call.args else None)
    if status not in ("success", "failure"):
        raise PyAutoGUIError("computer.terminate: status must be 'success' or 'failure'")
    return [Done() if status == "success" else Fail()]


def _statement(st: ast.stmt, ctx: _Ctx) -> list[Action]:
    if isinstance(st, ast.Import):
        if all(a.name in ("pyautogui", "time") and a.asname is None for a in st.names):
            return []
        raise PyAutoGUIError("only `import pyautogui` / `import time` are allowed")
    if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call)):
        raise PyAutoGUIError(f"unsupported statement: {ast.unparse(st)[:40]!r}")
    call = st.value
    f = call.func
    if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)):
        raise PyAutoGUIError(f"unsupported call: {ast.unparse(f)[:40]!r}")
    mod, fn = f.value.id, f.attr
    if mod == "time" and fn == "sleep":
        if len(call.args) != 1 or call.keywords:
            raise PyAutoGUIError("time.sleep takes one argument")
        s = _literal(call.args[0])
        if not isinstance(s, (int, float)) or isinstance(s, bool):
            raise PyAutoGUIError("time.sleep: seconds must be a number")
        return [Wait(seconds=float(s))]
    if mod == "computer" and fn in ("wait", "terminate", "triple_click"):
        actions = _computer(fn, call, ctx)
    elif mod != "pyautogui" or fn not in _SIGS:
        raise PyAutoGUIError(f"unsupported function {mod}.{fn}")
    else:
        a = _bind(fn, call)
        actions = _action(fn, a, ctx)
        if fn in ("scroll", "hscroll") and a.get("x") is None and a.get("y") is None:
            return actions  # pyautogui scrolls where the mouse is and leaves it there: the pointer is not moved
    for act in actions:
        if hasattr(act, "x"):
            ctx.ptr.x, ctx.ptr.y = act.x, act.y  # type: ignore[attr-defined]
        elif isinstance(act, Drag):
            ctx.ptr.x, ctx.ptr.y = act.x2, act.y2
    return actions


def _is_string(st: ast.stmt) -> bool:
    return isinstance(st, ast.Expr) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str)


def read_pyautogui(
    code: Any, screen_w: float, screen_h: float, pointer: Pointer | None = None, *, off_screen: str = "reject"
) -> ParsedCode:
    """OSWorld action text -> ParsedCode (actions in screen pixels, or the reason). Never raises, never executes.
    `off_screen`: "reject" (a point off the screen is an error) or "clamp" (kept at the screen edge, flagged)."""
    if off_screen not in ("reject", "clamp"):
        raise ValueError(f"off_screen must be 'reject' or 'clamp', not {off_screen!r}")
    ptr = pointer if pointer is not None else Pointer()
    if not isinstance(code, str):
        return ParsedCode(error=f"action is not a string ({type(code).__name__})")
    text = code.strip()
    if text in SPECIAL:
        return ParsedCode(actions=[SPECIAL[text]])
    if not text:
        return ParsedCode(error="empty action")
    if len(text) > MAX_CODE_CHARS:
        return ParsedCode(error=f"action too long ({len(text)} chars)")
    saved = (ptr.x, ptr.y)
    thought = None
    try:
        tree = ast.parse(text, mode="exec")
        strings = [st.value.value.strip() for st in tree.body if _is_string(st)]  # type: ignore[attr-defined]
        thought = "\n\n".join(s for s in strings if s) or None
        ctx = _Ctx(ptr, screen_w, screen_h, clamp=off_screen == "clamp")
        actions = [a for st in tree.body if not _is_string(st) for a in _statement(st, ctx)]
        if not actions:
            raise PyAutoGUIError("no pyautogui action" + (" (only a string)" if strings else ""))
        for a in actions:
            for fx, fy in (("x", "y"), ("x1", "y1"), ("x2", "y2")):
                if hasattr(a, fx) and not (0 <= getattr(a, fx) < screen_w and 0 <= getattr(a, fy) < screen_h):
                    raise PyAutoGUIError(
                        f"point ({getattr(a, fx):g}, {getattr(a, fy):g}) is off the {screen_w:g}x{screen_h:g} screen"
                    )
        return ParsedCode(actions=actions, thought=thought, notes=ctx.notes, flag="; ".join(ctx.flags) or None)
    except SyntaxError as e:
        ptr.x, ptr.y = saved
        return ParsedCode(error=f"not Python: {e.msg} (line {e.lineno})")
    except (PyAutoGUIError, ValidationError, RecursionError, MemoryError) as e:
        ptr.x, ptr.y = saved
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        return ParsedCode(error=msg[:200], thought=thought)


def parse_pyautogui(
    code: Any, screen_w: float, screen_h: float, pointer: Pointer | None = None
) -> tuple[list[Action], str | None]:
    """OSWorld action text -> (actions in screen pixels, None) or ([], reason); a flagged step (see
    `read_pyautogui`) comes back as ([], the flag). Never raises, never executes."""
    p = read_pyautogui(code, screen_w, screen_h, pointer)
    if p.error or p.flag:
        return [], p.error or p.flag
    return p.actions, None
