"""The DOM text view's state flags, from getDOMInfo-shaped trees (no browser; tests/test_miniwob_env.py drives
Chromium and checks every line's shape on real pages)."""

from __future__ import annotations

from envs.miniwob_dom import dom_elements, ui_text


def _node(ref: int, tag: str, classes: str = "", text: str | None = None, children=(), left=10, **kw):
    node = {"ref": ref, "tag": tag, "classes": classes, "left": left, "top": 10, "width": 30, "height": 10, **kw}
    if text is not None:
        node["text"] = text
    if children:
        node["children"] = list(children)
    return node


def _tabs(active: int) -> dict:
    """jQuery UI tabs: the state class sits on the <li>, the shown element is the link inside it."""
    lis = [
        _node(
            10 + k,
            "LI",
            "ui-tabs-tab ui-state-default" + (" ui-tabs-active ui-state-active" if k == active else ""),
            children=[_node(20 + k, "A", "ui-tabs-anchor", f"Tab #{k + 1}", left=10 + 40 * k, id=f"ui-id-{k + 1}")],
        )
        for k in range(3)
    ]
    return _node(1, "BODY", children=[_node(2, "UL", children=lis), _node(3, "SPAN", "alink", "lorem", left=50)])


def test_the_open_tab_is_marked_selected_and_no_other_line_is():
    for active in range(3):
        lines = ui_text(dom_elements(_tabs(active))).splitlines()
        marked = [ln for ln in lines if ln.endswith(" selected")]
        assert marked == [next(ln for ln in lines if f'"Tab #{active + 1}"' in ln)], lines
        assert not any("selected" in ln for ln in lines if "lorem" in ln)


def test_a_state_class_on_the_element_itself_marks_it_and_focus_comes_after():
    tree = _node(
        1,
        "BODY",
        children=[
            _node(2, "DIV", "syn tab active", "Kinnu", focused=True),
            _node(3, "DIV", "syn tab", "Jiosax", left=60),
            _node(4, "DIV", "activeness", "not a state token", left=100),
        ],
    )
    lines = ui_text(dom_elements(tree)).splitlines()
    assert lines[0].endswith("[30x10] selected focused"), lines
    assert not lines[1].endswith("selected") and not lines[2].endswith("selected"), lines


def test_svg_class_objects_never_mark_selected():
    tree = _node(1, "BODY", children=[_node(2, "circle", {"baseVal": "active"}, "", left=20)])
    (line,) = ui_text(dom_elements(tree)).splitlines()
    assert "selected" not in line
