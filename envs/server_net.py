"""The env server's connection guards, below HTTP routing: what a client can hold before it has authenticated.

    limits = ConnLimits(header_timeout_s=5, max_connections=1000)
    uvicorn.Config(app, http=protocol_class(limits), ...)         # header timeout + connection cap
    asyncio.Runner(loop_factory=loop_factory(limits)).run(...)    # TLS handshake timeout, quiet accept errors

- Every connection must deliver a request's complete headers within `header_timeout_s` of connecting, and
  again of the first byte of each later request on a keep-alive connection (a partial-header "slowloris"
  connection is closed then). TLS handshakes get the same timeout.
- At most `max_connections` connections are open: a new one past the cap closes the connection that has been
  idle (no request in progress: waiting for headers, or keep-alive) the longest, or, with none idle, itself.
  So a flood of partial-header connections cannot shut out a client that sends a whole request at once.
- Those closes, `accept()` failures (out of file descriptors) and uvicorn's warning per malformed request are
  logged as one line per minute with counts, never a line or a traceback per connection. `raise_fd_limit`
  lifts the soft descriptor limit to the hard one.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections import Counter

log = logging.getLogger("flywheel.env_server")

LOG_EVERY_S = 60.0


class ConnLimits:
    """The limits and the counters of what they closed (logged at most once per LOG_EVERY_S)."""

    def __init__(self, header_timeout_s: float = 5.0, max_connections: int = 1000):
        if header_timeout_s <= 0 or max_connections < 1:
            raise ValueError("header_timeout_s must be > 0 and max_connections >= 1")
        self.header_timeout_s, self.max_connections = header_timeout_s, max_connections
        self.counts: Counter[str] = Counter()  # since the last log line
        self.totals: Counter[str] = Counter()
        self._logged = -LOG_EVERY_S

    def note(self, what: str) -> None:
        """Count one event; log the counts so far when the last line is over a minute old."""
        self.counts[what] += 1
        self.totals[what] += 1
        now = time.monotonic()
        if now - self._logged >= LOG_EVERY_S:
            self._logged = now
            log.warning(
                "connection guard (last %gs): %s", LOG_EVERY_S, ", ".join(f"{n} {w}" for w, n in self.counts.items())
            )
            self.counts.clear()


def raise_fd_limit() -> int:
    """Raise the soft open-file limit to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        want = 1 << 20 if hard == resource.RLIM_INFINITY else hard
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
            soft = want
        except (ValueError, OSError):
            pass
    return soft


def protocol_class(limits: ConnLimits) -> type:
    """uvicorn's h11 protocol with the header timeout and the connection cap (uvicorn's `http=` accepts a class)."""
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class GuardedH11Protocol(H11Protocol):
        _timer: asyncio.TimerHandle | None = None
        _idle_since = 0.0

        def _idle(self) -> bool:
            """No request in progress: waiting for (the rest of) a request's headers, or kept alive."""
            return self.cycle is None or self.cycle.response_complete

        def _arm(self) -> None:
            if self._timer is None:
                self._timer = self.loop.call_later(limits.header_timeout_s, self._header_timeout)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _header_timeout(self) -> None:
            self._timer = None
            if self._idle() and not self.transport.is_closing():
                limits.note(f"closed for incomplete headers after {limits.header_timeout_s:g}s")
                self.transport.close()

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._idle_since = self.loop.time()
            self._arm()
            if len(self.connections) > limits.max_connections:
                idle = [c for c in self.connections if c is not self and c._idle() and not c.transport.is_closing()]
                victim = min(idle, key=lambda c: c._idle_since) if idle else self
                limits.note(
                    f"closed at the {limits.max_connections}-connection cap"
                    + (" (the longest idle)" if victim is not self else " (none idle: the new one)")
                )
                victim.transport.close()

        def data_received(self, data: bytes) -> None:
            before = self.cycle
            super().data_received(data)
            if self.cycle is not before:  # a request's headers are in
                self._disarm()
            elif self._idle():  # bytes of the next request's headers (or of a refused request's body)
                self._arm()

        def on_response_complete(self) -> None:
            self._idle_since = self.loop.time()
            super().on_response_complete()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """A request whose headers parsed but whose body did not (a bad chunk): the app may already be
            answering it. Mark its cycle disconnected first (its answer goes nowhere, instead of raising a
            protocol error in the app), and send no 400 over a response already started."""
            cycle = self.cycle
            if cycle is not None and not cycle.response_complete:
                cycle.disconnected = True
                cycle.message_event.set()
                if cycle.response_started:
                    self.transport.close()
                    return
            super().send_400_response(msg)

    return GuardedH11Protocol


class QuietUvicorn(logging.Filter):
    """uvicorn logs a warning for every malformed or upgrade request (pre-auth: a log flood); count them into
    the guard's line instead. Install on the `uvicorn.error` logger."""

    COUNTED = {
        "Invalid HTTP request received.": "malformed requests answered 400",
        "Unsupported upgrade request.": "upgrade requests ignored",
    }

    def __init__(self, limits: ConnLimits):
        super().__init__()
        self.limits = limits

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        if msg in self.COUNTED:
            self.limits.note(self.COUNTED[msg])
            return False
        return not msg.startswith("No supported WebSocket library")


def loop_factory(limits: ConnLimits):
    """A selector event loop whose TLS handshakes and shutdowns time out after the header timeout (a client
    that never answers the shutdown held the server's own stop for 30 s), and whose accept() errors
    (EMFILE under a connection flood) are counted into the guard's log line instead of one traceback each."""

    class GuardedLoop(asyncio.SelectorEventLoop):
        async def create_server(self, *args, **kw):
            if kw.get("ssl") is not None:  # a TLS hello or goodbye (close_notify) may take as long as headers
                kw.setdefault("ssl_handshake_timeout", limits.header_timeout_s)
                kw.setdefault("ssl_shutdown_timeout", limits.header_timeout_s)
            return await super().create_server(*args, **kw)

    def handler(loop: asyncio.AbstractEventLoop, context: dict) -> None:
        msg = str(context.get("message", ""))
        if "accept" in msg:
            exc = context.get("exception")
            limits.note(f"accept() failed ({type(exc).__name__}: {exc})" if exc else "accept() failed")
        else:
            loop.default_exception_handler(context)

    def make() -> asyncio.AbstractEventLoop:
        loop = GuardedLoop()
        loop.set_exception_handler(handler)
        return loop

    return make
