"""Compilers from the closed `Action` schema (screen pixels) to each environment's native form.

- `to_pyautogui`: OSWorld's ``pyautogui`` action space (a Python source string the VM runs;
  built only from numbers we formatted and `repr`-quoted strings, so typed text cannot
  inject code), or the special strings ``"WAIT"``/``"DONE"``/``"FAIL"``.
- `to_computer13`: OSWorld's ``computer_13`` dicts ``{action_type, parameters}``.
- `to_miniwob`: miniwob 1.1.0 action dicts built with ``env.create_action``.

All three share one key-name table (`normalize_keys`); the parser normalises keys with it
too, so an `Action` coming from `agents.parsing` already holds canonical names.
Anything an env cannot express raises `UnsupportedAction` with a readable reason.
"""

from __future__ import annotations

import re
from typing import Any

from agents.actions import Action, ActionType

# ---------------------------------------------------------------------------------------------
# keys

MODIFIERS = ("ctrl", "alt", "shift", "win")
NAMED_KEYS = frozenset(
    {
        "enter",
        "tab",
        "space",
        "backspace",
        "delete",
        "esc",
        "insert",
        "home",
        "end",
        "pageup",
        "pagedown",
        "up",
        "down",
        "left",
        "right",
        *MODIFIERS,
        "capslock",
        "numlock",
        "scrolllock",
        "printscreen",
        "pause",
        "volumeup",
        "volumedown",
        "volumemute",
        *(f"f{i}" for i in range(1, 25)),
    }
)
# lower-cased, with "_", "-" and spaces removed -> canonical (pyautogui) name
KEY_ALIASES: dict[str, str] = {
    "return": "enter",
    "ret": "enter",
    "cr": "enter",
    "kpenter": "enter",
    "numpadenter": "enter",
    "escape": "esc",
    "control": "ctrl",
    "ctl": "ctrl",
    "lctrl": "ctrl",
    "rctrl": "ctrl",
    "ctrlleft": "ctrl",
    "ctrlright": "ctrl",
    "controll": "ctrl",
    "controlr": "ctrl",
    "leftctrl": "ctrl",
    "rightctrl": "ctrl",
    "option": "alt",
    "opt": "alt",
    "altleft": "alt",
    "altright": "alt",
    "altl": "alt",
    "altr": "alt",
    "lalt": "alt",
    "ralt": "alt",
    "leftalt": "alt",
    "rightalt": "alt",
    "altgr": "alt",
    "shiftleft": "shift",
    "shiftright": "shift",
    "shiftl": "shift",
    "shiftr": "shift",
    "lshift": "shift",
    "rshift": "shift",
    "leftshift": "shift",
    "rightshift": "shift",
    "cmd": "win",
    "command": "win",
    "super": "win",
    "superl": "win",
    "superr": "win",
    "meta": "win",
    "windows": "win",
    "winleft": "win",
    "winright": "win",
    "lwin": "win",
    "rwin": "win",
    "os": "win",
    "del": "delete",
    "bksp": "backspace",
    "bs": "backspace",
    "back": "backspace",
    "spacebar": "space",
    "ins": "insert",
    "pgup": "pageup",
    "prior": "pageup",
    "pgdn": "pagedown",
    "pgdown": "pagedown",
    "next": "pagedown",
    "arrowup": "up",
    "uparrow": "up",
    "arrowdown": "down",
    "downarrow": "down",
    "arrowleft": "left",
    "leftarrow": "left",
    "arrowright": "right",
    "rightarrow": "right",
    "caps": "capslock",
    "prtsc": "printscreen",
    "prtscr": "printscreen",
    "prntscrn": "printscreen",
    "print": "printscreen",
    "printscr": "printscreen",
    "printscrn": "printscreen",
    "snapshot": "printscreen",
    "break": "pause",
    "audiovolumeup": "volumeup",
    "audiovolumedown": "volumedown",
    "audiovolumemute": "volumemute",
    "mute": "volumemute",
}
_SINGLE_CHAR = {" ": "space", "\n": "enter", "\r": "enter", "\t": "tab"}
_FKEY = re.compile(r"f([1-9]|1[0-9]|2[0-4])")


class UnsupportedAction(ValueError):
    """An action (or key) the target environment cannot express."""


def normalize_key(key: str) -> str:
    """One key name -> canonical (pyautogui) name; raises UnsupportedAction for unknown names.

    Single printable characters are keys as they are ("a", "A", "/", "+"); named keys are
    matched case-insensitively, ignoring "_", "-" and spaces ("Page_Down" -> "pagedown").
    """
    if not isinstance(key, str) or not key:
        raise UnsupportedAction(f"unknown key {key!r}")
    if len(key) == 1:
        if key in _SINGLE_CHAR:
            return _SINGLE_CHAR[key]
        if key.isprintable():
            return key
        raise UnsupportedAction(f"unknown key {key!r}")
    k = key.strip().lower().replace("_", "").replace("-", "").replace(" ", "")
    if len(k) == 1 and k.isprintable():  # e.g. " a "
        return k
    k = KEY_ALIASES.get(k, k)
    if k in NAMED_KEYS or _FKEY.fullmatch(k):
        return k
    shown = key if len(key) <= 30 else key[:27] + "..."
    raise UnsupportedAction(f"unknown key {shown!r}")


def normalize_keys(keys: list[str]) -> list[str]:
    """Canonical names for a key chord, e.g. ["Control", "A"] -> ["ctrl", "a"].

    In a chord with a modifier, letters are lower-cased (models write "ctrl+A" for ctrl+a;
    an upper-case letter would make pyautogui add shift). A lone "A" stays "A".
    """
    out = [normalize_key(k) for k in keys]
    if len(out) > 1 and any(k in MODIFIERS for k in out):
        out = [k.lower() if len(k) == 1 and k.isalpha() else k for k in out]
    return out


def _split_modifiers(keys: list[str]) -> tuple[list[str], list[str]]:
    keys = normalize_keys(keys)
    return [k for k in keys if k in MODIFIERS], [k for k in keys if k not in MODIFIERS]


# ---------------------------------------------------------------------------------------------
# OSWorld pyautogui


def _px(v: float) -> int:
    return int(round(v))


# The strings OSWorld's DesktopEnv.step checks for, the same in both of its action spaces.
_OSWORLD_SPECIAL = {ActionType.WAIT: "WAIT", ActionType.DONE: "DONE", ActionType.FAIL: "FAIL"}


def to_pyautogui(action: Action) -> str:
    """OSWorld ``pyautogui`` action string (Python source the VM executes), or "WAIT"/"DONE"/"FAIL".

    Coordinates are rounded to whole screen pixels. Strings appear only as `repr` literals
    (exactly one literal per argument; `repr` of a str always evaluates back to the same str).
    Scroll: our dy > 0 is down, pyautogui's is up, so ``scroll(-dy)``; dx > 0 = ``hscroll`` right.
    """
    t = ActionType(action.action)
    if t == ActionType.CLICK:
        args = f"x={_px(action.x)}, y={_px(action.y)}"
        if action.button != "left":
            args += f", button={action.button!r}"
        if action.clicks != 1:
            args += f", clicks={int(action.clicks)}"
        return f"pyautogui.click({args})"
    if t == ActionType.DOUBLE_CLICK:
        return f"pyautogui.doubleClick(x={_px(action.x)}, y={_px(action.y)})"
    if t == ActionType.RIGHT_CLICK:
        return f"pyautogui.rightClick(x={_px(action.x)}, y={_px(action.y)})"
    if t == ActionType.MOVE:
        return f"pyautogui.moveTo({_px(action.x)}, {_px(action.y)})"
    if t == ActionType.DRAG:
        return (
            f"pyautogui.moveTo({_px(action.x1)}, {_px(action.y1)}); "
            f"pyautogui.dragTo({_px(action.x2)}, {_px(action.y2)}, duration=0.5, button='left')"
        )
    if t == ActionType.SCROLL:
        x, y = _px(action.x), _px(action.y)
        cmds = []
        if action.dy or not action.dx:
            cmds.append(f"pyautogui.scroll({-int(action.dy)}, x={x}, y={y})")
        if action.dx:
            cmds.append(f"pyautogui.hscroll({int(action.dx)}, x={x}, y={y})")
        return "; ".join(cmds)
    if t == ActionType.TYPE:
        return f"pyautogui.write({str(action.text)!r})"
    if t == ActionType.KEY:
        keys = normalize_keys(list(action.keys))
        if len(keys) == 1:
            return f"pyautogui.press({keys[0]!r})"
        return f"pyautogui.hotkey({', '.join(repr(k) for k in keys)})"
    if t in _OSWORLD_SPECIAL:
        return _OSWORLD_SPECIAL[t]
    raise UnsupportedAction(f"no pyautogui form for {t.value}")  # pragma: no cover - closed schema


# ---------------------------------------------------------------------------------------------
# OSWorld computer_13


def to_computer13(action: Action) -> dict[str, Any] | list[dict[str, Any]] | str:
    """OSWorld ``computer_13`` action: a dict ``{"action_type", "parameters"}``, or

    - a **list** of dicts where computer_13 needs two steps: drag = ``[MOVE_TO start, DRAG_TO end]``
      (DRAG_TO drags from the current pointer position) and scroll = ``[MOVE_TO point, SCROLL]``
      (SCROLL has no position); the env steps them in order;
    - the strings ``"WAIT"``/``"DONE"``/``"FAIL"`` (what ``DesktopEnv.step`` checks for).

    SCROLL's dx/dy are passed to ``pyautogui.hscroll``/``vscroll`` (vscroll > 0 = up), so
    ``dy = -action.dy``. A single key is PRESS{key}; a chord is HOTKEY{keys}.
    """
    t = ActionType(action.action)

    def d(kind: str, **params: Any) -> dict[str, Any]:
        return {"action_type": kind, "parameters": params}

    if t == ActionType.CLICK:
        return d("CLICK", button=action.button, x=_px(action.x), y=_px(action.y), num_clicks=int(action.clicks))
    if t == ActionType.DOUBLE_CLICK:
        return d("DOUBLE_CLICK", x=_px(action.x), y=_px(action.y))
    if t == ActionType.RIGHT_CLICK:
        return d("RIGHT_CLICK", x=_px(action.x), y=_px(action.y))
    if t == ActionType.MOVE:
        return d("MOVE_TO", x=_px(action.x), y=_px(action.y))
    if t == ActionType.DRAG:
        return [d("MOVE_TO", x=_px(action.x1), y=_px(action.y1)), d("DRAG_TO", x=_px(action.x2), y=_px(action.y2))]
    if t == ActionType.SCROLL:
        return [d("MOVE_TO", x=_px(action.x), y=_px(action.y)), d("SCROLL", dx=int(action.dx), dy=-int(action.dy))]
    if t == ActionType.TYPE:
        return d("TYPING", text=str(action.text))
    if t == ActionType.KEY:
        keys = normalize_keys(list(action.keys))
        return d("PRESS", key=keys[0]) if len(keys) == 1 else d("HOTKEY", keys=keys)
    if t in _OSWORLD_SPECIAL:
        return _OSWORLD_SPECIAL[t]
    raise UnsupportedAction(f"no computer_13 form for {t.value}")  # pragma: no cover


# ---------------------------------------------------------------------------------------------
# MiniWoB

# canonical name -> WebDriver key name as miniwob writes it (miniwob.constants.WEBDRIVER_SPECIAL_KEYS)
MINIWOB_KEYS: dict[str, str] = {
    "enter": "<Enter>",
    "tab": "<Tab>",
    "space": "<Space>",
    "backspace": "<Backspace>",
    "delete": "<Delete>",
    "esc": "<Escape>",
    "insert": "<Insert>",
    "home": "<Home>",
    "end": "<End>",
    "pageup": "<PageUp>",
    "pagedown": "<PageDown>",
    "up": "<ArrowUp>",
    "down": "<ArrowDown>",
    "left": "<ArrowLeft>",
    "right": "<ArrowRight>",
    "pause": "<Pause>",
    **{f"f{i}": f"<F{i}>" for i in range(1, 13)},
}
# miniwob modifier prefixes, in the order miniwob composes them (A-, C-, M-, S-)
MINIWOB_MODIFIERS: dict[str, str] = {"alt": "A-", "ctrl": "C-", "win": "M-", "shift": "S-"}


def miniwob_key(keys: list[str]) -> str:
    """A key chord in miniwob's notation: ["enter"] -> "<Enter>", ["ctrl", "a"] -> "C-a",
    ["shift", "a"] -> "A" (miniwob lists capitals rather than S-a). Raises UnsupportedAction."""
    mods, rest = _split_modifiers(keys)
    if len(rest) != 1:
        raise UnsupportedAction(f"miniwob presses one key with optional modifiers, got {'+'.join(keys)!r}")
    k = rest[0]
    if k in MINIWOB_KEYS:
        name = MINIWOB_KEYS[k]
    elif len(k) == 1 and 32 <= ord(k) < 127:
        name = k
    else:
        raise UnsupportedAction(f"key {k!r} has no miniwob name")
    if "shift" in mods and len(name) == 1 and name.isalpha():
        mods = [m for m in mods if m != "shift"]
        name = name.upper()
    prefix = "".join(MINIWOB_MODIFIERS[m] for m in sorted(set(mods), key=list(MINIWOB_MODIFIERS).index))
    return prefix + name


def _chunks(text: str, n: int) -> list[str]:
    return [text[i : i + n] for i in range(0, len(text), n)] or [""]


def to_miniwob(action: Action, env_unwrapped: Any) -> list[dict[str, Any]]:
    """miniwob action dicts for one Action, built with ``env_unwrapped.create_action``.

    `action` must already be in miniwob's coordinate space (CSS pixels of the page).
    click -> CLICK_COORDS (clicks=2 -> DBLCLICK_COORDS), double_click -> DBLCLICK_COORDS,
    move -> MOVE_COORDS, scroll -> |dy| x SCROLL_DOWN/UP_COORDS (one miniwob scroll step per
    wheel click; dy = 0 -> MOVE_COORDS), type -> TYPE_TEXT in chunks of the env's text limit
    (64), key -> PRESS_KEY (the chord must be in the env's `allowed_keys`), wait -> NONE.
    Unsupported (raises): right_click, drag, middle/right button, triple click, horizontal
    scroll, keys miniwob does not allow, and done/fail (the env ends the episode itself).
    """
    from miniwob.action import ActionTypes

    cfg = env_unwrapped.action_space_config
    t = ActionType(action.action)

    def make(kind: ActionTypes, **kw: Any) -> dict[str, Any]:
        if kind not in cfg.action_types:
            raise UnsupportedAction(f"this miniwob env has no {kind.value} action")
        return env_unwrapped.create_action(kind, **kw)

    def coords(x: float, y: float):
        import numpy as np

        if cfg.coord_bins:
            bx = min(cfg.coord_bins[0] - 1, max(0, int(x * cfg.coord_bins[0] / cfg.screen_width)))
            by = min(cfg.coord_bins[1] - 1, max(0, int(y * cfg.coord_bins[1] / cfg.screen_height)))
            return np.array([bx, by])
        return np.array([x, y], dtype=np.float32)

    if t == ActionType.CLICK:
        if action.button != "left":
            raise UnsupportedAction(f"miniwob has no {action.button} click")
        if action.clicks == 1:
            return [make(ActionTypes.CLICK_COORDS, coords=coords(action.x, action.y))]
        if action.clicks == 2:
            return [make(ActionTypes.DBLCLICK_COORDS, coords=coords(action.x, action.y))]
        raise UnsupportedAction("miniwob has no triple click")
    if t == ActionType.DOUBLE_CLICK:
        return [make(ActionTypes.DBLCLICK_COORDS, coords=coords(action.x, action.y))]
    if t == ActionType.MOVE:
        return [make(ActionTypes.MOVE_COORDS, coords=coords(action.x, action.y))]
    if t == ActionType.SCROLL:
        if action.dx:
            raise UnsupportedAction("miniwob has no horizontal scroll")
        if not action.dy:
            return [make(ActionTypes.MOVE_COORDS, coords=coords(action.x, action.y))]
        kind = ActionTypes.SCROLL_DOWN_COORDS if action.dy > 0 else ActionTypes.SCROLL_UP_COORDS
        return [make(kind, coords=coords(action.x, action.y)) for _ in range(abs(int(action.dy)))]
    if t == ActionType.TYPE:
        n = int(getattr(cfg, "text_max_len", 64) or 64)
        return [make(ActionTypes.TYPE_TEXT, text=chunk) for chunk in _chunks(str(action.text), n)]
    if t == ActionType.KEY:
        name = miniwob_key(list(action.keys))
        allowed = list(cfg.allowed_keys)
        if name not in allowed:
            raise UnsupportedAction(f"key {name!r} is not in this miniwob env's allowed_keys")
        return [make(ActionTypes.PRESS_KEY, key=allowed.index(name))]
    if t == ActionType.WAIT:
        return [make(ActionTypes.NONE)]
    if t in (ActionType.RIGHT_CLICK, ActionType.DRAG):
        raise UnsupportedAction(f"miniwob has no {t.value} action")
    raise UnsupportedAction(f"{t.value} is handled by the env, not compiled to a miniwob action")
