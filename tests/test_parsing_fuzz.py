"""Property tests: the parser on >= 10,000 generated and mutated model outputs.

Every result is either a valid Action (it re-validates through the schema, and lies on the
screen when a transform is given) with no error, or no action and a short non-empty error.
The parser never raises and never reports an internal error. Derandomized (a fixed seed
per test), so a CI run is reproducible; no example database is written.
"""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agents.actions import (
    ACTION_ADAPTER,
    MAX_KEYS,
    MAX_TYPE_CHARS,
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
from agents.compile import NAMED_KEYS, to_computer13, to_pyautogui
from agents.coords import CoordSpace, CoordTransform
from agents.parsing import (
    CALL_CLOSE,
    CALL_OPEN,
    MAX_RESPONSE_CHARS,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_NAME,
    ParseResult,
    action_arguments,
    format_response,
    parse_response,
)

N_VALID, N_TEXT, N_JSON, N_JUNK = 2000, 3000, 3000, 2000  # 10,000 examples in all
FUZZ = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
)

_counts: dict[str, int] = {}

# ---------------------------------------------------------------------------------------------
# strategies

SCREENS = [(1920, 1080), (1280, 800), (160, 210), (320, 420), (3840, 2160)]


@st.composite
def transforms(draw) -> CoordTransform | None:
    w, h = draw(st.sampled_from(SCREENS))
    space = draw(st.sampled_from([None, *CoordSpace]))
    if space is None:
        return None
    if space == CoordSpace.ABSOLUTE:
        return CoordTransform.for_qwen25(
            w, h, factor=draw(st.sampled_from([28, 32])), max_pixels=draw(st.sampled_from([1003520, 12845056]))
        )
    if space == CoordSpace.SCALED:
        return CoordTransform.for_claude(w, h)
    return CoordTransform(space, w, h)


def _xy(w: int, h: int):
    return (
        st.floats(0, w - 1, allow_nan=False) | st.integers(0, w - 1),
        st.floats(0, h - 1, allow_nan=False) | st.integers(0, h - 1),
    )


KEY_NAMES = sorted(NAMED_KEYS) + list("abcxyzAZ019/-=[];'\\,.`+") + ["Return", "Control", "cmd", "Page_Down"]
TEXTS = st.text(min_size=1, max_size=MAX_TYPE_CHARS) | st.sampled_from(
    ["</tool_call>", '<tool_call>{"name": "computer_use"}', "'); import os #", '"\\', "\n\n", "🙂" * 10]
)


@st.composite
def actions(draw, w: int = 1920, h: int = 1080):
    xs, ys = _xy(w, h)
    kind = draw(
        st.sampled_from(
            ["click", "double_click", "right_click", "move", "drag", "scroll", "type", "key", "wait", "done", "fail"]
        )
    )
    if kind == "click":
        return Click(
            x=draw(xs),
            y=draw(ys),
            button=draw(st.sampled_from(["left", "right", "middle"])),
            clicks=draw(st.integers(1, 3)),
        )
    if kind in ("double_click", "right_click", "move"):
        return {"double_click": DoubleClick, "right_click": RightClick, "move": Move}[kind](x=draw(xs), y=draw(ys))
    if kind == "drag":
        return Drag(x1=draw(xs), y1=draw(ys), x2=draw(xs), y2=draw(ys))
    if kind == "scroll":
        return Scroll(x=draw(xs), y=draw(ys), dx=draw(st.integers(-50, 50)), dy=draw(st.integers(-50, 50)))
    if kind == "type":
        return Type(text=draw(TEXTS))
    if kind == "key":
        return Key(keys=draw(st.lists(st.sampled_from(KEY_NAMES), min_size=1, max_size=MAX_KEYS)))
    if kind == "wait":
        return Wait(seconds=draw(st.floats(0, 60, allow_nan=False)))
    return Done() if kind == "done" else Fail()


@st.composite
def formatted(draw):
    """(text, transform, action) for a valid formatted response."""
    t = draw(transforms())
    w, h = (t.screen_w, t.screen_h) if t else (1920, 1080)
    action = draw(actions(w, h))
    thought = draw(st.none() | st.text(max_size=300))
    desc = draw(st.text(max_size=80))
    return format_response(thought, desc, action, t, round_coords=draw(st.booleans())), t, action


JUNK_FRAGMENTS = [
    CALL_OPEN,
    CALL_CLOSE,
    THINK_OPEN,
    THINK_CLOSE,
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ":",
    ",",
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e400",
    "9" * 400,
    "9" * 5000,
    "\x00",
    "\ufeff",
    "\ud800",
    "🙂",
    "<|im_end|>",
    "Action: click",
    '{"action": "click", "x": 1, "y": 2}',
    "null",
    "true",
    '"computer_use"',
    '"arguments"',
    "\n",
    " " * 50,
    "{" * 300,
    "[" * 3000,
]
JUNK_TEXT = st.sampled_from(JUNK_FRAGMENTS) | st.text(max_size=30)


@st.composite
def text_mutation(draw, text: str) -> str:
    kind = draw(
        st.sampled_from(
            [
                "truncate",
                "flip",
                "insert",
                "delete",
                "dup_slice",
                "drop_tag",
                "dup_block",
                "pad_huge",
                "swap_tags",
                "replace_number",
            ]
        )
    )
    n = len(text)
    i = draw(st.integers(0, n))
    if kind == "truncate":
        return text[:i]
    if kind == "flip":
        if not n:
            return text
        i = min(i, n - 1)
        return text[:i] + draw(st.characters() | st.sampled_from(list('<>{}[]":,\\/'))) + text[i + 1 :]
    if kind == "insert":
        return text[:i] + draw(JUNK_TEXT) + text[i:]
    if kind == "delete":
        j = draw(st.integers(i, n))
        return text[:i] + text[j:]
    if kind == "dup_slice":
        j = draw(st.integers(i, n))
        return text[:j] + text[i:j] + text[j:]
    if kind == "drop_tag":
        return text.replace(draw(st.sampled_from([CALL_OPEN, CALL_CLOSE, THINK_OPEN, THINK_CLOSE])), "")
    if kind == "dup_block":
        a, b = text.find(CALL_OPEN), text.find(CALL_CLOSE)
        return text + "\n" + text[a : b + len(CALL_CLOSE)] if a >= 0 and b >= 0 else text + text
    if kind == "pad_huge":
        return text + draw(st.sampled_from([" ", "{", "x", "9"])) * draw(
            st.integers(MAX_RESPONSE_CHARS - n - 5, MAX_RESPONSE_CHARS - n + 5)
        )
    if kind == "swap_tags":
        return text.replace(CALL_OPEN, "\0").replace(CALL_CLOSE, CALL_OPEN).replace("\0", CALL_CLOSE)
    # replace the first number with something nasty
    for k, ch in enumerate(text):
        if ch.isdigit():
            j = k
            while j < n and (text[j].isdigit() or text[j] in ".eE-+"):
                j += 1
            return (
                text[:k]
                + draw(
                    st.sampled_from(
                        [
                            "NaN",
                            "Infinity",
                            "-Infinity",
                            "1e999",
                            "9" * 5000,
                            "1e308",
                            "-0",
                            "0.0000001",
                            "true",
                            '"1"',
                            "[1, 2]",
                            "null",
                            str(2**64),
                            "1_000",
                        ]
                    )
                )
                + text[j:]
            )
    return text


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(10**30), 10**30)
    | st.floats()
    | st.text(max_size=20)
    | st.sampled_from([0, 1, -1, 999, 1000, 1001, 1e5, 1e5 + 1, -1e-9, 2**53 + 1])
)
JSON_VALUES = st.recursive(
    JSON_SCALARS, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4), max_leaves=12
)
FIELD_NAMES = [
    "action",
    "x",
    "y",
    "x1",
    "y1",
    "x2",
    "y2",
    "dx",
    "dy",
    "text",
    "keys",
    "key",
    "seconds",
    "button",
    "clicks",
    "coordinate",
    "start_coordinate",
    "pixels",
    "direction",
    "amount",
    "status",
    "time",
    "name",
    "arguments",
    "",
    "X",
    "acti0n",
]
ACTION_NAMES = [
    "click",
    "left_click",
    "double_click",
    "right_click",
    "middle_click",
    "triple_click",
    "move",
    "mouse_move",
    "drag",
    "left_click_drag",
    "scroll",
    "hscroll",
    "type",
    "key",
    "wait",
    "done",
    "fail",
    "terminate",
    "jump",
    "CLICK",
    "",
    "answer",
]


@st.composite
def json_mutation(draw, obj: dict) -> object:
    """Mutate a tool call object: keys deleted/renamed/added, values of wrong types, aliases, nesting.

    Mostly the arguments object (where the validators are); sometimes the envelope."""
    obj = json.loads(json.dumps(obj))
    for _ in range(draw(st.integers(1, 3))):
        args = obj.get("arguments") if isinstance(obj, dict) else None
        if isinstance(args, dict) and draw(st.integers(0, 9)) < 8:
            keys = list(args)
            kind = draw(
                st.sampled_from(
                    [
                        "delete",
                        "rename",
                        "wrong_value",
                        "wrong_value",
                        "add",
                        "action_name",
                        "action_name",
                        "coordinate",
                        "alias",
                    ]
                )
            )
            if kind == "delete" and keys:
                del args[draw(st.sampled_from(keys))]
            elif kind == "rename" and keys:
                k = draw(st.sampled_from(keys))
                args[draw(st.sampled_from(FIELD_NAMES) | st.text(max_size=10))] = args.pop(k)
            elif kind == "wrong_value" and keys:
                args[draw(st.sampled_from(keys))] = draw(JSON_SCALARS | JSON_VALUES)
            elif kind == "add":
                args[draw(st.sampled_from(FIELD_NAMES))] = draw(JSON_SCALARS | JSON_VALUES)
            elif kind == "action_name":
                args["action"] = draw(st.sampled_from(ACTION_NAMES) | st.text(max_size=12))
            elif kind == "coordinate":
                args["coordinate"] = draw(st.lists(JSON_SCALARS, max_size=3))
            elif kind == "alias" and "x" in args and "y" in args:  # a valid alias: should still parse
                args["coordinate"] = [args.pop("x"), args.pop("y")]
        elif isinstance(obj, dict):
            keys = list(obj)
            kind = draw(st.sampled_from(["delete", "rename", "wrong_value", "add", "nest", "replace_all"]))
            if kind == "delete" and keys:
                del obj[draw(st.sampled_from(keys))]
            elif kind == "rename" and keys:
                obj[draw(st.sampled_from(FIELD_NAMES) | st.text(max_size=10))] = obj.pop(draw(st.sampled_from(keys)))
            elif kind == "wrong_value" and keys:
                obj[draw(st.sampled_from(keys))] = draw(JSON_VALUES)
            elif kind == "add":
                obj[draw(st.sampled_from(FIELD_NAMES))] = draw(JSON_VALUES)
            elif kind == "nest":
                return draw(st.sampled_from([[obj], {"name": TOOL_NAME, "arguments": [obj]}, {"tool_call": obj}]))
            else:
                return draw(JSON_VALUES)
        else:
            return draw(JSON_VALUES)
    return obj


ARG_DICTS = st.builds(
    lambda name, d: {"action": name, **d},
    st.sampled_from(ACTION_NAMES),
    st.dictionaries(st.sampled_from(FIELD_NAMES[1:]), JSON_SCALARS | JSON_VALUES, max_size=5),
)


# ---------------------------------------------------------------------------------------------
# the property


def check(text: str, transform: CoordTransform | None, allow_fallback: bool, name: str) -> ParseResult:
    _counts[name] = _counts.get(name, 0) + 1
    res = parse_response(text, transform, allow_fallback=allow_fallback)
    assert isinstance(res, ParseResult)
    if res.action is not None:
        assert res.error is None
        again = ACTION_ADAPTER.validate_python(res.action.model_dump())
        assert again == res.action
        ACTION_ADAPTER.validate_json(res.action.model_dump_json())
        if transform is not None:  # executed coordinates lie on the screen
            d = res.action.model_dump()
            for fx, fy in (("x", "y"), ("x1", "y1"), ("x2", "y2")):
                if fx in d:
                    assert 0 <= d[fx] <= transform.screen_w - 1 and 0 <= d[fy] <= transform.screen_h - 1
        to_pyautogui(res.action)  # compiles
        to_computer13(res.action)
        assert res.fallback is False or allow_fallback
    else:
        assert isinstance(res.error, str) and res.error.strip()
        assert len(res.error) <= 300
        assert not res.error.startswith("internal parser error"), res.error
    return res


@settings(max_examples=N_VALID, **FUZZ)
@given(formatted())
def test_valid_responses_parse_back(case):
    text, t, action = case
    res = check(text, t, False, "valid")
    assert res.action is not None, (text, res.error)
    assert res.action.action == action.action
    if t is None or t.space == CoordSpace.SCREEN:
        sx = sy = 0.5 + 1e-6
    else:
        sx, sy = 0.5 * t.screen_w / t.model_w + 1e-6, 0.5 * t.screen_h / t.model_h + 1e-6
    a, b = res.action.model_dump(), action.model_dump()
    for k in a:
        if k in ("x", "x1", "x2"):
            assert abs(a[k] - b[k]) <= sx
        elif k in ("y", "y1", "y2"):
            assert abs(a[k] - b[k]) <= sy
        elif k != "keys":
            assert a[k] == b[k] or (isinstance(a[k], float) and math.isclose(a[k], b[k]))


@settings(max_examples=N_TEXT, **FUZZ)
@given(formatted(), st.data(), st.booleans())
def test_text_mutations(case, data, allow_fallback):
    text, t, _ = case
    for _ in range(data.draw(st.integers(1, 3))):
        text = data.draw(text_mutation(text))
    check(text, t, allow_fallback, "text")


@settings(max_examples=N_JSON, **FUZZ)
@given(formatted(), st.data(), st.booleans(), st.booleans())
def test_json_mutations(case, data, allow_fallback, also_text):
    _, t, action = case
    obj = data.draw(json_mutation({"name": TOOL_NAME, "arguments": action_arguments(action, t)}))
    try:
        payload = json.dumps(obj, allow_nan=True, ensure_ascii=data.draw(st.booleans()))
    except ValueError:  # an int beyond the digit limit: write it by hand
        payload = '{"name": "computer_use", "arguments": {"action": "click", "x": ' + "9" * 5000 + ', "y": 1}}'
    closing = data.draw(st.sampled_from([f"\n{CALL_CLOSE}", CALL_CLOSE, "", f"{CALL_CLOSE}<|im_end|>"]))
    prefix = data.draw(st.sampled_from(["", "Action: x\n", f"{THINK_OPEN}t{THINK_CLOSE}\nAction: y\n"]))
    text = f"{prefix}{CALL_OPEN}\n{payload}{closing}"
    if also_text:
        text = data.draw(text_mutation(text))
    check(text, t, allow_fallback, "json")


@settings(max_examples=N_JUNK, **FUZZ)
@given(
    st.one_of(
        st.text(max_size=400),
        st.lists(JUNK_TEXT, max_size=12).map("".join),
        JSON_VALUES.map(lambda v: f"{CALL_OPEN}{json.dumps(v)}{CALL_CLOSE}"),
        JSON_VALUES.map(lambda v: f"{CALL_OPEN}{json.dumps({'name': TOOL_NAME, 'arguments': v})}{CALL_CLOSE}"),
        ARG_DICTS.map(lambda d: f"{CALL_OPEN}{json.dumps({'name': TOOL_NAME, 'arguments': d})}{CALL_CLOSE}"),
        ARG_DICTS.map(lambda d: f"{CALL_OPEN}{json.dumps({'name': TOOL_NAME, 'arguments': d})}{CALL_CLOSE}"),
        ARG_DICTS.map(json.dumps),  # bare (found only with allow_fallback)
        st.binary(max_size=200).map(lambda b: b.decode("latin-1")),
    ),
    transforms(),
    st.booleans(),
)
def test_generated_junk(text, t, allow_fallback):
    check(text, t, allow_fallback, "junk")


def test_adversarial_inputs_do_bounded_work(monkeypatch):
    """Worst cases near the length bound cost a bounded number of JSON decodes; beyond it, none.

    Counted, not timed (speed is a benchmark's business): each decode is linear in the text, so
    bounding their number bounds the parser's work on any input it accepts.
    """
    import agents.parsing as parsing

    calls = []
    real = parsing._DECODER.raw_decode

    def counting(s, idx=0):
        calls.append(len(s) - idx)
        return real(s, idx)

    monkeypatch.setattr(parsing._DECODER, "raw_decode", counting)
    cases = [
        "{" * (MAX_RESPONSE_CHARS - 1),
        '{"a": [' * 2500,
        CALL_OPEN + "[" * (MAX_RESPONSE_CHARS - 20),
        CALL_OPEN + '{"name": "computer_use", "arguments": {"action": "type", "text": "' + "\\u0041" * 3000 + '"}}',
        (THINK_OPEN + "x") * 2000,
        "Action: " * 2400,
        "9" * (MAX_RESPONSE_CHARS - 1),
        '{"action": "click", "x": ' + "9" * 19000 + "}",
    ]
    for text in cases:
        for fb in (False, True):
            calls.clear()
            res = check(text, None, fb, "adversarial")
            assert res.action is None
            assert len(calls) <= (parsing.MAX_FALLBACK_TRIES if fb else 0) + 1, (text[:40], len(calls))
    calls.clear()
    res = check("x" * 10**7, None, True, "adversarial")  # far beyond the bound: rejected unscanned
    assert res.error.startswith("response too long") and calls == []


def test_zz_example_count():
    """The four property tests above threw >= 10,000 outputs at the parser (when all ran here)."""
    ran = {k for k in ("valid", "text", "json", "junk") if k in _counts}
    if ran != {"valid", "text", "json", "junk"}:
        import pytest

        pytest.skip(f"only {sorted(ran)} ran in this process")
    total = sum(_counts[k] for k in ("valid", "text", "json", "junk"))
    assert total >= 10_000, _counts
