"""Compiled pyautogui actions on a real X display (Debian's Xvfb): the pointer and keyboard land where intended.

Needs Xvfb and a Python with pyautogui + python-xlib: scripts/setup.sh installs Debian's xvfb and the dev extra
has both packages, so CI runs it; the OSWorld venv ($FLYWHEEL_OSWORLD_PYTHON or .venv-osworld/bin/python) is tried
first. Skipped without them. Xvfb is started here in
its own process group and ended by it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agents.actions import Click, DoubleClick, Key, RightClick, Scroll, Type
from agents.compile import to_pyautogui

REPO = Path(__file__).resolve().parents[1]
PROBE = Path(__file__).parent / "fixtures" / "xvfb" / "probe.py"


def _osworld_python() -> str | None:
    # the OSWorld venv, else this one (the dev extra installs pyautogui + python-xlib, so CI runs this file)
    for p in (
        os.environ.get("FLYWHEEL_OSWORLD_PYTHON"),
        str(REPO / ".venv-osworld" / "bin" / "python"),
        sys.executable,
    ):
        if p and Path(p).exists():
            ok = subprocess.run(
                [p, "-c", "import pyautogui, Xlib"],
                capture_output=True,
                timeout=120,
                env={**os.environ, "DISPLAY": ":0"},
            )
            # pyautogui connects to $DISPLAY on import; an ImportError means missing packages, a display error is fine
            if b"ModuleNotFoundError" not in ok.stderr:
                return p
    return None


@pytest.fixture(scope="module")
def display():
    if not shutil.which("Xvfb"):
        pytest.skip("needs Debian's xvfb (scripts/setup.sh installs it)")
    py = _osworld_python()
    if py is None:
        pytest.skip("needs pyautogui + python-xlib (the dev extra, or the OSWorld venv of scripts/setup_osworld.sh)")
    num = 90 + os.getpid() % 100
    sock = Path(f"/tmp/.X11-unix/X{num}")
    proc = subprocess.Popen(
        ["Xvfb", f":{num}", "-screen", "0", "1280x800x24", "-nolisten", "tcp"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 30
    while not sock.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)  # ready when its socket exists
    if not sock.exists():
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("Xvfb did not start")
    yield py, f":{num}"
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=10)


def _run(display, actions) -> dict:
    py, disp = display
    cmds = [to_pyautogui(a) for a in actions]
    out = subprocess.run(
        [py, str(PROBE), json.dumps(cmds)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "DISPLAY": disp},
        cwd=str(PROBE.parent),
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_clicks_land_on_the_pixel_with_the_right_button(display):
    got = _run(display, [Click(x=321.4, y=187.6), DoubleClick(x=640, y=400), RightClick(x=10, y=790)])
    assert got["clicks"] == [[321, 188, 1], [640, 400, 1], [640, 400, 1], [10, 790, 3]]
    assert got["pointer"] == [10, 790]


def test_typed_text_key_combos_and_scroll_direction(display):
    got = _run(
        display, [Type(text="Hi there!"), Key(keys=["ctrl", "a"]), Key(keys=["Return"]), Scroll(x=200, y=100, dy=2)]
    )
    assert got["typed"].startswith("Hi there!")
    assert ["a", ["ctrl"]] in got["keys"]  # the chord arrives as one key with Control held
    assert any(k[0] == "Return" for k in got["keys"])
    assert got["clicks"] == [[200, 100, 5], [200, 100, 5]]  # our dy > 0 is down: X button 5, twice
