"""`flywheel import osworld-results`, `agentnet` and `slime` from the CLI: OSWorld result folders
(tests/fixtures/osworld_results, in the format of OSWorld's lib_run_single.py) and AgentNet records
(tests/fixtures/agentnet, OpenCUA's documented record) and slime SFT records (tests/fixtures/slime, the shape of
slime's curate_reasoning_sft.py) into the lake, and the pyautogui reader that never runs
the code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agents.actions import Click, Done, DoubleClick, Drag, Fail, Key, Move, RightClick, Scroll, Type, Wait
from agents.pyautogui_parse import Pointer, parse_pyautogui, read_pyautogui
from storage.catalog import connect

FIXTURES = Path(__file__).parent / "fixtures" / "osworld_results"
CHROME = "bb5e4c0d-f964-439c-97b6-bdb9747de3f4"
OS_TASK = "5812b315-e7bd-4265-b51f-863c02174c28"


@pytest.mark.parametrize(
    "code, want",
    [
        ("pyautogui.click(100, 200)", [Click(x=100, y=200)]),
        ("import pyautogui\npyautogui.click(x=5, y=6, clicks=2)", [Click(x=5, y=6, clicks=2)]),
        ("pyautogui.click(100, 200, button='right')", [RightClick(x=100, y=200)]),
        ("pyautogui.doubleClick((30, 40))", [DoubleClick(x=30, y=40)]),
        ("pyautogui.tripleClick(1, 2)", [Click(x=1, y=2, clicks=3)]),
        ("pyautogui.middleClick(1, 2)", [Click(x=1, y=2, button="middle")]),
        (
            "pyautogui.moveTo(10, 20); pyautogui.dragTo(300, 400, duration=0.5)",
            [Move(x=10, y=20), Drag(x1=10, y1=20, x2=300, y2=400)],
        ),
        ("pyautogui.moveTo(10, 20)\npyautogui.click()", [Move(x=10, y=20), Click(x=10, y=20)]),
        ("pyautogui.scroll(-3, x=50, y=60)", [Scroll(x=50, y=60, dy=3)]),
        ("pyautogui.hscroll(2, 50, 60)", [Scroll(x=50, y=60, dx=2)]),
        ("pyautogui.typewrite('hello', interval=0.05)", [Type(text="hello")]),
        ("pyautogui.write('a\"b')", [Type(text='a"b')]),
        ("pyautogui.typewrite(['a', 'enter'])", [Key(keys=["a"]), Key(keys=["enter"])]),
        ("pyautogui.press('Return')", [Key(keys=["enter"])]),
        ("pyautogui.press('tab', presses=2)", [Key(keys=["tab"]), Key(keys=["tab"])]),
        ("pyautogui.hotkey('ctrl', 'Shift', 't')", [Key(keys=["ctrl", "shift", "t"])]),
        ("import time\ntime.sleep(0.5)", [Wait(seconds=0.5)]),
        ("WAIT", [Wait(seconds=1)]),
        ("DONE", [Done()]),
        (" FAIL\n", [Fail()]),
    ],
)
def test_pyautogui_code_becomes_schema_actions(code, want):
    actions, err = parse_pyautogui(code, 1920, 1080)
    assert err is None and actions == want


@pytest.mark.parametrize(
    "code, why",
    [
        ("import os\nos.system('touch /tmp/flywheel-pwned')", "only `import pyautogui`"),
        ("__import__('os').system('touch /tmp/flywheel-pwned')", "unsupported call"),
        ("open('/tmp/flywheel-pwned', 'w').write('x')", "unsupported call"),
        ("pyautogui.click(x, y)", "not a literal"),
        ("pyautogui.click(*pts)", "*args"),
        ("for i in range(3):\n    pyautogui.press('down')", "unsupported statement"),
        ("pyautogui.mouseDown(); pyautogui.mouseUp()", "unsupported function pyautogui.mouseDown"),
        ("pyautogui.click()", "no known pointer"),
        ("pyautogui.dragTo(5, 5)", "without a known start point"),
        ("pyautogui.click(5000, 10)", "off the 1920x1080 screen"),
        ("pyautogui.press('hyperspace')", "unknown key"),
        ("pyautogui.click(1, 2, foo=3)", "unsupported argument 'foo'"),
        ("pyautogui.click(1, 2", "not Python"),
        ("", "empty action"),
        (None, "not a string"),
        ("x = 5", "unsupported statement"),
    ],
)
def test_anything_else_is_a_reason_never_executed(code, why):
    actions, err = parse_pyautogui(code, 1920, 1080)
    assert actions == [] and why in err
    assert not os.path.exists("/tmp/flywheel-pwned")


def test_the_pointer_carries_across_steps_and_a_failed_step_leaves_it():
    ptr = Pointer()
    parse_pyautogui("pyautogui.moveTo(7, 8)", 100, 100, ptr)
    assert parse_pyautogui("pyautogui.moveTo(9, 9); pyautogui.click(500, 1)", 100, 100, ptr)[0] == []
    assert parse_pyautogui("pyautogui.click()", 100, 100, ptr)[0] == [Click(x=7, y=8)]


def fw(*args):
    return subprocess.run(
        [sys.executable, "-m", "flywheel", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "FLYWHEEL_LAKE": ""},
    )


def test_import_osworld_results_from_the_cli(tmp_path):
    lake = tmp_path / "lake"
    r = fw("import", "osworld-results", str(FIXTURES), "--lake", str(lake))
    assert r.returncode == 1, r.stderr  # one folder has a corrupt line
    assert (
        "imported 2 episodes (12 steps, 2 kept unparsed with a reason, 1 parsed but flagged unfit for SFT), "
        "0 already in the lake, 1 rejected" in r.stdout
    )
    rejected = [ln for ln in r.stderr.splitlines() if "rejected" in ln]
    assert len(rejected) == 1 and "7a4deb26-d57d-4ea9-9a73-630f66a7b568/traj.jsonl:2: not JSON" in rejected[0]

    con = connect(lake)
    eps = {
        r[0]: r[1:]
        for r in con.execute(
            (
                "SELECT task_id, env, policy, policy_version, task_reward, success, "
                "status, n_steps, instruction FROM episodes"
            )
        ).fetchall()
    }
    assert eps[CHROME][:7] == ("osworld", "osworld-import", "claude-sonnet-4-6", 1.0, True, "ok", 7)
    assert eps[CHROME][7].startswith("Can you make Bing the main search engine")
    assert eps[OS_TASK][:7] == ("osworld", "osworld-import", "claude-sonnet-4-6", 0.0, False, "ok", 5)
    steps = con.execute(
        """SELECT s.step_idx, s.parse_ok, s.parse_error, s.action, s.screen_w, s.screen_h,
                                  s.action_desc, s.response_text, s.screenshot IS NOT NULL
                           FROM steps s JOIN episodes e USING (episode_id)
                           WHERE e.task_id = ? AND NOT s.is_final ORDER BY s.step_idx""",
        [CHROME],
    ).fetchall()
    # one traj line whose code holds three calls becomes three steps; moveTo + click() uses the moved pointer
    acts = [json.loads(s[3]) for s in steps]
    assert [a["action"] for a in acts] == ["click", "key", "type", "key", "move", "click", "done"]
    assert (acts[0]["x"], acts[0]["y"]) == (176, 12) and (acts[5]["x"], acts[5]["y"]) == (100, 60)
    assert all(s[1] for s in steps) and {(s[4], s[5]) for s in steps} == {(192, 108)} and all(s[8] for s in steps)
    assert steps[1][6].endswith("[part 1 of 3]") and steps[0][7].startswith("The Chrome menu")
    bad = con.execute(
        """SELECT s.step_idx, s.parse_ok, s.fallback_parse, s.parse_error, s.action FROM steps s
                         JOIN episodes e USING (episode_id) WHERE e.task_id = ? AND s.parse_error IS NOT NULL
                         ORDER BY 1""",
        [OS_TASK],
    ).fetchall()
    assert [b[0] for b in bad] == [0, 1, 2]
    # the first step has no screen before it: its action is kept, in the schema, flagged out of SFT
    assert bad[0][1:3] == (True, True) and json.loads(bad[0][4])["action"] == "right_click"
    assert "no screenshot of the screen before this step" in bad[0][3] and "not fit for SFT" in bad[0][3]
    assert bad[1][1:3] == (False, False) and bad[1][4] is None and "only `import pyautogui`" in bad[1][3]
    assert "unsupported statement" in bad[2][3]
    final = con.execute("SELECT count(*) FROM steps WHERE is_final AND screenshot IS NOT NULL").fetchone()
    assert final == (2,)

    again = fw("import", "osworld-results", str(FIXTURES), "--lake", str(lake))  # idempotent
    assert (
        "imported 0 episodes (0 steps, 0 kept unparsed with a reason), 2 already in the lake, 1 rejected"
        in again.stdout
    )
    assert connect(lake).execute("SELECT count(*) FROM episodes").fetchone() == (2,)

    missing = fw("import", "osworld-results", str(tmp_path / "nope"), "--lake", str(lake))
    assert missing.returncode == 2 and "not a folder of OSWorld results" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


# ---- AgentNet (OpenCUA) ----------------------------------------------------------------------------

AGENTNET = Path(__file__).parent / "fixtures" / "agentnet" / "agentnet_sample.jsonl"


def test_import_agentnet_converts_normalised_coordinates(tmp_path):
    lake = tmp_path / "lake"
    r = fw("import", "agentnet", str(AGENTNET), "--lake", str(lake))
    assert (
        r.returncode == 1
        and "imported 2 episodes (5 steps, 1 kept unparsed with a reason), 0 already in the lake, 2 rejected"
        in r.stdout
    )
    rejected = [ln for ln in r.stderr.splitlines() if "rejected" in ln]
    assert any("agentnet_sample.jsonl:3: traj[0] image 'nope.png' not found" in ln for ln in rejected)
    assert any("agentnet_sample.jsonl:4: not JSON" in ln for ln in rejected)
    con = connect(lake)
    rows = con.execute("""SELECT e.task_id, e.success, s.step_idx, s.action, s.thought, s.action_desc, s.parse_error,
                                 s.screen_w, s.screen_h
                          FROM steps s JOIN episodes e USING (episode_id) ORDER BY e.task_id, s.step_idx""").fetchall()
    ok = [r for r in rows if r[0] == "20240927_a1b2c3"]
    acts = [json.loads(r[3]) for r in ok]
    # (0.25, 0.5) on a 256x160 screen through CoordTransform.for_unit
    assert acts[0] == {"action": "click", "x": 64.0, "y": 80.0, "button": "left", "clicks": 1}
    assert [a["action"] for a in acts] == ["click", "key", "type", "done"]
    assert (
        ok[0][1] is True
        and ok[0][4] == "I need to select report.txt first."
        and ok[0][5] == "Click on report.txt to select it."
    )
    assert ok[1][5].endswith("[part 1 of 2]") and {(r[7], r[8]) for r in ok} == {(256, 160)}
    (bad,) = [r for r in rows if r[0] == "20241002_d4e5f6"]
    assert bad[1] is False and bad[3] is None and "off the" in bad[6]  # pixel coordinates in a 0..1 field
    again = fw("import", "agentnet", str(AGENTNET), "--lake", str(lake))
    assert "imported 0 episodes" in again.stdout and "2 already in the lake" in again.stdout


# ---- slime cookbook SFT records ----------------------------------------------------------------------

SLIME = Path(__file__).parent / "fixtures" / "slime" / "osworld_reasoning_sft_sample.jsonl"


def _slime_steps(lake: Path, task_prefix: str) -> list[tuple]:
    return (
        connect(lake)
        .execute(
            """SELECT s.step_idx, s.action, s.parse_error, s.thought, s.action_desc, s.screen_w, s.screen_h,
                  e.success, e.task_reward, e.instruction, e.policy_version
           FROM steps s JOIN episodes e USING (episode_id) WHERE e.task_id LIKE ? ORDER BY s.step_idx""",
            [task_prefix + "%"],
        )
        .fetchall()
    )


def test_import_slime_records_from_the_cli(tmp_path):
    lake = tmp_path / "lake"
    r = fw("import", "slime", str(SLIME), "--lake", str(lake))
    assert r.returncode == 1, r.stderr
    assert "imported 2 episodes (8 steps, 2 kept unparsed with a reason), 0 already in the lake, 3 rejected" in r.stdout
    rejected = [ln for ln in r.stderr.splitlines() if "rejected" in ln]
    assert any(
        "osworld_reasoning_sft_sample.jsonl:3: the user turns hold 3 <image> placeholders but 'images' has 2" in ln
        for ln in rejected
    )
    assert any("osworld_reasoning_sft_sample.jsonl:4: not JSON" in ln for ln in rejected)
    assert any("osworld_reasoning_sft_sample.jsonl:5: not a slime SFT record" in ln for ln in rejected)

    gt = _slime_steps(lake, "5812b315")
    acts = [json.loads(s[1]) for s in gt]
    assert [a["action"] for a in acts] == ["click", "type", "scroll", "key", "done"]
    assert (acts[0]["x"], acts[0]["y"]) == (32, 18)
    assert (acts[2]["x"], acts[2]["y"], acts[2]["dy"]) == (32, 18, 5)  # a bare scroll scrolls at the last click
    assert acts[3]["keys"] == ["ctrl", "s"] and {(s[5], s[6]) for s in gt} == {(64, 36)}
    assert gt[0][4] == "Click the Terminal icon in the dock." and gt[0][3].startswith("Based on the current screen")
    assert gt[0][7:] == (True, 1.0, "Open a terminal and list the home folder.", "original")

    opus = _slime_steps(lake, "bb5e4c0d")
    assert json.loads(opus[0][1])["x"] == 44 and opus[0][3] == "The Chrome menu is at the top right."
    # slime would run (60, 10) unscaled; here a point off the turn's 48x27 image is a reason, never clamped
    assert opus[1][1] is None and "outside the image: (60, 10) not in [0, 48] x [0, 27]" in opus[1][2]
    assert opus[2][1] is None and "no <tool_call> block" in opus[2][2]  # a thinking-only turn, kept
    assert opus[0][7:] == (False, 0.0, "Make Bing the default search engine in Chrome.", "reasoning_opus")

    again = fw("import", "slime", str(SLIME), "--lake", str(lake))
    assert (
        "imported 0 episodes (0 steps, 0 kept unparsed with a reason), 2 already in the lake, 3 rejected"
        in again.stdout
    )
    assert connect(lake).execute("SELECT count(*) FROM episodes").fetchone() == (2,)


def test_import_slime_maps_declared_screen_coordinates_onto_the_image(tmp_path):
    from flywheel.interop.common import ImportError_
    from flywheel.interop.slime import import_slime, parse_coords
    from storage.lake import Lake

    lake = tmp_path / "lake"
    assert import_slime(SLIME, Lake(lake), coords=parse_coords("128x72")).episodes == 2
    gt = _slime_steps(lake, "5812b315")
    click = json.loads(gt[0][1])
    assert (click["x"], click["y"]) == (16, 9) and (gt[0][5], gt[0][6]) == (64, 36)  # 128x72 points on a 64x36 image
    opus = _slime_steps(lake, "bb5e4c0d")
    assert json.loads(opus[1][1])["x"] == 60 * 48 / 128  # inside a 128x72 screen now, scaled onto the 48x27 image
    with pytest.raises(ImportError_, match="not a slime SFT file"):
        import_slime(tmp_path / "missing.jsonl", Lake(lake))

    bad = fw("import", "slime", str(SLIME), "--coords", "huge", "--lake", str(lake))
    assert bad.returncode == 2 and "use 'image', 'relative1000' or a screen size WxH" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1


# ---- the shapes real data has (issue 31) --------------------------------------------------------------


@pytest.mark.parametrize(
    "code, want, thought",
    [  # UI-TARS (OSWorld's mm_agents) writes an "Observation ... Thought ..." string before its calls
        (
            "import pyautogui\n'''\nObservation:\nA dialog.\n\nThought:\nClose it.\n'''\npyautogui.click(5, 6)",
            [Click(x=5, y=6)],
            "Observation:\nA dialog.\n\nThought:\nClose it.",
        ),
        ("pyautogui.hotkey(keys=['ctrl', 'F'])", [Key(keys=["ctrl", "f"])], None),  # OpenCUA's keyword form
        ("pyautogui.press(keys=['enter'])", [Key(keys=["enter"])], None),
        ("computer.triple_click(x=10, y=20)", [Click(x=10, y=20, clicks=3)], None),  # OpenCUA's action list
        ("computer.triple_click(10, 20)", [Click(x=10, y=20, clicks=3)], None),
    ],
)
def test_real_agent_code_shapes(code, want, thought):
    p = read_pyautogui(code, 1920, 1080)
    assert p.error is None and p.flag is None and p.actions == want and p.thought == thought


def test_scrolls_beyond_the_schema_are_saturated_and_noted_and_a_pointerless_scroll_is_flagged():
    ptr = Pointer()
    p = read_pyautogui("pyautogui.scroll(-800)", 1920, 1080, ptr)  # before any pointer position is known
    assert p.actions == [Scroll(x=960, y=540, dy=50)] and p.error is None
    assert p.flag and "before any pointer position is known" in p.flag
    assert p.notes == [{"note": "scroll saturated", "source": -800, "unit": "pyautogui clicks", "mapped": -50}]
    assert parse_pyautogui("pyautogui.scroll(-54)", 1920, 1080)[1] == p.flag.replace("-800", "-54")
    p = read_pyautogui("pyautogui.moveTo(100, 200)\npyautogui.scroll(-54)", 1920, 1080)
    assert p.flag is None and p.actions[1] == Scroll(x=100, y=200, dy=50) and p.notes[0]["source"] == -54
    assert read_pyautogui("pyautogui.scroll(3, x=5, y=6)", 1920, 1080).notes == []
    for bad, why in [
        ("pyautogui.hotkey('ctrl', keys=['c'])", "both as arguments and as keys="),
        ("computer.triple_click(x=1)", "takes x and y"),
        ("'''only a thought'''", "no pyautogui action (only a string)"),
    ]:
        assert why in read_pyautogui(bad, 1920, 1080).error


SHAPES = Path(__file__).parent / "fixtures" / "osworld_results_shapes"


def test_a_timed_out_run_keeps_its_steps_with_status_error_and_an_empty_run_is_named(tmp_path):
    lake = tmp_path / "lake"
    r = fw("import", "osworld-results", str(SHAPES), "--lake", str(lake))
    assert r.returncode == 0, r.stderr  # nothing rejected: the empty run is passed over, named
    assert (
        "imported 1 episodes (4 steps, 0 kept unparsed with a reason, 1 parsed but flagged unfit for SFT), "
        "0 already in the lake, 1 passed over (no episode in them), 0 rejected" in r.stdout
    )
    assert "b0000000-0000-4000-8000-00000000000b/traj.jsonl: no steps to import" in r.stdout
    assert "a bytes-like object is required" in r.stdout
    con = connect(lake)
    ep = con.execute("SELECT status, error, task_reward, success, n_steps FROM episodes").fetchone()
    assert ep[0] == "error" and "traj.jsonl:5: Time limit exceeded in chrome/" in ep[1] and ep[2:] == (None, False, 4)
    steps = con.execute(
        """SELECT action, parse_ok, parse_error, thought, prompt_context, fallback_parse FROM steps
           WHERE NOT is_final ORDER BY step_idx"""
    ).fetchall()
    acts = [json.loads(s[0]) for s in steps]
    assert [a["action"] for a in acts] == ["scroll", "click", "key", "scroll"]
    # the first scroll comes before any pointer position: parsed into the schema, kept, flagged out of SFT
    assert steps[0][1] is True and steps[0][5] is True and "before any pointer position is known" in steps[0][2]
    assert steps[0][3].startswith("Observation:\nA long article") and steps[1][3].endswith("at the bottom left.")
    assert all(s[1] and not s[5] for s in steps[1:]) and acts[2]["keys"] == ["ctrl", "f"]
    assert acts[3]["dy"] == 50 and json.loads(steps[3][4])["notes"][0] == {
        "note": "scroll saturated",
        "source": -800,
        "unit": "pyautogui clicks",
        "mapped": -50,
    }
    again = fw("import", "osworld-results", str(SHAPES), "--lake", str(lake))
    assert again.returncode == 0 and "imported 0 episodes" in again.stdout and "1 already in the lake" in again.stdout


LAYOUTS = Path(__file__).parent / "fixtures" / "osworld_results_layouts"
WRITER = "c0000000-0000-4000-8000-000000000001"
LFS_RUN = "c0000000-0000-4000-8000-000000000002"


def test_several_actions_of_one_response_see_its_screen_and_a_trial_folder_is_not_the_task(tmp_path):
    # qwen3vl-fixture: <example_id>/0/ (one folder per trial); step 1's two actions (one model response, run under
    # one step_num as lib_run_single.py does) were both saved to step_1.png, which holds the screen after the drag
    lake = tmp_path / "lake"
    r = fw("import", "osworld-results", str(LAYOUTS), "--lake", str(lake))
    assert r.returncode == 1  # the pointer-only run is rejected, named
    assert (
        "imported 2 episodes (6 steps, 0 kept unparsed with a reason, 2 parsed but flagged unfit for SFT), "
        "0 already in the lake, 1 rejected" in r.stdout
    )
    con = connect(lake)
    ep = con.execute(
        "SELECT episode_id, policy_version, sample_idx, task_reward, status FROM episodes WHERE task_id = ?", [WRITER]
    ).fetchone()
    assert ep[1:] == ("qwen3vl-fixture", 0, 1.0, "ok")
    run = LAYOUTS / "pyautogui/screenshot/qwen3vl-fixture/libreoffice_writer" / WRITER / "0"
    png = {n: (run / f"step_{n}.png").read_bytes() for n in range(4)}
    steps = con.execute(
        "SELECT action, screenshot, parse_ok, prompt_context FROM steps WHERE episode_id = ? ORDER BY step_idx",
        [ep[0]],
    ).fetchall()
    assert [json.loads(s[0])["action"] for s in steps[:-1]] == ["move", "drag", "click", "done"]
    assert [s[1] for s in steps] == [png[0], png[0], png[1], png[2], png[3]]  # the drag saw step_0, not step_1
    ctx = [json.loads(s[3]) for s in steps[:-1]]
    assert [(c["step_num"], c["action_of_step"]) for c in ctx] == [(1, 1), (1, 2), (2, 1), (3, 1)]
    assert all(s[2] for s in steps[:-1])


def test_a_repeated_step_num_with_another_response_is_not_the_same_response(tmp_path):
    # a fork that never advances step_num: each line has its own response, so each saw the previous line's screen
    from flywheel.interop.osworld import episode_rows

    src = LAYOUTS / "pyautogui/screenshot/qwen3vl-fixture/libreoffice_writer" / WRITER / "0"
    run = tmp_path / "res/pyautogui/screenshot/m/chrome/c0000000-0000-4000-8000-000000000009"
    run.mkdir(parents=True)
    for n in range(3):
        (run / f"step_{n}.png").write_bytes((src / f"step_{n}.png").read_bytes())
    lines = [
        {"step_num": 0, "action": "pyautogui.click(1, 2)", "response": f"r{n}", "screenshot_file": f"step_{n}.png"}
        for n in (1, 2)
    ]
    (run / "traj.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    _, steps = episode_rows(tmp_path / "res", run)
    assert [s["screenshot"] for s in steps] == [(run / f"step_{n}.png").read_bytes() for n in range(3)]


def test_a_git_lfs_pointer_before_the_lines_is_skipped_and_noted_and_alone_is_a_reason(tmp_path):
    lake = tmp_path / "lake"
    r = fw("import", "osworld-results", str(LAYOUTS), "--lake", str(lake))
    assert "c0000000-0000-4000-8000-000000000003/traj.jsonl:1: a Git LFS pointer, not the trajectory" in r.stderr
    con = connect(lake)
    steps = con.execute(
        """SELECT s.action, s.parse_ok, s.parse_error, s.prompt_context FROM steps s JOIN episodes e
           USING (episode_id) WHERE e.task_id = ? AND NOT s.is_final ORDER BY s.step_idx""",
        [LFS_RUN],
    ).fetchall()
    assert [json.loads(s[0]) for s in steps] == [Scroll(x=32, y=18, dy=10).model_dump()] * 2
    notes = [json.loads(s[3])["notes"] for s in steps]
    assert all("lines 1-3 are a Git LFS pointer" in n[0]["note"] for n in notes)
    # no click or moveTo ever placed the pointer: both scrolls are kept, flagged (the first one no more than the next)
    assert [s[1] for s in steps] == [True, True] and all("before any pointer position" in s[2] for s in steps)


def test_a_scroll_without_coordinates_does_not_make_its_guessed_point_the_pointer():
    ptr = Pointer()
    first = read_pyautogui("pyautogui.scroll(-3)", 100, 100, ptr)
    second = read_pyautogui("pyautogui.scroll(-3)", 100, 100, ptr)
    assert first.flag and second.flag and (ptr.x, ptr.y) == (None, None)
    read_pyautogui("pyautogui.scroll(2, x=10, y=20)", 100, 100, ptr)  # with coordinates pyautogui moves there
    assert (ptr.x, ptr.y) == (10, 20)
    p = read_pyautogui("pyautogui.scroll(-3)", 100, 100, ptr)
    assert p.flag is None and p.actions == [Scroll(x=10, y=20, dy=3)] and (ptr.x, ptr.y) == (10, 20)


BENCH = Path(__file__).parent / "fixtures" / "agentnet_shapes"


def test_a_pretty_printed_agentnetbench_record_imports_and_a_broken_one_is_one_error(tmp_path):
    lake = tmp_path / "lake"
    r = fw("import", "agentnet", str(BENCH / "bench_fixture_1.json"), "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    assert "imported 1 episodes (7 steps, 0 kept unparsed with a reason)" in r.stdout
    con = connect(lake)
    ep = con.execute("SELECT task_id, instruction, env_version, task_reward FROM episodes").fetchone()
    assert ep == ("bench_fixture_1", "Find the budget line and select it.", "agentnetbench", None)
    steps = con.execute("SELECT action, thought, action_desc, prompt_context FROM steps ORDER BY step_idx").fetchall()
    acts = [json.loads(s[0]) for s in steps]
    assert [a["action"] for a in acts] == ["key", "type", "key", "move", "scroll", "click", "done"]
    assert acts[0]["keys"] == ["ctrl", "f"] and acts[5] == {
        "action": "click",
        "x": 20.0,
        "y": 25.0,
        "button": "left",
        "clicks": 3,
    }
    assert acts[4]["dy"] == 50 and json.loads(steps[4][3])["notes"][0]["source"] == -54
    assert steps[0][1] == "Search for the word first." and steps[0][2] == "Open the find bar."
    assert json.loads(steps[0][3])["observation"] == "Screen 1."
    broken = fw("import", "agentnet", str(BENCH / "broken_pretty.json"), "--lake", str(lake))
    assert broken.returncode == 2 and len(broken.stderr.strip().splitlines()) == 1
    assert "neither JSON Lines (one record per line) nor one JSON document" in broken.stderr


def test_imported_demos_reach_the_sft_dataset_unchanged(tmp_path):
    """OSWorld results and AgentNet records, imported, curated: every fit step of the successful imports becomes
    one SFT row whose text is the step's thought and action line and whose tool call, read back by the student's
    parser, is the imported action (only the 0..1000 model space in between)."""
    import pyarrow.parquet as pq

    from agents.coords import CoordTransform
    from agents.parsing import parse_response
    from configs.loading import load_config
    from flywheel.interop.agentnet import import_agentnet
    from flywheel.interop.osworld import import_osworld
    from storage.lake import Lake
    from training.export import curate

    root = tmp_path / "lake"
    import_osworld(FIXTURES, Lake(root))
    import_agentnet(AGENTNET, Lake(root))
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", {"lake.root": str(root)})
    ds = curate(cfg, iteration=0, held_out=[])
    assert ds["source_counts"]["by_policy_iteration"] == {"agentnet-import/it0": 1, "osworld-import/it0": 1}
    lake_steps = {
        (r[0], r[1]): r[2:]
        for r in connect(root)
        .execute(
            """SELECT s.episode_id, s.step_idx, s.action, s.thought, s.action_desc, s.screen_w, s.screen_h
               FROM steps s JOIN episodes e USING (episode_id)
               WHERE e.success AND s.parse_ok AND NOT s.fallback_parse AND NOT s.is_final"""
        )
        .fetchall()
    }
    rows = pq.read_table(ds["data_files"]).to_pylist()
    assert {(r["episode_id"], int(r["step_idx"])) for r in rows} == set(lake_steps) and len(rows) == 11
    for r in rows:
        action, thought, desc, w, h = lake_steps[(r["episode_id"], int(r["step_idx"]))]
        text = r["messages"][-1]["content"][0]["text"]
        assert desc in text and (thought is None or thought in text)
        got = parse_response(text, CoordTransform.for_qwen3(w, h)).action
        want = json.loads(action)
        assert got is not None and got.action == want["action"]
        for k in ("x", "y", "x1", "y1", "x2", "y2"):  # the 0..1000 grid rounds a point to within one cell
            if k in want:
                cell = (w if k.startswith("x") else h) / 1000
                assert abs(getattr(got, k) - want[k]) <= cell, (k, got, want)
        assert {k: v for k, v in got.model_dump().items() if k not in ("x", "y", "x1", "y1", "x2", "y2")} == {
            k: v for k, v in want.items() if k not in ("x", "y", "x1", "y1", "x2", "y2")
        }


def test_agentnet_annotations_are_kept_with_each_step(tmp_path):
    """AgentNet's CoT annotations (data/cot-generate/README.md): the thought is the step's thought, the action
    line its action_desc, and observation / reflection / last_step_* plus the record's judge scores ride in the
    step's prompt_context; task_completed is the reward."""
    from flywheel.interop.agentnet import import_agentnet
    from storage.lake import Lake

    import_agentnet(AGENTNET, Lake(tmp_path / "lake"))
    ctx, thought, reward = (
        connect(tmp_path / "lake")
        .execute(
            """SELECT s.prompt_context, s.thought, e.task_reward FROM steps s JOIN episodes e USING (episode_id)
               WHERE e.task_id = '20240927_a1b2c3' AND s.step_idx = 0"""
        )
        .fetchone()
    )
    ctx = json.loads(ctx)
    assert thought == "I need to select report.txt first." and reward == 1.0
    assert ctx["observation"] == "The desktop shows report.txt." and ctx["last_step_correct"] is True
    assert ctx["last_step_redundant"] is False and ctx["record"]["alignment_score"] == 9
    assert ctx["record"]["actual_task"] == "Rename report.txt to final_report.txt"


# ---- off-screen points, misread points, missing first screens (issue 31, session 21) ------------------------


def test_an_off_screen_point_that_ran_is_kept_at_the_screen_edge_flagged_and_noted():
    # pyautogui hands the point to X, which keeps the pointer on the screen: the click ran at the edge
    ptr = Pointer()
    p = read_pyautogui("pyautogui.click(1, 1649)", 1920, 1080, ptr, off_screen="clamp")
    assert p.error is None and p.actions == [Click(x=1, y=1079)] and (ptr.x, ptr.y) == (1, 1079)
    assert p.flag and "point (1, 1649) is off the 1920x1080 screen: click kept at (1, 1079)" in p.flag
    assert p.notes == [
        {"note": "point off the screen", "source": [1.0, 1649.0], "mapped": [1.0, 1079.0], "unit": "screen pixels"}
    ]
    p = read_pyautogui("pyautogui.moveTo(-5, 20); pyautogui.dragTo(2500, 2000)", 1920, 1080, off_screen="clamp")
    assert p.actions == [Move(x=0, y=20), Drag(x1=0, y1=20, x2=1919, y2=1079)] and len(p.notes) == 2
    assert read_pyautogui("pyautogui.click(5, 6)", 1920, 1080, off_screen="clamp").flag is None
    # the default (AgentNet's unit square, where pixels in a 0..1 field are a wrong unit) stays an error
    assert read_pyautogui("pyautogui.click(1, 1649)", 1920, 1080).error == "point (1, 1649) is off the 1920x1080 screen"
    assert "must be finite" in read_pyautogui("pyautogui.click(1e999, 5)", 9, 9, off_screen="clamp").error


GROUNDING = Path(__file__).parent / "fixtures" / "osworld_results_grounding"
GROUNDED_RUN = "d0000000-0000-4000-8000-000000000001"


def test_flagged_steps_are_in_the_schema_and_out_of_sft(tmp_path):
    """A run in the shape of a grounding agent's (response 'click:<target>@(x,y)', x = 1 where its reply was misread)
    without step_0.png: every step parses into the schema; the first (no screen before it, a point below the screen),
    the second (x = 1 misread) are flagged, and curate takes only the others as SFT targets."""
    from configs.loading import load_config
    from training.export import curate

    lake = tmp_path / "lake"
    r = fw("import", "osworld-results", str(GROUNDING), "--lake", str(lake))
    assert r.returncode == 0, r.stderr
    assert "imported 1 episodes (6 steps, 0 kept unparsed with a reason, 2 parsed but flagged unfit for SFT)" in (
        r.stdout
    )
    steps = (
        connect(lake)
        .execute(
            """SELECT s.step_idx, s.action, s.parse_ok, s.fallback_parse, s.parse_error, s.prompt_context
               FROM steps s WHERE NOT s.is_final ORDER BY s.step_idx"""
        )
        .fetchall()
    )
    acts = [json.loads(s[1]) for s in steps]
    assert all(s[2] for s in steps) and [s[3] for s in steps] == [True, True, False, False, False, False]
    assert (acts[0]["x"], acts[0]["y"]) == (1, 107)  # click(1, 164) on a 192x108 screen: at the bottom edge
    first = steps[0][4]
    assert "no screenshot of the screen before this step" in first and "off the 192x108 screen" in first
    assert "x = 1 is not the model's" in first and "x = 1 is not the model's" in steps[1][4]
    assert json.loads(steps[0][5])["notes"][0] == {
        "note": "point off the screen",
        "source": [1.0, 164.0],
        "mapped": [1.0, 107.0],
        "unit": "screen pixels",
    }
    assert (acts[1]["x"], acts[1]["y"]) == (1, 40) and acts[3]["dy"] == 50 and steps[3][4] is None
    assert (acts[4]["x"], acts[4]["y"]) == (1, 50) and steps[4][4] is None  # x = 1 in another agent's response
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "tiny.yaml", {"lake.root": str(lake)})
    ds = curate(cfg, iteration=0, held_out=[])
    import pyarrow.parquet as pq

    rows = pq.read_table(ds["data_files"]).to_pylist()
    assert sorted(int(r["step_idx"]) for r in rows) == [2, 3, 4, 5]


def test_a_flagged_agentnet_step_is_in_the_schema_and_out_of_sft(tmp_path):
    # our own record: a scroll before any click (pyautogui scrolls where the mouse is: unknown), then a click
    from flywheel.interop.agentnet import import_agentnet
    from storage.lake import Lake

    import_agentnet(BENCH / "pointerless_scroll.jsonl", Lake(tmp_path / "lake"), images=BENCH / "images")
    steps = (
        connect(tmp_path / "lake")
        .execute("SELECT action, parse_ok, fallback_parse, parse_error FROM steps ORDER BY step_idx")
        .fetchall()
    )
    assert [(s[1], s[2]) for s in steps] == [(True, True), (True, False)]
    assert json.loads(steps[0][0])["action"] == "scroll" and "before any pointer position is known" in steps[0][3]


def test_the_screen_edge_is_where_pyautogui_leaves_an_off_screen_pointer(tmp_path):
    """The clamp rule against the real thing: pyautogui (this venv's, the dev extra) on Debian's Xvfb, a 320x200
    screen. Each off-screen code string runs there; the pointer ends where read_pyautogui(off_screen="clamp") says."""
    import shutil
    import signal
    import time

    if not shutil.which("Xvfb"):
        pytest.skip("needs Debian's xvfb (scripts/setup.sh installs it)")
    probe = subprocess.run([sys.executable, "-c", "import pyautogui"], capture_output=True, text=True, timeout=120)
    if "ModuleNotFoundError" in probe.stderr:
        pytest.skip("needs pyautogui + python-xlib (the dev extra)")
    codes = [
        "pyautogui.click(1, 1649)",
        "pyautogui.moveTo(-5, 20)",
        "pyautogui.click(2500, 150)",
        "pyautogui.moveTo(10, 10); pyautogui.dragTo(900, -40)",
    ]
    num = 200 + os.getpid() % 100
    xvfb = subprocess.Popen(
        ["Xvfb", f":{num}", "-screen", "0", "320x200x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not Path(f"/tmp/.X11-unix/X{num}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        script = (
            "import json, sys, pyautogui\npyautogui.FAILSAFE = False\npyautogui.PAUSE = 0\nout = []\n"
            "for code in json.loads(sys.argv[1]):\n    exec(code)\n    out.append(list(pyautogui.position()))\n"
            "print(json.dumps(out))"
        )
        ran = subprocess.run(
            [sys.executable, "-c", script, json.dumps(codes)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "DISPLAY": f":{num}"},
        )
        assert ran.returncode == 0, ran.stderr
        where = json.loads(ran.stdout)
    finally:
        os.killpg(xvfb.pid, signal.SIGTERM)
        xvfb.wait(timeout=30)
    for code, (x, y) in zip(codes, where):
        ptr = Pointer()
        p = read_pyautogui(code, 320, 200, ptr, off_screen="clamp")
        assert p.flag and "off the 320x200 screen" in p.flag
        assert (ptr.x, ptr.y) == (x, y), code
