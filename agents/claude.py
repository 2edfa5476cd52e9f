"""The Claude computer-use teacher: a `Policy` on the official `anthropic` SDK, for any `GuiEnv`.

    policy = ClaudePolicy(model="claude-sonnet-4-6", thinking_budget=1024)   # key: $ANTHROPIC_API_KEY only
    policy.reset("click-button", 3)
    d = policy.act(obs, history=[])   # Decision(action=Click(...), thought=<extended thinking>, extra={cost...})

Facts from Anthropic's computer-use tool docs
(https://platform.claude.com/docs/en/agents-and-tools/tool-use/computer-use-tool):

- tool ``computer_20251124`` with beta header ``computer-use-2025-11-24`` for Claude Opus 4.7, Opus 4.6,
  Sonnet 4.6 and Opus 4.5; ``computer_20250124`` with ``computer-use-2025-01-24`` for Sonnet 4.5, Haiku 4.5,
  Opus 4.1, Sonnet 4 and Opus 4 (`tool_version_for` picks by model name).
- Claude writes ``tool_use`` blocks named ``computer`` whose input has an ``action``: ``screenshot``,
  ``left_click``, ``right_click``, ``middle_click``, ``double_click``, ``triple_click``, ``mouse_move``,
  ``left_click_drag`` (start_coordinate, coordinate), ``scroll`` (coordinate, scroll_direction,
  scroll_amount), ``type`` (text), ``key`` (text, xdotool names like "ctrl+a", "Return"), ``wait``
  (duration), ``hold_key``, ``left_mouse_down``/``left_mouse_up``, ``cursor_position``, ``zoom``.
- Images above 1568 px on the long edge or about 1.15 megapixels are downscaled by the API (aspect kept),
  so we send the screenshot already scaled by that one factor (`agents.coords.claude_scaled_size`), declare
  that size as ``display_width_px``/``display_height_px``, and map Claude's coordinates back to screen pixels
  with the exact inverse (`CoordTransform.for_claude`). slime's cookbook skipped this step (its clicks on a
  1920x1080 VM used the coordinates of a smaller image).

Mapping into the closed action schema (agents/actions.py): every action that has a counterpart goes through
`agents.parsing.parse_arguments` (the same aliases and bounds checks as the student's parser). ``screenshot``
and ``cursor_position`` are answered inside `act` (no env step). The task ends with our ``finish`` tool
(status done/fail) or with a turn that calls no tool (done). Anything else (``zoom``, ``hold_key``, mouse
down/up, a click holding modifier keys, another tool) becomes a recorded parse error that Claude is told
about in the next tool_result; nothing crashes and nothing is executed as code.

Usage and dollars: each API reply's usage is priced with the config's table (`Price`), summed per step in
`Decision.extra` and written to the lake by flywheel.runtime.episode. The SDK retries 408/409/429/5xx (529 =
overloaded) with exponential backoff and honours retry-after; what still fails becomes one `ClaudeError`
line. The API key is read from $ANTHROPIC_API_KEY only and is never stored on this object's repr, in
errors (they are scrubbed) or in any lake row.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from agents.actions import Action, Done, Fail
from agents.base import Decision, Policy, StepRecord
from agents.coords import CLAUDE_MAX_LONG_EDGE, CLAUDE_MAX_PIXELS, CoordTransform
from agents.parsing import format_response, parse_arguments
from envs.base import Observation

log = logging.getLogger(__name__)

DOC_URL = "https://platform.claude.com/docs/en/agents-and-tools/tool-use/computer-use-tool"
API_KEY_ENV = "ANTHROPIC_API_KEY"
BETA_FOR_TOOL = {"computer_20251124": "computer-use-2025-11-24", "computer_20250124": "computer-use-2025-01-24"}
# Models the docs list for computer_20251124; every other model gets computer_20250124.
NEW_TOOL_MODELS = ("claude-opus-4-7", "claude-opus-4-6", "claude-sonnet-4-6", "claude-opus-4-5")
COMPUTER_TOOL = "computer"
FINISH_TOOL = "finish"
INTERNAL_ACTIONS = ("screenshot", "cursor_position")  # answered here: no env step
MAX_INTERNAL_CALLS = 4  # API calls per step while Claude only asks for screenshots
_DESC_CHARS = 120

FINISH_TOOL_DEF = {
    "name": FINISH_TOOL,
    "description": "End the task. status 'done' once the task is complete, 'fail' if it cannot be done.",
    "input_schema": {
        "type": "object",
        "properties": {
            "status": {"type": "string", "enum": ["done", "fail"]},
            "reason": {"type": "string", "description": "One sentence: why the task is done or impossible."},
        },
        "required": ["status"],
    },
}


class ClaudeError(RuntimeError):
    """The Claude API could not be used (bad key, unknown model, retries exhausted): one clear line."""


class _Secret:
    """Holds the API key; masked in reprs, so vars(), a debugger or a traceback shows '***'."""

    __slots__ = ("value",)

    def __init__(self, value: str):
        self.value = value

    def __repr__(self) -> str:
        return "'***'"

    __str__ = __repr__


def tool_version_for(model: str) -> str:
    return "computer_20251124" if model.startswith(NEW_TOOL_MODELS) else "computer_20250124"


@dataclass(frozen=True)
class Price:
    """USD per million tokens (Anthropic's pricing page): base input, output, 5-minute cache write, cache read."""

    input: float
    output: float
    cache_write: float
    cache_read: float

    def cost(self, usage: dict[str, Any]) -> float:
        u = {
            k: int(usage.get(k) or 0)
            for k in ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        }
        return (
            u["input_tokens"] * self.input
            + u["output_tokens"] * self.output
            + u["cache_creation_input_tokens"] * self.cache_write
            + u["cache_read_input_tokens"] * self.cache_read
        ) / 1e6


def price_for(model: str, prices: dict[str, Any]) -> Price:
    """The price of `model`: the table entry with the longest name prefix of it; ClaudeError if none."""
    keys = sorted((k for k in prices if model.startswith(k)), key=len, reverse=True)
    if not keys:
        raise ClaudeError(
            f"no price for Claude model {model!r} in claude.prices (known: {', '.join(sorted(prices))}); "
            "add one so cost and budget can be tracked"
        )
    p = prices[keys[0]]
    p = p if isinstance(p, dict) else p.model_dump() if hasattr(p, "model_dump") else vars(p)
    return Price(float(p["input"]), float(p["output"]), float(p["cache_write"]), float(p["cache_read"]))


def api_key() -> str | None:
    return os.environ.get(API_KEY_ENV) or None


def _png_scaled(png: bytes, w: int, h: int) -> bytes:
    from PIL import Image

    with Image.open(io.BytesIO(png)) as im:
        if im.size == (w, h):
            return png
        buf = io.BytesIO()
        im.convert("RGB").resize((w, h), Image.LANCZOS).save(buf, format="PNG")
        return buf.getvalue()


def _image_block(png: bytes) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode("ascii")},
    }


def _first_sentence(text: str) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    for stop in (". ", "! ", "? "):
        i = line.find(stop)
        if 0 < i < _DESC_CHARS:
            line = line[: i + 1]
    return line[:_DESC_CHARS].rstrip()


def _describe(inp: dict[str, Any]) -> str:
    act = str(inp.get("action", "?"))
    where = inp.get("coordinate")
    return (
        f"{act.replace('_', ' ')} at ({where[0]}, {where[1]})"
        if isinstance(where, list) and len(where) == 2
        else act.replace("_", " ")
    )


def map_tool_use(name: str, inp: Any, transform: CoordTransform) -> tuple[Action | None, str | None]:
    """One tool_use block -> (Action in screen pixels, None) or (None, reason). Never raises."""
    if name == FINISH_TOOL:
        status = inp.get("status") if isinstance(inp, dict) else None
        if status in ("done", "fail"):
            return (Done() if status == "done" else Fail()), None
        return None, "finish: status must be 'done' or 'fail'"
    if name != COMPUTER_TOOL:
        return None, f"unknown tool {str(name)[:40]!r}"
    if not isinstance(inp, dict) or not isinstance(inp.get("action"), str):
        return None, "computer: input needs a string 'action'"
    act = inp["action"]
    if act in ("zoom", "hold_key", "left_mouse_down", "left_mouse_up"):
        return None, f"unknown action {act!r}: not in this environment's action set"
    args = dict(inp)
    if act in ("left_click", "right_click", "middle_click", "double_click", "triple_click") and args.get("text"):
        return None, f"{act} while holding keys ({str(args['text'])[:20]!r}) is not supported"
    if act not in ("type", "key"):
        args.pop("text", None)  # an empty modifier string on a click
    if act == "wait" and "duration" not in args:
        args["duration"] = 1.0
    return parse_arguments(args, transform)


class ClaudePolicy(Policy):
    """Claude drives the env through the computer-use tool; one env step per `act` call."""

    name = "claude"

    def __init__(
        self,
        model: str,
        *,
        prices: dict[str, Any],
        base_url: str | None = None,
        max_tokens: int = 2048,
        thinking_budget: int | None = None,
        tool_version: str = "auto",
        history_images: int = 3,
        max_retries: int = 4,
        timeout_s: float = 120.0,
        max_long_edge: int = CLAUDE_MAX_LONG_EDGE,
        max_pixels: int = CLAUDE_MAX_PIXELS,
        client: Any = None,
    ):
        import anthropic

        self.model = self.version = model
        self.tool_version = tool_version_for(model) if tool_version == "auto" else tool_version
        if self.tool_version not in BETA_FOR_TOOL:
            raise ClaudeError(
                f"unknown computer-use tool version {tool_version!r}; use one of {', '.join(BETA_FOR_TOOL)}"
            )
        self.beta = BETA_FOR_TOOL[self.tool_version]
        self.price = price_for(model, prices)
        self.max_tokens, self.thinking_budget = max_tokens, thinking_budget
        self.history_images = history_images
        self.max_long_edge, self.max_pixels = max_long_edge, max_pixels
        self.base_url = base_url
        key = api_key()
        self._secret = _Secret(key) if key else None  # only to scrub error text
        if client is None and key is None:
            raise ClaudeError(f"the Claude teacher needs an API key: set {API_KEY_ENV} in the environment")
        self._client = client or anthropic.Anthropic(
            api_key=key, base_url=base_url, max_retries=max_retries, timeout=timeout_s
        )
        self.reset("", 0)

    def __repr__(self) -> str:
        return (
            f"ClaudePolicy(model={self.model!r}, tool={self.tool_version!r}, base_url={self.base_url!r}, "
            f"api_key={'***' if self._secret else None})"
        )

    def reset(self, task_id: str, seed: int) -> None:
        self._messages: list[dict[str, Any]] = []
        self._pending: list[str] = []  # tool_use ids of the last assistant turn, awaiting tool_results
        self._pointer: tuple[float, float] | None = None  # last pointer position (Claude's space)

    def close(self) -> None:
        try:
            self._client.close()
        except Exception:  # noqa: BLE001
            pass

    # ---- one step ---------------------------------------------------------------------------
    def act(self, obs: Observation, history: list[StepRecord]) -> Decision:
        t = CoordTransform.for_claude(
            obs.width, obs.height, max_long_edge=self.max_long_edge, max_pixels=self.max_pixels
        )
        shot = _image_block(_png_scaled(obs.screenshot_png, int(t.image_w), int(t.image_h)))
        if not history or not self._messages:
            self.reset("", 0)
            self._messages.append(
                {"role": "user", "content": [{"type": "text", "text": f"Task: {obs.instruction}"}, shot]}
            )
        else:
            self._messages.append({"role": "user", "content": self._results(history[-1], shot)})
        usage_total: dict[str, int] = {}
        cost, raws = 0.0, []
        t0 = time.perf_counter()
        for _ in range(MAX_INTERNAL_CALLS):
            resp = self._call(t)
            usage = resp.get("usage") or {}
            for k, v in usage.items():
                if isinstance(v, int):
                    usage_total[k] = usage_total.get(k, 0) + v
            cost += self.price.cost(usage)
            raws.append(resp)
            content = [b for b in resp.get("content") or [] if isinstance(b, dict)]
            self._messages.append({"role": "assistant", "content": content or [{"type": "text", "text": "(empty)"}]})
            uses = [b for b in content if b.get("type") == "tool_use"]
            self._pending = [str(b.get("id")) for b in uses]
            if (
                uses
                and uses[0].get("name") == COMPUTER_TOOL
                and isinstance(uses[0].get("input"), dict)
                and uses[0]["input"].get("action") in INTERNAL_ACTIONS
            ):
                self._messages.append({"role": "user", "content": self._internal(uses, shot)})
                continue
            decision = self._decide(resp, content, uses, t)
            break
        else:
            decision = Decision(
                response_text="", action=None, parse_error=f"no action after {MAX_INTERNAL_CALLS} screenshot requests"
            )
        decision.latency_ms = (time.perf_counter() - t0) * 1000
        decision.prompt_tokens = sum(
            usage_total.get(k, 0) for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
        )
        decision.completion_tokens = usage_total.get("output_tokens", 0)
        decision.extra.update(
            cost_usd=cost,
            input_tokens=usage_total.get("input_tokens", 0),
            output_tokens=usage_total.get("output_tokens", 0),
            cache_read_tokens=usage_total.get("cache_read_input_tokens", 0),
            cache_write_tokens=usage_total.get("cache_creation_input_tokens", 0),
            api_calls=len(raws),
            raw_response=json.dumps(raws),
        )
        return decision

    def _decide(self, resp: dict, content: list[dict], uses: list[dict], t: CoordTransform) -> Decision:
        thinking = "\n".join(b.get("thinking", "") for b in content if b.get("type") == "thinking").strip()
        text = "\n".join(b.get("text", "") for b in content if b.get("type") == "text").strip()
        thought = thinking or text or None
        if not uses:
            stop = resp.get("stop_reason")
            if stop == "end_turn":  # Claude considers the task finished and calls no tool
                return self._render(thought, _first_sentence(text) or "Finish the task", Done(), None, t)
            return Decision(
                response_text=text, action=None, thought=thought, parse_error=f"no tool call (stop_reason {stop!r})"
            )
        use = uses[0]
        inp = use.get("input")
        action, err = map_tool_use(str(use.get("name")), inp, t)
        desc = _first_sentence(text) or (_describe(inp) if isinstance(inp, dict) else str(use.get("name")))
        if action is not None and len(uses) > 1:
            log.info("Claude sent %d tool calls in one turn; only the first is executed", len(uses))
        return self._render(thought, desc, action, {"name": use.get("name"), "input": inp}, t, err)

    def _render(
        self,
        thought: str | None,
        desc: str,
        action: Action | None,
        call: dict | None,
        t: CoordTransform,
        err: str | None = None,
    ) -> Decision:
        raw = call["input"] if call and isinstance(call.get("input"), dict) else None
        if action is not None:
            text = format_response(thought, desc, action, t)
            if hasattr(action, "x"):
                self._pointer = t.to_model(action.x, action.y)  # type: ignore[attr-defined]
        else:
            body = json.dumps(call, ensure_ascii=False) if call else ""
            text = (f"<thinking>\n{thought}\n</thinking>\n" if thought else "") + f"Action: {desc}\n{body}"
        return Decision(
            response_text=text, action=action, thought=thought, action_desc=desc, raw_action=raw, parse_error=err
        )

    # ---- messages ---------------------------------------------------------------------------
    def _results(self, last: StepRecord, shot: dict) -> list[dict[str, Any]]:
        """tool_result blocks answering the previous turn's tool calls (the first one was the step's action)."""
        if not self._pending:  # the previous turn called no tool (e.g. cut at max_tokens)
            return [{"type": "text", "text": f"Result: {last.result}. Continue with the task."}, shot]
        first, *rest = self._pending
        if last.result.startswith("parse error"):
            out = [
                {
                    "type": "tool_result",
                    "tool_use_id": first,
                    "is_error": True,
                    "content": [{"type": "text", "text": last.result[len("parse error: ") :] + " (not executed)"}],
                }
            ]
            out[0]["content"].append({"type": "text", "text": "The screen is unchanged."})
        elif last.result != "ok":
            out = [
                {"type": "tool_result", "tool_use_id": first, "content": [{"type": "text", "text": last.result}, shot]}
            ]
        else:
            out = [{"type": "tool_result", "tool_use_id": first, "content": [shot]}]
        out += [
            {
                "type": "tool_result",
                "tool_use_id": i,
                "is_error": True,
                "content": [{"type": "text", "text": "not executed: one action per turn"}],
            }
            for i in rest
        ]
        return out

    def _internal(self, uses: list[dict], shot: dict) -> list[dict[str, Any]]:
        first, *rest = uses
        if first["input"]["action"] == "screenshot":
            content: list[dict] = [shot]
        else:
            x, y = self._pointer or (0, 0)
            content = [{"type": "text", "text": f"X={round(x)},Y={round(y)}"}]
        out = [{"type": "tool_result", "tool_use_id": str(first.get("id")), "content": content}]
        out += [
            {
                "type": "tool_result",
                "tool_use_id": str(u.get("id")),
                "is_error": True,
                "content": [{"type": "text", "text": "not executed: one action per turn"}],
            }
            for u in rest
        ]
        return out

    def _trimmed(self) -> list[dict[str, Any]]:
        """The conversation with only the last `history_images` screenshots kept (older ones become a note)."""
        seen, out = 0, []
        for msg in reversed(self._messages):
            if msg["role"] == "user" and isinstance(msg["content"], list):
                content = []
                for block in reversed(msg["content"]):
                    block, seen = self._trim_block(block, seen)
                    content.append(block)
                msg = {**msg, "content": list(reversed(content))}
            out.append(msg)
        return list(reversed(out))

    def _trim_block(self, block: dict, seen: int) -> tuple[dict, int]:
        if block.get("type") == "image":
            seen += 1
            return (
                block if seen <= self.history_images else {"type": "text", "text": "[older screenshot removed]"}
            ), seen
        if block.get("type") == "tool_result" and isinstance(block.get("content"), list):
            inner = []
            for b in reversed(block["content"]):
                b, seen = self._trim_block(b, seen)
                inner.append(b)
            return {**block, "content": list(reversed(inner))}, seen
        return block, seen

    def request(self, t: CoordTransform) -> dict[str, Any]:
        """The keyword arguments of one `client.beta.messages.create` call."""
        tool = {
            "type": self.tool_version,
            "name": COMPUTER_TOOL,
            "display_width_px": int(t.image_w),
            "display_height_px": int(t.image_h),
        }
        system = (
            "You operate a computer through the `computer` tool to complete the user's task. "
            f"The screen is {int(t.image_w)}x{int(t.image_h)} pixels; every screenshot you receive is the "
            "whole screen. Take one action per turn. When the task is complete, call `finish` with status "
            "'done'; if it cannot be done, call `finish` with status 'fail'."
        )
        kw: dict[str, Any] = dict(
            model=self.model,
            max_tokens=self.max_tokens,
            system=system,
            tools=[tool, FINISH_TOOL_DEF],
            messages=self._trimmed(),
            betas=[self.beta],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        )
        if self.thinking_budget:
            kw["thinking"] = {"type": "enabled", "budget_tokens": self.thinking_budget}
        return kw

    def _call(self, t: CoordTransform) -> dict[str, Any]:
        try:
            resp = self._client.beta.messages.create(**self.request(t))
        except Exception as e:  # noqa: BLE001 - every SDK failure becomes one ClaudeError line
            raise self._error(e) from None
        return resp.to_dict(mode="json") if hasattr(resp, "to_dict") else dict(resp)

    def _error(self, e: BaseException) -> ClaudeError:
        return ClaudeError(self._scrub(describe_error(e, self.model, self.base_url)))

    def _scrub(self, text: str) -> str:
        return text.replace(self._secret.value, "***") if self._secret else text


def describe_error(e: BaseException, model: str, base_url: str | None) -> str:
    """One line for an SDK exception: what went wrong and what to do about it."""
    import anthropic

    where = base_url or "https://api.anthropic.com"
    if isinstance(e, anthropic.APIStatusError):
        body = e.body if isinstance(e.body, dict) else {}
        err = body.get("error") if isinstance(body.get("error"), dict) else {}
        kind, msg = err.get("type") or "error", " ".join(str(err.get("message") or e.message).split())[:200]
        code = e.status_code
        if code == 401:
            return f"Claude API rejected the API key (HTTP 401 {kind}: {msg}); set {API_KEY_ENV} to a valid key"
        if code == 403:
            return f"Claude API refused the request (HTTP 403 {kind}: {msg}); check the key's workspace permissions"
        if code == 404:
            return (
                f"unknown Claude model {model!r} (HTTP 404 {kind}: {msg}); set claude.model to a model id from the docs"
            )
        if code == 429 or code >= 500:
            return f"Claude API kept failing (HTTP {code} {kind}: {msg}) after the SDK's retries; try again later"
        return f"Claude API rejected the request (HTTP {code} {kind}: {msg})"
    if isinstance(e, anthropic.APITimeoutError):
        return f"Claude API request to {where} timed out; raise claude.timeout_s"
    if isinstance(e, anthropic.APIConnectionError):
        return f"cannot reach the Claude API at {where} ({type(e).__name__})"
    first = (str(e).strip().splitlines() or [""])[0][:200]
    return f"Claude call failed: {type(e).__name__}: {first}"


def check_claude(model: str, *, base_url: str | None = None, timeout_s: float = 30.0, max_retries: int = 2) -> None:
    """Preflight before a run: the key is set and accepted and the model exists (GET /v1/models/{model}).
    Raises ClaudeError with one line; costs no tokens."""
    import anthropic

    key = api_key()
    if key is None:
        raise ClaudeError(f"bootstrap.policy is 'claude' but {API_KEY_ENV} is not set in the environment")
    with anthropic.Anthropic(api_key=key, base_url=base_url, timeout=timeout_s, max_retries=max_retries) as client:
        try:
            client.models.retrieve(model)
        except Exception as e:  # noqa: BLE001
            raise ClaudeError(describe_error(e, model, base_url).replace(key, "***")) from None
