"""Why clicks miss: each click step's cited element checked against the screen it was chosen on.

    flywheel lake grounding --stage evaluate --iteration 2          # per task: hit / absent / off_target / uncited
    rows = grounding_table(con, stage="evaluate", policy="student")

A reply's Action line cites the element it means (`Action: Click span "tellus" @ (714,571)`, see
agents/teacher_ctx.py) before the tool call that clicks. The step's UI text (screen px boxes, `steps.ui_text`)
and its executed click (`steps.action`, screen px) say which of four things happened:

- hit: the click landed inside the box of an element the line cites (its tag and text as the UI text lists them;
  a DOM id after the tag, `a#ui-id-2`, is not compared: a reply that garbles the id still names the element);
- absent: no element on this screen has the cited tag and text (the model named something that is not there:
  a near-copy of the word, a word from the instruction, an element of another tab);
- off_target: the cited element is on the screen but the click landed outside its box (the numbers were copied
  from another line, or made up);
- uncited: the Action line names no element (no `Click <tag> "<text>" @ (x,y)` form) or the step has no click.

A failed episode's clicks split this way separate a reading failure (absent: the model must learn to check
what is on the page) from a pointing failure (off_target: the element's own coordinates), which are fixed by
different data. Only the lake's columns are read; nothing is re-run.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from typing import Any

CATEGORIES = ("hit", "absent", "off_target", "uncited")
_CITE = re.compile(r"^Click (?P<name>.+?) @ \(-?\d+,-?\d+\)")


def _element(name: str) -> str:
    """A cited element as compared: `a#ui-id-2 "Tab #2"` -> `a "Tab #2"` (the DOM id dropped, the text kept)."""
    head, sep, rest = name.partition(" ")
    return head.split("#", 1)[0] + sep + rest


def classify_click(action_desc: str | None, action: Any, ui_text: str | None) -> str:
    """One step: 'hit', 'absent', 'off_target' or 'uncited' (see the module doc). `action` is the step's
    executed action (a dict or its JSON, x/y in screen px)."""
    from training.data import ui_boxes

    if isinstance(action, str):
        try:
            action = json.loads(action)
        except ValueError:
            return "uncited"
    m = _CITE.match((action_desc or "").strip())
    if not m or not isinstance(action, dict) or action.get("action") != "click":
        return "uncited"
    x, y = action.get("x"), action.get("y")
    if not isinstance(x, (int, float)) or not isinstance(y, (int, float)):
        return "uncited"
    want = _element(m["name"])
    cited = [b for b in ui_boxes(ui_text or "") if _element(b.cite.rsplit(" @ (", 1)[0]) == want]
    if not cited:
        return "absent"
    return "hit" if any(b.holds(x, y, slack=0.5) for b in cited) else "off_target"


GROUNDING_SQL = """
SELECT e.task_id, e.success, s.action_desc, s.action, s.ui_text
FROM steps AS s JOIN episodes AS e USING (episode_id)
WHERE NOT s.is_final AND s.action_desc LIKE 'Click%' {where}
"""


def grounding_table(
    con,
    *,
    stage: str | None = None,
    iteration: int | None = None,
    run_key: str | None = None,
    policy: str | None = None,
) -> list[dict[str, Any]]:
    """Per task (and an '__all__' row): click steps by category, over all episodes and over the failed ones
    (`failed_<category>`), for the episodes the filters select (each None: all)."""
    conds, params = [], []
    for col, val in (("e.stage", stage), ("e.iteration", iteration), ("e.run_key", run_key), ("e.policy", policy)):
        if val is not None:
            conds.append(f"AND {col} = ?")
            params.append(val)
    cur = con.execute(GROUNDING_SQL.format(where=" ".join(conds)), params)
    counts: dict[str, Counter] = defaultdict(Counter)
    for task, success, desc, action, ui in cur.fetchall():
        c = classify_click(desc, action, ui)
        for key in (task, "__all__"):
            counts[key]["clicks"] += 1
            counts[key][c] += 1
            if not success:
                counts[key]["failed_clicks"] += 1
                counts[key][f"failed_{c}"] += 1
    rows = []
    for task in sorted(counts, key=lambda t: (t == "__all__", t)):
        n = counts[task]
        row: dict[str, Any] = {"task_id": task, "clicks": n["clicks"]}
        row.update({c: n[c] for c in CATEGORIES})
        row["failed_clicks"] = n["failed_clicks"]
        row.update({f"failed_{c}": n[f"failed_{c}"] for c in CATEGORIES})
        rows.append(row)
    return rows
