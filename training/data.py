"""SFT samples from lake steps, and the collator that turns them into model inputs with assistant-only labels.

    opts = prompt_options(cfg.student)                       # the same PromptOptions the student policy uses
    rows = episode_samples(instruction, steps, "qwen3-vl", opts)   # one {"messages", "images"} per fit step
    batch = SFTCollator(processor)(rows)                     # input_ids, attention_mask, pixel_values, ..., labels

A sample is what the policy saw at one step, rebuilt with `agents.prompts.build_prompt` (the rollout's own
prompt builder): the instruction, older steps as text, the last K screenshots and the UI text; the target is
`agents.parsing.format_response` in the student's coordinate convention. Earlier steps whose action failed
(parse or exec error) still appear in the history, exactly as the policy saw them, but only fit steps become
targets. Labels cover the assistant reply and its <|im_end|> (the template's {% generation %} span), never the
prompt or the image pads. No torch at import time: training/export.py imports this to build the curate export.
"""

from __future__ import annotations

import io
import json
import re
from typing import Any, NamedTuple, Sequence

from agents.actions import ACTION_ADAPTER
from agents.base import StepRecord
from agents.coords import CoordTransform
from agents.parsing import action_arguments, format_response
from agents.prompts import PromptOptions, build_prompt, cite_marks, sft_messages, transform_for

IGNORE_INDEX = -100  # label of every token that is not trained on


def prompt_options(student_cfg: Any) -> PromptOptions:
    """The prompt options of a StudentConfig: the same ones agents.student.build_student_policy uses."""
    return PromptOptions.from_student(student_cfg)


def _action(step: dict[str, Any]):
    return ACTION_ADAPTER.validate_json(step["action"]) if step.get("action") else None


def history_record(step: dict[str, Any], transform: CoordTransform | None = None) -> StepRecord:
    """The StepRecord a later step's prompt shows for `step` (the rollout's EpisodeRun writes the same); with the
    model's `transform`, a teacher's Action line has its cited points in that space, as its target had."""
    action = _action(step)
    if action is None:
        result = f"parse error: {step.get('parse_error')}"
    elif step.get("exec_error"):
        result = f"exec error: {step['exec_error']}"
    else:
        result = "ok"
    desc = _texts_in_space(step, action, transform)[1] if transform is not None else step.get("action_desc")
    return StepRecord(int(step["step_idx"]), step.get("thought"), desc, action, result, step.get("screenshot"))


def _texts_in_space(step: dict[str, Any], action, transform: CoordTransform) -> tuple[str | None, str | None]:
    """The step's (thought, Action line) with their points ("at (x,y)", a cited UI line's "@ (x,y)") in the
    model's space.

    Both are written in the same space as the raw tool call: a teacher without a transform writes screen pixels
    (raw_action == the screen-space arguments), and those points are rewritten; a model's own text is already in
    its space and kept verbatim."""
    from agents.teacher import points_in_model_space

    thought, desc = step.get("thought"), step.get("action_desc")
    if action is None or not step.get("raw_action"):
        return thought, desc
    raw = json.loads(step["raw_action"])
    if raw == action_arguments(action) and raw != action_arguments(action, transform):
        return tuple(points_in_model_space(t, transform) if t else t for t in (thought, desc))
    return thought, desc


def target_text(step: dict[str, Any], transform: CoordTransform) -> str:
    """The assistant reply for a fit step: the model text format in the model's coordinate space."""
    action = _action(step)
    if action is None:
        raise ValueError(f"step {step.get('episode_id')}/{step.get('step_idx')} has no parsed action to train on")
    thought, desc = _texts_in_space(step, action, transform)
    return format_response(thought, desc or "", action, transform)


_UI_BOX = re.compile(r"(?P<cite>[^\n]*? @ \((?P<x>-?\d+),(?P<y>-?\d+)\)) \[(?P<w>\d+)x(?P<h>\d+)\]")


class UIBox(NamedTuple):
    """One UI-text element as its line shows it: the line up to its centre (`button "no" @ (53,141)`), the centre
    and the size, in the space the text is written in."""

    cite: str
    cx: int
    cy: int
    w: int
    h: int

    def holds(self, x: float, y: float, slack: float = 0.0) -> bool:
        """(x, y) inside the box, widened by `slack` on each side (0.5: the rounding of a line's integers)."""
        return abs(x - self.cx) <= self.w / 2 + slack and abs(y - self.cy) <= self.h / 2 + slack


def ui_boxes(text: str) -> list[UIBox]:
    """Every UI-text element box in `text` (UI-text lines, or a whole prompt), in order."""
    return [UIBox(m["cite"].strip(), *(int(m[k]) for k in ("x", "y", "w", "h"))) for m in _UI_BOX.finditer(text)]


def box_at(text: str, x: float, y: float) -> UIBox | None:
    """The smallest UI-text element box in `text` (UI-text lines, or a whole prompt) that holds (x, y), if any."""
    return min((b for b in ui_boxes(text) if b.holds(x, y)), key=lambda b: b.w * b.h, default=None)


def cite_what_it_did(step: dict[str, Any]) -> dict[str, Any]:
    """The step with its Action line rebuilt from what it did, in the teacher's words: a click cites the UI-text
    line of the element under its point (the smallest box holding it) and clicks that element's centre, the
    numbers the line shows; a type quotes the text typed. For the student's own successes: its Action line is its
    own guess (`Click button "DDDD2"` over a text field it did hit), and SFT on it would teach the guess, while
    the grounding a small student learns is "cite the line, then copy its numbers". The step comes back in the
    teacher's space convention (raw_action = the screen-space call), so target_text() and history_record() write
    its points in the model's space as for a teacher's step. Unchanged: other actions, or no box holds the point."""
    action = _action(step)
    if action is None:
        return step
    if action.action == "type":
        return dict(step, action_desc=f'Type "{action.text}"')
    if action.action != "click" or not step.get("ui_text"):
        return step
    box = box_at(step["ui_text"], action.x, action.y)
    if box is None:
        return step
    snapped = action.model_copy(update={"x": float(box.cx), "y": float(box.cy)})
    return dict(
        step,
        action=json.dumps(snapped.model_dump()),
        raw_action=json.dumps(action_arguments(snapped)),
        action_desc=f"Click {box.cite}",
    )


def cut_loops(steps: Sequence[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """An episode's steps without its loops: when a step sees the same page (UI text and screenshot) as an earlier
    step, the steps between them changed nothing that stayed, so they are cut and the episode reads as if the
    policy had acted from the earlier page directly. A successful student episode with detours (a click that
    reopened the same page, a wrong tab then back) then teaches the short path, not the wasted clicks.

    Steps without UI text are never matched (a screenshot alone can miss state such as focus). Returns the kept
    steps renumbered 0..n-1 (each with `lake_step_idx`, its index in the lake) and how many steps were cut."""
    kept: list[dict[str, Any]] = []
    seen: dict[tuple[str, bytes], int] = {}  # page -> its position in `kept`
    for step in steps:
        key = (step.get("ui_text") or "", bytes(step.get("screenshot") or b""))
        at = seen.get(key) if key[0] else None
        if at is not None:
            for dropped in kept[at:]:
                seen.pop((dropped.get("ui_text") or "", bytes(dropped.get("screenshot") or b"")), None)
            del kept[at:]
        if key[0]:
            seen[key] = len(kept)
        kept.append(step)
    out = [dict(s, step_idx=i, lake_step_idx=int(s.get("lake_step_idx", s["step_idx"]))) for i, s in enumerate(kept)]
    return out, len(steps) - len(kept)


def episode_samples(
    instruction: str, steps: Sequence[dict[str, Any]], arch: str, opts: PromptOptions
) -> list[dict[str, Any]]:
    """One sample per fit step of an episode (steps in order, each a CURATE_EXPORT_STEPS row).

    Returns dicts with `messages` (sft_messages: the prompt + the assistant target), `images` (PNG bytes, in
    the order of the messages' image items), `step_idx` and `target`."""
    out: list[dict[str, Any]] = []
    history: list[StepRecord] = []
    for i, step in enumerate(steps):
        if int(step["step_idx"]) != i:
            raise ValueError(
                f"episode {step.get('episode_id')}: steps must be complete and ordered "
                f"(got step_idx {step['step_idx']} at position {i})"
            )
        t = transform_for(arch, int(step["screen_w"]), int(step["screen_h"]), space=opts.coord_space)
        if step.get("fit"):
            prompt = build_prompt(instruction, step["screenshot"], step.get("ui_text"), history, opts, t)
            target = cite_marks(target_text(step, t), step.get("ui_text"), opts, t)
            out.append(
                {
                    "messages": sft_messages(prompt, target),
                    "images": list(prompt.images),
                    "step_idx": i,
                    "target": target,
                }
            )
        history.append(history_record(step, t))
    return out


# ------------------------------------------------------------------------------------------------ collate
def _pil(img: Any):
    """PIL image from PNG bytes, a datasets Image dict {"bytes", "path"} or a PIL image."""
    from PIL import Image

    if isinstance(img, dict):
        img = img.get("bytes") or img.get("path")
    if isinstance(img, (bytes, bytearray)):
        return Image.open(io.BytesIO(img)).convert("RGB")
    if isinstance(img, str):
        return Image.open(img).convert("RGB")
    return img.convert("RGB")


def with_images(messages: list[dict[str, Any]], images: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages with each {"type": "image"} item carrying its PIL image (what processor.apply_chat_template reads)."""
    pil = [_pil(i) for i in images]
    out, k = [], 0
    for m in messages:
        content = m["content"]
        if isinstance(content, list):
            items = []
            for item in content:
                item = {key: v for key, v in item.items() if v is not None}  # Parquet fills absent keys with None
                if item.get("type") == "image":
                    if k >= len(pil):
                        raise ValueError(f"sample has more image items than images ({len(pil)})")
                    item = {"type": "image", "image": pil[k]}
                    k += 1
                items.append(item)
            content = items
        out.append({"role": m["role"], "content": content})
    if k != len(pil):
        raise ValueError(f"sample has {k} image items but {len(pil)} images")
    return out


TARGET_FORMATS = ("full", "action", "tool_call")


def retarget(text: str, fmt: str) -> str:
    """An assistant target in a shorter format: `full` keeps it; `action` drops the <thinking> block; `tool_call`
    keeps only the <tool_call> (no thought, no "Action:" line). A small CPU student trained on `action` spends its
    few minutes on the coordinates instead of on 40 tokens of restated thought per step; the policy's parser
    takes all three formats."""
    from agents.parsing import CALL_OPEN, THINK_CLOSE, THINK_OPEN

    if fmt == "full":
        return text
    if fmt not in TARGET_FORMATS:
        raise ValueError(f"unknown SFT target format {fmt!r}: use one of {', '.join(TARGET_FORMATS)}")
    i, j = text.find(THINK_OPEN), text.find(THINK_CLOSE)
    if i != -1 and j > i:
        text = (text[:i] + text[j + len(THINK_CLOSE) :]).lstrip("\n")
    if fmt == "tool_call":
        k = text.find(CALL_OPEN)
        text = text[k:] if k != -1 else text
    return text


def retarget_sample(sample: dict[str, Any], fmt: str) -> dict[str, Any]:
    """The sample with each assistant message's text in target format `fmt` (the prompt is untouched)."""
    if fmt == "full":
        return sample
    msgs = []
    for m in sample["messages"]:
        if m["role"] == "assistant" and isinstance(m["content"], list):
            m = {
                **m,
                "content": [
                    {**c, "text": retarget(c["text"], fmt)} if c.get("type") == "text" and c.get("text") else c
                    for c in m["content"]
                ],
            }
        msgs.append(m)
    return {**sample, "messages": msgs}


# The SDPO teacher's privileged block (training.rl, hint-aware SFT below): appended to the last user message.
SOLUTION_BLOCK = "\n\nCorrect solution:\n\n{solution}\n\n"
FEEDBACK_BLOCK = "\nThe following is feedback from your unsuccessful earlier attempt:\n\n{feedback}\n\n"
REPROMPT_TAIL = "\nCorrectly solve the original task.\n"


def teacher_messages(
    messages: list[dict[str, Any]], solution: str | None = None, feedback: str | None = None
) -> list[dict[str, Any]]:
    """The SDPO teacher's prompt: the row's own messages with the privileged block appended to the last user
    message (its images and history untouched)."""
    block = (
        (SOLUTION_BLOCK.format(solution=solution) if solution else "")
        + (FEEDBACK_BLOCK.format(feedback=feedback) if feedback else "")
        + REPROMPT_TAIL
    )
    out = [dict(m) for m in messages]
    k = max(i for i, m in enumerate(out) if m["role"] == "user")
    content = out[k]["content"]
    content = list(content) if isinstance(content, list) else [{"type": "text", "text": content}]
    out[k]["content"] = content + [{"type": "text", "text": block}]
    return out


def hinted_samples(samples: Sequence[dict[str, Any]], fraction: float, seed: int = 0) -> list[dict[str, Any]]:
    """Hint-aware SFT (sft.hint_fraction): copies of round(fraction x n) samples, picked by `seed`, whose last user
    message ends with the SDPO teacher's privileged block (teacher_messages) holding the
    sample's own reply as the solution: "Step k:" (k = the sample's step_idx + 1, as the curate export stores it)
    and the reply without its thought, as rl_data.solution_text writes a successful episode's steps. The target
    is unchanged. A multi-step episode's teacher is shown every step of a sibling's episode; a hint here holds
    only the current one."""
    import random

    if fraction <= 0 or not samples:
        return []
    picked = sorted(random.Random(seed).sample(range(len(samples)), min(len(samples), round(fraction * len(samples)))))
    out = []
    for i in picked:
        msgs = samples[i]["messages"]
        reply = (
            next((c["text"] for c in msgs[-1]["content"] if c.get("type") == "text"), None)
            if msgs and msgs[-1]["role"] == "assistant" and isinstance(msgs[-1]["content"], list)
            else None
        )
        if not reply:
            continue
        if samples[i].get("step_idx") is None:
            raise ValueError("sft.hint_fraction needs each sample's step_idx (the curate export's column)")
        solution = f"Step {int(samples[i]['step_idx']) + 1}:\n{retarget(reply, 'action').strip()}"
        out.append({**samples[i], "messages": teacher_messages(msgs[:-1], solution) + [msgs[-1]]})
    return out


PIN = True  # False: cat_rows ignores `pin` (benchmarks/sft_profile.py measures with and without)


def cat_rows(parts: Sequence[Any], pin: bool = False):
    """torch.cat(parts, dim=0); with `pin` (and CUDA) written straight into page-locked host memory, so that
    `.to("cuda", non_blocking=True)` is an asynchronous DMA instead of a staged copy that blocks the host (torch's
    caching host allocator reuses the buffer once the copy has finished)."""
    import torch

    if not (pin and PIN and torch.cuda.is_available()):
        return torch.cat(list(parts), dim=0)
    if all(p.is_pinned() and p.is_contiguous() for p in parts):  # kept page-locked (EncodedSamples on CUDA)
        return parts[0] if len(parts) == 1 else PinnedRows(list(parts))  # no host copy
    shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
    return torch.cat(list(parts), dim=0, out=torch.empty(shape, dtype=parts[0].dtype, pin_memory=True))


class PinnedRows:
    """Page-locked tensors that `.to(device, non_blocking=True)` concatenates on the device: one asynchronous copy
    per part into its slice, where `torch.cat` into a new pinned buffer first would copy every byte on the host
    (two 1280x704 screenshots a sample, 24 samples a step: ~0.4 GB of host memcpy in the step's critical path).
    The parts must stay unchanged until the copies have run (kept encodings are never written)."""

    def __init__(self, parts: list[Any]):
        self.parts = parts
        self.dtype = parts[0].dtype
        self.shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])

    def to(self, device, non_blocking: bool = False):
        import torch

        out = torch.empty(self.shape, dtype=self.dtype, device=device)
        a = 0
        for p in self.parts:
            out[a : a + p.shape[0]].copy_(p, non_blocking=non_blocking)
            a += p.shape[0]
        return out


class PinnedSlabs:
    """Page-locked host tensors carved from 256 MB slabs: one cudaHostAlloc per slab, not one per tensor (pinning is
    slow, and torch's caching host allocator rounds every block up to a power of two). Never freed piecewise: for
    tensors kept for the whole run (EncodedSamples' pixel_values, VisionFeatures' image features)."""

    SLAB = 256 << 20

    def __init__(self):
        self._slab, self._used = None, 0

    def empty(self, shape, dtype):
        import torch

        n = max(1, int(torch.Size(shape).numel())) * torch.empty((), dtype=dtype).element_size()
        n_aligned = (n + 511) // 512 * 512
        if self._slab is None or self._used + n_aligned > self._slab.numel():
            self._slab, self._used = torch.empty(max(self.SLAB, n_aligned), dtype=torch.uint8, pin_memory=True), 0
        view = self._slab[self._used : self._used + n].view(dtype).view(shape)
        self._used += n_aligned
        return view

    def copy(self, t):
        """A page-locked copy of host tensor `t`."""
        return self.empty(t.shape, t.dtype).copy_(t)


class SFTCollator:
    """Samples -> a padded batch of processor inputs plus `labels` (assistant tokens only, else -100).

    Uses the processor's chat template with `return_assistant_tokens_mask`: the template wraps each assistant
    reply and its <|im_end|> in {% generation %}, so the mask is exactly the reply tokens. Image pads, the
    system/user turns and padding are never labelled. Pads go on the right (the processor's own side is left,
    for generation): with left padding, CUDA SDPA's backward over the fully masked pad rows gives NaN
    gradients in bf16 (measured on an H100 at step 13 of the small model; right padding ran clean).

    Each sample is encoded on its own (`encode`: one chat-template + image-processor call) and a batch is the
    right-padded concatenation (`pad`), so a training loop can encode every sample once and reuse the tensors
    every epoch (training.sft caches them); `collator(samples)` is `pad([encode(s) for s in samples])`."""

    MIN_TRANSFORMERS = (5, 18)  # 5.17's processors return an empty assistant mask for most samples with an image

    def __init__(self, processor):
        import transformers

        have = tuple(int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
        if have < self.MIN_TRANSFORMERS:
            raise RuntimeError(
                f"transformers {transformers.__version__} is too old for SFT: its processors mark no assistant tokens "
                f"in most samples with an image; install transformers>={'.'.join(map(str, self.MIN_TRANSFORMERS))}"
            )
        self.processor = processor
        tok = getattr(processor, "tokenizer", processor)
        self.pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0

    def encode(self, sample: dict[str, Any]) -> dict[str, Any]:
        """One sample -> tensors with a batch dimension of 1, `labels` included."""
        import torch

        conv = with_images(sample["messages"], sample.get("images") or [])
        out = self.processor.apply_chat_template(
            [conv], tokenize=True, return_dict=True, return_tensors="pt", return_assistant_tokens_mask=True
        )
        mask = torch.as_tensor(out.pop("assistant_masks")).bool() & out["attention_mask"].bool()
        if not mask.any():
            raise ValueError("a sample has no assistant tokens to train on (does its template mark {% generation %}?)")
        out["labels"] = out["input_ids"].masked_fill(~mask, IGNORE_INDEX)
        return dict(out)

    def length(self, sample: dict[str, Any]) -> int:
        """The tokens `encode(sample)` gives, without decoding an image or running the image processor: the templated
        text's tokens with each image placeholder counted as that image's tokens (from its size alone). Falls
        back to encoding when the processor cannot count them."""
        images = sample.get("images") or []
        count = getattr(self.processor, "_get_num_multimodal_tokens", None)
        if count is None:
            return int(self.encode(sample)["input_ids"].shape[1])
        from PIL import Image

        # the template only writes a placeholder per image item: no pixels needed, and PIL reads sizes from headers
        conv = [
            {
                "role": m["role"],
                "content": [{k: v for k, v in c.items() if v is not None} for c in m["content"]]
                if isinstance(m["content"], list)
                else m["content"],
            }
            for m in sample["messages"]
        ]
        text = self.processor.apply_chat_template([conv], tokenize=False)
        n = len(self.processor.tokenizer(text[0] if isinstance(text, list) else text)["input_ids"])
        if not images:
            return n

        def size(img):
            raw = img.get("bytes") or img.get("path") if isinstance(img, dict) else img
            return (
                Image.open(io.BytesIO(raw))
                if isinstance(raw, (bytes, bytearray))
                else Image.open(raw)
                if isinstance(raw, str)
                else raw
            ).size

        mm = count(image_sizes=[(h, w) for w, h in map(size, images)])
        per_image = mm["num_image_tokens"] if isinstance(mm, dict) else mm.num_image_tokens
        return n - len(images) + sum(per_image)

    def pad(self, encoded: Sequence[dict[str, Any]], pin: bool = False) -> dict[str, Any]:
        """Right-pad per-sample encodings into one batch; image tensors (pixel_values, grid) are concatenated
        (pixel_values into page-locked memory with `pin`: cat_rows)."""
        import torch

        width = max(e["input_ids"].shape[1] for e in encoded)
        fill = {"input_ids": self.pad_id, "attention_mask": 0, "labels": IGNORE_INDEX}
        out: dict[str, Any] = {}
        for key in dict.fromkeys(k for e in encoded for k in e):
            parts = [e[key] for e in encoded if key in e]  # image keys: only samples with images have them
            if parts[0].dim() == 2 and parts[0].shape[0] == 1 and key not in ("pixel_values", "image_grid_thw"):
                parts = [torch.nn.functional.pad(p, (0, width - p.shape[1]), value=fill.get(key, 0)) for p in parts]
            out[key] = cat_rows(parts, pin=pin and key == "pixel_values")
        return out

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        return self.pad([self.encode(s) for s in samples])
