"""Processes an env started, found again after the process between them died: by a mark in their environment.

    mark = new_mark()
    subprocess.Popen(cmd, env={**os.environ, BROWSER_MARK: mark})   # chromedriver; Chromium inherits it
    ...
    kill_marked(BROWSER_MARK, mark)                                    # at close: what is left of them

A SIGKILLed chromedriver leaves its Chromium running, and a SIGKILLed env-server slot child its chromedriver and
Chromium: re-parented (to init or a subreaper), out of the tree of whoever would end them, and still running (the
chaos run, benchmarks/chaos.py, found both). What they inherit from their starter's environment still names them.
Chromium's helper processes (renderers, zygotes, GPU) overwrite their environment, but exit with their browser.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

BROWSER_MARK = "FLYWHEEL_BROWSER_MARK"  # envs/miniwob.py: each chromedriver (and its Chromium)
SLOT_MARK = "FLYWHEEL_SLOT_MARK"  # envs/slot_process.py: each slot's child (and all it starts)


def new_mark() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex}"


def marked(var: str, mark: str) -> list[int]:
    """Pids of live processes (not this one) whose environment holds var=mark."""
    want, out = f"{var}={mark}".encode(), []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and int(d.name) != os.getpid():
            try:
                if want in (d / "environ").read_bytes().split(b"\0"):
                    out.append(int(d.name))
            except OSError:  # gone meanwhile, or another user's
                pass
    return out


def kill_marked(var: str, mark: str) -> int:
    """SIGKILL every process marked var=mark; returns how many were signalled."""
    n = 0
    for pid in marked(var, mark):
        try:
            os.kill(pid, signal.SIGKILL)
            n += 1
        except (ProcessLookupError, PermissionError):
            pass
    return n
