"""One env in a child process, behind the `GuiEnv` interface: what each env-server slot holds.

    env = ProcessEnv("miniwob", {"screenshot_scale": 1})   # returns once the child's env is built
    obs = env.reset("click-test", 0); env.step(Click(x=80, y=100)); env.evaluate(); env.close()

Why: with every slot's env in the server process, N slots' Selenium/PIL work shared one GIL and one
process's CPU share (2 slots in one process ran ~0.84x of 2 local envs; 2 one-slot servers 0.95x,
docs/LOG.md). The child stays in the server's process group, so ending that group ends every browser.
A SIGKILLed child leaves its chromedriver and browser behind (re-parented, still running): they carry the
child's mark in their environment (envs/procs.py), and close() ends every process that does.
Only reset/step/evaluate/healthy/close cross the pipe (pickled dataclasses and pydantic actions).
A ValueError in the child (bad task id) comes back as ValueError; anything else, and a dead child, as EnvError.
"""

from __future__ import annotations

import os
import signal
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from envs.base import EnvError, GuiEnv
from envs.procs import SLOT_MARK, kill_marked, new_mark

_METHODS = frozenset({"reset", "step", "evaluate", "healthy"})


def _child(conn, name: str, kwargs: dict[str, Any], mark: str = "") -> None:
    from envs.registry import make_env

    os.environ[SLOT_MARK] = mark  # chromedriver and Chromium inherit it
    try:
        env = make_env(name, **kwargs)
    except Exception as e:  # noqa: BLE001 - reported to the parent as one line
        conn.send(("error", (False, f"{type(e).__name__}: {e}".splitlines()[0])))
        return
    conn.send(
        (
            "ok",
            {
                "accepts_task_config": bool(getattr(env, "accepts_task_config", False)),
                "name": getattr(env, "name", name),
            },
        )
    )
    try:
        while True:
            try:
                method, args, kw = conn.recv()
            except (EOFError, OSError):
                return
            if method == "close":
                return
            try:
                if method not in _METHODS:
                    raise ValueError(f"no env method {method!r}")
                conn.send(("ok", getattr(env, method)(*args, **kw)))
            except Exception as e:  # noqa: BLE001 - the parent raises it
                msg = (str(e).strip().splitlines() or [""])[0][:500]
                conn.send(
                    ("error", (isinstance(e, ValueError), f"{type(e).__name__}: {msg}" if msg else type(e).__name__))
                )
    finally:
        env.close()


def _descendants(pid: int) -> list[int]:
    """Pids of every live process below `pid` (a stuck child's chromedriver and browsers), from /proc."""
    children: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d.name))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


class ProcessEnv(GuiEnv):
    """Args: env_name/env_kwargs as for `envs.registry.make_env`; start_timeout_s for the env to be built;
    call_timeout_s: a reset/step/evaluate that takes longer is a stuck env (EnvError; the server restarts the slot)."""

    def __init__(
        self,
        env_name: str,
        env_kwargs: dict[str, Any] | None = None,
        start_timeout_s: float = 600.0,
        call_timeout_s: float = 600.0,
    ):
        self.call_timeout_s, self._broken = call_timeout_s, False
        ctx = get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._mark = new_mark()
        self._proc = ctx.Process(target=_child, args=(child, env_name, dict(env_kwargs or {}), self._mark), daemon=True)
        self._proc.start()
        child.close()
        self.name = env_name
        try:
            info = self._recv(start_timeout_s)
        except Exception:
            self.close()
            raise
        self.name, self.accepts_task_config = info["name"], info["accepts_task_config"]

    def _recv(self, timeout_s: float | None = None) -> Any:
        try:
            if timeout_s is not None and not self._conn.poll(timeout_s):
                self._broken = True  # its answer may still come: this pipe can no longer pair calls and replies
                raise EnvError(f"env process did not answer within {timeout_s:g}s")
            kind, payload = self._conn.recv()
        except (EOFError, OSError):
            self._proc.join(timeout=1)
            raise EnvError(f"env process died (exit code {self._proc.exitcode})") from None
        if kind == "ok":
            return payload
        is_value_error, msg = payload
        raise (ValueError if is_value_error else EnvError)(msg)

    def _call(self, method: str, *args, **kw) -> Any:
        if self._broken:
            raise EnvError("env process is broken (an earlier call timed out); the slot must restart")
        try:
            self._conn.send((method, args, kw))
        except (OSError, ValueError):
            raise EnvError(f"env process is gone (exit code {self._proc.exitcode})") from None
        return self._recv(self.call_timeout_s)

    def reset(self, task_id: str, seed: int, **kw):
        return self._call("reset", task_id, seed, **kw)

    def step(self, action):
        return self._call("step", action)

    def evaluate(self) -> float:
        return self._call("evaluate")

    def healthy(self) -> bool:
        return bool(self._call("healthy")) and self._proc.is_alive()

    def close(self) -> None:
        """Ask the child to close its env; kill it if it does not exit, and whatever of its env outlived it."""
        try:
            self._conn.send(("close", (), {}))
        except (OSError, ValueError):
            pass
        self._proc.join(timeout=10)
        if self._proc.is_alive():  # stuck: end it and what it started (we started all of them)
            below = _descendants(self._proc.pid)
            self._proc.kill()
            for pid in below:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self._proc.join(timeout=5)
        kill_marked(SLOT_MARK, self._mark)  # a killed child's chromedriver and browser (none after a clean close)
        self._conn.close()
