"""Prefect lifecycle for the flywheel: settings for in-process runs, and `flywheel up` / `flywheel down`.

    with local_settings():            # in-process runs: heartbeats off, results in .prefect/results
        flywheel_flow(...)
    info = up(port=4200)              # server + work pools + deployments + one worker per pool
    down()                            # stops exactly the processes `up` recorded, by process group

`up` starts every process in its own session and records pid, process group and start time in
`.prefect/flywheel-up.json`; `down` signals only those groups, and only while the pid still belongs
to the process `up` started (same start time: a reused pid is left alone). The server keeps its SQLite
database and the workers' flow runs keep their persisted results under `.prefect/` (git-ignored), so
history survives a restart.
Prefect is imported inside the functions: `flywheel --help` stays fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import yaml

from flywheel.errors import UserError

STATE_FILE = "flywheel-up.json"


def project_root() -> Path:
    """The folder holding prefect.yaml: the working directory, else the checkout this package is in."""
    for cand in (Path.cwd(), Path(__file__).resolve().parents[1]):
        if (cand / "prefect.yaml").exists():
            return cand
    raise UserError("no prefect.yaml here: run this from the project folder")


def results_dir(root: Path | None = None) -> Path:
    """Where Prefect persists stage results (cache records): $FLYWHEEL_RESULTS, else .prefect/results.
    Outside the lake on purpose: deleting it only forgets what was cached."""
    env = os.environ.get("FLYWHEEL_RESULTS")
    return Path(env).resolve() if env else (root or project_root()) / ".prefect" / "results"


def read_state(state_dir: Path) -> dict[str, Any] | None:
    f = state_dir / STATE_FILE
    return json.loads(f.read_text()) if f.exists() else None


def running_api_url(state_dir: Path | None = None) -> str | None:
    """The API URL of a `flywheel up` server that is still answering, if any."""
    try:
        st = read_state(state_dir or project_root() / ".prefect")
    except (UserError, OSError, ValueError):
        return None
    return st["api_url"] if st and _healthy(st["api_url"]) else None


@contextmanager
def local_settings() -> Iterator[None]:
    """Settings for running flows in this process (`flywheel run`, `python -m flows.X`).

    Heartbeats are off: they exist to spot a crashed worker process, but here the API server is
    this process's own child (ephemeral) or a local one, and each flow run would otherwise wait up
    to a second for the heartbeat thread on exit (7 flow runs per iteration). Runs go to a running
    `flywheel up` server when there is one (so they show in its UI), else to an ephemeral API."""
    from prefect.settings import (
        PREFECT_API_URL,
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY,
        PREFECT_RESULTS_LOCAL_STORAGE_PATH,
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS,
        temporary_settings,
    )

    # read by the ephemeral server subprocess at start; offline it would log a telemetry DNS error
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    updates: dict[Any, Any] = {
        PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None,
        PREFECT_RESULTS_LOCAL_STORAGE_PATH: str(results_dir()),
        # the first start creates and migrates the SQLite database: on a busy
        # 2-core box that took longer than the 20 s default and the run died
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS: max(
            120, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()
        ),
    }
    if not PREFECT_API_URL.value():
        url = running_api_url()
        if url:
            updates[PREFECT_API_URL] = url
        else:
            from flows.ephemeral import ephemeral_server_dies_with_parent

            ephemeral_server_dies_with_parent()
    with temporary_settings(updates=updates):
        yield


# ------------------------------------------------------------------------------------ processes
def _healthy(api_url: str, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None if it
    is gone or a zombie. Together with the pid it names one process: a reused pid starts later."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()  # the command name in (...) may contain spaces
    return None if fields[0] == "Z" else fields[19]


def _alive(proc: dict[str, Any]) -> bool:
    """The recorded process is still the one `up` started (not a new process that reused its pid)."""
    return _start_time(proc["pid"]) == proc["started"]


def _spawn(name: str, argv: list[str], env: dict[str, str], cwd: Path, log_dir: Path) -> dict[str, Any]:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with open(log, "ab") as fh:
        # own session = own process group: `down` can end it and every child it started
        p = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=fh,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    return {"name": name, "pid": p.pid, "pgid": p.pid, "started": _start_time(p.pid), "argv": argv, "log": str(log)}


def _stop(proc: dict[str, Any], grace_s: float = 10.0) -> bool:
    if not _alive(proc):
        return False
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc["pgid"], sig)
        except ProcessLookupError:
            return True
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:  # reap it if it is our child (`up` and `down` in one process, e.g. tests)
                os.waitpid(proc["pid"], os.WNOHANG)
            except ChildProcessError:
                pass
            if _start_time(proc["pid"]) is None:
                return True
            time.sleep(0.2)
    return True


def _tail(path: str, n: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def work_pools(root: Path) -> dict[str, dict[str, Any]]:
    """The pools declared under `definitions.work_pools` in prefect.yaml."""
    doc = yaml.safe_load((root / "prefect.yaml").read_text()) or {}
    pools = (doc.get("definitions") or {}).get("work_pools") or {}
    if not pools:
        raise UserError(
            f"{root / 'prefect.yaml'}: definitions.work_pools is empty; declare the cpu and gpu pools there"
        )
    return pools


def _ensure_pools(api_url: str, pools: dict[str, dict[str, Any]]) -> None:
    """Create (or update) each process pool with its concurrency limit."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.workers.process import ProcessWorker

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        for p in pools.values():
            if p.get("type", "process") != "process":
                raise UserError(f"work pool {p['name']}: only process pools are started by `flywheel up`")
            try:
                client.read_work_pool(p["name"])
                client.update_work_pool(p["name"], WorkPoolUpdate(concurrency_limit=p.get("concurrency_limit")))
            except ObjectNotFound:
                client.create_work_pool(
                    WorkPoolCreate(
                        name=p["name"],
                        type="process",
                        concurrency_limit=p.get("concurrency_limit"),
                        base_job_template=ProcessWorker.get_default_base_job_template(),
                    )
                )


def _wait_healthy(proc: dict[str, Any], api_url: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if _healthy(api_url):
            return
        if _start_time(proc["pid"]) is None:
            raise UserError(
                f"the Prefect server exited during start; its log ({proc['log']}) ends:\n{_tail(proc['log'])}"
            )
        time.sleep(0.5)
    raise UserError(f"the Prefect server did not answer at {api_url} within {timeout_s:.0f}s (log: {proc['log']})")


def _check_port_free(host: str, port: int) -> None:
    """UserError when another process (not a Prefect server: that one answers /health) holds host:port, so a
    taken port fails here in one line instead of as a server that never answers after a 90 s wait."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no conflict
        try:
            s.bind((host, port))
        except socket.gaierror as e:
            raise UserError(f"--host {host} is not an address of this machine ({e.strerror})") from None
        except OSError as e:
            raise UserError(
                f"port {port} on {host} is taken by another process ({e.strerror}); pick another --port"
            ) from None


def up(
    *,
    host: str = "127.0.0.1",
    port: int = 4200,
    root: Path | None = None,
    state_dir: Path | None = None,
    extra_env: dict[str, str] | None = None,
    server_timeout_s: float = 90.0,
) -> dict[str, Any]:
    """Start a Prefect server, create the pools, deploy prefect.yaml, start one worker per pool.

    Returns the recorded state (api_url, ui_url, processes). On any failure, whatever was started
    is stopped again before the error is raised."""
    root = root or project_root()
    state_dir = (state_dir or root / ".prefect").resolve()
    old = read_state(state_dir)
    if old and any(_alive(p) for p in old["processes"]):
        raise UserError(f"already up ({old['ui_url']}); run `flywheel down` first")
    # clients on this machine connect to 127.0.0.1 when the server listens on every interface
    api_url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{port}/api"
    if _healthy(api_url):
        raise UserError(f"something already answers at {api_url}; pick another --port")
    _check_port_free(host, port)
    pools = work_pools(root)
    prefect_bin = str(Path(sys.executable).with_name("prefect"))
    env = {
        **os.environ,
        "PREFECT_HOME": str(state_dir / "home"),
        "PREFECT_API_URL": api_url,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_RESULTS_LOCAL_STORAGE_PATH": str(results_dir(root)),
        **(extra_env or {}),
    }
    # the lake the workers inherit (`flywheel up --lake` sets it): a deployed run checks that it uses the same one
    lake = str(Path(env["FLYWHEEL_LAKE"]).expanduser().resolve()) if env.get("FLYWHEEL_LAKE") else None
    state = {
        "api_url": api_url,
        "ui_url": api_url.removesuffix("/api"),
        "root": str(root),
        "lake": lake,
        "processes": [],
    }
    logs = state_dir / "logs"

    def record(proc: dict[str, Any]) -> None:
        state["processes"].append(proc)
        state_dir.mkdir(parents=True, exist_ok=True)
        (state_dir / STATE_FILE).write_text(json.dumps(state, indent=2))

    try:
        # the UI (served by the server) must call this server's API, not the default port
        server_env = {**env, "PREFECT_UI_API_URL": api_url}
        record(
            _spawn(
                "server", [prefect_bin, "server", "start", "--host", host, "--port", str(port)], server_env, root, logs
            )
        )
        _wait_healthy(state["processes"][0], api_url, server_timeout_s)
        _ensure_pools(api_url, pools)
        dep = subprocess.run(
            [prefect_bin, "--no-prompt", "deploy", "--all"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        if dep.returncode != 0:
            tail = "\n".join((dep.stdout + dep.stderr).strip().splitlines()[-15:])
            raise UserError(f"`prefect deploy --all` failed (exit {dep.returncode}):\n{tail}")
        for p in pools.values():
            argv = [
                prefect_bin,
                "worker",
                "start",
                "--pool",
                p["name"],
                "--type",
                "process",
                "--name",
                f"{p['name']}-{os.uname().nodename}",
            ]
            if p.get("worker_limit"):
                argv += ["--limit", str(p["worker_limit"])]
            record(_spawn(f"worker-{p['name']}", argv, env, root, logs))
    except BaseException:
        down(state_dir=state_dir)
        raise
    return state


def down(*, state_dir: Path | None = None) -> list[str]:
    """Stop what `up` recorded (workers first, then the server); returns the names stopped."""
    state_dir = (state_dir or project_root() / ".prefect").resolve()
    state = read_state(state_dir)
    if not state:
        return []
    stopped = [p["name"] for p in reversed(state["processes"]) if _stop(p)]
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    return stopped
