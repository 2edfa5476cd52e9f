"""`flywheel import slime PATH`: the slime OSWorld cookbook's SFT records into the lake as episodes and steps.

    res = import_slime(Path("osworld_reasoning_sft_v1.jsonl"), lake)                 # coordinates: image pixels
    res = import_slime(path, lake, coords=(1920, 1080))                              # coordinates: a 1920x1080 screen

The format (THUDM/slime, examples/osworld/tools/curate_reasoning_sft.py; docs/IMPORTS.md) is one JSON record per
line, one whole trajectory each: ``messages`` (``{role, content}``, content a string: a system prompt, then user
turns whose ``<image>`` placeholders take the next entry of ``images`` in order, and assistant turns
``<thinking>..</thinking>\\nAction: ..\\n<tool_call>{"name": "computer_use", "arguments": {...}}</tool_call>``),
``images`` (base64 PNG data URIs), ``reward``, ``task_id``, ``num_steps``, ``source_dataset``, ``quality_rank`` and
``metadata`` (``instruction``, ``domain``, ...).

Each assistant turn becomes one step: its screen is the newest image shown before it (slime drops the image of a
turn whose screen did not change), and its text is read by agents.parsing.parse_response, the student's own
strict JSON reader (never executed). A turn without a readable tool call (slime keeps thinking-only turns of
failed teacher runs) is kept with parse_ok false and the reason.

Coordinates. slime never rescales: the model sees a resized screenshot and its coordinates run unchanged on the
VM (shared/research/osworld_slime.md). We do not copy that. Every point goes through one CoordTransform into the
pixels of the step's own image (the lake's screen space), from a declared space: ``image`` (the default: pixels
of the image the turn shows, which is what both of slime's sources hold), ``relative1000`` (Qwen3-VL's 0..1000),
or ``(W, H)`` (pixels of a WxH screen, e.g. VM pixels stored with downscaled images). A point outside the
declared space is a parse error with the reason, never clamped onto the screen.

Episode ids hash the record's content, so a rerun (or the same record twice) adds nothing. The SFT record holds no
screen after the last action, so these episodes have no final row.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from pathlib import Path
from typing import Any, Union

from agents.coords import CoordSpace, CoordTransform
from agents.parsing import CALL_CLOSE, CALL_OPEN, parse_response
from flywheel.interop.common import ImportError_, ImportResult, import_records, imported_episode, png_size
from storage.lake import Lake

RUN_KEY = "import-slime"
POLICY = "slime-import"
IMAGE_TAG = "<image>"
Coords = Union[str, tuple[int, int]]  # "image" | "relative1000" | (W, H)


def parse_coords(text: str) -> Coords:
    """The --coords option: 'image', 'relative1000' or 'WxH' (e.g. 1920x1080)."""
    if text in ("image", "relative1000"):
        return text
    m = re.fullmatch(r"(\d{1,5})x(\d{1,5})", text.strip())
    if not m or int(m.group(1)) == 0 or int(m.group(2)) == 0:
        raise ImportError_(f"--coords {text!r}: use 'image', 'relative1000' or a screen size WxH like 1920x1080")
    return int(m.group(1)), int(m.group(2))


def transform(coords: Coords, w: int, h: int) -> CoordTransform:
    """Declared coordinate space -> pixels of a w x h image (the step's screen in the lake)."""
    if coords == "image":
        return CoordTransform.identity(w, h)
    if coords == "relative1000":
        return CoordTransform.for_qwen3(w, h)
    W, H = coords  # type: ignore[misc]
    return CoordTransform(CoordSpace.ABSOLUTE, w, h, W, H)


def _png(uri: Any, where: str) -> bytes:
    if not isinstance(uri, str):
        raise ImportError_(f"{where}: not a base64 image string")
    data = uri.split(",", 1)[1] if uri.startswith("data:") else uri
    try:
        png = base64.b64decode(data, validate=True)
        png_size(png)
    except (binascii.Error, ValueError):
        raise ImportError_(f"{where}: not a base64 PNG (expected data:image/png;base64,...)") from None
    return png


def _instruction(rec: dict, messages: list[dict]) -> str | None:
    meta = rec.get("metadata")
    if isinstance(meta, dict) and isinstance(meta.get("instruction"), str) and meta["instruction"]:
        return meta["instruction"]
    for m in messages:  # slime's observation text: "[Task]\n<instruction>\n\n[Accessibility Tree]..."
        if m["role"] == "user" and "[Task]" in m["content"]:
            return m["content"].split("[Task]", 1)[1].strip().split("\n\n", 1)[0].strip() or None
    return None


def _with_pointer(text: str, pointer: list[float] | None) -> tuple[str, str | None]:
    """A scroll without a coordinate scrolls where the pointer is (pyautogui.scroll without x, y): the last point
    the trajectory clicked, written into the call. Returns (text to parse, error)."""
    i = text.find(CALL_OPEN)
    j = text.find(CALL_CLOSE, i + 1) if i >= 0 else -1
    if i < 0:
        return text, None
    body = text[i + len(CALL_OPEN) : j if j >= 0 else len(text)]
    try:
        call = json.loads(body)
        args = call["arguments"]
        is_bare_scroll = args.get("action") == "scroll" and "coordinate" not in args and "x" not in args
    except (ValueError, TypeError, KeyError, AttributeError):
        return text, None  # the strict parser gives the reason
    if not is_bare_scroll:
        return text, None
    if pointer is None:
        return text, "scroll without a coordinate before any click (the pointer position is unknown)"
    call["arguments"] = {**args, "coordinate": pointer}
    return text[:i] + CALL_OPEN + "\n" + json.dumps(call) + "\n" + (text[j:] if j >= 0 else CALL_CLOSE), None


def _check(path: Path, n: int, rec: Any) -> tuple[str, list[dict], list[Any]]:
    where = f"{path}:{n}"
    if not isinstance(rec, dict) or not isinstance(rec.get("messages"), list) or not rec["messages"]:
        raise ImportError_(f"{where}: not a slime SFT record (needs a non-empty 'messages' list)")
    if not isinstance(rec.get("task_id"), str) or not rec["task_id"]:
        raise ImportError_(f"{where}: 'task_id' missing")
    images = rec.get("images", [])
    if not isinstance(images, list):
        raise ImportError_(f"{where}: 'images' must be a list of base64 PNG data URIs")
    for k, m in enumerate(rec["messages"]):
        if (
            not isinstance(m, dict)
            or m.get("role") not in ("system", "user", "assistant")
            or not isinstance(m.get("content"), str)
        ):
            raise ImportError_(f"{where}: messages[{k}] needs a role (system, user or assistant) and string content")
    tags = sum(m["content"].count(IMAGE_TAG) for m in rec["messages"] if m["role"] == "user")
    if tags != len(images):
        raise ImportError_(
            f"{where}: the user turns hold {tags} {IMAGE_TAG} placeholders but 'images' has {len(images)} entries"
        )
    if not any(m["role"] == "assistant" for m in rec["messages"]):
        raise ImportError_(f"{where}: no assistant turn")
    return where, rec["messages"], images


def record_rows(path: Path, n: int, rec: Any, coords: Coords, git_sha: str | None) -> tuple[dict, list[dict]]:
    """One slime record -> (episode row, step rows). Raises ImportError_ naming the file and line."""
    where, messages, images = _check(path, n, rec)
    eid = hashlib.sha1(("slime|" + json.dumps(rec, sort_keys=True)).encode()).hexdigest()[:16]
    k_img, screen, size, pointer = 0, None, None, None
    steps, n_bad = [], 0
    for k, m in enumerate(messages):
        if m["role"] == "user":
            for _ in range(m["content"].count(IMAGE_TAG)):
                screen = _png(images[k_img], f"{where}: images[{k_img}]")
                size = png_size(screen)
                k_img += 1
            continue
        if m["role"] != "assistant":
            continue
        text, err = _with_pointer(m["content"], pointer)
        t = transform(coords, *size) if size else None
        res = parse_response(text, t)
        if err is None and size is None:
            err = "no screenshot before this turn (no <image> in an earlier user turn)"
        err = err or res.error
        action = res.action if err is None else None
        if action is not None and isinstance(res.raw_args, dict) and "coordinate" in res.raw_args:
            pointer = res.raw_args["coordinate"]
        steps.append(
            dict(
                episode_id=eid,
                step_idx=len(steps),
                is_final=False,
                screenshot=screen,
                screen_w=size[0] if size else None,
                screen_h=size[1] if size else None,
                ui_text=None,
                prompt_context=json.dumps(
                    {"source": "slime", "message": k, "coords": coords if isinstance(coords, str) else "%dx%d" % coords}
                ),
                response_text=m["content"],
                thought=res.thought,
                action_desc=res.action_desc,
                raw_action=json.dumps(res.raw_args) if res.raw_args is not None else None,
                action=action.model_dump_json() if action is not None else None,
                parse_ok=err is None,
                parse_error=err,
                fallback_parse=False,
                exec_error=None,
                run_key=RUN_KEY,
                git_sha=git_sha,
                config_hash=None,
            )
        )
        n_bad += err is not None
    reward = rec.get("reward")
    reward = float(reward) if isinstance(reward, (int, float)) and not isinstance(reward, bool) else None
    meta = rec.get("metadata") if isinstance(rec.get("metadata"), dict) else {}
    ep = imported_episode(
        episode_id=eid,
        task_id=rec["task_id"],
        seed=0,
        instruction=_instruction(rec, messages),
        env="osworld",
        env_version=f"slime osworld sft ({meta.get('domain') or 'unknown domain'})",
        policy=POLICY,
        policy_version=str(rec.get("source_dataset") or "unknown"),
        task_reward=reward,
        success=reward is not None and reward >= 1.0,
        n_steps=len(steps),
        n_parse_errors=n_bad,
        run_key=RUN_KEY,
        git_sha=git_sha,
    )
    return ep, steps


def import_slime(
    path: Path, lake: Lake, *, coords: Coords = "image", iteration: int = 0, git_sha: str | None = None
) -> ImportResult:
    """Every record of a slime SFT JSON Lines file into the lake (stage 'import'); already imported ones skipped."""
    path = Path(path)
    if not path.is_file():
        raise ImportError_(f"{path}: not a slime SFT file (JSON Lines of {{messages, images, reward, task_id}})")
    return import_records(
        path, lake, lambda p, n, rec: record_rows(p, n, rec, coords, git_sha), run_key=RUN_KEY, iteration=iteration
    )
