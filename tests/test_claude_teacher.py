"""The Claude computer-use teacher (agents/claude.py) against a local replay of the Anthropic API.

The real `anthropic` SDK talks HTTP to tests/claude_replay.py, which answers with recorded Messages API
exchanges (tests/fixtures/anthropic). These tests call the policy directly with observations; the
browser tests in test_claude_bootstrap.py drive real MiniWoB episodes into the lake.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import traceback

import pytest
from claude_replay import ClaudeReplay, fixture
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

from agents.actions import Click, Done, Drag, Fail, Key, Move, RightClick, Scroll, Type, Wait
from agents.base import StepRecord
from agents.claude import ClaudeError, ClaudePolicy, Price, check_claude, map_tool_use, tool_version_for
from agents.coords import CoordTransform, claude_scaled_size
from configs.loading import parse_config
from configs.models import ClaudeConfig, ConfigError
from envs.base import Observation

KEY = "sk-ant-api03-FAKE-flywheel-3c9e1f7a5b"  # recognisable: must never show up outside the x-api-key header
MODEL = "claude-sonnet-4-6"
PRICES = {k: v.model_dump() for k, v in ClaudeConfig().prices.items()}


def png(w: int, h: int, color=(200, 220, 240)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), color).save(buf, format="PNG")
    return buf.getvalue()


def obs(w: int = 1920, h: int = 1080) -> Observation:
    return Observation(screenshot_png=png(w, h), width=w, height=h, instruction="Click the button.")


@pytest.fixture
def server():
    srv = ClaudeReplay().start()
    yield srv
    srv.stop()


@pytest.fixture
def make_policy(server, monkeypatch):
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    made: list[ClaudePolicy] = []

    def make(**kw) -> ClaudePolicy:
        kw.setdefault("prices", PRICES)
        kw.setdefault("max_retries", 2)
        p = ClaudePolicy(kw.pop("model", MODEL), base_url=server.url, **kw)
        made.append(p)
        return p

    yield make
    for p in made:
        p.close()


def sent_key(req: dict) -> str | None:
    """The key as the SDK sent it: the documented x-api-key header, or a Bearer Authorization header."""
    h = req["headers"]
    return h.get("x-api-key") or (h.get("authorization") or "").removeprefix("Bearer ") or None


def usage_cost(name: str, price: Price) -> float:
    return price.cost(fixture(name)["body"]["usage"])


# ---- coordinates -------------------------------------------------------------------------------

SCREENS = [(160 * k, 210 * k) for k in (1, 2, 4, 8)] + [
    (1024, 768),
    (1280, 800),
    (1366, 768),
    (1920, 1080),
    (2560, 1440),
    (3840, 2160),
]


@pytest.mark.parametrize("w,h", SCREENS)
@settings(max_examples=60, deadline=None)
@given(fx=st.floats(0, 1, allow_nan=False), fy=st.floats(0, 1, allow_nan=False))
def test_points_round_trip_through_claudes_scaled_space(w, h, fx, fy):
    """screen px -> the scaled screenshot Claude sees -> the integer Claude writes -> screen px again."""
    t = CoordTransform.for_claude(w, h)
    sw, sh = claude_scaled_size(w, h)
    assert (t.image_w, t.image_h) == (sw, sh) and sw <= 1568 and sh <= 1568 and sw * sh <= 1_150_000
    x, y = round(fx * (w - 1)), round(fy * (h - 1))
    mx, my = t.to_model(x, y)
    assert t.to_screen(mx, my) == pytest.approx((x, y), abs=1e-6)  # the exact inverse
    bx, by = t.to_screen(round(mx), round(my))  # Claude writes integers on its image
    # one pixel whenever the image is at most 2x smaller than the screen (every size here but 4K, where
    # half a model pixel is 1.34 screen px: rounding, not the transform)
    tol = max(1.0, 0.5 * w / sw + 1e-9)
    assert abs(bx - x) <= tol and abs(by - y) <= max(1.0, 0.5 * h / sh + 1e-9)
    if w <= 2560:
        assert abs(bx - x) <= 1 and abs(by - y) <= 1


def test_tool_version_follows_the_docs_table():
    assert tool_version_for("claude-opus-4-7") == "computer_20251124"
    assert tool_version_for("claude-sonnet-4-6") == "computer_20251124"
    assert tool_version_for("claude-sonnet-4-5-20250929") == "computer_20250124"
    assert tool_version_for("claude-haiku-4-5") == "computer_20250124"


# ---- every Claude action maps to the schema ------------------------------------------------------

T = CoordTransform.for_claude(1920, 1080)  # 1429x804: a real downscale
S = 1920 / 1429, 1080 / 804


@pytest.mark.parametrize(
    "inp, want",
    [
        ({"action": "left_click", "coordinate": [100, 200]}, Click(x=100 * S[0], y=200 * S[1])),
        ({"action": "right_click", "coordinate": [100, 200]}, RightClick(x=100 * S[0], y=200 * S[1])),
        ({"action": "middle_click", "coordinate": [10, 20]}, Click(x=10 * S[0], y=20 * S[1], button="middle")),
        ({"action": "double_click", "coordinate": [10, 20]}, None),  # checked below: DoubleClick
        ({"action": "triple_click", "coordinate": [10, 20]}, Click(x=10 * S[0], y=20 * S[1], clicks=3)),
        ({"action": "mouse_move", "coordinate": [0, 0]}, Move(x=0, y=0)),
        (
            {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [300, 400]},
            Drag(x1=1 * S[0], y1=2 * S[1], x2=300 * S[0], y2=400 * S[1]),
        ),
        (
            {"action": "scroll", "coordinate": [50, 60], "scroll_direction": "down", "scroll_amount": 3},
            Scroll(x=50 * S[0], y=60 * S[1], dy=3),
        ),
        (
            {"action": "scroll", "coordinate": [50, 60], "scroll_direction": "left", "scroll_amount": 2},
            Scroll(x=50 * S[0], y=60 * S[1], dx=-2),
        ),
        ({"action": "type", "text": "hello world"}, Type(text="hello world")),
        ({"action": "key", "text": "ctrl+a"}, Key(keys=["ctrl", "a"])),
        ({"action": "key", "text": "Return"}, Key(keys=["enter"])),
        ({"action": "wait", "duration": 2}, Wait(seconds=2)),
        ({"action": "left_click", "coordinate": [1429, 804]}, Click(x=1919, y=1079)),  # far edge: clamped on screen
    ],
)
def test_claude_actions_map_to_the_schema(inp, want):
    action, err = map_tool_use("computer", inp, T)
    assert err is None, err
    if want is None:
        assert action.action == "double_click" and action.x == pytest.approx(10 * S[0])
    else:
        assert action.model_dump() == pytest.approx(want.model_dump()) if hasattr(want, "x") else action == want


@pytest.mark.parametrize(
    "name, inp, why",
    [
        ("computer", {"action": "zoom", "region": [0, 0, 10, 10]}, "unknown action 'zoom'"),
        ("computer", {"action": "hold_key", "text": "shift", "duration": 1}, "unknown action 'hold_key'"),
        ("computer", {"action": "left_mouse_down"}, "unknown action 'left_mouse_down'"),
        ("computer", {"action": "left_click", "coordinate": [5, 5], "text": "shift"}, "while holding keys"),
        ("computer", {"action": "fly_to_moon"}, "unknown action"),
        ("computer", {"action": "left_click", "coordinate": [2000, 5]}, "outside the image"),
        ("computer", {"action": "key", "text": "hyper+q"}, "unknown key"),
        ("computer", "not a dict", "needs a string 'action'"),
        ("bash", {"command": "rm -rf /"}, "unknown tool 'bash'"),
        ("finish", {"status": "maybe"}, "status must be"),
    ],
)
def test_unknown_or_unsupported_actions_are_errors_not_crashes(name, inp, why):
    action, err = map_tool_use(name, inp, T)
    assert action is None and why in err


def test_finish_maps_to_done_and_fail():
    assert map_tool_use("finish", {"status": "done"}, T) == (Done(), None)
    assert map_tool_use("finish", {"status": "fail", "reason": "no such file"}, T) == (Fail(), None)


# ---- requests, thinking, cost --------------------------------------------------------------------


def test_first_step_request_thinking_and_cost(server, make_policy):
    server.plan("screenshot_first", "click_ct_seed0")
    policy = make_policy(thinking_budget=1024, max_tokens=2048)
    policy.reset("click-test", 0)
    d = policy.act(obs(1280, 1680), [])  # MiniWoB at screenshot_scale 8
    reqs = server.sent()
    assert len(reqs) == 2  # the screenshot request was answered inside act: no env step
    first, second = reqs[0], reqs[1]
    assert first["headers"]["anthropic-beta"] == "computer-use-2025-11-24"
    assert sent_key(first) == KEY and "anthropic-version" in first["headers"]
    body = first["body"]
    assert body["model"] == MODEL and body["thinking"] == {"type": "enabled", "budget_tokens": 1024}
    tool = body["tools"][0]
    assert tool == {"type": "computer_20251124", "name": "computer", "display_width_px": 936, "display_height_px": 1228}
    assert body["tools"][1]["name"] == "finish"
    img = next(b for b in body["messages"][0]["content"] if b["type"] == "image")
    assert Image.open(io.BytesIO(base64.b64decode(img["source"]["data"]))).size == (936, 1228)
    # the second call answers the screenshot tool_use with a screenshot and passes the thinking block back
    msgs = second["body"]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user"]
    assert msgs[1]["content"][0]["type"] == "thinking" and msgs[1]["content"][0]["signature"]
    assert msgs[2]["content"][0]["type"] == "tool_result" and msgs[2]["content"][0]["tool_use_id"] == "toolu_01Scr"
    # the decision: Claude's (176, 830) on the 936x1228 image, in screen pixels
    assert isinstance(d.action, Click)
    assert (d.action.x, d.action.y) == pytest.approx((176 * 1280 / 936, 830 * 1680 / 1228))
    assert d.thought.startswith("The 'Click Me!' button") and d.raw_action == {
        "action": "left_click",
        "coordinate": [176, 830],
    }
    assert d.action_desc == "I'll click the button."
    price = Price(3, 15, 3.75, 0.3)
    assert d.extra["cost_usd"] == pytest.approx(
        usage_cost("screenshot_first", price) + usage_cost("click_ct_seed0", price)
    )
    assert d.extra["api_calls"] == 2 and len(json.loads(d.extra["raw_response"])) == 2
    assert d.completion_tokens == 64 + 141 and d.prompt_tokens == 1890 + 4010 + 1200


def test_errors_are_fed_back_and_the_next_turn_continues(server, make_policy):
    server.plan("zoom_unsupported", "finish_done")
    policy = make_policy()
    d0 = policy.act(obs(), [])
    assert (
        d0.action is None and "unknown action 'zoom'" in d0.parse_error and d0.thought.startswith("The button is small")
    )
    hist = [StepRecord(0, d0.thought, d0.action_desc, None, f"parse error: {d0.parse_error}")]
    d1 = policy.act(obs(), hist)
    assert d1.action == Done()
    result = server.sent()[1]["body"]["messages"][-1]["content"][0]
    assert result["tool_use_id"] == "toolu_02Zoom" and result["is_error"] is True
    assert "zoom" in result["content"][0]["text"]


def test_a_turn_without_a_tool_call_ends_the_episode(server, make_policy):
    server.plan("end_turn_text")
    assert make_policy().act(obs(), []).action == Done()


def test_only_the_last_screenshots_are_resent(server, make_policy):
    server.plan(*["click_ct_seed1"] * 5)
    policy = make_policy(history_images=2)
    hist: list[StepRecord] = []
    for i in range(5):
        d = policy.act(obs(), hist)
        hist.append(StepRecord(i, d.thought, d.action_desc, d.action, "ok"))
    last = json.dumps(server.sent()[-1]["body"]["messages"])
    assert last.count('"type": "image"') == 2 and last.count("[older screenshot removed]") == 3


# ---- failures: retries and one-line errors ------------------------------------------------------


def test_429_529_and_500_are_retried(server, make_policy):
    server.plan("error_rate_limit", "error_overloaded", "error_api_500", "click_ct_seed1")
    d = make_policy(max_retries=3).act(obs(), [])
    assert isinstance(d.action, Click) and len(server.sent()) == 4


def test_retries_run_out_with_one_line(server, make_policy):
    server.plan(*["error_overloaded"] * 3)
    with pytest.raises(ClaudeError) as err:
        make_policy(max_retries=2).act(obs(), [])
    msg = str(err.value)
    assert "HTTP 529 overloaded_error" in msg and "after the SDK's retries" in msg and "\n" not in msg
    assert len(server.sent()) == 3


def test_bad_key_and_unknown_model_are_one_line(server, make_policy, monkeypatch):
    server.plan("error_auth")
    with pytest.raises(
        ClaudeError,
        match=r"rejected the API key \(HTTP 401 authentication_error: invalid x-api-key\); "
        r"set ANTHROPIC_API_KEY",
    ):
        make_policy().act(obs(), [])
    server.plan("error_not_found")
    with pytest.raises(ClaudeError, match=r"unknown Claude model 'claude-sonnet-4-6' \(HTTP 404 not_found_error"):
        make_policy().act(obs(), [])
    assert len(server.sent()) == 2  # 401 and 404 are not retried
    server.model_reply = "error_not_found"
    with pytest.raises(ClaudeError, match="unknown Claude model 'claude-sonnet-9-9'"):
        check_claude("claude-sonnet-9-9", base_url=server.url)
    monkeypatch.delenv("ANTHROPIC_API_KEY")
    with pytest.raises(ClaudeError, match="ANTHROPIC_API_KEY is not set"):
        check_claude(MODEL, base_url=server.url)
    with pytest.raises(ClaudeError, match="set ANTHROPIC_API_KEY in the environment"):
        ClaudePolicy(MODEL, prices=PRICES, base_url=server.url)


def test_config_rules():
    with pytest.raises(ConfigError, match="thinking_budget .* must be below claude.max_tokens"):
        parse_config({"claude": {"thinking_budget": 4096, "max_tokens": 2048}})
    with pytest.raises(ConfigError, match="no entry for claude.model 'gpt-5'"):
        parse_config({"claude": {"model": "gpt-5"}})
    cfg = parse_config({"bootstrap": {"policy": "auto", "budget_usd": 2.5}})
    assert cfg.bootstrap.budget_usd == 2.5


# ---- the key -------------------------------------------------------------------------------------


def test_api_key_never_leaves_the_header(server, make_policy, caplog):
    caplog.set_level(logging.DEBUG)  # the SDK's own debug logging included
    policy = make_policy(max_retries=1)
    seen = [repr(policy), str(vars(policy))]
    for plan in (["error_auth"], ["error_not_found"], ["error_overloaded"] * 2, ["error_invalid_request"]):
        server.plan(*plan)
        with pytest.raises(ClaudeError) as err:
            policy.act(obs(), [])
        seen += [str(err.value), "".join(traceback.format_exception(err.value))]
    server.plan("click_ct_seed1")
    d = policy.act(obs(), [])
    seen += [repr(d), json.dumps(d.extra), d.response_text, caplog.text]
    assert all(sent_key(r) == KEY for r in server.sent())  # it was sent
    leaks = [s[max(0, s.find(KEY) - 150) : s.find(KEY) + 50] for s in seen if KEY in s]
    assert not leaks
    assert "***" in repr(policy)
