"""The env server: N envs of one kind (MiniWoB or OSWorld) behind HTTP, for rollouts over many machines.

    flywheel env serve --env miniwob --slots 4 --port 8100          # token from $FLYWHEEL_ENV_TOKEN
    curl -H "Authorization: Bearer $FLYWHEEL_ENV_TOKEN" http://127.0.0.1:8100/v1/health

Endpoints (JSON; every one needs `Authorization: Bearer <token>` when the server has a token):
    GET    /v1/health                       per-slot state (starting/ready/busy/releasing/restarting/broken),
                                            free slots, lease requests waiting
    POST   /v1/sessions[?wait_s=]           lease a ready slot -> {session_id, ...}; 503 when none frees in wait_s;
                                            with a reset body, also resets it (-> observation): one round trip
    POST   /v1/sessions/{id}/reset          {task_id, seed, task_config?} -> observation
    POST   /v1/sessions/{id}/step           {action: <agents.actions schema>} -> step result
    POST   /v1/sessions/{id}/evaluate[?release=true]   -> {reward}; release ends the session (slot freed)
    GET    /v1/sessions/{id}/screenshot     the last observation's PNG
    DELETE /v1/sessions/{id}                end the session, free the slot

Status codes (every error is one JSON line `{"error": ...}`; nothing else is answered):
    200/201  done (201: a session leased)
    400      bad input the env refused (unknown task id, a task_config the env takes none of); also uvicorn's
             plain-text answer to a malformed request (bad request line, headers or framing)
    401      missing or wrong token
    404      unknown session (closed, reclaimed idle, past its lifetime, lost to a slot failure) or path
    405      wrong method for the path
    409      not now: no episode yet (step, evaluate or screenshot before the session's first reset), or
             another call of the same session still running (one at a time)
    413      body over --max-body-kb (with or without Content-Length: counted while it is read)
    422      invalid JSON, query or action (`agents.actions`)
    429      over the token's --rate-limit; Retry-After says when to send it again (it did not run)
    502      the slot's env failed during the call (`{"error", "status": "error"}`): the episode is lost and
             the slot restarts
    503      no free slot within wait_s; or bodies being read across all requests at --max-body-total-mb
             (Retry-After: 1)
A request refused before routing (401, 413, 429, 503 for bodies) also closes its connection.

A lease starts clean: the session sees nothing of the env until its own reset (409 before), and a call still
running when its session ends (closed, reclaimed, lifetime) finishes before the slot is ready again
("releasing"): the next session never gets the last one's late observation. A lease request that waits
(`wait_s`) holds no handler thread and leaves the queue when its client disconnects; a slot leased for a
client that left meanwhile is given back at once.

Limits: a session holds one slot and loses it after `--idle-timeout` s without a call or `--max-session` s
after its lease; each token may send `--rate-limit` requests/s (bursts as large; default 50 per slot);
request bodies are capped per request (`--max-body-kb`) and in total (`--max-body-total-mb`; plus transport
buffers of < 0.3 MiB per open connection), and the heap is trimmed after a burst of them. Connections
(envs/server_net.py): request headers, and TLS handshakes, must arrive within `--header-timeout` s; past
`--max-connections` the longest idle connection is closed; such closes and malformed requests are counted in
one log line a minute. `--tls-cert/--tls-key` serve https (RemoteEnv verifies with `ca_file`).

Safety: actions are data validated by `agents.actions.ACTION_ADAPTER` (422 otherwise), never code; the token
is compared in constant time and never logged or echoed; the server binds to loopback unless told otherwise,
and refuses a non-loopback address without a token.
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


class SessionConflict(RuntimeError):
    """The call cannot run now: no episode yet (reset first), or another call of the session is running (409)."""


@dataclass
class Slot:
    idx: int
    env: GuiEnv | None = None
    state: str = "starting"  # starting | ready | busy | releasing | restarting | broken
    session: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # one env call at a time
    inflight: int = 0  # env calls running or queued on `lock` (guarded by the pool's mu)
    episode: bool = False  # the session has reset the env: before that, nothing of the env is shown
    episodes: int = 0
    restarts: int = 0
    last_error: str | None = None
    leased_at: float = 0.0
    last_used: float = field(default_factory=time.monotonic)
    last_check: float = field(default_factory=time.monotonic)
    last_png: bytes | None = None


def _one_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0][:300]}" if s else type(e).__name__


class SlotPool:
    """N env slots, their sessions, the lease queue, the reaper and the health checker (threads; no asyncio here).

    Leases are first come first served: `enqueue` a wake-up callback, `try_lease` whenever woken (it succeeds
    only for the head of the queue with a ready slot), `dequeue` when done or given up. The callback runs under
    the pool's lock and must only schedule the waiter (the HTTP layer's waiters are coroutines: no thread waits).
    """

    def __init__(
        self,
        factory: Callable[[], GuiEnv],
        slots: int,
        *,
        idle_timeout_s: float = 300.0,
        health_interval_s: float = 15.0,
        max_session_s: float = 0.0,
    ):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.factory, self.idle_timeout_s, self.health_interval_s = factory, idle_timeout_s, health_interval_s
        self.max_session_s = max_session_s  # 0: no limit
        self.slots = [Slot(i) for i in range(slots)]
        self.sessions: dict[str, Slot] = {}
        self.ended: OrderedDict[str, str] = OrderedDict()  # recently ended session -> why (clear 404s)
        self.mu = threading.Lock()  # guards slot states, the session table and the lease queue
        self._queue: OrderedDict[int, Callable[[], None]] = OrderedDict()  # ticket -> wake, first come first served
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
            self._wake()

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
            for wake in self._queue.values():  # waiters see the stop and give up
                wake()
        for env in envs:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass

    # ------------------------------------------------------------------ leases
    def enqueue(self, wake: Callable[[], None]) -> int:
        """Join the lease queue; `wake()` is called (under the pool's lock) when the waiter should try again."""
        with self.mu:
            self._tickets += 1
            self._queue[self._tickets] = wake
            return self._tickets

    def try_lease(self, ticket: int) -> tuple[str, Slot] | None:
        """A new session on a ready slot if `ticket` heads the queue and a slot is ready; it leaves the queue then."""
        with self.mu:
            if self.stop.is_set() or next(iter(self._queue), None) != ticket:
                return None
            s = next((s for s in self.slots if s.state == "ready"), None)
            if s is None:
                return None
            sid, now = secrets.token_urlsafe(16), time.monotonic()
            s.state, s.session, s.episode, s.last_png, s.leased_at, s.last_used = "busy", sid, False, None, now, now
            self.sessions[sid] = s
            del self._queue[ticket]
            self._wake()  # the next in line may take another ready slot
            return sid, s

    def dequeue(self, ticket: int) -> None:
        """Leave the queue (timed out, or the client went away); the next in line is woken."""
        with self.mu:
            if self._queue.pop(ticket, None) is not None:
                self._wake()

    def _wake(self) -> None:
        """Under self.mu: wake the head of the queue when a slot is ready (it leases it, then wakes the next)."""
        if self._queue and any(s.state == "ready" for s in self.slots):
            next(iter(self._queue.values()))()

    def _end(self, sid: str, why: str) -> None:
        self.sessions.pop(sid, None)
        self.ended[sid] = why
        while len(self.ended) > 4096:
            self.ended.popitem(last=False)

    def _free(self, s: Slot) -> None:
        """Under self.mu: the slot's session is over. A call still running on it finishes first (its result is
        not kept), then the slot is ready: the next lease never meets the previous session's late work."""
        s.session, s.state = None, ("releasing" if s.inflight else "ready")
        if s.state == "ready":
            self._wake()

    def release(self, sid: str) -> None:
        with self.mu:
            s = self._slot(sid)
            self._end(sid, "closed by the client")
            if s.state == "busy" and s.session == sid:
                self._free(s)

    def _slot(self, sid: str) -> Slot:
        s = self.sessions.get(sid)
        if s is None:
            why = self.ended.get(sid, "never existed")
            raise SessionGone(f"unknown env session ({why}); lease a new one with POST /v1/sessions")
        return s

    # ------------------------------------------------------------------ env calls
    def call(self, sid: str, fn: Callable[[GuiEnv], Any], *, new_episode: bool = False) -> Any:
        """Run fn(env) on the session's slot. ValueError passes through (bad input: 400); any other failure
        restarts the slot and raises SlotFailed (the episode is lost: status error). Only a reset
        (`new_episode`) may run before the session's first reset; one call of a session runs at a time."""
        with self.mu:
            s = self._slot(sid)
            if s.inflight:
                raise SessionConflict("another call of this session is still running: one call at a time")
            if not (new_episode or s.episode):
                raise SessionConflict("no episode yet: reset the session first")
            s.last_used, s.inflight = time.monotonic(), s.inflight + 1
        try:
            with s.lock:
                return self._run(s, sid, fn, new_episode)
        finally:
            with self.mu:
                s.inflight -= 1
                s.last_used = time.monotonic()
                if s.state == "releasing" and not s.inflight:
                    s.state = "ready"
                    self._wake()

    def _run(self, s: Slot, sid: str, fn: Callable[[GuiEnv], Any], new_episode: bool) -> Any:
        with self.mu:
            if s.session != sid or s.env is None:  # ended or restarted while we waited for the lock
                self._slot(sid)
                raise SessionGone("env session lost while waiting for its slot")
            env = s.env
        try:
            out = fn(env)
        except ValueError:
            raise
        except Exception as e:  # noqa: BLE001 - EnvError (browser/VM died) or a bug in the env
            why = f"slot {s.idx} failed: {_one_line(e)}"
            log.warning("%s; restarting it", why)
            with self.mu:
                if s.session == sid:
                    self._end(sid, f"lost: {why}")
                if s.state in ("busy", "releasing"):
                    self._restart(s, why)
            raise SlotFailed(f"{why}; the episode is lost and the slot is restarting") from e
        with self.mu:
            if s.session == sid:  # still this session's slot: its observation is the latest
                png = getattr(getattr(out, "observation", out), "screenshot_png", None)
                if png:
                    s.last_png = png
                if new_episode:
                    s.episode, s.episodes = True, s.episodes + 1
        return out

    def screenshot(self, sid: str) -> bytes:
        with self.mu:
            s = self._slot(sid)
            if not s.episode or s.last_png is None:
                raise SessionConflict("no observation yet: reset the session first")
            return s.last_png

    # ------------------------------------------------------------------ background
    def _reap_loop(self) -> None:
        while not self.stop.wait(min(1.0, self.idle_timeout_s / 4)):
            now = time.monotonic()
            with self.mu:
                for s in self.slots:
                    if s.state == "busy" and self.max_session_s and now - s.leased_at > self.max_session_s:
                        log.info("slot %d: session reached the %gs lifetime, ended", s.idx, self.max_session_s)
                        self._end(s.session, f"ended after the {self.max_session_s:g}s session lifetime")
                        self._free(s)
                    elif s.state == "busy" and now - s.last_used > self.idle_timeout_s and not s.inflight:
                        log.info("slot %d: session idle for %.0fs, reclaimed", s.idx, now - s.last_used)
                        self._end(s.session, f"reclaimed after {self.idle_timeout_s:g}s idle")
                        self._free(s)
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
                    "in_call": s.inflight > 0,
                    "episodes": s.episodes,
                    "restarts": s.restarts,
                    "last_error": s.last_error,
                    "idle_s": round(time.monotonic() - s.last_used, 1) if s.state == "busy" else None,
                }
                for s in self.slots
            ]
            waiting = len(self._queue)
        free = sum(1 for s in slots if s["state"] == "ready")
        ready = all(s["state"] in ("ready", "busy", "releasing") for s in slots)
        return {"status": "ready" if ready else "degraded", "free": free, "waiting": waiting, "slots": slots}


class RateLimit:
    """Token buckets: `rate` requests/s per key on average, bursts of up to `rate` (at least 1) at once.
    Used from the event loop only (no lock); the oldest of more than `max_keys` buckets is forgotten."""

    def __init__(self, rate: float, max_keys: int = 10_000):
        if rate <= 0:
            raise ValueError(f"rate must be > 0, got {rate}")
        self.rate, self.burst, self.max_keys = rate, max(1.0, rate), max_keys
        self.buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, when)

    def take(self, key: str) -> float:
        """0.0 when a request of `key` may go now (it is counted), else the seconds until one may."""
        now = time.monotonic()
        tokens, then = self.buckets.pop(key, (self.burst, now))
        tokens = min(self.burst, tokens + (now - then) * self.rate)
        wait = 0.0 if tokens >= 1 else (1 - tokens) / self.rate
        self.buckets[key] = (tokens - 1 if not wait else tokens, now)
        if len(self.buckets) > self.max_keys:
            self.buckets.popitem(last=False)
        return wait


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
