"""SFT samples from lake steps, and the collator that turns them into model inputs with assistant-only labels.

    opts = prompt_options(cfg.student)                       # the same PromptOptions the student policy uses
    rows = episode_samples(instruction, steps, "qwen3-vl", opts)   # one {"messages", "images"} per fit step
    batch = SFTCollator(processor)(rows)                     # input_ids, attention_mask, pixel_values, ..., labels

A sample is what the policy saw at one step, rebuilt with `agents.prompts.build_prompt` (the rollout's own
prompt builder): the instruction, older steps as text, the last K screenshots and the UI text; the target is
`agents.parsing.format_response` in the student's coordinate convention. Earlier steps whose action failed
(parse or exec error) still appear in the history, exactly as the policy saw them, but only fit steps become
targets. Labels cover the assistant reply and its <|im_end|> (the template's {% generation %} span), never the
prompt or the image pads. No torch at import time: storage/curate.py imports this to build the export.
"""

from __future__ import annotations

import io
import json
from typing import Any, Sequence

from agents.actions import ACTION_ADAPTER
from agents.base import StepRecord
from agents.coords import CoordTransform
from agents.parsing import action_arguments, format_response
from agents.prompts import PromptOptions, build_prompt, sft_messages, transform_for

IGNORE_INDEX = -100  # label of every token that is not trained on


def prompt_options(student_cfg: Any) -> PromptOptions:
    """The prompt options of a StudentConfig: the same ones agents.student.build_student_policy uses."""
    return PromptOptions(history_images=student_cfg.history_images, use_ui_text=student_cfg.use_ui_text)


def _action(step: dict[str, Any]):
    return ACTION_ADAPTER.validate_json(step["action"]) if step.get("action") else None


def history_record(step: dict[str, Any]) -> StepRecord:
    """The StepRecord a later step's prompt shows for `step` (the rollout's EpisodeRun writes the same)."""
    action = _action(step)
    if action is None:
        result = f"parse error: {step.get('parse_error')}"
    elif step.get("exec_error"):
        result = f"exec error: {step['exec_error']}"
    else:
        result = "ok"
    return StepRecord(int(step["step_idx"]), step.get("thought"), step.get("action_desc"), action, result,
                      step.get("screenshot"))


def _thought_in_space(step: dict[str, Any], action, transform: CoordTransform) -> str | None:
    """The thought with its "at (x,y)" points in the model's space.

    A thought is written in the same space as the raw tool call: a teacher without a transform writes screen
    pixels (raw_action == the screen-space arguments), and those points are rewritten; a model's own thought is
    already in its space and kept verbatim."""
    from agents.teacher import thought_in_model_space

    thought = step.get("thought")
    if not thought or not step.get("raw_action"):
        return thought
    raw = json.loads(step["raw_action"])
    if raw == action_arguments(action) and raw != action_arguments(action, transform):
        return thought_in_model_space(thought, transform)
    return thought


def target_text(step: dict[str, Any], transform: CoordTransform) -> str:
    """The assistant reply for a fit step: the model text format in the model's coordinate space."""
    action = _action(step)
    if action is None:
        raise ValueError(f"step {step.get('episode_id')}/{step.get('step_idx')} has no parsed action to train on")
    return format_response(_thought_in_space(step, action, transform), step.get("action_desc") or "", action,
                           transform)


def episode_samples(instruction: str, steps: Sequence[dict[str, Any]], arch: str,
                    opts: PromptOptions) -> list[dict[str, Any]]:
    """One sample per fit step of an episode (steps in order, each a CURATE_EXPORT_STEPS row).

    Returns dicts with `messages` (sft_messages: the prompt + the assistant target), `images` (PNG bytes, in
    the order of the messages' image items), `step_idx` and `target`."""
    out: list[dict[str, Any]] = []
    history: list[StepRecord] = []
    for i, step in enumerate(steps):
        if int(step["step_idx"]) != i:
            raise ValueError(f"episode {step.get('episode_id')}: steps must be complete and ordered "
                             f"(got step_idx {step['step_idx']} at position {i})")
        if step.get("fit"):
            t = transform_for(arch, int(step["screen_w"]), int(step["screen_h"]))
            prompt = build_prompt(instruction, step["screenshot"], step.get("ui_text"), history, opts, t)
            target = target_text(step, t)
            out.append({"messages": sft_messages(prompt, target), "images": list(prompt.images),
                        "step_idx": i, "target": target})
        history.append(history_record(step))
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


class SFTCollator:
    """Samples -> a padded batch of processor inputs plus `labels` (assistant tokens only, else -100).

    Uses the processor's chat template with `return_assistant_tokens_mask`: the template wraps each assistant
    reply and its <|im_end|> in {% generation %}, so the mask is exactly the reply tokens. Image pads, the
    system/user turns and padding are never labelled. Pads go on the right (the processor's own side is left,
    for generation): with left padding, CUDA SDPA's backward over the fully masked pad rows gives NaN
    gradients in bf16 (measured on an H100 at step 13 of the small model; right padding ran clean)."""

    def __init__(self, processor):
        self.processor = processor

    def __call__(self, samples: Sequence[dict[str, Any]]) -> dict[str, Any]:
        import torch

        convs = [with_images(s["messages"], s.get("images") or []) for s in samples]
        out = self.processor.apply_chat_template(convs, tokenize=True, return_dict=True, return_tensors="pt",
                                                 return_assistant_tokens_mask=True,
                                                 processor_kwargs={"padding": True, "padding_side": "right"})
        mask = torch.as_tensor(out.pop("assistant_masks")).bool() & out["attention_mask"].bool()
        if not mask.any(dim=1).all():
            raise ValueError("a sample has no assistant tokens to train on (does its template mark {% generation %}?)")
        out["labels"] = out["input_ids"].masked_fill(~mask, IGNORE_INDEX)
        return dict(out)
