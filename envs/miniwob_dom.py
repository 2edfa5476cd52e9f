"""MiniWoB's DOM snapshot (`core.getDOMInfo()`) as plain dicts and as a compact text view.

    elems = dom_elements(raw)          # pre-order list of dicts, boxes in CSS px
    ui_text(elems, scale=2)            # 'button "Submit" @ (160,300) [120x40]' lines, screen px

`dom_elements` mirrors `miniwob.dom.DOMElement` (same tags, the same "all children are
text" fix) without its numpy serialisation. The text view lists what a person would
read or press: text leaves, inputs, buttons, links, svg shapes and elements with an id,
each with its centre and size in the screen space the policy acts in.
"""

from __future__ import annotations

import re
from typing import Any

# Shown even without text: things one clicks or types into, and svg shapes.
_INTERACTIVE = frozenset({"button", "select", "textarea"})
_SHAPES = frozenset({"circle", "rect", "polygon", "ellipse", "path", "line"})
_TEXT_MAX = 80  # long enough for find-word paragraphs and table cells
_RGBA = re.compile(r"rgba?\(([0-9.]+), ([0-9.]+), ([0-9.]+)(?:, ([0-9.]+))?\)")
# Class tokens that mark the selected item of a group (the open tab): jQuery UI's tabs and the synthetic pages.
# An accessibility tree says `selected` for these; the screenshot shows it only as styling.
_SELECTED = frozenset({"active", "selected", "ui-tabs-active", "ui-state-active"})


def _color(s: str | None) -> tuple[float, float, float, float]:
    """'rgb(255, 0, 0)' -> (1.0, 0.0, 0.0, 1.0), in 0..1 like miniwob (None -> white)."""
    if not s:
        return 1.0, 1.0, 1.0, 1.0
    m = _RGBA.search(s)
    if not m:
        return 1.0, 1.0, 1.0, 1.0
    a = float(m.group(4)) if m.group(4) is not None else 1.0
    return float(m.group(1)) / 255, float(m.group(2)) / 255, float(m.group(3)) / 255, a


def dom_elements(raw: dict[str, Any]) -> list[dict[str, Any]]:
    """Flatten the raw getDOMInfo tree into pre-order dicts (ref, parent, tag, text, value, id, classes,
    left/top/width/height in CSS px, bg_color/fg_color in 0..1, focused, tampered, leaf, depth)."""
    out: list[dict[str, Any]] = []

    def visit(node: dict[str, Any], parent: int, depth: int) -> None:
        children = node.get("children") or []
        text = str(node["text"]) if "text" in node else None
        if children and all(c["tag"].lower() == "t" for c in children):
            text, children = " ".join(str(c.get("text", "")) for c in children), []
        classes = node.get("classes", "")
        e = {
            "ref": node["ref"],
            "parent": parent,
            "tag": node["tag"].lower(),
            "text": text,
            "value": node.get("value"),
            "id": node.get("id", "") or "",
            "classes": classes if isinstance(classes, str) else "SVG_CLASS",
            "left": float(node["left"]),
            "top": float(node["top"]),
            "width": float(node["width"]),
            "height": float(node["height"]),
            "bg_color": _color(node.get("bgColor")),
            "fg_color": _color(node.get("fgColor")),
            "focused": bool(node.get("focused", False)),
            "tampered": bool(node.get("tampered", False)),
            "leaf": text is not None,
            "depth": depth,
        }
        out.append(e)
        for c in children:
            visit(c, node["ref"], depth + 1)

    visit(raw, 0, 0)
    return out


def _swatch(e: dict[str, Any]) -> str | None:
    """'bg=yellow' / 'bg=#12ab34' for an empty leaf painted in a solid colour (colour boxes); layout
    boxes have a transparent background and are not shown."""
    if not e["leaf"] or e["text"] or e["width"] < 4 or e["height"] < 4:
        return None
    r, g, b, a = e["bg_color"]
    if a < 1.0:
        return None
    hexa = "#{:02x}{:02x}{:02x}".format(*(int(round(c * 255)) for c in (r, g, b)))
    return f"bg={_color_names().get(hexa, hexa)}"


def _color_names() -> dict[str, str]:
    global _NAMES
    if _NAMES is None:
        from PIL import ImageColor

        _NAMES = {v: k for k, v in sorted(ImageColor.colormap.items(), reverse=True) if isinstance(v, str)}
        _NAMES.update({"#808080": "grey", "#00ffff": "cyan", "#ff00ff": "magenta"})  # the names tasks use
    return _NAMES


_NAMES: dict[str, str] | None = None


def _shown(e: dict[str, Any]) -> bool:
    tag = e["tag"]
    if tag.startswith("input_") or tag in _INTERACTIVE:
        return True
    if e["leaf"]:
        return bool(e["text"]) or tag in _SHAPES or bool(e["id"]) or _swatch(e) is not None
    return False


def _quote(s: str) -> str:
    s = " ".join(str(s).split())
    if len(s) > _TEXT_MAX:
        s = s[: _TEXT_MAX - 3] + "..."
    return '"' + s.replace('"', "'") + '"'


def _classes_mark_selected(e: dict[str, Any] | None) -> bool:
    return bool(e) and isinstance(e["classes"], str) and not _SELECTED.isdisjoint(e["classes"].split())


def element_line(e: dict[str, Any], scale: int = 1, selected: bool = False) -> str:
    """One element as `tag#id "text" @ (cx,cy) [wxh] flags`, in screen px (CSS px * scale)."""
    tag = "text" if e["tag"] == "t" else e["tag"]
    label = f"{tag}#{e['id']}" if e["id"] else tag
    parts = [label]
    if tag in ("input_checkbox", "input_radio"):
        if e["text"]:
            parts.append(_quote(e["text"]))
    elif tag.startswith("input_") or tag in ("textarea", "select"):
        parts.append(_quote(e["value"] if e["value"] is not None else ""))
    elif e["text"]:
        parts.append(_quote(e["text"]))
    elif _swatch(e):
        parts.append(_swatch(e))
    cx, cy = (e["left"] + e["width"] / 2) * scale, (e["top"] + e["height"] / 2) * scale
    parts.append(f"@ ({round(cx)},{round(cy)}) [{round(e['width'] * scale)}x{round(e['height'] * scale)}]")
    if tag in ("input_checkbox", "input_radio"):
        parts.append("checked" if e["value"] else "unchecked")
    if selected:
        parts.append("selected")
    if e["focused"]:
        parts.append("focused")
    return " ".join(parts)


def visible(e: dict[str, Any], task_w: float, task_h: float) -> bool:
    """The box overlaps the task area the screenshot shows."""
    return (
        e["width"] > 0
        and e["height"] > 0
        and e["left"] < task_w
        and e["top"] < task_h
        and e["left"] + e["width"] > 0
        and e["top"] + e["height"] > 0
    )


def is_selected(e: dict[str, Any], by_ref: dict[int, dict[str, Any]]) -> bool:
    """The element is the selected one of its group: a selected-state class on it or on its parent (jQuery UI
    marks the tab's <li>, the link inside it is what is shown)."""
    return _classes_mark_selected(e) or _classes_mark_selected(by_ref.get(e["parent"]))


def ui_text(elems: list[dict[str, Any]], scale: int = 1, task_w: float = 160, task_h: float = 210) -> str:
    """The compact text view: one shown, visible element per line, in document order."""
    by_ref = {e["ref"]: e for e in elems}
    return "\n".join(
        element_line(e, scale, is_selected(e, by_ref)) for e in elems[1:] if _shown(e) and visible(e, task_w, task_h)
    )
