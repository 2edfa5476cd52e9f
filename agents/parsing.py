"""The model text format, and a strict parser for it.

The one format teachers write and students are trained on::

    <thinking>
    {thought}
    </thinking>
    Action: {short description}
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "click", "x": 412, "y": 230}}
    </tool_call>

`format_response` writes it (coordinates in the model's space via `agents.coords`),
`parse_response` reads it back into an `Action` in screen pixels, or a short error reason.
Model output is untrusted: it is only ever `json.loads`-ed (NaN/Infinity and duplicate keys
rejected), never `eval`-ed; the parser never raises, and inputs longer than
`MAX_RESPONSE_CHARS` are rejected up front so adversarial text cannot be slow.

Canonical arguments are the fields of `agents.actions` (``{"action": "click", "x", "y",
"button", "clicks"}``, ``drag{x1, y1, x2, y2}``, ``scroll{x, y, dx, dy}`` with dx/dy in wheel
clicks, positive = right/down, ``type{text}``, ``key{keys: [...]}``, ``wait{seconds}``,
``done{}``, ``fail{}``). Also accepted, because Qwen's / Claude's computer_use tools produce
them (the Action is the same; nothing is ever inferred from prose):

==========================  ==========================================================
written                     read as
==========================  ==========================================================
``"coordinate": [x, y]``    ``x, y`` (for drag: the end point ``x2, y2``)
``"start_coordinate": [x,y]`` drag start ``x1, y1`` (Claude's ``left_click_drag``)
``left_click``              ``click``
``middle_click``            ``click`` with ``button: "middle"``
``triple_click``            ``click`` with ``clicks: 3``
``mouse_move``              ``move``
``left_click_drag``         ``drag`` (needs a start point; Qwen's form without one is an error)
``hscroll``                 ``scroll`` (horizontal)
scroll ``"pixels": n``      Qwen's amount, passed to ``pyautogui.scroll`` (wheel clicks,
                            positive = up): ``dy = -n``; for ``hscroll``: ``dx = n``
scroll ``"direction"``      ``up|down|left|right`` (also ``scroll_direction``) with
                            ``"amount"`` / ``"scroll_amount"`` wheel clicks (default 5)
key ``"keys": "ctrl+a"``    ``keys: ["ctrl", "a"]``; a list element ``"ctrl+a"`` is split too;
                            ``"key": "enter"`` and Claude's ``"text": "ctrl+a"`` likewise
(all key names)             normalised by `agents.compile.normalize_keys`; unknown -> error
wait ``"time"``/``"duration"``  ``seconds``
``terminate``               ``status: "success"`` -> ``done``, ``"failure"`` -> ``fail``
==========================  ==========================================================

Everything else is an error: unknown actions or keys, extra fields, wrong types, non-finite
or huge numbers, coordinates outside the model's image, zero or several ``<tool_call>``
blocks, text after ``</tool_call>``. A missing ``</tool_call>`` at the very end is fine
(generation stops on it). With ``allow_fallback=True`` a bare JSON object (a tool call, or
an arguments object with ``"action"``) outside any tags is accepted and flagged
``fallback=True`` (curation excludes those steps from SFT data).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from agents.actions import (
    Action,
    ActionType,
    Click,
    Done,
    DoubleClick,
    Drag,
    Fail,
    Key,
    Move,
    RightClick,
    Scroll,
    Type,
    Wait,
)
from agents.coords import COORD_FIELDS, COORD_PAIRS, CoordTransform

TOOL_NAME = "computer_use"
MAX_RESPONSE_CHARS = 20_000
MAX_ERROR_CHARS = 300
MAX_FALLBACK_TRIES = 64
SCROLL_DEFAULT_CLICKS = 5
_MAX_ABS_NUMBER = 1e9  # anything bigger is junk; also keeps int->float conversion safe

THINK_OPEN, THINK_CLOSE = "<thinking>", "</thinking>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
# End-of-turn markers a backend may leave after the stop string.
_END_TOKENS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>")

_MODELS = {
    ActionType.CLICK: Click,
    ActionType.DOUBLE_CLICK: DoubleClick,
    ActionType.RIGHT_CLICK: RightClick,
    ActionType.MOVE: Move,
    ActionType.DRAG: Drag,
    ActionType.SCROLL: Scroll,
    ActionType.TYPE: Type,
    ActionType.KEY: Key,
    ActionType.WAIT: Wait,
    ActionType.DONE: Done,
    ActionType.FAIL: Fail,
}
_FIELD_ORDER = {t: list(m.model_fields) for t, m in _MODELS.items()}

# action name as written -> (canonical action, implied fields)
_ACTION_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    **{t.value: (t.value, {}) for t in ActionType},
    "left_click": ("click", {}),
    "middle_click": ("click", {"button": "middle"}),
    "triple_click": ("click", {"clicks": 3}),
    "mouse_move": ("move", {}),
    "left_click_drag": ("drag", {}),
    "hscroll": ("scroll", {}),
    "terminate": ("terminate", {}),
}


class _ParseError(Exception):
    pass


@dataclass
class ParseResult:
    action: Action | None  # screen space; None when parsing failed
    raw_args: dict | None  # the "arguments" object as written (model space)
    thought: str | None
    action_desc: str | None
    error: str | None  # short reason when action is None
    fallback: bool = False  # parsed from a bare JSON object (allow_fallback=True)
    clamped: bool = False  # a model-space point on the image's far edge was clamped onto the screen

    @property
    def ok(self) -> bool:
        return self.action is not None


# ---------------------------------------------------------------------------------------------
# writing


def _num(v: float, round_coord: bool = False) -> int | float:
    if round_coord:
        return int(round(v))
    if isinstance(v, float) and v.is_integer():
        return int(v)
    return v


def _one_line(s: str) -> str:
    return " ".join(_neutralise(s).split())


def _neutralise(s: str) -> str:
    """Keep the format's tags out of free text (a thought quoting `<tool_call>` would break parsing)."""
    for tag in (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE):
        s = s.replace(tag, tag.replace("<", "[").replace(">", "]"))
    return s


def action_arguments(
    action: Action, transform: CoordTransform | None = None, *, round_coords: bool = True
) -> dict[str, Any]:
    """The canonical `arguments` object of an action: coordinates in model space, defaults omitted."""
    t = ActionType(action.action)
    d = transform.action_to_model(action) if transform is not None else action.model_dump()
    out: dict[str, Any] = {"action": t.value}
    fields = _MODELS[t].model_fields
    for name in _FIELD_ORDER[t]:
        if name == "action":
            continue
        v = d[name]
        if name in COORD_FIELDS:
            out[name] = _num(v, round_coords)
        elif v != fields[name].default or fields[name].is_required():
            out[name] = _num(v) if isinstance(v, float) else v
    return out


def format_tool_call(action: Action, transform: CoordTransform | None = None, *, round_coords: bool = True) -> str:
    call = {"name": TOOL_NAME, "arguments": action_arguments(action, transform, round_coords=round_coords)}
    body = json.dumps(call, ensure_ascii=False)
    # typed text may contain the format's own tags: escape their "<" (still the same JSON string)
    for tag in (THINK_OPEN, THINK_CLOSE, CALL_OPEN, CALL_CLOSE):
        body = body.replace(tag, "\\u003c" + tag[1:])
    return f"{CALL_OPEN}\n{body}\n{CALL_CLOSE}"


def format_response(
    thought: str | None,
    action_desc: str,
    action: Action,
    transform: CoordTransform | None = None,
    *,
    round_coords: bool = True,
) -> str:
    """The model-format text for one step.

    Coordinates are written in the model's space (`transform`; None = screen pixels) and, by
    default, rounded to integers as a model would write them (so a round trip through
    `parse_response` is exact in screen space and within half a model unit otherwise);
    `round_coords=False` writes exact values (integers when whole). Tags inside `thought` /
    `action_desc` are defanged to ``[tool_call]`` etc.; `action_desc` is folded onto one line.
    Typed text containing a tag is written with its ``<`` as ``\\u003c`` (the same JSON string).

    >>> print(format_response("The OK button is bottom right.", "Click OK", Click(x=412, y=230)))
    <thinking>
    The OK button is bottom right.
    </thinking>
    Action: Click OK
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "click", "x": 412, "y": 230}}
    </tool_call>
    """
    parts = []
    if thought is not None and thought.strip():
        parts.append(f"{THINK_OPEN}\n{_neutralise(thought.strip())}\n{THINK_CLOSE}")
    parts.append(f"Action: {_one_line(action_desc or '')}".rstrip())
    parts.append(format_tool_call(action, transform, round_coords=round_coords))
    return "\n".join(parts)


def action_text_for_history(action: Action, transform: CoordTransform | None = None) -> str:
    """A compact one-line rendering for the text history of older steps, e.g. ``click(412, 230)``.

    Coordinates are in the model's space when a transform is given (what the model would
    have written), else screen pixels.
    """
    a = action_arguments(action, transform)
    t = a.pop("action")
    if t in ("click", "double_click", "right_click", "move", "scroll"):
        args = [str(a.pop("x")), str(a.pop("y"))]
    elif t == "drag":
        args = [str(a.pop(k)) for k in ("x1", "y1", "x2", "y2")]
    elif t == "type":
        text = a.pop("text")
        args = [json.dumps(text if len(text) <= 60 else text[:57] + "...", ensure_ascii=False)]
    elif t == "key":
        args = ["+".join(a.pop("keys"))]
    elif t == "wait":
        args = [f"{_num(action.seconds)}s"]  # type: ignore[union-attr]
        a.clear()
    else:
        args = []
    args += [f"{k}={v}" for k, v in a.items()]
    return f"{t}({', '.join(args)})"


# ---------------------------------------------------------------------------------------------
# reading


def _short(v: Any, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[: n - 3] + "..."


def _reject_constant(c: str):
    raise ValueError(f"non-finite number {c}")


def _pairs_no_dupes(pairs: list[tuple[str, Any]]) -> dict:
    d: dict[str, Any] = {}
    for k, v in pairs:
        if k in d:
            raise ValueError(f"duplicate key {_short(k)}")
        d[k] = v
    return d


_DECODER = json.JSONDecoder(object_pairs_hook=_pairs_no_dupes, parse_constant=_reject_constant)


def _loads(s: str) -> Any:
    try:
        obj, end = _DECODER.raw_decode(s)
    except json.JSONDecodeError as e:
        raise _ParseError(f"invalid JSON: {e.msg} at char {e.pos}") from None
    except RecursionError:
        raise _ParseError("invalid JSON: nested too deeply") from None
    except ValueError as e:  # duplicate keys, NaN/Infinity, ints beyond the digit limit
        msg = str(e)
        raise _ParseError(
            "invalid JSON: integer too long" if "digits" in msg else f"invalid JSON: {msg[:80]}"
        ) from None
    if s[end:].strip():
        raise _ParseError(f"invalid JSON: extra data at char {end}")
    return obj


def _finite_number(field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _ParseError(f"{field}: must be a number, got {type(v).__name__}")
    if isinstance(v, int) and abs(v) > _MAX_ABS_NUMBER:
        raise _ParseError(f"{field}: number too large")
    if not math.isfinite(v) or abs(v) > _MAX_ABS_NUMBER:
        raise _ParseError(f"{field}: number too large" if math.isfinite(v) else f"{field}: must be finite")
    return v


def _point(field: str, v: Any) -> tuple[Any, Any]:
    if not isinstance(v, list) or len(v) != 2:
        raise _ParseError(f"{field}: must be a list [x, y]")
    return v[0], v[1]


def _pop_one(d: dict, *names: str) -> Any:
    present = [n for n in names if n in d]
    if len(present) > 1:
        raise _ParseError(f"both {present[0]!r} and {present[1]!r} given")
    return d.pop(present[0]) if present else None


def _split_chord(s: str) -> list[str]:
    """'ctrl+a' -> ['ctrl', 'a']; 'ctrl++' -> ['ctrl', '+']; '+' -> ['+']."""
    if len(s) <= 1 or "+" not in s:
        return [s]
    parts = s.split("+")
    keys, i = [], 0
    while i < len(parts):
        p = parts[i]
        if p == "" and i + 1 < len(parts) and parts[i + 1] == "":  # an empty pair is a literal '+'
            keys.append("+")
            i += 2
            continue
        if p == "":
            raise _ParseError(f"keys: malformed key combination {_short(s)}")
        keys.append(p)
        i += 1
    return keys


def _canonical_keys(v: Any) -> list[str]:
    from agents.compile import UnsupportedAction, normalize_keys

    if isinstance(v, str):
        raw = _split_chord(v)
    elif isinstance(v, list) and all(isinstance(k, str) for k in v):
        if len(v) > 8:
            raise _ParseError("keys: too many keys")
        raw = [k for item in v for k in _split_chord(item)]
    else:
        raise _ParseError("keys: must be a string or a list of strings")
    if not raw:
        raise _ParseError("keys: must not be empty")
    try:
        return normalize_keys(raw)
    except UnsupportedAction as e:
        raise _ParseError(str(e)) from None


def _canonical_args(args: dict) -> dict[str, Any]:
    """Resolve the documented aliases into the schema's field names (still model space)."""
    if "action" not in args:
        raise _ParseError("action: field required")
    name = args["action"]
    if not isinstance(name, str):
        raise _ParseError("action: must be a string")
    if name not in _ACTION_ALIASES:
        raise _ParseError(f"unknown action {_short(name)}")
    act, implied = _ACTION_ALIASES[name]
    rest = {k: v for k, v in args.items() if k != "action"}

    if act == "terminate":
        status = rest.pop("status", None)
        if status not in ("success", "failure"):
            raise _ParseError("terminate: status must be 'success' or 'failure'")
        out: dict[str, Any] = {"action": "done" if status == "success" else "fail"}
        out.update(rest)  # anything else is reported as an extra field by the schema
        return out

    out = {"action": act}
    srcs: dict[str, str] = {}

    def _set(_out: dict, key: str, value: Any, source: str) -> None:
        """Set a canonical field; a field given twice (e.g. 'coordinate' and 'x') is an error."""
        if key in srcs:
            first = srcs[key]
            raise _ParseError(f"both {first!r} and {source!r} given" if first != source else f"{key!r} given twice")
        srcs[key] = source
        out[key] = value

    if act == "drag":
        if "start_coordinate" in rest:
            x1, y1 = _point("start_coordinate", rest.pop("start_coordinate"))
            _set(out, "x1", x1, "start_coordinate")
            _set(out, "y1", y1, "start_coordinate")
        if "coordinate" in rest:
            x2, y2 = _point("coordinate", rest.pop("coordinate"))
            _set(out, "x2", x2, "coordinate")
            _set(out, "y2", y2, "coordinate")
        if "x1" not in out and "x1" not in rest:
            raise _ParseError("drag: needs a start point ('start_coordinate' or x1, y1)")
    elif "coordinate" in rest:
        x, y = _point("coordinate", rest.pop("coordinate"))
        _set(out, "x", x, "coordinate")
        _set(out, "y", y, "coordinate")

    if act == "scroll":
        horizontal = name == "hscroll"
        if "pixels" in rest:
            px = rest.pop("pixels")
            if isinstance(px, bool) or not isinstance(px, int):
                raise _ParseError("pixels: must be an integer")
            _set(out, "dx" if horizontal else "dy", px if horizontal else -px, "pixels")
        direction = _pop_one(rest, "direction", "scroll_direction")
        amount = _pop_one(rest, "amount", "scroll_amount")
        if direction is not None:
            if direction not in ("up", "down", "left", "right"):
                raise _ParseError("direction: must be 'up', 'down', 'left' or 'right'")
            if amount is None:
                amount = SCROLL_DEFAULT_CLICKS
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise _ParseError("amount: must be a non-negative integer")
            field = "dy" if direction in ("up", "down") else "dx"
            _set(out, field, -amount if direction in ("up", "left") else amount, "direction")
        elif amount is not None:
            raise _ParseError("amount: given without a direction")
    elif act == "key":
        sources = [k for k in ("keys", "key", "text") if k in rest]
        if len(sources) > 1:
            raise _ParseError(f"key: give one of 'keys', 'key', 'text', not {sources}")
        if sources:
            out["keys"] = _canonical_keys(rest.pop(sources[0]))
    elif act == "wait":
        for alias in ("time", "duration"):
            if alias in rest:
                _set(out, "seconds", rest.pop(alias), alias)

    for k, v in rest.items():
        _set(out, k, v, k)
    for k, v in implied.items():
        if k in out and out[k] != v:
            raise _ParseError(f"{name!r} conflicts with {k}={_short(out[k])}")
        out[k] = v
    return out


def _validate(args: Any, transform: CoordTransform | None, clamped: list[bool] | None = None) -> Action:
    if not isinstance(args, dict):
        raise _ParseError("arguments: must be an object")
    canon = _canonical_args(args)
    for f in COORD_FIELDS:
        if f in canon:
            canon[f] = _finite_number(f, canon[f])
    for f in ("dx", "dy", "seconds", "clicks"):
        if f in canon and isinstance(canon[f], (int, float)) and not isinstance(canon[f], bool):
            _finite_number(f, canon[f])
    if transform is not None:
        for fx, fy in COORD_PAIRS:
            if fx in canon and fy in canon and not transform.in_model_bounds(canon[fx], canon[fy]):
                raise _ParseError(
                    f"coordinates outside the image: ({canon[fx]:g}, {canon[fy]:g}) not in "
                    f"[0, {transform.model_w:g}] x [0, {transform.model_h:g}]"
                )
        if clamped is not None:
            clamped[0] = any(
                transform.would_clamp(canon[fx], canon[fy]) for fx, fy in COORD_PAIRS if fx in canon and fy in canon
            )
        canon = transform.action_to_screen(canon)
    model = _MODELS[ActionType(canon["action"])]
    try:
        return model.model_validate(canon, strict=True)
    except ValidationError as e:
        errs = e.errors(include_url=False, include_input=False)
        first = errs[0]
        loc = ".".join(str(p) for p in first["loc"])
        msg = str(first["msg"])
        msg = msg[:1].lower() + msg[1:]
        more = f" (+{len(errs) - 1} more)" if len(errs) > 1 else ""
        raise _ParseError(f"{loc}: {msg}{more}" if loc else f"{msg}{more}") from None


def parse_arguments(args: Any, transform: CoordTransform | None = None) -> tuple[Action | None, str | None]:
    """An already-decoded arguments object (e.g. a Claude computer-use `tool_use` input) -> (Action in screen
    pixels, None), or (None, short reason). The same aliases and checks as `parse_response`; never raises."""
    try:
        return _validate(args, transform), None
    except _ParseError as e:
        return None, str(e)[:MAX_ERROR_CHARS] or "parse error"
    except Exception as e:  # noqa: BLE001 - a parser bug must become an error string, not a crash
        return None, f"internal parser error: {type(e).__name__}: {e}"[:MAX_ERROR_CHARS]


def _from_call(obj: Any, transform: CoordTransform | None, clamped: list[bool] | None = None) -> tuple[dict, Action]:
    """A decoded tool call -> (raw arguments, Action)."""
    if not isinstance(obj, dict):
        raise _ParseError("tool call: must be a JSON object")
    if "name" not in obj:
        raise _ParseError("tool call: 'name' missing")
    if obj["name"] != TOOL_NAME:
        raise _ParseError(f"unknown tool {_short(obj['name'])}")
    extra = [k for k in obj if k not in ("name", "arguments")]
    if extra:
        raise _ParseError(f"tool call: unexpected key {_short(extra[0])}")
    if "arguments" not in obj:
        raise _ParseError("tool call: 'arguments' missing")
    args = obj["arguments"]
    if not isinstance(args, dict):
        raise _ParseError("arguments: must be an object")
    return args, _validate(args, transform, clamped)


def _strip_end(s: str) -> str:
    s = s.strip()
    changed = True
    while changed:
        changed = False
        for tok in _END_TOKENS:
            if s.endswith(tok):
                s = s[: -len(tok)].rstrip()
                changed = True
    return s


def _fallback(text: str, transform: CoordTransform | None, clamped: list[bool]) -> tuple[dict, Action] | None:
    """The first bare JSON object that is a tool call or an arguments object, if any."""
    pos, tries = 0, 0
    while tries < MAX_FALLBACK_TRIES:
        i = text.find("{", pos)
        if i < 0:
            return None
        tries += 1
        pos = i + 1
        try:
            obj, _ = _DECODER.raw_decode(text, i)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and "name" in obj and "arguments" in obj:
            return _from_call(obj, transform, clamped)
        if isinstance(obj, dict) and "action" in obj:
            return obj, _validate(obj, transform, clamped)
    return None


def parse_response(text: str, transform: CoordTransform | None = None, *, allow_fallback: bool = False) -> ParseResult:
    """Parse model text into a screen-space Action, or a `ParseResult` with `error` set. Never raises.

    >>> from agents.coords import CoordTransform
    >>> text = ('Action: Click OK\\n<tool_call>\\n'
    ...         '{"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [500, 500]}}')
    >>> parse_response(text, CoordTransform.for_qwen3(1920, 1080)).action
    Click(action='click', x=960.0, y=540.0, button='left', clicks=1)
    >>> parse_response("I will click OK.").error
    'no <tool_call> block'
    """
    res = ParseResult(None, None, None, None, None, False)
    try:
        _parse_into(res, text, transform, allow_fallback)
    except _ParseError as e:
        res.action, res.error = None, str(e)[:MAX_ERROR_CHARS] or "parse error"
    except Exception as e:  # noqa: BLE001 - a parser bug must become an error string, not a crash
        res.action = None
        res.error = f"internal parser error: {type(e).__name__}: {e}"[:MAX_ERROR_CHARS]
    return res


def _parse_into(res: ParseResult, text: Any, transform: CoordTransform | None, allow_fallback: bool) -> None:
    if not isinstance(text, str):
        raise _ParseError(f"response is not a string ({type(text).__name__})")
    if len(text) > MAX_RESPONSE_CHARS:
        raise _ParseError(f"response too long ({len(text)} chars > {MAX_RESPONSE_CHARS})")

    clamped = [False]
    body = text
    i, c = text.find(THINK_OPEN), text.find(CALL_OPEN)
    if i >= 0 and (c < 0 or i < c):  # a thinking block opens before any tool call
        j = text.find(THINK_CLOSE, i)
        if j < 0:
            raise _ParseError("unclosed <thinking> block")
        res.thought = text[i + len(THINK_OPEN) : j].strip()
        body = text[j + len(THINK_CLOSE) :]

    n_open = body.count(CALL_OPEN)
    start = body.find(CALL_OPEN)
    head = body if start < 0 else body[:start]
    for line in head.splitlines():
        if line.strip().startswith("Action:"):
            res.action_desc = line.strip()[len("Action:") :].strip()
            break

    if n_open == 0:
        if CALL_CLOSE in body:
            raise _ParseError("</tool_call> without <tool_call>")
        if allow_fallback:
            found = _fallback(body, transform, clamped)
            if found is not None:
                res.raw_args, res.action = found
                res.fallback, res.clamped = True, clamped[0]
                return
            raise _ParseError("no <tool_call> block and no bare JSON action")
        raise _ParseError("no <tool_call> block")
    if n_open > 1:
        raise _ParseError(f"multiple <tool_call> blocks ({n_open})")
    after = body[start + len(CALL_OPEN) :]
    n_close = body.count(CALL_CLOSE)
    if n_close > 1:
        raise _ParseError(f"multiple </tool_call> tags ({n_close})")
    if n_close == 1:
        k = after.find(CALL_CLOSE)
        if k < 0:
            raise _ParseError("</tool_call> before <tool_call>")
        payload, tail = after[:k], after[k + len(CALL_CLOSE) :]
        if _strip_end(tail):
            raise _ParseError("unexpected text after </tool_call>")
    else:
        payload = _strip_end(after)  # generation stopped on </tool_call>
    payload = payload.strip()
    if not payload:
        raise _ParseError("empty <tool_call> block")
    obj = _loads(payload)
    if isinstance(obj, dict) and isinstance(obj.get("arguments"), dict):
        res.raw_args = obj["arguments"]
    _, res.action = _from_call(obj, transform, clamped)
    res.clamped = clamped[0]
