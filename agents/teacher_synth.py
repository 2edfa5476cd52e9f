"""Scripted-teacher recipes of the synthetic `synth/<kind>` tasks (envs/synth); merged into RECIPES.

Each recipe reads only what the page tells any agent: `ctx.fields` (the instruction's named values:
target, field names, quoted texts, button) and the DOM (labels, the `#marked` item's text, field ids
derived from field names the way the page derives them). Every step is a pixel click or typed text
whose Action line cites the element's UI-text line, as the MiniWoB recipes do.
"""

from __future__ import annotations

import re
from typing import Callable, Iterator

from agents.teacher_ctx import Ctx, El, Step, TeacherError, norm


def field_id(name: str) -> str:
    """The DOM id of a synth field (synth.js SYN.fieldId): 'Tami vos' -> 'tami_vos'."""
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def _fill(ctx: Ctx, name: str, text: str, why: str) -> Iterator[Step]:
    inp = ctx.one(f"{name} field", tag="input_text", id=field_id(name))
    yield ctx.click(inp, f"the {name} field", why)
    yield ctx.type(text, f'The {name} field is focused, so I type "{text}".')


def _press(ctx: Ctx, why: str) -> Step:
    label = ctx.fields["button"]
    return ctx.click(ctx.one(f"button {label!r}", tag="button", text=label), f'the "{label}" button', why)


def _numbered(fields: dict[str, str], key: str) -> list[str]:
    out, i = [], 1
    while f"{key}_{i}" in fields:
        out.append(fields[f"{key}_{i}"])
        i += 1
    return out


def synth_click(ctx: Ctx) -> Iterator[Step]:
    role, target = ctx.fields["role"], ctx.fields["target"]
    e = ctx.one(f"{role} {target!r}", tag="button" if role == "button" else "a", text=target)
    yield ctx.click(e, f'the {role} "{target}"', f'The task names the {role} "{target}".')


def synth_fill(ctx: Ctx) -> Iterator[Step]:
    """synth/type and synth/form: each named field gets its quoted text, then the named button."""
    names, texts = _numbered(ctx.fields, "field"), _numbered(ctx.fields, "text")
    if not names or len(names) != len(texts):
        raise TeacherError(f"{ctx.task_id}: fields {ctx.fields}")
    for i, (name, text) in enumerate(zip(names, texts)):
        first = "First" if i == 0 and len(names) > 1 else "Next" if i else ""
        why = f'{first + ": " if first else ""}{name} must hold "{text}".'
        yield from _fill(ctx, name, text, why)
    done = "The field is filled" if len(names) == 1 else "Both fields are filled"
    yield _press(ctx, f'{done}; now I press "{ctx.fields["button"]}".')


def synth_read(ctx: Ctx) -> Iterator[Step]:
    text = norm(ctx.one("marked item", id="marked")["text"])
    name = ctx.fields["field_1"]
    yield from _fill(ctx, name, text, f'The marked (yellow) item reads "{text}"; I type it into {name}.')
    yield _press(ctx, f'"{text}" is in {name}; now I press "{ctx.fields["button"]}".')


def _options(ctx: Ctx, tag: str) -> dict[str, El]:
    """label text -> its radio/checkbox (the input and its text share a <label>)."""
    out = {}
    for e in ctx.find(tag=tag):
        lab = ctx.parent(e)
        texts = [c for c in ctx.children(lab) if c["tag"] == "t"] if lab else []
        if texts:
            out[norm(texts[0]["text"])] = e
    return out


def synth_option(ctx: Ctx) -> Iterator[Step]:
    widget, targets = ctx.fields["widget"], _numbered(ctx.fields, "target")
    opts = _options(ctx, f"input_{widget}")
    for i, t in enumerate(targets):
        if t not in opts:
            raise TeacherError(f"{ctx.task_id}: no {widget} {t!r}")
        if len(targets) == 1:
            why = f'I need to select "{t}".'
        else:
            why = f"The options to select are {', '.join(targets)}; " + ("first" if i == 0 else "next") + f' "{t}".'
        yield ctx.click(opts[t], f'the {widget} of "{t}"', why)
    what = "The option is selected" if len(targets) == 1 else "The options are selected"
    yield _press(ctx, f'{what}; now I press "{ctx.fields["button"]}".')


def synth_tabs(ctx: Ctx) -> Iterator[Step]:
    tab, target = ctx.fields["tab"], ctx.fields["target"]
    links = ctx.find(tag="a", text=target, pred=ctx.visible)
    if not links:
        e = ctx.one(f"tab {tab!r}", cls="tab", text=tab)
        yield ctx.click(e, f'the "{tab}" tab', f'The link "{target}" is on the "{tab}" tab; I open that tab first.')
        links = ctx.find(tag="a", text=target, pred=ctx.visible)
    if not links:
        raise TeacherError(f"{ctx.task_id}: link {target!r} not on tab {tab!r}")
    yield ctx.click(links[0], f'the link "{target}"', f'The "{tab}" tab is open and shows the link "{target}".')


def synth_search(ctx: Ctx) -> Iterator[Step]:
    """Check the open tab's links for the exact text; if it is not there, open the next unvisited tab (bar order)."""
    target, tried = ctx.fields["target"], set()
    while True:
        links = ctx.find(tag="a", text=target, pred=ctx.visible)
        if links:
            yield ctx.click(links[0], f'the link "{target}"', f'The link "{target}" is on this tab.')
            return
        tabs = ctx.find(cls="tab")
        tried |= {norm(t["text"]) for t in tabs if "active" in t["classes"].split()}
        nxt = [t for t in tabs if norm(t["text"]) not in tried]
        if not nxt:
            raise TeacherError(f"{ctx.task_id}: link {target!r} on no tab")
        name = norm(nxt[0]["text"])
        tried.add(name)
        yield ctx.click(nxt[0], f'the "{name}" tab', f'The link "{target}" is not on this tab; I try the next one.')


SYNTH_RECIPES: dict[str, Callable[[Ctx], Iterator[Step]]] = {
    "synth/click": synth_click,
    "synth/type": synth_fill,
    "synth/form": synth_fill,
    "synth/read": synth_read,
    "synth/option": synth_option,
    "synth/tabs": synth_tabs,
    "synth/search": synth_search,
}
