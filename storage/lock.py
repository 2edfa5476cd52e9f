"""One flywheel parent per lake: an advisory `flock` on `<lake>/.flywheel.lock`.

    with parent_lock(lake, "flywheel run"):      # LakeBusy (one line: who holds it, since when) if taken
        ...

The kernel drops the lock when its holder exits, killed or not, so there is never a stale lock to
clean up; the file's JSON only says who holds it. Stage workers never take it: they write disjoint
run keys, and the parent is what must not race (two parents would run the same iteration twice).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from contextlib import contextmanager
from typing import Iterator

from storage.lake import Lake, LakeError

LOCK_FILE = ".flywheel.lock"


class LakeBusy(LakeError):
    """Another flywheel parent holds this lake."""


def holder(lake: Lake) -> dict | None:
    try:
        return json.loads((lake.root / LOCK_FILE).read_text() or "null")
    except (OSError, ValueError):
        return None


@contextmanager
def parent_lock(lake: Lake, what: str = "flywheel run") -> Iterator[None]:
    path = lake.root / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            h = holder(lake) or {}
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"])) if h.get("started") else "?"
            raise LakeBusy(
                f"another {h.get('what', 'flywheel run')} is running on the lake {lake.root} "
                f"(pid {h.get('pid', '?')} on {h.get('host', '?')}, since {since}); wait for it to end, "
                "or give this run its own --lake"
            ) from None
        os.ftruncate(fd, 0)
        os.write(
            fd,
            json.dumps(
                {"what": what, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
            ).encode(),
        )
        yield
    finally:
        os.close(fd)  # closing releases the flock
