"""The env server: N envs of one kind (MiniWoB or OSWorld) behind HTTP, for rollouts over many machines.

    flywheel env serve --env miniwob --slots 4 --port 8100          # token from $FLYWHEEL_ENV_TOKEN
    curl -H "Authorization: Bearer $FLYWHEEL_ENV_TOKEN" http://127.0.0.1:8100/v1/health

Endpoints (JSON; every one needs `Authorization: Bearer <token>` when the server has a token):
    GET    /v1/health                       per-slot state (starting/ready/busy/restarting/broken), free slots
    POST   /v1/sessions[?wait_s=]           lease a ready slot -> {session_id, ...}; 503 when none frees in wait_s;
                                            with a reset body, also resets it (-> observation): one round trip
    POST   /v1/sessions/{id}/reset          {task_id, seed, task_config?} -> observation
    POST   /v1/sessions/{id}/step           {action: <agents.actions schema>} -> step result
    POST   /v1/sessions/{id}/evaluate[?release=true]   -> {reward}; release ends the session (slot freed)
    GET    /v1/sessions/{id}/screenshot     the last observation's PNG
    DELETE /v1/sessions/{id}                end the session, free the slot

Safety: a session holds one slot and loses it after `idle_timeout_s` without a call; actions are data
validated by `agents.actions.ACTION_ADAPTER` (422 otherwise), never code; the token is compared in
constant time and never logged or echoed; request bodies are capped (413); the server binds to
loopback unless told otherwise, and refuses a non-loopback address without a token.
Readiness is polled: slots start in background threads and `health` says when each is ready. A slot
whose env raises an env failure (a call past --call-timeout included: envs/slot_process.py), or fails the
periodic health check while idle, is restarted in the background; the episode it was running is answered
with a 502 `{"error", "status": "error"}`.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

from envs.base import GuiEnv

log = logging.getLogger("flywheel.env_server")


class SessionGone(LookupError):
    """The session id is unknown: closed, reclaimed after its idle timeout, or lost to a slot failure."""


class SlotFailed(RuntimeError):
    """The slot's env broke during a call; the session's episode is lost (the slot restarts)."""


@dataclass
class Slot:
    idx: int
    env: GuiEnv | None = None
    state: str = "starting"  # starting | ready | busy | restarting | broken
    session: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # one env call at a time
    episodes: int = 0
    restarts: int = 0
    last_error: str | None = None
    last_used: float = field(default_factory=time.monotonic)
    last_check: float = field(default_factory=time.monotonic)
    last_png: bytes | None = None


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300]}" if s else type(e).__name__


class SlotPool:
    """N env slots, their sessions, the idle reaper and the health checker (threads; no asyncio here)."""

    def __init__(
        self,
        factory: Callable[[], GuiEnv],
        slots: int,
        *,
        idle_timeout_s: float = 300.0,
        health_interval_s: float = 15.0,
    ):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.factory, self.idle_timeout_s, self.health_interval_s = factory, idle_timeout_s, health_interval_s
        self.slots = [Slot(i) for i in range(slots)]
        self.sessions: dict[str, Slot] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # recently ended session -> why (clear 404s)
        self.mu = threading.Lock()  # guards slot states, the session table and the lease queue
        self.freed = threading.Condition(self.mu)  # notified whenever a slot becomes ready
        self._queue: list[int] = []  # lease requests waiting, first come first served
        self._tickets = 0
        self.stop = threading.Event()
        self._reaper = threading.Thread(target=self._reap_loop, name="env-reaper", daemon=True)

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        for s in self.slots:
            threading.Thread(target=self._boot, args=(s,), name=f"env-slot-{s.idx}", daemon=True).start()
        self._reaper.start()

    def _boot(self, s: Slot) -> None:
        """Create (or re-create) the slot's env; the slot is ready when the constructor returns."""
        old, s.env = s.env, None
        if old is not None:
            try:
                old.close()
            except Exception:  # noqa: BLE001 - the broken env may not close cleanly; a new one replaces it
                pass
        try:
            env = self.factory()
        except Exception as e:  # noqa: BLE001 - reported in health; the reaper retries
            with self.mu:
                s.state, s.last_error, s.last_check = "broken", f"start failed: {_one_line(e)}", time.monotonic()
            log.warning("slot %d failed to start: %s", s.idx, _one_line(e))
            return
        with self.mu:
            if self.stop.is_set():
                env.close()
                return
            s.env, s.state, s.last_check = env, "ready", time.monotonic()
            self.freed.notify_all()

    def _restart(self, s: Slot, why: str) -> None:
        """Mark the slot restarting (under self.mu) and rebuild its env in the background."""
        s.state, s.last_error, s.session = "restarting", why, None
        s.restarts += 1
        threading.Thread(target=self._boot, args=(s,), name=f"env-slot-{s.idx}-restart", daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        with self.mu:
            envs = [s.env for s in self.slots if s.env is not None]
            for s in self.slots:
                s.env, s.state = None, "closed"
            self.sessions.clear()
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ sessions
    def acquire(self, wait_s: float = 0.0) -> tuple[str, Slot] | None:
        """Lease a ready slot, waiting up to wait_s for one; waiters are served first come first served
        (a client that gives its slot back and asks again cannot starve one that was already waiting)."""
        deadline = time.monotonic() + wait_s
        with self.freed:
            self._tickets += 1
            ticket = self._tickets
            self._queue.append(ticket)
            try:
                while True:
                    free = [s for s in self.slots if s.state == "ready"] if self._queue[0] == ticket else []
                    if free:
                        s, sid = free[0], secrets.token_urlsafe(16)
                        s.state, s.session, s.last_used, s.last_png = "busy", sid, time.monotonic(), None
                        self.sessions[sid] = s
                        return sid, s
                    left = deadline - time.monotonic()
                    if left <= 0 or self.stop.is_set():
                        return None
                    self.freed.wait(left)
            finally:
                self._queue.remove(ticket)
                self.freed.notify_all()  # the next in line may take a free slot now

    def _end(self, sid: str, why: str) -> None:
        self.sessions.pop(sid, None)
        self.ended[sid] = why
        while len(self.ended) > 4096:
            self.ended.popitem(last=False)

    def release(self, sid: str) -> None:
        with self.mu:
            s = self._slot(sid)
            self._end(sid, "closed by the client")
            if s.state == "busy" and s.session == sid:
                s.state, s.session = "ready", None
                self.freed.notify_all()

    def _slot(self, sid: str) -> Slot:
        s = self.sessions.get(sid)
        if s is None:
            why = self.ended.get(sid, "never existed")
            raise SessionGone(f"unknown env session ({why}); lease a new one with POST /v1/sessions")
        return s

    def call(self, sid: str, fn: Callable[[GuiEnv], Any], *, new_episode: bool = False) -> Any:
        """Run fn(env) on the session's slot. ValueError passes through (bad input: 400); any other
        failure restarts the slot and raises SlotFailed (the episode is lost: status error)."""
        with self.mu:
            s = self._slot(sid)
            s.last_used = time.monotonic()
        with s.lock:
            if s.session != sid or s.env is None:  # reclaimed or restarted while we waited for the lock
                with self.mu:
                    self._slot(sid)
                raise SessionGone("env session lost while waiting for its slot")
            try:
                out = fn(s.env)
            except ValueError:
                raise
            except Exception as e:  # noqa: BLE001 - EnvError (browser/VM died) or a bug in the env
                why = f"slot {s.idx} failed: {_one_line(e)}"
                log.warning("%s; restarting it", why)
                with self.mu:
                    self._end(sid, f"lost: {why}")
                    self._restart(s, why)
                raise SlotFailed(f"{why}; the episode is lost and the slot is restarting") from e
            finally:
                s.last_used = time.monotonic()
            png = getattr(getattr(out, "observation", out), "screenshot_png", None)
            if png:
                s.last_png = png
            s.episodes += int(new_episode)
        return out

    def screenshot(self, sid: str) -> bytes | None:
        with self.mu:
            return self._slot(sid).last_png

    # ------------------------------------------------------------------ background
    def _reap_loop(self) -> None:
        while not self.stop.wait(min(1.0, self.idle_timeout_s / 4)):
            now = time.monotonic()
            with self.mu:
                for s in self.slots:
                    if s.state == "busy" and now - s.last_used > self.idle_timeout_s and not s.lock.locked():
                        log.info("slot %d: session idle for %.0fs, reclaimed", s.idx, now - s.last_used)
                        self._end(s.session, f"reclaimed after {self.idle_timeout_s:g}s idle")
                        s.state, s.session = "ready", None
                        self.freed.notify_all()
                    elif s.state == "broken" and now - s.last_check > self.health_interval_s:
                        s.last_check = now
                        self._restart(s, s.last_error or "broken")
            self._check_idle_slots(now)

    def _check_idle_slots(self, now: float) -> None:
        """Probe each idle ready slot every health_interval_s; an unhealthy one is restarted."""
        for s in self.slots:
            if s.state != "ready" or now - s.last_check < self.health_interval_s or not s.lock.acquire(blocking=False):
                continue
            try:
                s.last_check = now
                ok, why = True, ""
                try:
                    ok = bool(s.env.healthy()) if s.env is not None else False
                except Exception as e:  # noqa: BLE001
                    ok, why = False, _one_line(e)
                if not ok:
                    with self.mu:
                        if s.state == "ready":
                            self._restart(s, f"health check failed {why}".strip())
            finally:
                s.lock.release()

    def health(self) -> dict[str, Any]:
        with self.mu:
            slots = [
                {
                    "slot": s.idx,
                    "state": s.state,
                    "in_call": s.lock.locked(),
                    "episodes": s.episodes,
                    "restarts": s.restarts,
                    "last_error": s.last_error,
                    "idle_s": round(time.monotonic() - s.last_used, 1) if s.state == "busy" else None,
                }
                for s in self.slots
            ]
        free = sum(1 for s in slots if s["state"] == "ready")
        ready = all(s["state"] in ("ready", "busy") for s in slots)
        return {"status": "ready" if ready else "degraded", "free": free, "slots": slots}


# ---------------------------------------------------------------------------------------- binding
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, token: str | None) -> None:
    """Raise ValueError for a non-loopback bind without a token (anyone on the network could drive the envs)."""
    if not is_loopback(host) and not token:
        raise ValueError(
            f"refusing to bind {host} without an API token: set $FLYWHEEL_ENV_TOKEN (or --token), or bind 127.0.0.1"
        )


def token_ok(header: bytes | None, token: str) -> bool:
    """Constant-time check of an `Authorization: Bearer <token>` header."""
    expected = b"Bearer " + token.encode()
    return hmac.compare_digest(header or b"", expected)
