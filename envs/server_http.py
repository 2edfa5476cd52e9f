"""The env server's HTTP layer (FastAPI + uvicorn) over `envs.server.SlotPool`; see envs/server.py.

    serve(ServerSettings(env="miniwob", slots=2, token=os.environ.get("FLYWHEEL_ENV_TOKEN")), port=8100)

Endpoint handlers are plain `def`s: FastAPI runs them in its thread pool, so N slots step in parallel
while each slot's lock keeps one call at a time on its env.
"""

from __future__ import annotations

import json
import socket
import sys
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from pydantic import BaseModel, ConfigDict, Field

from envs.server import SessionGone, SlotFailed, SlotPool, check_bind, token_ok
from envs.wire import API, dumps, obs_to_json, step_to_json


class ResetBody(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task_id: str = Field(min_length=1, max_length=200)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    task_config: dict[str, Any] | None = None  # OSWorld: the task JSON (else the server's tasks dir)


MAX_BODY_BYTES = 1 << 20  # 1 MiB: an action is < 1 KB; an OSWorld task config a few KB


@dataclass
class ServerSettings:
    env: str  # "miniwob" | "osworld"
    slots: int = 1
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    token: str | None = field(default=None, repr=False)  # never in reprs or logs
    idle_timeout_s: float = 300.0
    health_interval_s: float = 15.0
    max_body_bytes: int = MAX_BODY_BYTES
    call_timeout_s: float = 600.0  # a reset/step/evaluate running longer is a stuck env: the slot restarts


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
    """ASGI middleware: API token (constant time) and a request body cap, before any handler runs.

    The body is read here (at most max_body_bytes) and replayed to the app, so a chunked upload
    without Content-Length cannot get past the cap either."""

    def __init__(self, app, token: str | None, max_body: int):
        self.app, self.token, self.max_body = app, token, max_body

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
        declared = headers.get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
            return await _reply(send, 413, f"request body over the {self.max_body} byte limit")
        chunks, size, more = [], 0, True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                return await _reply(send, 413, f"request body over the {self.max_body} byte limit")
            chunks.append(chunk)
            more = msg.get("more_body", False)
        body, sent = b"".join(chunks), False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        return await self.app(scope, replay, send)


async def _reply(send, status: int, error: str) -> None:
    body = json.dumps({"error": error}).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _errors(e) -> str:
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in e.errors())


def _err(code: int, msg: str, **extra):
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": msg, **extra}, status_code=code)


def _error_handlers(app) -> None:
    """Every failure a client can cause or meet, as one JSON line with its status code."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, e: RequestValidationError):
        return _err(422, f"invalid request: {_errors(e)}")

    @app.exception_handler(SessionGone)
    async def _gone(request: Request, e: SessionGone):
        return _err(404, str(e))

    @app.exception_handler(SlotFailed)
    async def _slot_failed(request: Request, e: SlotFailed):
        return _err(502, str(e), status="error")

    @app.exception_handler(ValueError)
    async def _value(request: Request, e: ValueError):
        return _err(400, str(e).splitlines()[0] if str(e) else "bad request")


def _routes(app, pool: SlotPool, settings: ServerSettings, version: str) -> None:
    """health, and the session endpoints: open (+ reset), reset, step, evaluate (+ release), screenshot, close."""
    from fastapi import Body, Query
    from fastapi.responses import Response
    from pydantic import ValidationError

    from agents.actions import ACTION_ADAPTER

    @app.get(f"{API}/health")
    def health():
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
    def open_session(
        body: Optional[ResetBody] = None,
        wait_s: float = Query(0.0, ge=0, le=30, description="wait this long for a free slot"),
    ):
        """Lease a slot; with a reset body, also start the episode (one round trip instead of two)."""
        got = pool.acquire(wait_s)
        if got is None:
            return _err(503, f"no free slot: {settings.slots} slots, none ready and free", free=0)
        sid, slot = got
        out: dict[str, Any] = {"session_id": sid, "slot": slot.idx, "env": settings.env, "env_version": version}
        if body is not None:
            try:
                out["observation"] = do_reset(sid, body)
            except ValueError:
                pool.release(sid)
                raise
        out["free"] = pool.health()["free"]
        return Response(dumps(out), status_code=201, media_type="application/json")

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
    def screenshot(sid: str):
        png = pool.screenshot(sid)
        if png is None:
            return _err(409, "no observation yet: reset the session first")
        return Response(png, media_type="image/png")

    @app.delete(f"{API}/sessions/{{sid}}")
    def close_session(sid: str):
        pool.release(sid)
        return {"closed": True, "free": pool.health()["free"]}


def create_app(settings: ServerSettings, pool: SlotPool | None = None):
    from fastapi import FastAPI

    pool = pool or SlotPool(
        _env_factory(settings),
        settings.slots,
        idle_timeout_s=settings.idle_timeout_s,
        health_interval_s=settings.health_interval_s,
    )
    version = env_version(settings.env)

    @asynccontextmanager
    async def lifespan(app):
        pool.start()
        try:
            yield
        finally:
            pool.close()

    app = FastAPI(title="flywheel env server", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.pool = pool

    _error_handlers(app)

    _routes(app, pool, settings, version)
    return _Guard(app, settings.token, settings.max_body_bytes)


def serve(settings: ServerSettings, host: str = "127.0.0.1", port: int = 8100, access_log: bool = False) -> None:
    """Bind, print one line with the URL (port 0 = any free port), and serve until SIGINT/SIGTERM.
    ValueError for a non-loopback host without a token, OSError when the address cannot be bound."""
    import uvicorn

    check_bind(host, settings.token)
    # proto=IPPROTO_TCP explicitly: asyncio sets TCP_NODELAY only on sockets whose proto says TCP, and without
    # it every keep-alive response waits ~40 ms (headers and body are two writes; Nagle vs delayed ACK).
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(
        f"env server: {settings.slots} x {settings.env} on http://{shown}:{bound} "
        f"(token {'required' if settings.token else 'off'}, idle timeout {settings.idle_timeout_s:g}s)",
        flush=True,
        file=sys.stdout,
    )
    config = uvicorn.Config(
        create_app(settings), log_level="warning", access_log=access_log, timeout_keep_alive=75, lifespan="on"
    )
    uvicorn.Server(config).run(sockets=[sock])
