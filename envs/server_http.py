"""The env server's HTTP layer (FastAPI + uvicorn) over `envs.server.SlotPool`; see envs/server.py.

    serve(ServerSettings(env="miniwob", slots=2, token=os.environ.get("FLYWHEEL_ENV_TOKEN")), port=8100)

Env calls (reset, step, evaluate) are plain `def`s: FastAPI runs them in its thread pool, so N slots step in
parallel while each slot's lock keeps one call at a time on its env (and a session one call at a time: 409).
Everything else is a coroutine on the event loop and never waits for a thread: health, screenshot, close,
and the lease, whose wait for a free slot (`wait_s`) is a coroutine in the pool's queue that also watches
its client: a client that went away leaves the queue, and a slot leased for one is given back at once.
Below routing, `_Guard` checks the token, the rate limit and body sizes, and envs/server_net.py the
connections themselves (header timeout, connection cap).
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import logging
import math
import socket
import ssl
import sys
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field
from starlette.requests import Request  # module level: FastAPI resolves the handlers' annotations here

from envs.server import (
    RateLimit,
    SessionConflict,
    SessionGone,
    SlotFailed,
    SlotPool,
    check_bind,
    token_ok,
)
from envs.wire import API, dumps, obs_to_json, step_to_json

log = logging.getLogger("flywheel.env_server")


class ResetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1, max_length=200)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    task_config: dict[str, Any] | None = None  # OSWorld: the task JSON (else the server's tasks dir)


MAX_BODY_BYTES = 1 << 20  # 1 MiB: an action is < 1 KB; an OSWorld task config a few KB
MAX_BODY_TOTAL_BYTES = 64 << 20  # request bodies held at once, across all requests
TRIM_AFTER_BYTES = 1 << 20  # after this much body read, the heap is trimmed once the burst is over


@dataclass
class ServerSettings:
    env: str  # "miniwob" | "osworld"
    slots: int = 1
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    token: str | None = field(default=None, repr=False)  # never in reprs or logs
    idle_timeout_s: float = 300.0
    health_interval_s: float = 15.0
    max_body_bytes: int = MAX_BODY_BYTES
    max_body_total_bytes: int = MAX_BODY_TOTAL_BYTES  # past it: 503 + Retry-After
    call_timeout_s: float = 600.0  # a reset/step/evaluate running longer is a stuck env: the slot restarts
    max_session_s: float = 3600.0  # a session is ended this long after its lease (0: no limit)
    rate_limit_per_s: float | None = None  # requests/s per token (bursts of as many); None: 50 per slot; 0: off
    header_timeout_s: float = 5.0  # a connection's request headers must be complete this soon (and TLS handshakes)
    max_connections: int = 1000  # open connections; past it the longest idle one is closed
    tls_cert: str | None = None  # PEM certificate (chain) and key: serve https
    tls_key: str | None = None

    def rate(self) -> float:
        return 50.0 * self.slots if self.rate_limit_per_s is None else self.rate_limit_per_s


def env_version(env: str) -> str:
    """What the episodes' `env_version` records for this server's env kind (the client adds the URL)."""
    from importlib.metadata import PackageNotFoundError, version

    dist = {"miniwob": "miniwob", "osworld": "desktop-env"}.get(env, env)
    try:
        return f"{env} {version(dist)}"
    except PackageNotFoundError:
        return env


def _env_factory(settings: ServerSettings):
    """Each slot's env runs in its own child process (envs/slot_process.py): slots do not share one GIL."""
    from envs.slot_process import ProcessEnv

    def make():
        return ProcessEnv(settings.env, settings.env_kwargs, call_timeout_s=settings.call_timeout_s)

    return make


class _Guard:
    """ASGI middleware, before any handler runs: the API token (constant time), the per-token rate limit (429),
    and request bodies. The body is read here and replayed to the app, so it is capped while it is read,
    with or without Content-Length: max_body bytes per request (413) and max_body_total bytes across all
    requests being read or handled (503 + Retry-After). A refusal closes the connection (its body unread)."""

    def __init__(self, app, token: str | None, max_body: int, max_body_total: int, rate: float):
        self.app, self.token, self.max_body, self.max_body_total = app, token, max_body, max_body_total
        self.rate = RateLimit(rate) if rate > 0 else None
        self.held = 0  # body bytes held by requests in progress (touched on the event loop only)
        self.read, self.last_read = 0, 0.0  # body bytes read since the heap was last trimmed; when the last came
        self.trim_later: asyncio.TimerHandle | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if self.token and not token_ok(headers.get(b"authorization"), self.token):
            return await _reply(
                send,
                401,
                "missing or wrong API token: send 'Authorization: Bearer <token>' "
                "with the server's token ($FLYWHEEL_ENV_TOKEN)",
            )
        if self.rate is not None:
            wait = self.rate.take(self.token or (scope.get("client") or ("?",))[0])
            if wait:
                return await _reply(
                    send, 429, f"rate limit: over {self.rate.rate:g} requests/s for this token", retry_after=wait
                )
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return await _reply(send, 413, f"request body over the {self.max_body} byte limit")
        buf, more, held = bytearray(), True, 0
        try:
            while more:
                msg = await receive()
                if msg["type"] == "http.disconnect":
                    return
                chunk = msg.get("body", b"")
                self.read, self.last_read = self.read + len(chunk), time.monotonic()
                if len(buf) + len(chunk) > self.max_body:
                    return await _reply(send, 413, f"request body over the {self.max_body} byte limit")
                if self.held + len(chunk) > self.max_body_total:
                    return await _reply(send, 503, "server busy reading other requests' bodies", retry_after=1)
                buf += chunk
                self.held, held = self.held + len(chunk), held + len(chunk)
                more = msg.get("more_body", False)
            body, sent = bytes(buf), False
            del buf

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            return await self.app(scope, replay, send)
        finally:
            self.held -= held
            self._trim()

    def _trim(self) -> None:
        """After a burst of bodies (over TRIM_AFTER_BYTES read since the last trim, refused ones included),
        return the memory to the OS once the burst is over: none held and no body byte for a second."""
        if self.read > TRIM_AFTER_BYTES and self.trim_later is None:
            self.trim_later = asyncio.get_running_loop().call_later(1.0, self._trim_now)

    def _trim_now(self) -> None:
        self.trim_later = None
        if self.held or time.monotonic() - self.last_read < 1.0:  # the burst goes on: look again in a second
            self.trim_later = asyncio.get_running_loop().call_later(1.0, self._trim_now)
            return
        self.read = 0
        _trim_heap()


async def _reply(send, status: int, error: str, retry_after: float | None = None) -> None:
    """A refusal from the guard: one JSON line, and the connection closes (the request body may be unread)."""
    body = json.dumps({"error": error}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after is not None:
        headers.append((b"retry-after", str(max(1, math.ceil(retry_after))).encode()))
    headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _errors(e) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())


def _err(code: int, msg: str, **extra):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": msg, **extra}, status_code=code)


def _error_handlers(app) -> None:
    """Every failure a client can cause or meet, as one JSON line with its status code."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, e: RequestValidationError):
        return _err(422, f"invalid request: {_errors(e)}")

    @app.exception_handler(HTTPException)
    async def _routing(request: Request, e: HTTPException):  # unknown path (404), wrong method (405)
        return _err(e.status_code, f"{e.detail}: {request.method} {request.url.path[:200]}")

    @app.exception_handler(SessionGone)
    async def _gone(request: Request, e: SessionGone):
        return _err(404, str(e))

    @app.exception_handler(SessionConflict)
    async def _conflict(request: Request, e: SessionConflict):
        return _err(409, str(e))

    @app.exception_handler(SlotFailed)
    async def _slot_failed(request: Request, e: SlotFailed):
        return _err(502, str(e), status="error")

    @app.exception_handler(ValueError)
    async def _value(request: Request, e: ValueError):
        return _err(400, str(e).splitlines()[0] if str(e) else "bad request")


class _Waiter:
    """One lease request waiting its turn, as a coroutine: woken by the pool when a slot is ready, and by its
    client's disconnect (watched from the moment the body has been read until the answer is sent)."""

    def __init__(self, request):
        self.loop = asyncio.get_running_loop()
        self.woke, self.gone = asyncio.Event(), asyncio.Event()
        self.watcher = asyncio.create_task(self._watch(request))

    async def _watch(self, request) -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass
        self.gone.set()
        self.woke.set()

    def wake(self) -> None:  # called under the pool's lock, from any thread
        try:
            self.loop.call_soon_threadsafe(self.woke.set)
        except RuntimeError:  # the loop closed: the server is stopping
            pass

    async def lease(self, pool: SlotPool, wait_s: float) -> tuple[str, Any] | None:
        """Wait up to wait_s in the pool's first-come-first-served queue; None on timeout or disconnect."""
        ticket = pool.enqueue(self.wake)
        deadline = self.loop.time() + wait_s
        try:
            while True:
                self.woke.clear()
                got = pool.try_lease(ticket)
                left = deadline - self.loop.time()
                if got is not None or self.gone.is_set() or left <= 0 or pool.stop.is_set():
                    return got
                try:
                    await asyncio.wait_for(self.woke.wait(), left)
                except asyncio.TimeoutError:
                    pass
        finally:
            pool.dequeue(ticket)


def _routes(app, pool: SlotPool, settings: ServerSettings, version: str) -> None:
    """health, and the session endpoints: open (+ reset), reset, step, evaluate (+ release), screenshot, close."""
    from fastapi import Body, Query
    from fastapi.responses import Response
    from pydantic import ValidationError
    from starlette.concurrency import run_in_threadpool

    from agents.actions import ACTION_ADAPTER

    @app.get(f"{API}/health")
    async def health():
        return {"env": settings.env, "env_version": version, "idle_timeout_s": settings.idle_timeout_s, **pool.health()}

    def do_reset(sid: str, body: ResetBody) -> dict[str, Any]:
        def go(env):
            if body.task_config is not None:
                if not getattr(env, "accepts_task_config", False):
                    raise ValueError(f"the {settings.env} env takes no task_config")
                return env.reset(body.task_id, body.seed, task_config=body.task_config)
            return env.reset(body.task_id, body.seed)

        return obs_to_json(pool.call(sid, go, new_episode=True))

    @app.post(f"{API}/sessions", status_code=201)
    async def open_session(
        request: Request,
        body: Optional[ResetBody] = None,
        wait_s: float = Query(0.0, ge=0, le=30, description="wait this long for a free slot"),
    ):
        """Lease a slot; with a reset body, also start the episode (one round trip instead of two)."""
        waiter = _Waiter(request)
        try:
            got = await waiter.lease(pool, wait_s)
            if got is None:
                return _err(503, f"no free slot: {settings.slots} slots, none ready and free", free=0)
            sid, slot = got
            out: dict[str, Any] = {"session_id": sid, "slot": slot.idx, "env": settings.env, "env_version": version}
            if body is not None:
                try:
                    out["observation"] = await run_in_threadpool(do_reset, sid, body)
                except (ValueError, SessionConflict):
                    pool.release(sid)
                    raise
            if waiter.gone.is_set():  # the client left while we leased and reset: nobody would hold this session
                log.info("slot %d: its client left before the lease was answered; given back", slot.idx)
                _release_quietly(pool, sid)
            out["free"] = pool.health()["free"]
            return Response(dumps(out), status_code=201, media_type="application/json")
        finally:
            waiter.watcher.cancel()

    @app.post(f"{API}/sessions/{{sid}}/reset")
    def reset(sid: str, body: ResetBody):
        return Response(dumps(do_reset(sid, body)), media_type="application/json")

    @app.post(f"{API}/sessions/{{sid}}/step")
    def step(sid: str, body: dict[str, Any] = Body(...)):
        if set(body) != {"action"} or not isinstance(body["action"], dict):
            return _err(422, 'invalid request: the body must be {"action": {...}} (agents.actions schema)')
        try:
            action = ACTION_ADAPTER.validate_python(body["action"])
        except ValidationError as e:
            return _err(422, f"invalid action: {_errors(e)}")
        return Response(
            dumps(step_to_json(pool.call(sid, lambda env: env.step(action)))), media_type="application/json"
        )

    @app.post(f"{API}/sessions/{{sid}}/evaluate")
    def evaluate(sid: str, release: bool = Query(False, description="end the session after scoring")):
        out: dict[str, Any] = {"reward": float(pool.call(sid, lambda env: env.evaluate()))}
        if release:  # the episode is over: give the slot back in the same round trip
            pool.release(sid)
            out["free"] = pool.health()["free"]
        return out

    @app.get(f"{API}/sessions/{{sid}}/screenshot")
    async def screenshot(sid: str):
        return Response(pool.screenshot(sid), media_type="image/png")

    @app.delete(f"{API}/sessions/{{sid}}")
    async def close_session(sid: str):
        pool.release(sid)
        return {"closed": True, "free": pool.health()["free"]}


def _release_quietly(pool: SlotPool, sid: str) -> None:
    try:
        pool.release(sid)
    except SessionGone:
        pass


def create_app(settings: ServerSettings, pool: SlotPool | None = None):
    from fastapi import FastAPI

    pool = pool or SlotPool(
        _env_factory(settings),
        settings.slots,
        idle_timeout_s=settings.idle_timeout_s,
        health_interval_s=settings.health_interval_s,
        max_session_s=settings.max_session_s,
    )
    version = env_version(settings.env)

    @asynccontextmanager
    async def lifespan(app):
        pool.start()
        try:
            yield
        finally:
            pool.close()

    app = FastAPI(
        title="flywheel env server",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
        openapi_url=None,
        redirect_slashes=False,  # "/v1/sessions/" is a 404, not a redirect (a documented code, one JSON line)
    )
    app.state.pool = pool

    _error_handlers(app)

    _routes(app, pool, settings, version)
    return _Guard(app, settings.token, settings.max_body_bytes, settings.max_body_total_bytes, settings.rate())


def _tls_context(settings: ServerSettings) -> ssl.SSLContext | None:
    """Check the TLS settings early: ValueError (one line) for half a pair or a certificate that does not load."""
    if not (settings.tls_cert or settings.tls_key):
        return None
    if not (settings.tls_cert and settings.tls_key):
        raise ValueError("TLS needs both --tls-cert and --tls-key")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(settings.tls_cert, settings.tls_key)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"cannot load the TLS certificate/key: {e}") from None
    return ctx


def _trim_heap() -> None:
    """Give the heap's free pages back to the OS: glibc keeps them after a burst of request bodies (a flood of
    300 trickled 480 KiB bodies left ~140 MiB resident after they were freed)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def serve(settings: ServerSettings, host: str = "127.0.0.1", port: int = 8100, access_log: bool = False) -> None:
    """Bind, print one line with the URL (port 0 = any free port), and serve until SIGINT/SIGTERM.
    ValueError for a non-loopback host without a token or bad TLS files, OSError when the address cannot be bound."""
    import uvicorn

    from envs.server_net import ConnLimits, QuietUvicorn, loop_factory, protocol_class, raise_fd_limit

    check_bind(host, settings.token)
    tls = _tls_context(settings)
    limits = ConnLimits(settings.header_timeout_s, settings.max_connections)
    fds = raise_fd_limit()
    if limits.max_connections > fds - 256:  # leave room for the slots' pipes, the logs and the listening socket
        limits.max_connections = max(16, fds - 256)
        log.warning("max connections lowered to %d: the process may open %d files", limits.max_connections, fds)
    # proto=IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without
    # it every keep-alive response waits ~40 ms (headers and body are two writes; Nagle vs delayed ACK).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"env server: {settings.slots} x {settings.env} on {'https' if tls else 'http'}://{shown}:{bound} "
        f"(token {'required' if settings.token else 'off'}, idle timeout {settings.idle_timeout_s:g}s)",
        flush=True,
        file=sys.stdout,
    )
    config = uvicorn.Config(
        create_app(settings),
        log_level="warning",
        access_log=access_log,
        timeout_keep_alive=75,
        lifespan="on",
        http=protocol_class(limits),
        ws="none",
        ssl_certfile=settings.tls_cert if tls else None,
        ssl_keyfile=settings.tls_key if tls else None,
    )
    logging.getLogger("uvicorn.error").addFilter(QuietUvicorn(limits))  # after Config: it sets up logging
    server = uvicorn.Server(config)
    with asyncio.Runner(loop_factory=loop_factory(limits)) as runner:
        runner.run(server.serve(sockets=[sock]))
