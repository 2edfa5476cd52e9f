"""Per-task recipes of the scripted MiniWoB teacher (see agents/teacher.py).

A recipe is a generator `recipe(ctx) -> Iterator[Step]`. It reads `ctx` (the current
observation's DOM, refreshed by the teacher before the generator resumes) and yields one
pixel-level step at a time. DOM boxes are CSS px; `Ctx.click` turns them into screen
coordinates (`* scale`) at a point of the element that no later element covers.
"""

from __future__ import annotations

import re
from typing import Callable, Iterator

from agents.teacher_ctx import TASK_H, Ctx, El, Step, TeacherError, cap, norm
from agents.teacher_synth import SYNTH_RECIPES

# -------------------------------------------------------------------- shared pieces
_SUBMIT_TEXTS = ("submit", "login", "log in", "go!", "search", "ok")


def submit_button(ctx: Ctx) -> El:
    for e in ctx.elems:
        if e["tag"] == "button" and norm(e["text"]).lower() in _SUBMIT_TEXTS:
            return e
    for e in ctx.elems:
        if e["id"] in ("subbtn", "submit") or {"final", "ui-submit"} & set(e["classes"].split()):
            return e
    raise TeacherError(f"{ctx.task_id}: no submit button")


def click_submit(ctx: Ctx, why: str = "Now I submit.") -> Step:
    e = submit_button(ctx)
    label = norm(e["text"]) or "Submit"
    return ctx.click(e, f'the "{label}" button', why)


def fill(ctx: Ctx, field: El, text: str, name: str, why: str = "") -> Iterator[Step]:
    yield ctx.click(field, name, why or f'I need to type "{text}" into {name}.')
    yield ctx.type(text, f'{cap(name)} is focused, so I type "{text}".')


def _first_input(ctx: Ctx, tag: str = "input_text") -> El:
    return ctx.one(f"{tag} field", tag=tag)


# -------------------------------------------------------------------- one-click tasks
def click_test(ctx: Ctx) -> Iterator[Step]:
    yield ctx.click(ctx.one("button", tag="button"), "the button", "The task is to click the button.")


def click_named_button(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    e = ctx.one(f"button {target}", tag="button", text=target)
    yield ctx.click(e, f'the "{target}" button', f'I need the button labelled "{target}".')


def click_button_sequence(ctx: Ctx) -> Iterator[Step]:
    yield ctx.click(ctx.one("ONE", tag="button", text="ONE"), 'button "ONE"', "First I click ONE.")
    yield ctx.click(ctx.one("TWO", tag="button", text="TWO"), 'button "TWO"', "ONE is done; now TWO.")


def click_link(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    e = ctx.one(f"link {target}", tag="span", text=target)
    yield ctx.click(e, f'the link "{target}"', f'I need the link "{target}".')


def click_dialog(ctx: Ctx) -> Iterator[Step]:
    e = ctx.one("close button", tag="button", cls="ui-dialog-titlebar-close")
    yield ctx.click(e, 'the dialog\'s close "x" button', "The dialog closes with the x in its title bar.")


def click_dialog_2(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    found = ctx.find(tag="button", text=target)
    if not found and target.lower() == "x":
        found = ctx.find(tag="button", cls="ui-dialog-titlebar-close")
    if not found:
        raise TeacherError(f"click-dialog-2: no button {target!r}")
    yield ctx.click(found[0], f'the "{target}" button', f'I need the dialog button labelled "{target}".')


def click_tab(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    e = ctx.one(f"tab {target}", tag="a", text=f"Tab #{target}")
    yield ctx.click(e, f'the "Tab #{target}" tab', f"The task asks for Tab #{target}.")


def click_color(ctx: Ctx) -> Iterator[Step]:
    from PIL import ImageColor

    target = ctx.fields["target"].strip().lower()
    want = ImageColor.getrgb(target)[:3]
    for e in ctx.find(cls="color", pred=lambda e: ctx.visible(e)):
        rgb = tuple(int(round(c * 255)) for c in e["bg_color"][:3])
        if rgb == want:
            yield ctx.click(e, f"the {target} box", f"The {target} box is the one to click.")
            return
    raise TeacherError(f"click-color: no {target} box")


_WIDGET_TAGS = {
    "radio": "input_radio",
    "checkbox": "input_checkbox",
    "text": "input_text",
    "textarea": "textarea",
    "button": "button",
}


def click_widget(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    e = ctx.one(f"{target} widget", tag=_WIDGET_TAGS[target])
    yield ctx.click(e, f"the {target} widget", f'I need a widget of kind "{target}".')


def grid_coordinate(ctx: Ctx) -> Iterator[Step]:
    x, y = ctx.fields["x"], ctx.fields["y"]
    e = ctx.one(f"point x={x}, y={y}", tag="circle", id=f"({x},{y})")
    yield ctx.click(e, f"the grid point x={x}, y={y}", f"Counting grid lines from the centre gives x={x}, y={y}.")


_SHAPE_NAMES = {"circle": "Circle", "rect": "Rectangle", "polygon": "Triangle"}


def identify_shape(ctx: Ctx) -> Iterator[Step]:
    svg = ctx.one("figure", tag="svg")
    shape = next(e for e in ctx.subtree(svg)[1:] if e["tag"] in ("text", *_SHAPE_NAMES))
    if shape["tag"] == "text":
        answer = "Number" if norm(shape["text"]).isdigit() else "Letter"
        why = f'The figure shows "{norm(shape["text"])}", a {answer.lower()}.'
    else:
        answer = _SHAPE_NAMES[shape["tag"]]
        why = f"The figure is a {answer.lower()}."
    yield ctx.click(ctx.one(answer, tag="button", text=answer), f'the "{answer}" button', why)


def focus_text(ctx: Ctx) -> Iterator[Step]:
    yield ctx.click(_first_input(ctx), "the text field", "Clicking the text field focuses it.")


def focus_text_2(ctx: Ctx) -> Iterator[Step]:
    n = int(ctx.fields["target"])
    fields = ctx.find(tag="input_text")
    yield ctx.click(fields[n - 1], f"text field #{n}", f"I need to focus input box number {n}.")


# -------------------------------------------------------------------- several clicks
def _option_inputs(ctx: Ctx, kind: str) -> Iterator[tuple[str, El]]:
    """(label text, its checkbox/radio) pairs."""
    for e in ctx.find(tag=kind):
        lab = ctx.parent(e)
        texts = [c for c in ctx.children(lab) if c["tag"] == "t"] if lab else []
        if texts:
            yield norm(texts[0]["text"]), e


def click_checkboxes(ctx: Ctx) -> Iterator[Step]:
    targets = [v for k, v in ctx.fields.items() if k.startswith("target")]
    boxes = dict(_option_inputs(ctx, "input_checkbox"))
    for i, t in enumerate(targets):
        why = f"The list to select is {', '.join(targets)}; " + ("first" if i == 0 else "next") + f' "{t}".'
        yield ctx.click(boxes[t], f'the checkbox of "{t}"', why)
    done = "All listed boxes are checked" if targets else "Nothing is to be selected"
    yield click_submit(ctx, f"{done}; now I submit.")


def click_option(ctx: Ctx) -> Iterator[Step]:
    t = ctx.fields["target"]
    radios = dict(_option_inputs(ctx, "input_radio"))
    yield ctx.click(radios[t], f'the option "{t}"', f'I need to select "{t}".')
    yield click_submit(ctx, f'"{t}" is selected; now I submit.')


def click_tab_2(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    tried: set[str] = set()
    while True:
        links = ctx.find(tag="span", text=target, pred=ctx.visible)
        if links:
            yield ctx.click(links[0], f'the link "{target}"', f'The link "{target}" is on this tab.')
            return
        active = {
            norm(a["text"])
            for a in ctx.find(tag="a", cls="ui-tabs-anchor")
            if "ui-tabs-active" in (ctx.parent(a) or {"classes": ""})["classes"].split()
        }
        tried |= active
        nxt = [a for a in ctx.find(tag="a", cls="ui-tabs-anchor") if norm(a["text"]) not in tried]
        if not nxt:
            raise TeacherError(f"click-tab-2: link {target!r} in no tab")
        name = norm(nxt[0]["text"])
        tried.add(name)
        yield ctx.click(nxt[0], f'tab "{name}"', f'The link "{target}" is not on this tab; I try the next one.')


def click_collapsible(ctx: Ctx) -> Iterator[Step]:
    header = ctx.one("section header", tag="h3")
    yield ctx.click(header, f'the "{norm(header["text"])}" header', "The section must be expanded first.")
    for _ in range(8):  # the accordion animates open; click Submit once it stops moving
        btn, prev = submit_button(ctx), None
        if ctx.prev:
            prev = next((p for p in ctx.prev if p["ref"] == btn["ref"]), None)
        box = lambda e: (round(e["left"]), round(e["top"]), round(e["width"]), round(e["height"]))  # noqa: E731
        if prev is not None and box(prev) == box(btn) and ctx.visible(btn) and btn["top"] <= TASK_H - 8:
            yield click_submit(ctx, "The section is open and Submit has stopped moving.")
            return
        yield ctx.wait(0.25, "The section is still opening; I wait for it to settle.")
    raise TeacherError("click-collapsible: Submit never settled")


def navigate_tree(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    for _ in range(12):
        hits = ctx.find(tag="span", text=target, pred=ctx.visible)
        if hits:
            yield ctx.click(hits[0], f'"{target}"', f'"{target}" is visible in the tree.')
            return
        closed = ctx.find(cls="expandable-hitarea", pred=ctx.visible)
        if not closed:
            raise TeacherError(f"navigate-tree: {target!r} not found and nothing left to expand")
        folder = next((c for c in ctx.children(ctx.parent(closed[0])) if c["tag"] == "span"), None)
        name = norm(folder["text"]) if folder else "folder"
        yield ctx.click(
            closed[0], f'the expander of folder "{name}"', f'"{target}" is not visible; I open folder "{name}".'
        )
    raise TeacherError("navigate-tree: too many folders")


def odd_or_even(ctx: Ctx) -> Iterator[Step]:
    rows = ctx.find(tag="div", cls="row")
    for i in range(len(rows)):
        row = ctx.find(tag="div", cls="row")[i]
        sub = ctx.subtree(row)
        num = int(next(e for e in sub if "display-number" in e["classes"].split())["text"])
        kind = "even" if num % 2 == 0 else "odd"
        btn = next(e for e in sub if e["tag"] == "button" and kind in e["classes"].split())
        yield ctx.click(btn, f'the "{cap(kind)}" button of row {i + 1}', f"{num} is {kind}.")
    yield click_submit(ctx, "Every number is marked; now I submit.")


# -------------------------------------------------------------------- typing
def enter_text(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    yield from fill(ctx, _first_input(ctx), target, "the text field")
    yield click_submit(ctx, f'"{target}" is typed; now I submit.')


def enter_text_2(ctx: Ctx) -> Iterator[Step]:
    text = ctx.fields["text"]
    text = text.lower() if ctx.fields["case"] == "lower" else text.upper()
    yield from fill(
        ctx, _first_input(ctx), text, "the text field", f'In {ctx.fields["case"]} case the text is "{text}".'
    )
    yield click_submit(ctx, f'"{text}" is typed; now I submit.')


def enter_password(ctx: Ctx) -> Iterator[Step]:
    pw = ctx.fields["target"]
    yield from fill(ctx, ctx.one("password", id="password"), pw, "the password field")
    yield from fill(ctx, ctx.one("verify", id="verify"), pw, "the verify password field")
    yield click_submit(ctx, "Both fields hold the password; now I submit.")


def login_user(ctx: Ctx) -> Iterator[Step]:
    yield from fill(ctx, ctx.one("username", id="username"), ctx.fields["username"], "the username field")
    yield from fill(ctx, ctx.one("password", id="password"), ctx.fields["password"], "the password field")
    yield click_submit(ctx, "Username and password are in; now I log in.")


def find_word(ctx: Ctx) -> Iterator[Step]:
    n = int(ctx.fields["target"])
    words = norm(ctx.one("paragraph", tag="p")["text"]).split()
    word = re.sub(r"[^0-9A-Za-z]", "", words[n - 1])
    yield from fill(ctx, _first_input(ctx), word, "the answer field", f'Word number {n} of the paragraph is "{word}".')
    yield click_submit(ctx)


def read_table(ctx: Ctx) -> Iterator[Step]:
    key = ctx.fields["target"]
    tds = ctx.find(tag="td")
    value = next(norm(tds[i + 1]["text"]) for i, e in enumerate(tds[:-1]) if norm(e["text"]) == key)
    yield from fill(ctx, _first_input(ctx), value, "the text field", f'The table says {key} is "{value}".')
    yield click_submit(ctx)


def _solve(problem: str) -> tuple[str, int]:
    p = problem.replace("=", " ").replace("\u2212", "-").strip()
    m = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/x])\s*(-?\d+)\s*", p)
    if m:  # arithmetic ("x" is then the multiplication sign)
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        v = {"+": a + b, "-": a - b, "*": a * b, "x": a * b, "/": a // b if b else 0}[op]
        return f"{a} {op} {b} = {v}", v
    if "x" in p:  # "a op x = b" or "x op a = b"
        m = re.fullmatch(r"\s*(-?\d+)\s*([+\-*/])\s*x\s+(-?\d+)\s*", p) or None
        if m:
            a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
            x = {"+": b - a, "-": a - b, "*": b // a if a else 0}.get(op, 0)
        else:
            m = re.fullmatch(r"\s*x\s*([+\-*/])\s*(-?\d+)\s+(-?\d+)\s*", p)
            if not m:
                raise TeacherError(f"cannot parse algebra problem {problem!r}")
            op, a, b = m.group(1), int(m.group(2)), int(m.group(3))
            x = {"+": b - a, "-": b + a, "*": b // a if a else 0, "/": b * a}[op]
        return f"x = {x}", x
    raise TeacherError(f"cannot parse math problem {problem!r}")


def simple_math(ctx: Ctx) -> Iterator[Step]:
    problem = norm(ctx.one("problem", id="math-problem")["text"])
    why, value = _solve(problem)
    yield from fill(ctx, ctx.one("answer", id="math-answer"), str(value), "the answer box", f"{why}.")
    yield click_submit(ctx)


def enter_date(ctx: Ctx) -> Iterator[Step]:
    mm, dd, yyyy = ctx.fields["target"].split("/")
    digits = f"{int(mm):02d}{int(dd):02d}{yyyy}"
    field = ctx.one("date field", tag="input_date")
    yield ctx.click(
        field, "the month part of the date field", "Typing starts in the month part of the date field.", dx=10
    )
    yield ctx.type(digits, f"The date is {ctx.fields['target']}; I type month, day and year: {digits}.")
    yield click_submit(ctx)


def enter_time(ctx: Ctx) -> Iterator[Step]:
    m = re.fullmatch(r"(\d{1,2}):(\d{2})\s*([AP])M", ctx.fields["target"].strip().upper())
    if not m:
        raise TeacherError(f"enter-time: cannot parse {ctx.fields['target']!r}")
    keys = f"{int(m.group(1)):02d}{m.group(2)}{m.group(3)}"
    field = ctx.one("time field", tag="input_time")
    yield ctx.click(
        field, "the hour part of the time field", "Typing starts in the hour part of the time field.", dx=10
    )
    yield ctx.type(keys, f"The time is {ctx.fields['target']}; I type hours, minutes and A/P: {keys}.")
    yield click_submit(ctx)


def choose_list(ctx: Ctx) -> Iterator[Step]:
    target = ctx.fields["target"]
    yield ctx.click(ctx.one("list", tag="select"), "the drop-down list", f'I need "{target}" from the list.')
    yield ctx.type(target, f'Typing "{target}" selects it in the focused list.')
    yield click_submit(ctx, f'"{target}" is selected; now I submit.')


def _menu_items(ctx: Ctx, ok: Callable[[str], bool]) -> list[El]:
    return ctx.find(cls="ui-menu-item-wrapper", pred=lambda e: ok(norm(e["text"])))


def use_autocomplete(ctx: Ctx) -> Iterator[Step]:
    start, end = ctx.fields["start"], ctx.fields.get("end", "")
    fits = f'starts with "{start}"' + (f' and ends with "{end}"' if end else "")
    yield from fill(ctx, ctx.one("input", tag="input_text"), start, "the text field", f"The answer {fits}.")
    for _ in range(10):  # suggestions appear after a short delay
        items = _menu_items(ctx, lambda t: t.startswith(start) and t.endswith(end))
        if items:
            break
        yield ctx.wait(0.3, "The suggestions have not appeared yet; I wait.")
    else:
        raise TeacherError("use-autocomplete: no suggestion appeared")
    name = norm(items[0]["text"])
    if items[0]["top"] + items[0]["height"] > TASK_H:  # below the screen: type more to narrow the list
        yield ctx.type(name[len(start) :], f'"{name}" {fits}; I type the rest of it to narrow the list.')
        for _ in range(10):
            items = _menu_items(ctx, lambda t: t == name)
            if items and all(norm(e["text"]).startswith(name) for e in _menu_items(ctx, lambda t: True)):
                break
            yield ctx.wait(0.3, "The list has not narrowed yet; I wait.")
        else:
            raise TeacherError("use-autocomplete: the list did not narrow")
    yield ctx.click(items[0], f'the suggestion "{name}"', f'"{name}" {fits}.')
    yield click_submit(ctx, f'"{name}" is entered; now I submit.')


_FORM_KEYS = {"genre": ("genre",), "director": ("director",), "year": ("year", "date")}


def _field_of(ctx: Ctx, inp: El) -> str | None:
    """The form field an input belongs to: the closest ancestor holding exactly one label word."""
    for anc in ctx.ancestors(inp):
        texts = [
            norm(e["text"]).lower()
            for e in ctx.subtree(anc)
            if e["leaf"] and e["text"] and not e["tag"].startswith("input_")
        ]
        kinds = {k for k, words in _FORM_KEYS.items() for t in texts if any(w in t for w in words)}
        if len(kinds) == 1:
            return kinds.pop()
        if len(kinds) > 1:
            return None
    return None


def multi_form(ctx: Ctx) -> Iterator[Step]:
    for inp in ctx.find(tag="input_text"):
        kind = _field_of(ctx, inp)
        if kind is None:
            raise TeacherError(f"{ctx.task_id}: unlabelled input")
        value = ctx.fields[kind]
        yield from fill(ctx, inp, value, f"the {kind} field", f'The {kind} must be "{value}".')
    yield click_submit(ctx, "All fields are filled; now I search.")


def guess_number(ctx: Ctx) -> Iterator[Step]:
    lo, hi = 0, 9
    field = ctx.one("number field", tag="input_number")
    first = True
    while lo <= hi:
        guess = (lo + hi) // 2
        if first:
            yield ctx.click(
                field, "the number field", f"The number is between {lo} and {hi}; I guess {guess}.", dx=8
            )  # the left part: the centre of a number input is near its spin arrows
            first = False
        else:
            yield ctx.key(
                ["ctrl", "a"],
                "Select the old guess",
                f"The number is between {lo} and {hi}; I replace the old guess with {guess}.",
            )
        yield ctx.type(str(guess), f"I type the guess {guess}.")
        yield ctx.key(["enter"], "Press Enter to submit the guess", "Enter submits the guess.")
        fb = (
            "higher"
            if ctx.find(id="higher", pred=ctx.visible)
            else "lower"
            if ctx.find(id="lower", pred=ctx.visible)
            else ""
        )
        if "higher" in fb:
            lo = guess + 1
        elif "lower" in fb:
            hi = guess - 1
        else:
            return  # correct (the env has ended the episode) or no feedback
    raise TeacherError("guess-number: ran out of numbers")


RECIPES: dict[str, Callable[[Ctx], Iterator[Step]]] = {
    "click-test": click_test,
    "click-test-2": click_named_button,
    "click-button": click_named_button,
    "unicode-test": click_named_button,
    "click-button-sequence": click_button_sequence,
    "click-link": click_link,
    "click-dialog": click_dialog,
    "click-dialog-2": click_dialog_2,
    "click-tab": click_tab,
    "click-color": click_color,
    "click-widget": click_widget,
    "grid-coordinate": grid_coordinate,
    "identify-shape": identify_shape,
    "focus-text": focus_text,
    "focus-text-2": focus_text_2,
    "click-checkboxes": click_checkboxes,
    "click-checkboxes-large": click_checkboxes,
    "click-checkboxes-transfer": click_checkboxes,
    "click-option": click_option,
    "click-tab-2": click_tab_2,
    "click-tab-2-hard": click_tab_2,
    "click-collapsible": click_collapsible,
    "navigate-tree": navigate_tree,
    "odd-or-even": odd_or_even,
    "enter-text": enter_text,
    "enter-text-dynamic": enter_text,
    "enter-text-2": enter_text_2,
    "enter-password": enter_password,
    "login-user": login_user,
    "find-word": find_word,
    "read-table": read_table,
    "simple-arithmetic": simple_math,
    "simple-algebra": simple_math,
    "enter-date": enter_date,
    "enter-time": enter_time,
    "choose-list": choose_list,
    "use-autocomplete": use_autocomplete,
    "multi-orderings": multi_form,
    "multi-layouts": multi_form,
    "guess-number": guess_number,
}
RECIPES.update(SYNTH_RECIPES)  # synth/<kind> (envs/synth): agents/teacher_synth.py
