"""A `GuiEnv` whose env lives on an env server (envs/server.py): what `env.name: remote` builds.

    env = RemoteEnv(["http://10.0.0.5:8100", "http://10.0.0.6:8100"])   # token from $FLYWHEEL_ENV_TOKEN
    obs = env.reset("click-test", seed=3)      # leases a slot on the server with the most free slots
    res = env.step(Click(x=80, y=105))
    env.evaluate(); env.close()                # close gives the slot back

The env holds its slot (session) across episodes, like a local env holds its browser; a reset
whose session was reclaimed (idle timeout) or whose server went away leases a new slot, on
another server if need be (nothing of the episode has happened yet). A failure during an episode
raises EnvError: the runner records the episode as `error` and retries it (flywheel.runtime.rollout).
The token is read from the environment variable named by `token_env`, kept out of reprs, and
never part of the URLs, the rollout spec or the lake. An https server is verified against the system CAs, or
against `ca_file` (a PEM bundle: a self-signed server's certificate). A request refused by the server's rate
limit (429) is sent again after the Retry-After it names (it did not run).
"""

from __future__ import annotations

import os
import random
import socket
import ssl
import time
from typing import Any
from urllib.parse import urlsplit

from agents.actions import Action
from envs.base import EnvError, GuiEnv, Observation, StepResult
from envs.wire import API, TOKEN_ENV, obs_from_json, step_from_json

DOWN_COOLDOWN_S = 10.0  # a server that failed is skipped this long when leasing
RATE_LIMIT_RETRIES = 3  # a 429 is retried this many times, each after its Retry-After (capped)
RETRY_AFTER_MAX_S = 5.0


def check_server_url(url: str) -> str:
    """The URL without a trailing slash; ValueError for anything but http(s)://host[:port][/path]."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"env server URL {url!r} must look like http://host:port")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ValueError(
            f"env server URL {url!r} must not carry credentials, a query or a fragment (the token goes in ${TOKEN_ENV})"
        )
    return url.rstrip("/")


class RemoteEnv(GuiEnv):
    """One slot on one of `servers`, leased at the first reset and given back by `close()`.

    Args:
        servers: env server base URLs; slots are leased where the most are free.
        token_env: environment variable holding the API token (empty/unset: no token sent).
        timeout_s: per-request read timeout (an OSWorld step with its pause fits well inside).
        acquire_timeout_s: how long a reset waits for a free slot when every slot is busy.
        probe: check at construction that at least one server answers (a clear error early).
        ca_file: PEM CA bundle that verifies https servers (default: the system CAs).
    """

    name = "remote"

    def __init__(
        self,
        servers: list[str],
        *,
        token_env: str = TOKEN_ENV,
        timeout_s: float = 120.0,
        acquire_timeout_s: float = 120.0,
        probe: bool = True,
        ca_file: str | None = None,
        task_configs: dict[str, dict[str, Any]] | None = None,
    ):
        import httpx

        if not servers:
            raise ValueError("RemoteEnv needs at least one env server URL")
        self.servers = [check_server_url(u) for u in servers]
        token = os.environ.get(token_env) or None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        # TCP_NODELAY: httpcore writes a request's headers and body separately; with Nagle on, the body waits
        # for the server's delayed ACK (up to 40 ms on Linux) on every POST.
        verify: ssl.SSLContext | bool = True
        if ca_file:
            try:
                verify = ssl.create_default_context(cafile=os.path.expanduser(ca_file))
            except (OSError, ssl.SSLError) as e:
                raise ValueError(f"cannot load the env servers' CA file {ca_file!r}: {e}") from None
        transport = httpx.HTTPTransport(verify=verify, socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)])
        self._http = httpx.Client(headers=headers, timeout=httpx.Timeout(timeout_s, connect=5.0), transport=transport)
        self._transport_errors = (httpx.TransportError,)
        self.acquire_timeout_s = acquire_timeout_s
        self._down: dict[str, float] = {}  # url -> when it last failed
        self._free: dict[str, int] = {}  # url -> free slots it last reported
        self._reward: float | None = None  # the scored episode's reward once its slot is given back
        self._url: str | None = None
        self._sid: str | None = None
        self.env_version: str | None = None
        self.task_configs = dict(task_configs or {})  # task id -> task JSON sent with its reset (OSWorld, the lake)
        if probe:
            self._probe()

    def __repr__(self) -> str:  # no token, ever
        return f"RemoteEnv(servers={self.servers!r}, session={'on ' + self._url if self._sid else 'none'})"

    # ------------------------------------------------------------------ HTTP
    def _req(self, method: str, url: str, what: str, **kw) -> Any:
        """One request -> JSON; EnvError naming the server on a transport failure or an error status."""
        for attempt in range(RATE_LIMIT_RETRIES + 1):
            try:
                r = self._http.request(method, url, **kw)
            except self._transport_errors as e:
                raise _Unreachable(f"env server {_base(url)} unreachable during {what}: {type(e).__name__}: {e}") from e
            if r.status_code != 429 or attempt == RATE_LIMIT_RETRIES:
                break
            try:
                time.sleep(min(RETRY_AFTER_MAX_S, max(0.1, float(r.headers.get("retry-after", 1)))))
            except ValueError:
                time.sleep(1.0)
        if r.status_code >= 400:
            try:
                msg = r.json().get("error") or r.text
            except ValueError:
                msg = r.text[:300]
            raise _Refused(f"env server {_base(url)}: {what} failed (HTTP {r.status_code}): {msg}", r.status_code)
        return r.json()

    def _probe(self) -> None:
        """Raise EnvError naming every server's problem when none answers its health endpoint."""
        problems = []
        for url in self.servers:
            try:
                self._free[url] = int(self._req("GET", f"{url}{API}/health", "health", timeout=5.0).get("free", 0))
                return
            except EnvError as e:
                self._down[url] = time.monotonic()
                problems.append(str(e))
        raise EnvError("no usable env server: " + " | ".join(problems))

    # ------------------------------------------------------------------ slots
    def _acquire(self, reset: dict[str, Any]) -> Observation:
        """Lease a slot and reset it in one request: first without waiting, on the servers that last reported the
        most free slots; when all are busy, wait in the servers' first-come-first-served queues in turn."""
        deadline = time.monotonic() + self.acquire_timeout_s
        live = [u for u in self.servers if time.monotonic() - self._down.get(u, -1e9) >= DOWN_COOLDOWN_S]
        order = sorted(live or self.servers, key=lambda u: (-self._free.get(u, 1), random.random()))
        problems, dead = [], set()
        waits = [0.0] * len(order)
        while True:
            for url, wait_s in zip(order, waits):
                try:
                    got = self._req(
                        "POST",
                        f"{url}{API}/sessions",
                        "lease and reset",
                        params={"wait_s": wait_s},
                        json=reset,
                        timeout=self._http.timeout.read + wait_s,
                    )
                except _Unreachable as e:
                    self._down[url] = time.monotonic()
                    problems.append(str(e))
                    dead.add(url)
                    continue
                except _Refused as e:
                    if e.status == 503:
                        self._free[url] = 0
                        continue
                    if e.status == 502:  # that slot failed and restarts: try the next server
                        problems.append(str(e))
                        continue
                    if e.status in (400, 422):  # a bad task id / config is the caller's error
                        raise ValueError(str(e)) from None
                    raise  # 401 and the like: retrying elsewhere would not help
                self._url, self._sid = url, got["session_id"]
                self._free[url] = int(got.get("free", 0))
                self.name = got.get("env") or "remote"
                self.env_version = f"{got.get('env_version') or self.name} via {url}"
                return obs_from_json(got["observation"])
            order = [u for u in order if u not in dead]
            if not order:
                raise EnvError("no env server reachable: " + " | ".join(problems))
            if time.monotonic() > deadline:
                raise EnvError(
                    f"no free env slot on {len(order)} reachable server(s) within {self.acquire_timeout_s:g}s"
                )
            random.shuffle(order)
            waits = [2.0] * len(order)  # queue on each server in turn (FIFO there), 2 s at a time

    def _drop_session(self, url_down: bool = False) -> None:
        if url_down and self._url:
            self._down[self._url] = time.monotonic()
        self._sid = None

    def _session_url(self, op: str) -> str:
        if self._sid is None:
            raise EnvError(f"{op}() without a live env session: reset() first")
        return f"{self._url}{API}/sessions/{self._sid}/{op}"

    # ------------------------------------------------------------------ GuiEnv
    def reset(self, task_id: str, seed: int, task_config: dict | None = None) -> Observation:
        body: dict[str, Any] = {"task_id": task_id, "seed": int(seed)}
        if task_config is None:
            task_config = self.task_configs.get(task_id)
        if task_config is not None:
            body["task_config"] = task_config
        last: Exception | None = None
        for _ in range(len(self.servers) + 2):  # nothing happened yet: another slot / server is safe
            self._reward = None
            if self._sid is None:
                return self._acquire(body)
            try:
                return obs_from_json(self._req("POST", self._session_url("reset"), "reset", json=body))
            except _Unreachable as e:
                self._drop_session(url_down=True)
                last = e
            except _Refused as e:
                if e.status not in (404, 502):  # 400/422: a bad task id or config is the caller's error
                    raise ValueError(str(e)) from None
                self._drop_session()  # 404 reclaimed / 502 the slot failed (the server ended the session)
                last = e
        raise EnvError(f"reset failed on every attempt: {last}")

    def step(self, action: Action) -> StepResult:
        url = self._session_url("step")
        try:
            return step_from_json(self._req("POST", url, "step", json={"action": action.model_dump(mode="json")}))
        except _Unreachable:
            self._drop_session(url_down=True)
            raise
        except _Refused as e:
            if e.status in (404, 502):  # the server already ended the session
                self._drop_session()
            raise

    def evaluate(self) -> float:
        """Score the episode, then give the slot back so another client can use it until the next reset
        (the rollout runner evaluates once, at the end of every episode that did not fail)."""
        if self._sid is None and self._reward is not None:
            return self._reward
        got = self._req("POST", self._session_url("evaluate"), "evaluate", params={"release": "true"})
        self._free[self._url], self._sid = int(got.get("free", 0)), None  # the server ended the session
        self._reward = float(got["reward"])
        return self._reward

    def _release(self) -> None:
        if self._sid is None:
            return
        try:
            got = self._http.delete(f"{self._url}{API}/sessions/{self._sid}", timeout=5.0)
            if got.status_code == 200:
                self._free[self._url] = int(got.json().get("free", 0))
        except Exception:  # noqa: BLE001 - best effort: the server reclaims the slot after its idle timeout
            pass
        self._sid = None

    def screenshot(self) -> bytes:
        r = self._http.get(self._session_url("screenshot"))
        r.raise_for_status()
        return r.content

    def close(self) -> None:
        """Give the slot back (best effort: an unreachable server reclaims it after its idle timeout)."""
        self._release()
        self._http.close()


class _Unreachable(EnvError):
    """The server did not answer (connection refused/reset, timeout)."""


class _Refused(EnvError):
    """The server answered with an error status (404: session reclaimed/closed/lost; 502: the slot failed)."""

    def __init__(self, msg: str, status: int):
        super().__init__(msg)
        self.status = status


def _base(url: str) -> str:
    p = urlsplit(url)
    return f"{p.scheme}://{p.netloc}"
