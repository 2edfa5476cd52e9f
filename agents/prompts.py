"""The one prompt builder: rollouts, SFT samples and evaluation all call `build_prompt`.

(The slime cookbook trains and evaluates with different prompts; here there is one code path.)

    t = transform_for("qwen3-vl", obs.width, obs.height)
    p = build_prompt(obs.instruction, obs.screenshot_png, obs.ui_text, history, PromptOptions(), t)
    p.messages   # chat messages with {"type": "image"} placeholders, in the order of p.images
    p.images     # PNG bytes: the last K-1 earlier screenshots, then the current one
    sft_messages(p, target_text)   # the same messages + the assistant target (for SFT)

A prompt holds: a system prompt defining the `computer_use` tool and the coordinate
convention, the instruction, older steps as text (thought/action/result), a window of the
last K screenshots, and optionally the UI text view (DOM / accessibility tree) with its
element coordinates rewritten into the model's coordinate space, so a coordinate the model
reads can be written back unchanged.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from agents.base import StepRecord
from agents.coords import CoordSpace, CoordTransform
from agents.parsing import action_text_for_history

_CONVENTION = {
    CoordSpace.SCREEN: "x, y are pixels of the screenshot (origin top-left).",
    CoordSpace.ABSOLUTE: "x, y are pixels of the screenshot as you see it (origin top-left).",
    CoordSpace.RELATIVE1000: "x, y are relative positions from 0 to 1000 (0,0 top-left; 1000,1000 bottom-right).",
    CoordSpace.SCALED: "x, y are pixels of the screenshot as you see it (origin top-left).",
}

_TOOL_DOC = """Tool computer_use(action, ...), one call per reply:
  click(x, y[, button, clicks]) | double_click(x, y) | right_click(x, y) | move(x, y)
  drag(x1, y1, x2, y2) | scroll(x, y, dx, dy) | type(text) | key(keys: list, e.g. ["ctrl","a"])
  wait(seconds) | done() | fail()"""

_FORMAT = (
    "Reply as:\n<thinking>\n...\n</thinking>\nAction: <short description>\n"
    '<tool_call>\n{"name": "computer_use", "arguments": {"action": ..., ...}}\n</tool_call>'
)


@dataclass(frozen=True)
class PromptOptions:
    history_images: int = 1  # K screenshots in the window, the current one included (0 = text only)
    max_text_history: int = 8  # older steps kept as text lines
    use_ui_text: bool = True  # the DOM / accessibility text view (tiny CPU models need it)
    # full adds the tool's action list (pretrained models); none sends no system message (a random-init student
    # learns the format from its data, and a constant 74-token line is ~17% of its every sample)
    system: Literal["compact", "full", "none"] = "compact"
    max_ui_chars: int = 3000
    ui_sizes: bool = True  # each UI line's "[wxh]" box size after its centre (off: ~9 tokens a line fewer)
    # each UI line numbered "[k] ", and an Action line that cites a line cites its number first ("Click [3] button
    # "no" @ (...)"): the copy of the centre keys on a number no other line has (cite_marks)
    ui_marks: bool = False
    # the reply's coordinate space: "native" = the model family's own (transform_for); "screen" = the screenshot's
    # pixels, the numbers the UI text view shows, so pointing at an element is copying its numbers rather than
    # rescaling them (for the embedded random-init student it measured worse: docs/RESULTS.md "Session 37")
    coord_space: Literal["native", "screen"] = "native"

    @classmethod
    def from_student(cls, student: Any) -> PromptOptions:
        """The options a student config sets (configs.models.StudentConfig, or settings that carry its fields): the
        one place rollouts, SFT exports and RL rows read them from, so all three build the same prompt."""
        return cls(
            history_images=student.history_images,
            use_ui_text=student.use_ui_text,
            coord_space=student.coord_space,
            system=student.system_prompt,
            ui_sizes=student.ui_sizes,
            ui_marks=student.ui_marks,
        )


def transform_for(
    arch: str,
    screen_w: int,
    screen_h: int,
    image_size: tuple[int, int] | None = None,
    space: str = "native",
) -> CoordTransform:
    """The coordinate convention of a model family: Qwen3-VL 0-1000 relative; Qwen2.5-VL absolute
    pixels of the resized image (`image_size` = (w, h) the processor produces); 'screen' = identity.
    `space="screen"` (PromptOptions.coord_space) overrides the family's convention with screen pixels."""
    if space == "screen":
        return CoordTransform.identity(screen_w, screen_h)
    if space != "native":
        raise ValueError(f"unknown coordinate space {space!r}: use native or screen")
    if arch == "qwen3-vl":
        return CoordTransform.for_qwen3(screen_w, screen_h)
    if arch == "qwen2.5-vl":
        if image_size:
            return CoordTransform(CoordSpace.ABSOLUTE, screen_w, screen_h, image_size[0], image_size[1])
        return CoordTransform.for_qwen25(screen_w, screen_h)
    if arch == "screen":
        return CoordTransform.identity(screen_w, screen_h)
    raise ValueError(f"unknown model family {arch!r}: use qwen3-vl, qwen2.5-vl or screen")


def system_prompt(opts: PromptOptions, transform: CoordTransform) -> str:
    """The system message's text ("" for `system="none"`: build_prompt then sends no system message)."""
    if opts.system == "none":
        return ""
    lines = ["You operate a computer through the computer_use tool to complete the task.", _CONVENTION[transform.space]]
    if opts.system == "full":
        lines += [_TOOL_DOC, _FORMAT]
    return "\n".join(lines)


_POINT = re.compile(r"@ \((-?\d+(?:\.\d+)?),(-?\d+(?:\.\d+)?)\)(?: \[(\d+(?:\.\d+)?)x(\d+(?:\.\d+)?)\])?")


def ui_text_in_model_space(ui_text: str, transform: CoordTransform) -> str:
    """Rewrite `@ (x,y) [wxh]` element boxes from screen pixels into the model's coordinate space."""
    if transform.space == CoordSpace.SCREEN:
        return ui_text

    def sub(m: re.Match) -> str:
        x, y = transform.to_model(float(m.group(1)), float(m.group(2)))
        out = f"@ ({round(x)},{round(y)})"
        if m.group(3):
            w, h = transform.to_model(float(m.group(3)), float(m.group(4)))
            out += f" [{round(w)}x{round(h)}]"
        return out

    return _POINT.sub(sub, ui_text)


_SIZE = re.compile(r"(@ \(-?\d+(?:\.\d+)?,-?\d+(?:\.\d+)?\)) \[\d+(?:\.\d+)?x\d+(?:\.\d+)?\]")
_MARK = re.compile(r"\[(\d+)\] ")


def prompt_ui_text(ui_text: str, opts: PromptOptions, transform: CoordTransform) -> str:
    """The UI text view as the prompt shows it: in the model's space, without box sizes unless `ui_sizes`, each line
    numbered with `ui_marks`, cut to `max_ui_chars`."""
    ui = ui_text_in_model_space(ui_text, transform)
    if not opts.ui_sizes:
        ui = _SIZE.sub(r"\1", ui)
    if opts.ui_marks:
        ui = "\n".join(f"[{k}] {line}" for k, line in enumerate(ui.split("\n"), 1))
    return ui[: opts.max_ui_chars]


_CITE = re.compile(r"^(Action: \w+ )(?!\[\d+\] )(.+? @ \(-?\d+,-?\d+\))", re.M)


def cite_marks(reply: str, ui_text: str | None, opts: PromptOptions, transform: CoordTransform) -> str:
    """A target reply for a prompt with `ui_marks`: its Action line, when it cites a line of the prompt's UI text,
    gets that line's number before the cited text ('Action: Click button "no" @ (106,457)' -> 'Action: Click [4]
    button "no" @ (106,457)'). Unchanged without marks, without UI text, or when no line is cited."""
    if not (opts.ui_marks and opts.use_ui_text and ui_text):
        return reply
    lines: dict[str, str] = {}
    for line in prompt_ui_text(ui_text, opts, transform).split("\n"):
        m = _MARK.match(line)
        if m:  # an Action line cites a line up to its centre: the size, when shown, is not part of it
            lines.setdefault(_SIZE.sub(r"\1", line[m.end() :]), m.group(1))

    def sub(m: re.Match) -> str:
        k = lines.get(m.group(2))
        return f"{m.group(1)}[{k}] {m.group(2)}" if k else m.group(0)

    return _CITE.sub(sub, reply, count=1)


def _history_line(rec: StepRecord, transform: CoordTransform) -> str:
    act = action_text_for_history(rec.action, transform) if rec.action is not None else "(no valid action)"
    desc = f"{rec.action_desc} -> " if rec.action_desc else ""
    return f"Step {rec.step_idx + 1}: {desc}{act} [{rec.result}]"


@dataclass
class Prompt:
    messages: list[dict[str, Any]]
    images: list[bytes]
    context: dict[str, Any] = field(default_factory=dict)  # what went in (stored as steps.prompt_context)


def build_prompt(
    instruction: str,
    screenshot_png: bytes,
    ui_text: str | None,
    history: list[StepRecord],
    opts: PromptOptions,
    transform: CoordTransform,
) -> Prompt:
    content: list[dict[str, Any]] = [{"type": "text", "text": f"Task: {instruction}"}]
    text_hist = history[-opts.max_text_history :] if opts.max_text_history else []
    if text_hist:
        lines = "\n".join(_history_line(r, transform) for r in text_hist)
        content.append({"type": "text", "text": f"\nPrevious steps:\n{lines}"})
    k_prev = max(opts.history_images - 1, 0)
    prev_shots = [r for r in history[-k_prev:] if r.screenshot_png] if k_prev else []
    images: list[bytes] = []
    for r in prev_shots:
        content += [{"type": "text", "text": f"\nScreen before step {r.step_idx + 1}:"}, {"type": "image"}]
        images.append(r.screenshot_png)  # type: ignore[arg-type]
    if opts.history_images > 0:
        content += [{"type": "text", "text": "\nCurrent screen:"}, {"type": "image"}]
        images.append(screenshot_png)
    if opts.use_ui_text and ui_text:
        ui = prompt_ui_text(ui_text, opts, transform)
        content.append({"type": "text", "text": f"\nUI elements:\n{ui}"})
    system = system_prompt(opts, transform)
    messages = [{"role": "system", "content": [{"type": "text", "text": system}]}] if system else []
    messages.append({"role": "user", "content": content})
    ctx = {
        "history_text_steps": len(text_hist),
        "history_images": len(images),
        "ui_text": bool(opts.use_ui_text and ui_text),
        "coord_space": transform.space.value,
        "system": opts.system,
        "ui_sizes": opts.ui_sizes,
        "ui_marks": opts.ui_marks,
    }
    return Prompt(messages, images, ctx)


def sft_messages(prompt: Prompt, target_text: str) -> list[dict[str, Any]]:
    """The prompt's messages plus the assistant target: one SFT sample, same prompt as rollouts."""
    return prompt.messages + [{"role": "assistant", "content": [{"type": "text", "text": target_text}]}]
