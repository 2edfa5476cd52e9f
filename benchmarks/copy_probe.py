"""Benchmark: can a random-init student learn to point (find the UI line named by the task, copy its
coordinates) and to copy (type the quoted text), and what does it need? Text only, no browser, no image:
the prompt and reply are the student's own format (system prompt, `Task:`, `UI elements:` lines,
`Action:` line + tool call) with fresh random labels, values and positions drawn per sample.

    .venv/bin/python benchmarks/copy_probe.py --model-config <model dir> --steps 1000 --pool 0      # fresh samples
    .venv/bin/python benchmarks/copy_probe.py --model-config <model dir> --steps 1000 --pool 3000   # a fixed pool
    .venv/bin/python benchmarks/copy_probe.py ... --rope-theta 10000 --json out.json

Score: exact match of the whole reply (teacher-forced argmax over the reply's tokens) on 256 held-out
samples, split into "point" (click: the label and both coordinates) and "copy" (type: the quoted text),
at evaluation points along the run. Prints one JSON object. Used to pick the mid-training recipe
(flywheel/midtrain.py): corpus size against steps, the model's rope base, the learning rate.

`--kind presence` asks click-tab-2's question instead (session 48): a tabbed page, `Find the link "X" on one of the
tabs and click it.`, the open tab's words as UI lines. Half the pages hold `span "X"` (the reply clicks it), the rest
do not (the reply opens the next tab); a near-copy of X (one letter changed) stands on the tab in half of each, and
X itself may stand inside a plain text line. Scored as "present" and "absent".
"""

from __future__ import annotations

import argparse
import json
import math
import random
import string
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from agents.actions import Click, Type  # noqa: E402
from agents.parsing import format_tool_call  # noqa: E402
from agents.prompts import PromptOptions, system_prompt, transform_for  # noqa: E402

ROLES = (("button", "button"), ("a", "link"), ("span", "text"))
SYLL = ["ba", "ko", "mi", "tu", "re", "sa", "lo", "ve", "qu", "dri", "pla", "sto", "nex", "ur", "ai", "zo"]


def _label(rng: random.Random) -> str:
    u = rng.random()
    if u < 0.4:
        return "".join(rng.choice(SYLL) for _ in range(rng.randint(1, 3))).capitalize()
    if u < 0.8:
        return "".join(rng.choice(string.ascii_letters) for _ in range(rng.randint(3, 7)))
    return "".join(rng.choice(string.ascii_lowercase + string.digits) for _ in range(rng.randint(3, 6)))


# The student's own system prompt (Qwen3-VL: coordinates 0-1000).
SYSTEM = system_prompt(PromptOptions(), transform_for("qwen3-vl", 1000, 1000))


def sample(rng: random.Random) -> tuple[list[dict], str]:
    """(messages without the reply, reply) of one click or type instance."""
    n = rng.randint(3, 7)
    labels: list[str] = []
    while len(labels) < n:
        s = _label(rng)
        if s.lower() not in {x.lower() for x in labels}:
            labels.append(s)
    lines, els = [], []
    for lab in labels:
        tag, noun = rng.choice(ROLES)
        x, y, w, h = rng.randint(30, 970), rng.randint(60, 970), rng.randint(40, 400), rng.randint(30, 110)
        lines.append(f'{tag} "{lab}" @ ({x},{y}) [{w}x{h}]')
        els.append((tag, noun, lab, x, y))
    if rng.random() < 0.5:
        tag, noun, lab, x, y = rng.choice([e for e in els if e[0] != "span"] or els)
        task = f'Click the {noun} "{lab}".'
        reply = f'Action: Click {tag} "{lab}" @ ({x},{y})\n' + format_tool_call(Click(x=x, y=y))
    else:
        value = _label(rng)
        field = _label(rng).capitalize()
        x, y = rng.randint(30, 970), rng.randint(60, 970)
        lines.append(f'input_text#{field.lower()} "" @ ({x},{y}) [300x60] focused')
        task = f'Enter "{value}" into the {field} field.'
        reply = f'Action: Type "{value}"\n' + format_tool_call(Type(text=value))
    rng.shuffle(lines)
    user = f"Task: {task}\nCurrent screen:\n\nUI elements:\n" + "\n".join(lines)
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}], reply


def _near(rng: random.Random, word: str) -> str:
    """`word` with one letter changed."""
    i = rng.randrange(len(word))
    c = rng.choice([ch for ch in string.ascii_lowercase if ch != word[i].lower()])
    return word[:i] + c + word[i + 1 :]


def _click_reply(cite: str, x: int, y: int) -> str:
    """The reply clicking UI line `cite` at (x, y) on the 160x210 page, in the model's 0-1000 space."""
    mx, my = x * 1000 // 160, y * 1000 // 210
    return f"Action: Click {cite} @ ({mx},{my})\n" + format_tool_call(Click(x=mx, y=my))


def presence_sample(rng: random.Random) -> tuple[list[dict], str, str]:
    """(messages, reply, "present" | "absent") of one tabbed page."""
    n_tabs, open_tab = rng.randint(2, 4), 1
    target = _label(rng)
    lines = [
        f'a#ui-id-{t} "Tab #{t}" @ ({27 + 44 * (t - 1)},70) [40x23]' + (" selected" if t == open_tab else "")
        for t in range(1, n_tabs + 1)
    ]
    words: list[str] = []
    n_words = rng.randint(4, 10)
    while len(words) < n_words:
        w = _label(rng)
        if w.lower() != target.lower() and w not in words:
            words.append(w)
    present = rng.random() < 0.5
    if rng.random() < 0.5:
        words.append(_near(rng, target))
    spans = [(w, rng.random() < 0.6) for w in words]  # (word, a span (link) or inside a text line)
    if present:
        spans.append((target, True))
    elif rng.random() < 0.5:
        spans.append((target, False))  # the word as plain text, not a link
    rng.shuffle(spans)
    where = {}
    for w, is_link in spans:
        x, y = rng.randint(20, 150), rng.randint(100, 200)
        if is_link:
            lines.append(f'span "{w}" @ ({x},{y}) [{6 * len(w)}x11]')
            where[w] = (x, y)
        else:
            lines.append(f'text "{_label(rng).lower()} {w} {_label(rng).lower()}" @ ({x},{y}) [90x11]')
    if present:
        reply = _click_reply(f'span "{target}"', *where[target])
    else:
        reply = _click_reply(f'a#ui-id-{open_tab + 1} "Tab #{open_tab + 1}"', 27 + 44 * open_tab, 70)
    task = f'Find the link "{target}" on one of the tabs and click it.'
    user = f"Task: {task}\nCurrent screen:\n\nUI elements:\n" + "\n".join(lines)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}]
    return msgs, reply, "present" if present else "absent"


def encode(tok, msgs: list[dict], reply: str) -> tuple[list[int], int]:
    """Token ids of prompt + reply, and where the reply starts."""
    prompt = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    p = tok(prompt, add_special_tokens=False)["input_ids"]
    r = tok(reply + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return p + r, len(p)


def batch_tensors(rows: list[tuple[list[int], int]], pad: int):
    import torch

    n = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    lab = torch.full((len(rows), n), -100, dtype=torch.long)
    att = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (x, start) in enumerate(rows):
        ids[i, : len(x)] = torch.tensor(x)
        att[i, : len(x)] = 1
        lab[i, start : len(x)] = torch.tensor(x[start:])
    return ids, att, lab


def exact(model, rows, kinds, pad: int, bs: int = 64) -> dict[str, float]:
    import torch

    right: dict[str, list[int]] = {}
    model.eval()
    with torch.no_grad():
        for i in range(0, len(rows), bs):
            ids, att, lab = (t.to(model.device) for t in batch_tensors(rows[i : i + bs], pad))
            logits = model(input_ids=ids, attention_mask=att).logits
            pred = logits[:, :-1].argmax(-1)
            tgt = lab[:, 1:]
            ok = ((pred == tgt) | (tgt == -100)).all(-1)
            for k, o in zip(kinds[i : i + bs], ok.tolist()):
                right.setdefault(k, [0, 0])
                right[k][0] += int(o)
                right[k][1] += 1
    model.train()
    return {k: round(a / max(b, 1), 4) for k, (a, b) in right.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--model-config", required=True, help="a model folder (its config and tokenizer; weights are re-initialised)"
    )
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--pool", type=int, default=0, help="0: fresh samples every step; N: a fixed pool of N samples")
    ap.add_argument("--rope-theta", type=float, default=None)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=250)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", default=None)
    ap.add_argument("--kind", choices=["copy", "presence"], default="copy", help="the task family (see above)")
    a = ap.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    tok = AutoTokenizer.from_pretrained(a.model_config)
    cfg = AutoConfig.from_pretrained(a.model_config)
    if a.rope_theta:
        cfg.text_config.rope_parameters["rope_theta"] = a.rope_theta
    if a.layers:
        cfg.text_config.num_hidden_layers = a.layers
    model = AutoModelForImageTextToText.from_config(cfg).to(a.device)
    pad = tok.pad_token_id or 0
    rng = random.Random(a.seed)
    held_rng = random.Random(10_000 + a.seed)
    if a.kind == "presence":
        held3 = [presence_sample(held_rng) for _ in range(256)]
        held, held_kinds = [(m, r) for m, r, _ in held3], [k for _, _, k in held3]

        def draw(r: random.Random) -> tuple[list[dict], str]:
            return presence_sample(r)[:2]
    else:
        held = [sample(held_rng) for _ in range(256)]
        held_kinds = ["point" if r.startswith("Action: Click") else "copy" for _, r in held]
        draw = sample
    held_rows = [encode(tok, m, r) for m, r in held]
    pool = [encode(tok, *draw(rng)) for _ in range(a.pool)] if a.pool else None
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warm = 30
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(s, a.steps) / a.steps))
    )
    curve, t0, loss_ema = [], time.monotonic(), None
    for step in range(1, a.steps + 1):
        rows = rng.sample(pool, a.batch) if pool else [encode(tok, *draw(rng)) for _ in range(a.batch)]
        ids, att, lab = batch_tensors(rows, pad)
        out = model(input_ids=ids.to(a.device), attention_mask=att.to(a.device), labels=lab.to(a.device))
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_ema = out.loss.item() if loss_ema is None else 0.95 * loss_ema + 0.05 * out.loss.item()
        if step % a.eval_every == 0 or step == a.steps:
            acc = exact(model, held_rows, held_kinds, pad)
            curve.append({"step": step, "loss": round(loss_ema, 4), **acc, "s": round(time.monotonic() - t0, 1)})
            print(json.dumps(curve[-1]), file=sys.stderr, flush=True)
    res = {"args": vars(a), "curve": curve, "final": curve[-1]}
    print(json.dumps(res, indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
