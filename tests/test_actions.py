"""The action-text layer: schema, coordinate transforms, model format round trips, parse
errors, and the compilers (pyautogui / computer_13 strings checked without executing anything;
miniwob on a real Chromium)."""

from __future__ import annotations

import ast
import json
import math
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from agents.actions import (
    ACTION_ADAPTER,
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
    action_from_dict,
    action_to_json,
)
from agents.compile import (
    UnsupportedAction,
    miniwob_key,
    normalize_key,
    normalize_keys,
    to_computer13,
    to_miniwob,
    to_pyautogui,
)
from agents.coords import CoordSpace, CoordTransform, claude_scaled_size, qwen_smart_resize
from agents.parsing import MAX_RESPONSE_CHARS, ParseResult, action_text_for_history, format_response, parse_response

SW, SH = 1920, 1080

TRANSFORMS = {
    CoordSpace.SCREEN: CoordTransform.identity(SW, SH),
    CoordSpace.ABSOLUTE: CoordTransform.for_qwen25(SW, SH, max_pixels=1280 * 28 * 28),  # 1316x728
    CoordSpace.RELATIVE1000: CoordTransform.for_qwen3(SW, SH),
    CoordSpace.SCALED: CoordTransform.for_claude(SW, SH),
}

SAMPLES = [
    Click(x=412, y=230),
    Click(x=0, y=0, button="right", clicks=2),
    Click(x=SW - 1, y=SH - 1, button="middle", clicks=3),
    DoubleClick(x=100.5, y=200.25),
    RightClick(x=1500, y=900),
    Move(x=960, y=540),
    Drag(x1=10, y1=20, x2=1800, y2=1000),
    Scroll(x=500, y=400, dy=3),
    Scroll(x=500, y=400, dx=-2, dy=-5),
    Type(text='he said "hi" \'there\'\n\\ path C:\\temp ünïcode 🙂 {"json": 1} </tool_call>'),
    Key(keys=["enter"]),
    Key(keys=["ctrl", "shift", "t"]),
    Wait(),
    Wait(seconds=2.5),
    Done(),
    Fail(),
]


def _coord_tol(t: CoordTransform) -> tuple[float, float]:
    """Rounding to whole model units moves a point by at most half a unit in screen pixels."""
    if t.space == CoordSpace.SCREEN:
        return 0.5, 0.5
    return 0.5 * SW / t.model_w + 1e-6, 0.5 * SH / t.model_h + 1e-6


def _assert_close(a, b, tol=(1e-6, 1e-6)):
    da, db = a.model_dump(), b.model_dump()
    assert da.keys() == db.keys()
    for k in da:
        if k in ("x", "x1", "x2"):
            assert abs(da[k] - db[k]) <= tol[0], (k, da, db)
        elif k in ("y", "y1", "y2"):
            assert abs(da[k] - db[k]) <= tol[1], (k, da, db)
        else:
            assert da[k] == db[k], (k, da, db)


# ---------------------------------------------------------------------------------------------
# schema


def test_every_action_type_has_a_sample():
    assert {a.type for a in SAMPLES} == set(ActionType)


def test_schema_validates_and_rejects():
    assert action_from_dict({"action": "click", "x": 1, "y": 2}) == Click(x=1, y=2)
    for a in SAMPLES:
        assert action_from_dict(json.loads(action_to_json(a))) == a
    bad = [
        {"action": "click", "x": 1},  # y missing
        {"action": "click", "x": 1, "y": 2, "foo": 3},  # extra field
        {"action": "click", "x": float("nan"), "y": 2},
        {"action": "click", "x": 1e6, "y": 2},
        {"action": "click", "x": 1, "y": 2, "clicks": 4},
        {"action": "scroll", "x": 1, "y": 2, "dy": 51},
        {"action": "type", "text": ""},
        {"action": "type", "text": "x" * 513},
        {"action": "key", "keys": []},
        {"action": "key", "keys": ["a"] * 5},
        {"action": "wait", "seconds": 61},
        {"action": "jump"},
    ]
    for d in bad:
        with pytest.raises(ValidationError):
            ACTION_ADAPTER.validate_python(d)


# ---------------------------------------------------------------------------------------------
# coordinates


def test_qwen_smart_resize_known_values():
    assert qwen_smart_resize(1080, 1920, factor=32) == (736, 1312)  # slime's OSWorld setting
    assert qwen_smart_resize(1080, 1920, factor=28, max_pixels=12845056) == (1092, 1932)
    assert qwen_smart_resize(1080, 1920, factor=28) == (728, 1316)
    assert qwen_smart_resize(210, 160, factor=28) == (224, 168)
    assert qwen_smart_resize(10, 10, factor=28) == (56, 56)  # up to min_pixels
    with pytest.raises(ValueError):
        qwen_smart_resize(10, 3000)


@settings(max_examples=1000, deadline=None, derandomize=True, database=None)
@given(
    h=st.integers(1, 5000),
    w=st.integers(1, 5000),
    factor=st.sampled_from([28, 32]),
    max_pixels=st.sampled_from([28 * 28 * 1280, 1003520, 12845056, 2_000_000]),
)
def test_qwen_smart_resize_matches_transformers(h, w, factor, max_pixels):
    ref = pytest.importorskip("transformers.models.qwen2_vl.image_processing_pil_qwen2_vl")
    if max(h, w) / min(h, w) > 200:
        return
    got = qwen_smart_resize(h, w, factor=factor, max_pixels=max_pixels)
    assert got == ref.smart_resize(h, w, factor=factor, min_pixels=56 * 56, max_pixels=max_pixels)
    assert got[0] % factor == 0 and got[1] % factor == 0


def test_qwen25_default_is_the_released_processor_config():
    t = CoordTransform.for_qwen25(SW, SH)
    assert (t.image_w, t.image_h) == (1932, 1092)  # 12845056 max pixels: upscaled to multiples of 28
    assert (TRANSFORMS[CoordSpace.ABSOLUTE].image_w, TRANSFORMS[CoordSpace.ABSOLUTE].image_h) == (1316, 728)


def test_claude_scaled_size():
    w, h = claude_scaled_size(1920, 1080)
    assert max(w, h) <= 1568 and w * h <= 1_150_000 and abs(w / h - 1920 / 1080) < 0.01
    assert claude_scaled_size(1024, 768) == (1024, 768)


@pytest.mark.parametrize("space", list(CoordSpace))
def test_transform_round_trip(space):
    t = TRANSFORMS[space]
    for x, y in [(0, 0), (412, 230), (SW - 1, SH - 1), (960.5, 540.25)]:
        mx, my = t.to_model(x, y)
        assert t.in_model_bounds(mx, my)
        sx, sy = t.to_screen(mx, my)
        assert math.isclose(sx, x, abs_tol=1e-9) and math.isclose(sy, y, abs_tol=1e-9)
    d = t.action_to_screen(t.action_to_model(Drag(x1=1, y1=2, x2=3, y2=4)))
    assert [round(d[k], 9) for k in ("x1", "y1", "x2", "y2")] == [1, 2, 3, 4]
    assert t.action_to_screen({"action": "type", "text": "x"}) == {"action": "type", "text": "x"}


def test_transform_scales_and_clamps():
    t = TRANSFORMS[CoordSpace.RELATIVE1000]
    assert t.to_screen(500, 500) == (960.0, 540.0)
    assert t.to_screen(1000, 1000) == (SW - 1, SH - 1)  # clamped onto the screen
    assert t.would_clamp(1000, 1000) and not t.would_clamp(500, 500)
    assert t.to_screen(-5, 2000) == (0.0, SH - 1)
    q = CoordTransform(CoordSpace.ABSOLUTE, 1920, 1080, 1312, 736)
    assert q.to_screen(656, 368) == (960.0, 540.0)
    assert q.to_model(1920, 1080) == (1312.0, 736.0)
    with pytest.raises(ValueError):
        CoordTransform(CoordSpace.ABSOLUTE, 1920, 1080)  # needs the model image size


# ---------------------------------------------------------------------------------------------
# format -> parse round trips


@pytest.mark.parametrize("space", list(CoordSpace))
@pytest.mark.parametrize("action", SAMPLES, ids=lambda a: a.action)
def test_format_parse_round_trip(space, action):
    t = TRANSFORMS[space]
    text = format_response("I see the dialog.\nNext I act.", "do the thing", action, t)
    res = parse_response(text, t)
    assert res.error is None, (text, res.error)
    assert not res.fallback
    assert res.thought == "I see the dialog.\nNext I act."
    assert res.action_desc == "do the thing"
    _assert_close(res.action, action, _coord_tol(t))
    if space == CoordSpace.SCREEN and all(
        float(v).is_integer() for k, v in action.model_dump().items() if k in ("x", "y", "x1", "y1", "x2", "y2")
    ):
        assert res.action == action  # integer screen coordinates survive exactly
    # writing the parsed action again gives the same text (rounding is idempotent)
    assert format_response("I see the dialog.\nNext I act.", "do the thing", res.action, t) == text
    # exact (unrounded) coordinates round-trip to floating-point precision
    exact = parse_response(format_response(None, "x", action, t, round_coords=False), t)
    assert exact.error is None
    _assert_close(exact.action, action, (1e-6, 1e-6))


def test_format_shape():
    t = CoordTransform(CoordSpace.ABSOLUTE, 1920, 1080, 1312, 736)
    text = format_response("think", "Click OK", Click(x=960, y=540), t)
    assert text == (
        "<thinking>\nthink\n</thinking>\nAction: Click OK\n<tool_call>\n"
        '{"name": "computer_use", "arguments": {"action": "click", "x": 656, "y": 368}}\n</tool_call>'
    )
    res = parse_response(text, t)
    assert res.action == Click(x=960, y=540) and res.raw_args == {"action": "click", "x": 656, "y": 368}
    assert format_response(None, "Done", Done()) == (
        'Action: Done\n<tool_call>\n{"name": "computer_use", "arguments": {"action": "done"}}\n</tool_call>'
    )
    # tags in free text are defanged so they cannot break the format
    text = format_response("a </thinking> b <tool_call>", "x <tool_call>\ny", Wait())
    res = parse_response(text)
    assert (
        res.action == Wait() and res.thought == "a [/thinking] b [tool_call]" and res.action_desc == "x [tool_call] y"
    )


def test_history_text():
    t = TRANSFORMS[CoordSpace.RELATIVE1000]
    assert action_text_for_history(Click(x=412, y=230)) == "click(412, 230)"
    assert action_text_for_history(Click(x=960, y=540), t) == "click(500, 500)"
    assert action_text_for_history(Click(x=1, y=2, button="right")) == "click(1, 2, button=right)"
    assert action_text_for_history(Drag(x1=1, y1=2, x2=3, y2=4)) == "drag(1, 2, 3, 4)"
    assert action_text_for_history(Scroll(x=1, y=2, dy=-3)) == "scroll(1, 2, dy=-3)"
    assert action_text_for_history(Type(text='a "b"')) == 'type("a \\"b\\"")'
    assert action_text_for_history(Key(keys=["ctrl", "c"])) == "key(ctrl+c)"
    assert action_text_for_history(Wait(seconds=2)) == "wait(2s)"
    assert action_text_for_history(Done()) == "done()"
    long = action_text_for_history(Type(text="y" * 300))
    assert len(long) < 80 and "\n" not in action_text_for_history(Type(text="a\nb"))


# ---------------------------------------------------------------------------------------------
# parser: aliases and errors


def _call(args, close=True) -> str:
    body = json.dumps({"name": "computer_use", "arguments": args})
    return f"Action: x\n<tool_call>\n{body}\n" + ("</tool_call>" if close else "")


@pytest.mark.parametrize(
    "args, expected",
    [
        ({"action": "left_click", "coordinate": [10, 20]}, Click(x=10, y=20)),
        ({"action": "click", "x": 10, "y": 20, "button": "right"}, Click(x=10, y=20, button="right")),
        ({"action": "middle_click", "coordinate": [10, 20]}, Click(x=10, y=20, button="middle")),
        ({"action": "triple_click", "coordinate": [10, 20]}, Click(x=10, y=20, clicks=3)),
        ({"action": "double_click", "coordinate": [10, 20]}, DoubleClick(x=10, y=20)),
        ({"action": "right_click", "coordinate": [10, 20]}, RightClick(x=10, y=20)),
        ({"action": "mouse_move", "coordinate": [10, 20]}, Move(x=10, y=20)),
        ({"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [3, 4]}, Drag(x1=1, y1=2, x2=3, y2=4)),
        ({"action": "scroll", "coordinate": [5, 6], "pixels": -3}, Scroll(x=5, y=6, dy=3)),
        ({"action": "hscroll", "coordinate": [5, 6], "pixels": 2}, Scroll(x=5, y=6, dx=2)),
        ({"action": "scroll", "coordinate": [5, 6], "direction": "up"}, Scroll(x=5, y=6, dy=-5)),
        (
            {"action": "scroll", "coordinate": [5, 6], "scroll_direction": "right", "scroll_amount": 2},
            Scroll(x=5, y=6, dx=2),
        ),
        ({"action": "key", "keys": "ctrl+a"}, Key(keys=["ctrl", "a"])),
        ({"action": "key", "keys": ["Control", "Shift", "T"]}, Key(keys=["ctrl", "shift", "t"])),
        ({"action": "key", "keys": ["ctrl+c"]}, Key(keys=["ctrl", "c"])),
        ({"action": "key", "keys": "ctrl++"}, Key(keys=["ctrl", "+"])),
        ({"action": "key", "key": "Return"}, Key(keys=["enter"])),
        ({"action": "key", "text": "Page_Down"}, Key(keys=["pagedown"])),
        ({"action": "wait", "time": 2}, Wait(seconds=2)),
        ({"action": "wait", "duration": 0.5}, Wait(seconds=0.5)),
        ({"action": "terminate", "status": "success"}, Done()),
        ({"action": "terminate", "status": "failure"}, Fail()),
    ],
)
def test_aliases(args, expected):
    res = parse_response(_call(args))
    assert res.error is None and res.action == expected and res.raw_args == args


def test_missing_close_tag_is_fine_and_end_tokens_are_ignored():
    assert parse_response(_call({"action": "done"}, close=False)).action == Done()
    assert parse_response(_call({"action": "done"}) + "<|im_end|>\n").action == Done()
    assert parse_response(_call({"action": "done"}, close=False) + "<|im_end|>").action == Done()


@pytest.mark.parametrize(
    "text, reason",
    [
        ("I will click the OK button.", "no <tool_call> block"),
        ("", "no <tool_call> block"),
        ("<tool_call>\n{not json}\n</tool_call>", "invalid JSON"),
        ("<tool_call>\n</tool_call>", "empty <tool_call> block"),
        (_call({"action": "jump"}), "unknown action 'jump'"),
        (_call({"action": "click", "y": 3}), "x: field required"),
        (_call({"action": "click", "x": 1, "y": 2, "why": "ok"}), "why: extra inputs are not permitted"),
        (_call({"action": "click", "x": "1", "y": 2}), "x: must be a number"),
        (_call({"action": "click", "x": True, "y": 2}), "x: must be a number"),
        (_call({"action": "click", "x": 1e300, "y": 2}), "x: number too large"),
        (_call({"action": "click", "coordinate": [1, 2, 3]}), "coordinate: must be a list [x, y]"),
        (_call({"action": "click", "coordinate": [1, 2], "x": 5, "y": 2}), "both 'coordinate' and 'x' given"),
        (_call({"action": "left_click_drag", "coordinate": [1, 2]}), "drag: needs a start point"),
        (_call({"action": "key", "keys": ["hyper"]}), "unknown key 'hyper'"),
        (_call({"action": "key", "keys": 5}), "keys: must be a string or a list of strings"),
        (_call({"action": "terminate", "status": "maybe"}), "terminate: status must be"),
        (_call({"action": "scroll", "coordinate": [1, 2], "direction": "sideways"}), "direction: must be"),
        (_call({"action": "type", "text": ""}), "text: string should have at least 1 character"),
        (_call({"action": "click", "x": 1, "y": 2}) + "\nand then more", "unexpected text after </tool_call>"),
        (_call({"action": "done"}) + _call({"action": "done"}), "multiple <tool_call> blocks (2)"),
        ('<tool_call>{"name": "bash", "arguments": {"cmd": "rm -rf /"}}</tool_call>', "unknown tool 'bash'"),
        ('<tool_call>{"name": "computer_use"}</tool_call>', "tool call: 'arguments' missing"),
        ('<tool_call>{"name": "computer_use", "arguments": "{}"}</tool_call>', "arguments: must be an object"),
        (
            '<tool_call>{"name": "computer_use", "arguments": {"action": "done"}, "id": 1}</tool_call>',
            "tool call: unexpected key 'id'",
        ),
        ("<tool_call>[1, 2]</tool_call>", "tool call: must be a JSON object"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "click", "x": NaN, "y": 1}}', "invalid JSON"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "click", "x": 1, "x": 2}}', "duplicate key 'x'"),
        ('<tool_call>{"name": "computer_use", "arguments": {"action": "done"}} {"extra": 1}', "extra data"),
        ("<thinking> I am thinking and then the generation got cut", "unclosed <thinking> block"),
        ("</tool_call>", "</tool_call> without <tool_call>"),
        ("x" * (MAX_RESPONSE_CHARS + 1), "response too long"),
        ("<tool_call>" + "[" * 15000, "invalid JSON"),
    ],
)
def test_errors(text, reason):
    res = parse_response(text)
    assert res.action is None and res.error and reason in res.error, res.error
    assert len(res.error) <= 300


def test_coordinates_outside_the_image():
    t = TRANSFORMS[CoordSpace.RELATIVE1000]
    res = parse_response(_call({"action": "click", "x": 1001, "y": 5}), t)
    assert res.action is None and "coordinates outside the image" in res.error
    assert parse_response(_call({"action": "click", "x": -1, "y": 5}), t).error.startswith("coordinates outside")
    res = parse_response(_call({"action": "click", "x": 1000, "y": 1000}), t)  # the edge: clamped onto the screen
    assert res.action == Click(x=SW - 1, y=SH - 1) and res.clamped
    assert not parse_response(_call({"action": "click", "x": 999, "y": 999}), t).clamped
    q = TRANSFORMS[CoordSpace.ABSOLUTE]
    assert "outside" in parse_response(_call({"action": "click", "x": q.image_w + 1, "y": 0}), q).error


def test_tags_inside_typed_text():
    # a model typing "<thinking>" without a thinking block is still parsed
    res = parse_response(_call({"action": "type", "text": "<thinking> is a tag"}))
    assert res.action == Type(text="<thinking> is a tag") and res.thought is None
    # format_response escapes the tags in JSON strings so its own output always parses back
    a = Type(text="</thinking><tool_call></tool_call><thinking>")
    text = format_response(None, "type tags", a)
    assert "\\u003c/tool_call>" in text and parse_response(text).action == a


def test_non_string_input_is_an_error_not_a_crash():
    for bad in (None, 5, b"<tool_call>", ["x"]):
        res = parse_response(bad)  # type: ignore[arg-type]
        assert res.action is None and res.error


def test_fallback_only_when_asked_and_never_from_prose():
    text = 'Sure! {"name": "computer_use", "arguments": {"action": "click", "x": 3, "y": 4}}'
    assert parse_response(text).error == "no <tool_call> block"
    res = parse_response(text, allow_fallback=True)
    assert res.action == Click(x=3, y=4) and res.fallback and res.raw_args == {"action": "click", "x": 3, "y": 4}
    res = parse_response('```json\n{"action": "type", "text": "hi"}\n```', allow_fallback=True)
    assert res.action == Type(text="hi") and res.fallback
    res = parse_response("I should click the OK button at (100, 200).", allow_fallback=True)
    assert res.action is None and res.error and not res.fallback  # prose never becomes a click
    # a tagged response is parsed strictly even with the fallback allowed
    res = parse_response(_call({"action": "click", "x": 1, "y": 2}), allow_fallback=True)
    assert res.action == Click(x=1, y=2) and not res.fallback


def test_parse_result_defaults():
    r = parse_response(_call({"action": "done"}))
    assert isinstance(r, ParseResult) and r.ok and r.thought is None and r.action_desc == "x"


# ---------------------------------------------------------------------------------------------
# keys


def test_normalize_keys():
    assert normalize_keys(["Return"]) == ["enter"]
    assert normalize_keys(["Control", "A"]) == ["ctrl", "a"]
    assert normalize_keys(["A"]) == ["A"]
    assert normalize_keys(["cmd", "shift", "ArrowUp"]) == ["win", "shift", "up"]
    assert normalize_keys(["Escape", "Page-Up", "F11", " "]) == ["esc", "pageup", "f11", "space"]
    for bad in ("hyper", "f25", "\x00", ""):
        with pytest.raises(UnsupportedAction):
            normalize_key(bad)


# ---------------------------------------------------------------------------------------------
# compilers: OSWorld


def test_to_pyautogui():
    assert to_pyautogui(Click(x=412.4, y=229.6)) == "pyautogui.click(x=412, y=230)"
    assert (
        to_pyautogui(Click(x=1, y=2, button="right", clicks=2)) == "pyautogui.click(x=1, y=2, button='right', clicks=2)"
    )
    assert to_pyautogui(DoubleClick(x=1, y=2)) == "pyautogui.doubleClick(x=1, y=2)"
    assert to_pyautogui(RightClick(x=1, y=2)) == "pyautogui.rightClick(x=1, y=2)"
    assert to_pyautogui(Move(x=1, y=2)) == "pyautogui.moveTo(1, 2)"
    assert (
        to_pyautogui(Drag(x1=1, y1=2, x2=3, y2=4))
        == "pyautogui.moveTo(1, 2); pyautogui.dragTo(3, 4, duration=0.5, button='left')"
    )
    assert to_pyautogui(Scroll(x=5, y=6, dy=3)) == "pyautogui.scroll(-3, x=5, y=6)"  # down = negative
    assert to_pyautogui(Scroll(x=5, y=6, dx=2)) == "pyautogui.hscroll(2, x=5, y=6)"
    assert (
        to_pyautogui(Scroll(x=5, y=6, dx=-1, dy=-2)) == "pyautogui.scroll(2, x=5, y=6); pyautogui.hscroll(-1, x=5, y=6)"
    )
    assert to_pyautogui(Type(text="hello")) == "pyautogui.write('hello')"
    assert to_pyautogui(Key(keys=["Return"])) == "pyautogui.press('enter')"
    assert to_pyautogui(Key(keys=["ctrl", "a"])) == "pyautogui.hotkey('ctrl', 'a')"
    assert (to_pyautogui(Wait()), to_pyautogui(Done()), to_pyautogui(Fail())) == ("WAIT", "DONE", "FAIL")
    for a in SAMPLES:  # every non-special output is valid Python made only of pyautogui calls
        s = to_pyautogui(a)
        if s in ("WAIT", "DONE", "FAIL"):
            continue
        for stmt in ast.parse(s).body:
            assert isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call)
            assert ast.unparse(stmt.value.func).startswith("pyautogui.")


NASTY_TEXTS = [
    "it's",
    'say "hi"',
    "back\\slash",
    "new\nline",
    "tab\tand\rcr",
    "'''",
    '"""',
    "\\'; import os; os.system('x') #",
    "'); import os; os.system('rm -rf /'); ('",
    "\x00nul",
    "ünïcode 🙂 \u202e rtl",
    "{}",
    "\\",
    "\\\\'",
    "\n",
]


def _assert_single_call_literal(src: str, func: str, text: str):
    tree = ast.parse(src, mode="exec")
    assert len(tree.body) == 1
    expr = tree.body[0]
    assert isinstance(expr, ast.Expr) and isinstance(expr.value, ast.Call)
    call = expr.value
    assert ast.unparse(call.func) == func and not call.keywords and len(call.args) == 1
    assert isinstance(call.args[0], ast.Constant) and call.args[0].value == text


@pytest.mark.parametrize("text", NASTY_TEXTS)
def test_pyautogui_escaping(text):
    _assert_single_call_literal(to_pyautogui(Type(text=text)), "pyautogui.write", text)


@settings(
    max_examples=300, deadline=None, derandomize=True, database=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.text(min_size=1, max_size=512))
def test_pyautogui_escaping_property(text):
    _assert_single_call_literal(to_pyautogui(Type(text=text)), "pyautogui.write", text)


def test_to_computer13():
    assert to_computer13(Click(x=1.4, y=2)) == {
        "action_type": "CLICK",
        "parameters": {"button": "left", "x": 1, "y": 2, "num_clicks": 1},
    }
    assert to_computer13(DoubleClick(x=1, y=2)) == {"action_type": "DOUBLE_CLICK", "parameters": {"x": 1, "y": 2}}
    assert to_computer13(RightClick(x=1, y=2)) == {"action_type": "RIGHT_CLICK", "parameters": {"x": 1, "y": 2}}
    assert to_computer13(Move(x=1, y=2)) == {"action_type": "MOVE_TO", "parameters": {"x": 1, "y": 2}}
    assert to_computer13(Drag(x1=1, y1=2, x2=3, y2=4)) == [
        {"action_type": "MOVE_TO", "parameters": {"x": 1, "y": 2}},
        {"action_type": "DRAG_TO", "parameters": {"x": 3, "y": 4}},
    ]
    assert to_computer13(Scroll(x=5, y=6, dx=1, dy=3)) == [
        {"action_type": "MOVE_TO", "parameters": {"x": 5, "y": 6}},
        {"action_type": "SCROLL", "parameters": {"dx": 1, "dy": -3}},
    ]  # vscroll > 0 is up
    assert to_computer13(Type(text="a'b")) == {"action_type": "TYPING", "parameters": {"text": "a'b"}}
    assert to_computer13(Key(keys=["Return"])) == {"action_type": "PRESS", "parameters": {"key": "enter"}}
    assert to_computer13(Key(keys=["ctrl", "S"])) == {"action_type": "HOTKEY", "parameters": {"keys": ["ctrl", "s"]}}
    assert (to_computer13(Wait()), to_computer13(Done()), to_computer13(Fail())) == ("WAIT", "DONE", "FAIL")
    for a in SAMPLES:  # JSON-serialisable, as the env server sends it
        json.dumps(to_computer13(a))


# ---------------------------------------------------------------------------------------------
# compilers: MiniWoB


def test_miniwob_key_names():
    assert miniwob_key(["enter"]) == "<Enter>"
    assert miniwob_key(["ctrl", "a"]) == "C-a"
    assert miniwob_key(["shift", "a"]) == "A"
    assert miniwob_key(["Tab"]) == "<Tab>"
    assert miniwob_key(["alt", "ctrl", "delete"]) == "A-C-<Delete>"
    assert miniwob_key(["ctrl", "alt", "delete"]) == "A-C-<Delete>"  # miniwob's prefix order
    with pytest.raises(UnsupportedAction):
        miniwob_key(["ctrl", "a", "b"])
    with pytest.raises(UnsupportedAction):
        miniwob_key(["printscreen"])


@pytest.fixture
def miniwob_env():
    if not (os.path.exists("/usr/bin/chromium") and os.path.exists("/usr/bin/chromedriver")):
        pytest.skip("chromium not installed")
    os.environ.setdefault("MINIWOB_CHROME_BINARY", "/usr/bin/chromium")
    os.environ.setdefault("MINIWOB_CHROMEDRIVER", "/usr/bin/chromedriver")
    import gymnasium as gym
    import miniwob

    gym.register_envs(miniwob)
    envs = []

    def make(name):
        env = gym.make(name)
        envs.append(env)
        return env

    yield make
    for env in envs:
        env.close()


def _center(obs, pred):
    el = next(e for e in obs["dom_elements"] if pred(e))
    return float(el["left"][0] + el["width"][0] / 2), float(el["top"][0] + el["height"][0] / 2)


@pytest.mark.browser
def test_miniwob_click_and_type_on_real_env(miniwob_env):
    from miniwob.action import ActionTypes

    env = miniwob_env("miniwob/enter-text-v1")
    obs, _ = env.reset(seed=0)
    u = env.unwrapped
    cfg = u.action_space_config
    target = dict(obs["fields"])["target"]

    # unit checks of the compiled dicts on the real action space
    [a] = to_miniwob(Click(x=10, y=20), u)
    assert cfg.action_types[a["action_type"]] == ActionTypes.CLICK_COORDS and list(a["coords"]) == [10, 20]
    chunks = to_miniwob(Type(text="x" * 150), u)
    assert [len(c["text"]) for c in chunks] == [64, 64, 22]
    assert all(cfg.action_types[c["action_type"]] == ActionTypes.TYPE_TEXT for c in chunks)
    [k] = to_miniwob(Key(keys=["ctrl", "a"]), u)
    assert cfg.allowed_keys[k["key"]] == "C-a"
    assert cfg.action_types[to_miniwob(Wait(), u)[0]["action_type"]] == ActionTypes.NONE
    assert len(to_miniwob(Scroll(x=1, y=2, dy=-3), u)) == 3
    for bad in (
        RightClick(x=1, y=2),
        Drag(x1=1, y1=2, x2=3, y2=4),
        Key(keys=["ctrl", "z"]),
        Scroll(x=1, y=2, dx=1),
        Click(x=1, y=2, button="right"),
        Done(),
        Fail(),
    ):
        with pytest.raises(UnsupportedAction):
            to_miniwob(bad, u)

    # and a real episode: click the field, type the target, press submit
    ix, iy = _center(obs, lambda e: e["tag"] == "input_text")
    bx, by = _center(obs, lambda e: e["tag"] == "button")
    for action in (Click(x=ix, y=iy), Type(text=target), Click(x=bx, y=by)):
        for mw in to_miniwob(action, u):
            obs, reward, terminated, truncated, info = env.step(mw)
    assert terminated and reward > 0, info


@pytest.mark.browser
def test_miniwob_click_test(miniwob_env):
    env = miniwob_env("miniwob/click-test-v1")
    obs, _ = env.reset(seed=1)
    x, y = _center(obs, lambda e: e["tag"] == "button")
    text = format_response("The button is there.", "Click the button", Click(x=x, y=y))
    res = parse_response(text)
    [mw] = to_miniwob(res.action, env.unwrapped)
    _, reward, terminated, _, _ = env.step(mw)
    assert terminated and reward > 0


def test_module_doctests():
    import doctest

    import agents.coords
    import agents.parsing

    for mod in (agents.coords, agents.parsing):
        assert doctest.testmod(mod).failed == 0, mod.__name__
