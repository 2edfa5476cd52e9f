"""The ephemeral Prefect API server of a local run (`flywheel run` without `flywheel up`) lives and dies with it.

    ephemeral_server_dies_with_parent()   # once, before Prefect starts the server (flows.orchestrate.local_settings)

Prefect starts that server with `subprocess.Popen` and stops it only at a clean exit. Three faults the chaos
iteration (benchmarks/chaos.py) found are handled here: a run killed with -9 left its server running for ever
(PR_SET_PDEATHSIG), a server killed while starting made the run wait out the 120 s startup timeout, and a server
killed mid-run made Prefect's client retry every call for minutes (the run now ends at once with one line).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from functools import partial
from types import ModuleType
from typing import Any


class _DiesWithParent(ModuleType):
    """Marks the patched `subprocess` of Prefect's server module."""


class _ServerProcess(subprocess.Popen):
    """The ephemeral server's process. Prefect polls it only while waiting for the server to answer, and restarts
    it only on exit code 3 (port taken): a server killed while starting made the run wait out the whole startup
    timeout (120 s) before failing. Any other exit now fails the start at once (the rerun resumes), and once
    started, `_watch_server` ends the run when the server dies."""

    stopping = False

    def poll(self) -> int | None:
        rc = super().poll()
        if rc is not None and rc != 3:
            raise RuntimeError(f"the ephemeral Prefect API server exited with code {rc} while starting")
        return rc

    def send_signal(self, sig: int) -> None:  # Popen's polls first: stopping a server that is gone is no error
        self.stopping = True
        if subprocess.Popen.poll(self) is None:
            try:
                super().send_signal(sig)
            except RuntimeError:
                pass


def _watch_server(proc: _ServerProcess) -> None:
    """A local run cannot go on without its ephemeral server: when it dies (other than when Prefect stops it, or
    exit code 3, which Prefect answers with a new server), end the run at once, as a SIGKILL would, with one line.
    Prefect's client would otherwise retry every call for minutes (6 min for one SFT stage in the chaos run)."""
    while not proc.stopping:
        time.sleep(0.5)
        rc = subprocess.Popen.poll(proc)
        if rc is None or proc.stopping:
            continue
        if rc != 3:
            print(
                f"error: the ephemeral Prefect API server exited with code {rc}; rerun the same command to continue",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)  # what is written is whole (one transaction per write); the rollout workers follow us
        return


def _pdeathsig(parent: int) -> None:
    """preexec_fn: the kernel SIGKILLs this child when the thread that forked it ends (PR_SET_PDEATHSIG)."""
    import ctypes

    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the call
        os._exit(1)


def ephemeral_server_dies_with_parent() -> None:
    """Make the ephemeral Prefect API server that a local run starts die with that run, even under SIGKILL.

    Prefect starts it with `subprocess.Popen` (prefect/server/api/server.py) and stops it only at exit, so a
    `flywheel run` killed with -9 left its uvicorn server running for ever (issue 32's chaos run found one after
    every parent kill). Its module gets a `subprocess` whose Popen adds PR_SET_PDEATHSIG(SIGKILL), on Linux and
    only when called from the main thread (the signal follows the forking thread, which must live as long as the
    process). A server that exits while starting fails the start at once (`_ServerProcess`). Idempotent."""
    if not sys.platform.startswith("linux"):
        return
    import threading

    import prefect.server.api.server as server

    if isinstance(server.subprocess, _DiesWithParent):
        return

    class _Module(_DiesWithParent):
        def __getattr__(self, name: str) -> Any:
            return getattr(subprocess, name)

        @staticmethod
        def Popen(*args: Any, **kwargs: Any) -> subprocess.Popen:  # noqa: N802 (subprocess's name)
            if threading.current_thread() is threading.main_thread() and "preexec_fn" not in kwargs:
                kwargs["preexec_fn"] = partial(_pdeathsig, os.getpid())
            proc = _ServerProcess(*args, **kwargs)
            threading.Thread(target=_watch_server, args=(proc,), name="flywheel-server-watch", daemon=True).start()
            return proc

    server.subprocess = _Module("subprocess")
