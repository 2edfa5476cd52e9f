"""Why click-button eval episodes fail: each episode's first reply, classified against the screen's text.

    .venv/bin/python benchmarks/click_button_failures.py LAKE [EVALUATE_RUN_KEY]

Reads the newest evaluate run of LAKE (or the one named) and prints JSON:
  - "replies": success / wrong label / right label with x, y or both wrong / unparseable, where a coordinate is
    wrong when it is more than 3 units (of the model's 0..1000 space) from the asked button's line in ui_text;
  - "by_position": successes / episodes by where the asked button sits: the screen's first line or a later one,
    and at the left edge (its x is then a function of its label's width) or not.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from storage.catalog import connect  # noqa: E402

ACTION = re.compile(r'Click button "([^"]*)" @ \((\d+),(\d+)\)')


def _classify(ok: bool, want: str, ui: str, act: str | None, w: int, h: int) -> str:
    if ok:
        return "success"
    m = ACTION.match(act or "")
    if not m:
        return "unparseable or another action"
    if m.group(1) != want:
        return "wrong label"
    line = re.search(r'button "%s" @ \((\d+),(\d+)\)' % re.escape(want), ui)
    bad_x = abs(int(m.group(2)) - round(int(line.group(1)) * 1000 / w)) > 3
    bad_y = abs(int(m.group(3)) - round(int(line.group(2)) * 1000 / h)) > 3
    return {
        (True, True): "right label, both wrong",
        (True, False): "right label, x wrong",
        (False, True): "right label, y wrong",
    }.get((bad_x, bad_y), "right label, coordinates right")


def main() -> None:
    con = connect(sys.argv[1])  # the lake's views (local or s3://)
    key = (
        sys.argv[2]
        if len(sys.argv) > 2
        else con.execute(
            "SELECT run_key FROM episodes WHERE stage = 'evaluate' GROUP BY run_key ORDER BY max(ended_at) DESC LIMIT 1"
        ).fetchone()[0]
    )
    rows = con.execute(
        "SELECT e.success, e.instruction, s.ui_text, s.action_desc, s.screen_w, s.screen_h "
        "FROM steps s JOIN episodes e USING (episode_id) WHERE e.run_key = ? "
        "AND e.task_id LIKE '%click-button%' AND s.step_idx = 0 ORDER BY e.seed",
        [key],
    ).fetchall()
    replies, where = collections.Counter(), collections.defaultdict(lambda: [0, 0])
    for ok, instr, ui, act, w, h in rows:
        want = re.search(r'"([^"]+)"', instr or "")
        lines = (ui or "").splitlines()
        i = next((k for k, line in enumerate(lines) if want and line.startswith(f'button "{want.group(1)}"')), None)
        if i is None:  # not a click-button screen this script can read (no quoted label, or no such button line)
            replies["asked button not in ui_text"] += 1
            continue
        want = want.group(1)
        replies[_classify(ok, want, ui, act, w, h)] += 1
        x, width = int(re.search(r"@ \((\d+),", lines[i]).group(1)), int(re.search(r"\[(\d+)x", lines[i]).group(1))
        pos = ("first line" if i == 0 else "later line") + (", left edge" if 2 * x - width <= 6 else ", not left")
        where[pos][0] += bool(ok)
        where[pos][1] += 1
    print(
        json.dumps(
            {
                "run_key": key,
                "episodes": len(rows),
                "replies": dict(replies),
                "by_position": {k: f"{s}/{n}" for k, (s, n) in sorted(where.items())},
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
