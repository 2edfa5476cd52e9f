"""Why clicks miss (flywheel/grounding.py, `flywheel lake grounding`): the cited element against the screen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic import synthetic_episodes

from flywheel.grounding import classify_click
from storage.lake import Lake

ROOT = Path(__file__).resolve().parents[1]
# A click-tab-2 screen as the lake stores it (screen px, box centres)
UI = "\n".join(
    [
        'a#ui-id-1 "Tab #1" @ (27,70) [40x23]',
        'a#ui-id-2 "Tab #2" @ (71,70) [40x23] focused',
        'span "nibh" @ (119,132) [19x11]',
        'span "tellus" @ (119,164) [23x11]',
        'span "tellus" @ (40,120) [23x11]',
    ]
)


def click(x, y):
    return {"action": "click", "x": x, "y": y, "button": "left", "clicks": 1}


@pytest.mark.parametrize(
    "desc,action,want",
    [
        ('Click span "tellus" @ (744,781)', click(119.0, 164.0), "hit"),
        ('Click span "tellus" @ (744,781)', click(130.0, 169.0), "hit"),  # inside the box's edge
        ('Click span "tellus" @ (250,571)', click(40.0, 120.0), "hit"),  # the second "tellus"
        ('Click span "tellus" @ (714,571)', click(114.2, 119.9), "off_target"),  # the numbers of another line
        ('Click span "tellus" @ (744,700)', click(119.0, 147.0), "off_target"),
        ('Click span "tellu" @ (744,781)', click(119.0, 164.0), "absent"),  # a near-copy: not on this screen
        ('Click span "velit" @ (744,781)', click(119.0, 164.0), "absent"),
        ('Click a "tellus" @ (744,781)', click(119.0, 164.0), "absent"),  # the tag is part of the citation
        ('Click a#ui-id-2 "Tab #2" @ (444,333)', click(71.0, 70.0), "hit"),
        ('Click a#ui-id-1 "Tab #2" @ (444,333)', click(71.0, 70.0), "hit"),  # a garbled id still names the tab
        ('Click a "Tab #2" @ (444,333)', click(27.0, 70.0), "off_target"),  # Tab #1's box
        ("Click the button", click(119.0, 164.0), "uncited"),
        ('Click span "tellus" @ (744,781)', {"action": "type", "text": "x"}, "uncited"),
        ('Click span "tellus" @ (744,781)', "not json", "uncited"),
        (None, click(1, 1), "uncited"),
    ],
)
def test_classify_click(desc, action, want):
    assert classify_click(desc, action, UI) == want
    assert classify_click(desc, json.dumps(action), UI) == want  # the lake stores the action as JSON


def test_grounding_cli_counts_per_task_and_failed(tmp_path):
    eps, steps = synthetic_episodes(12, 2)
    by_ep = {e["episode_id"]: e for e in eps}
    cases = {"hit": (119.0, 164.0, "tellus"), "off_target": (114.0, 120.0, "tellus"), "absent": (119.0, 164.0, "tellu")}
    want: dict = {}
    for i, s in enumerate(s for s in steps if not s["is_final"]):
        cat = ("hit", "off_target", "absent")[i % 3]
        x, y, text = cases[cat]
        s.update(ui_text=UI, action=json.dumps(click(x, y)), action_desc=f'Click span "{text}" @ (1,1)')
        e = by_ep[s["episode_id"]]
        for key in (e["task_id"], "__all__"):
            w = want.setdefault(key, {"clicks": 0, "failed_clicks": 0})
            w["clicks"] += 1
            w[cat] = w.get(cat, 0) + 1
            if not e["success"]:
                w["failed_clicks"] += 1
                w[f"failed_{cat}"] = w.get(f"failed_{cat}", 0) + 1
    lk = Lake(tmp_path / "lake")
    lk.write("episodes", eps, iteration=0, stage="rollouts", run_key="r")
    lk.write("steps", steps, iteration=0, stage="rollouts", run_key="r")
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "flywheel", "lake", "grounding", "--lake", str(lk.root), *a],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    r = run("--json", "--stage", "rollouts")
    assert r.returncode == 0, r.stderr
    rows = {row["task_id"]: row for row in json.loads(r.stdout)}
    assert set(rows) == set(want) and list(json.loads(r.stdout))[-1]["task_id"] == "__all__"
    for task, w in want.items():
        got = {k: v for k, v in rows[task].items() if k != "task_id" and v}
        assert got == w, (task, got, w)
    assert 0 < rows["__all__"]["failed_clicks"] < rows["__all__"]["clicks"]  # both kinds of episode are there
    r = run("--json", "--stage", "evaluate")  # a filter that selects nothing
    assert r.returncode == 0 and json.loads(r.stdout) == []
    r = run()  # the table
    assert r.returncode == 0 and "off_target" in r.stdout and "__all__" in r.stdout, r.stderr
