"""Env servers: MiniWoB behind real `flywheel env serve` processes, driven over HTTP and by the rollout runner.

Two servers with 2 slots each (a third one is started, and SIGKILLed, by the fault test). Every server is
started here in its own process group and ended by that group only.
"""

from __future__ import annotations

import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import httpx
import pytest

from agents.actions import Click
from configs.loading import load_config, parse_config
from configs.models import ConfigError
from envs.base import EnvError
from envs.remote import RemoteEnv
from flywheel.runtime.rollout import PolicySpec, RolloutError, RolloutSpec, make_jobs, run_rollouts
from storage.catalog import connect

pytestmark = pytest.mark.browser

REPO = Path(__file__).resolve().parents[1]
TOKEN = "test-token-5f1c9a"
FAST = (
    "--idle-timeout",
    "2",
    "--health-interval",
    "1",
)  # what the servers and the rollout workers read from $FLYWHEEL_ENV_TOKEN


class Server:
    """One `flywheel env serve` process in its own process group, ready when its slots are.
    `verify`: what the test's client verifies an https server with (an ssl context holding its CA);
    `max_files`: the server's open-file limit (soft and hard), to show what a connection flood does to it."""

    def __init__(self, tmp: Path, slots: int = 2, *extra: str, verify=True, max_files: int | None = None):
        self.log = tmp / f"server-{time.monotonic_ns()}.log"
        env = dict(os.environ, FLYWHEEL_ENV_TOKEN=TOKEN, OMP_NUM_THREADS="1")
        limit = ["prlimit", f"--nofile={max_files}:{max_files}", "--"] if max_files else []
        with open(self.log, "w") as err:
            self.proc = subprocess.Popen(
                [
                    *limit,
                    sys.executable,
                    "-m",
                    "flywheel",
                    "env",
                    "serve",
                    "--env",
                    "miniwob",
                    "--slots",
                    str(slots),
                    "--port",
                    "0",
                    *extra,
                ],
                cwd=REPO,
                env=env,
                stdout=subprocess.PIPE,
                stderr=err,
                text=True,
                start_new_session=True,
            )
        self.url = self._read_url(deadline=time.monotonic() + 60)
        self.http = httpx.Client(headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30, verify=verify)
        try:
            self.wait_ready(slots)
        except BaseException:  # no server outlives a failed start
            self.stop()
            raise

    def _read_url(self, deadline: float) -> str:
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if sel.select(timeout=0.5):
                line = self.proc.stdout.readline()
                m = re.search(r"https?://[0-9.]+:\d+", line)
                if m:
                    return m.group(0)
            if self.proc.poll() is not None:
                break
        self.stop()
        raise RuntimeError(f"env server did not start: {self.log.read_text()[-2000:]}")

    def health(self) -> dict:
        return self.http.get(f"{self.url}/v1/health").json()

    def wait_ready(self, free: int, timeout_s: float = 60) -> dict:
        """Poll health until `free` slots are ready (readiness by polling, never by sleeping a fixed time)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                h = self.health()
                if h.get("free", -1) >= free:
                    return h
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{self.url} not ready: {self.health()}")

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)  # the server and every browser it started
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if hasattr(self, "http"):
            self.http.close()  # a TLS server waits for its clients' goodbye when it stops
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("env-servers")
    # short idle timeout and health interval so the reclaim and restart tests need no servers of their own
    a = Server(tmp, 2, *FAST)
    try:
        b = Server(tmp, 2, *FAST)
    except Exception:
        a.stop()
        raise
    yield a, b
    for s in (a, b):
        s.stop()
    for s in (a, b):  # the token never reaches a server's log
        assert TOKEN not in s.log.read_text()


@pytest.fixture
def token_env(monkeypatch):
    monkeypatch.setenv("FLYWHEEL_ENV_TOKEN", TOKEN)  # rollout workers inherit it


def _remote_spec(lake_root, run_key, urls, tasks, seeds, **kw) -> RolloutSpec:
    jobs = make_jobs(run_key, list(tasks), list(seeds), policy_tag="scripted:0")
    return RolloutSpec(
        run_key=run_key,
        iteration=0,
        stage="rollouts",
        lake_root=str(lake_root),
        jobs=jobs,
        policy=PolicySpec("scripted"),
        env={"name": "remote", "servers": list(urls)},
        max_steps=6,
        episode_timeout_s=60,
        env_error_retries=2,
        **kw,
    )


# ------------------------------------------------------------------------------------------ HTTP surface
def test_bad_tokens_malformed_actions_and_oversized_bodies_get_clear_4xx(servers):
    a, _ = servers
    raw = httpx.Client(timeout=30)
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        r = raw.get(f"{a.url}/v1/health", headers=headers)
        assert r.status_code == 401 and "token" in r.json()["error"] and TOKEN not in r.text
    r = a.http.post(f"{a.url}/v1/sessions")
    assert r.status_code == 201
    sid = r.json()["session_id"]
    base = f"{a.url}/v1/sessions/{sid}"
    try:
        assert a.http.get(f"{base}/screenshot").status_code == 409  # nothing observed yet
        obs = a.http.post(f"{base}/reset", json={"task_id": "click-test", "seed": 3}).json()
        assert obs["width"] == 160 and obs["instruction"]
        png = a.http.get(f"{base}/screenshot")
        assert png.headers["content-type"] == "image/png" and png.content[:4] == b"\x89PNG"
        bad = [
            ({"action": {"action": "exec", "code": "import os"}}, "invalid action"),
            ({"action": {"action": "click", "x": 10}}, "click.y"),
            ({"action": {"action": "type", "text": "hi", "run": True}}, "type.run"),
            ({"action": "pyautogui.click(1, 2)"}, "invalid request"),
            ({"action": {"action": "done"}, "extra": 1}, "invalid request"),
        ]
        for body, expect in bad:
            r = a.http.post(f"{base}/step", json=body)
            assert r.status_code == 422 and expect in r.json()["error"], (body, r.text)
        r = a.http.post(f"{base}/reset", json={"task_id": "no-such-task"})
        assert r.status_code == 400 and "no-such-task" in r.json()["error"]
        r = a.http.post(
            f"{base}/step", content=b"{" + b" " * (2 << 20) + b"}", headers={"content-type": "application/json"}
        )
        assert r.status_code == 413 and "limit" in r.json()["error"]
        r = a.http.post(f"{base}/step", json={"action": {"action": "done"}})  # the session survived all that
        assert r.status_code == 200 and r.json()["done"] is True
    finally:
        assert a.http.delete(base).status_code == 200
    r = a.http.post(f"{base}/step", json={"action": {"action": "done"}})
    assert r.status_code == 404 and "closed by the client" in r.json()["error"]


def test_idle_session_is_reclaimed(servers):
    a, _ = servers
    sid = a.http.post(f"{a.url}/v1/sessions").json()["session_id"]
    assert a.health()["free"] == 1
    a.wait_ready(2, timeout_s=20)  # the reaper gives the slot back
    r = a.http.post(f"{a.url}/v1/sessions/{sid}/reset", json={"task_id": "click-test"})
    assert r.status_code == 404 and "idle" in r.json()["error"]


def _browsers(server: Server) -> list[int]:
    """Pids of the Chromium browser processes (not renderers/helpers) in a server's process group."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (d / "cmdline").read_bytes()  # Chromium rewrites its children's: one string, no NULs
        except OSError:
            continue
        if (
            int(stat[2]) == server.proc.pid
            and stat[0] != "Z"
            and b"chromium" in cmd.split(b" ")[0]
            and b"--type=" not in cmd
        ):
            out.append(int(d.name))
    return out


def test_crashed_slot_is_restarted_and_its_episode_is_an_error(servers, token_env):
    _, b = servers
    env = RemoteEnv([b.url])
    env.reset("click-test", 0)
    busy = next(sl["slot"] for sl in b.health()["slots"] if sl["state"] == "busy")
    pids = _browsers(b)
    assert len(pids) == 2
    for pid in pids:  # both browsers die: the idle slot's and the one mid-episode
        os.kill(pid, signal.SIGKILL)
    with pytest.raises(EnvError, match="HTTP 502.*the episode is lost"):
        env.step(Click(x=80, y=100))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # both restarted and serving again (readiness by polling)
        h = b.health()
        if h["free"] == 2 and all(sl["restarts"] >= 1 for sl in h["slots"]):
            break
        time.sleep(0.2)
    errors = {sl["slot"]: sl["last_error"] for sl in h["slots"]}
    assert h["free"] == 2 and f"slot {busy} failed" in errors[busy]
    assert "health check failed" in errors[1 - busy]  # found by the idle health check, not by a client
    assert env.reset("click-test", 1).width == 160 and env.evaluate() == 0.0
    env.close()


def test_no_reachable_server_is_one_clear_error(lake_root, token_env):
    with pytest.raises(EnvError, match="no usable env server.*127.0.0.1:9.*unreachable"):
        RemoteEnv(["http://127.0.0.1:9"])
    spec = _remote_spec(
        lake_root,
        "none",
        ["http://127.0.0.1:9", "http://127.0.0.1:7"],
        ["click-test"],
        [0],
        n_envs=1,
        worker_start_timeout_s=30,
    )
    with pytest.raises(RolloutError, match="no usable env server"):
        run_rollouts(spec, progress=False)


def test_serve_refuses_a_public_bind_without_a_token():
    env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_ENV_TOKEN"}
    out = subprocess.run(
        [sys.executable, "-m", "flywheel", "env", "serve", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )
    assert out.returncode == 2 and "without an API token" in out.stderr and "Traceback" not in out.stderr


def test_remote_config_is_validated():
    assert load_config(REPO / "configs" / "osworld.yaml").env.name == "remote"  # the documented fleet
    ok = parse_config({"env": {"name": "remote", "servers": ["http://10.0.0.5:8100/"]}})
    assert ok.env.servers == ["http://10.0.0.5:8100"]
    bad = [
        ({"env": {"name": "remote"}}, "env.servers is empty"),
        ({"env": {"servers": ["http://a:1"]}}, "set env.name: remote"),
        ({"env": {"name": "remote", "servers": ["ftp://a:1"]}}, "http://host:port"),
        ({"env": {"name": "remote", "servers": ["http://u:secret@a:1"]}}, "credentials"),
        ({"env": {"name": "remote", "servers": ["http://a:1"], "token_env": "abc def"}}, "NAME of an environment"),
    ]
    for data, msg in bad:
        with pytest.raises(ConfigError, match=msg):
            parse_config(data)


# ------------------------------------------------------------------------------------------ rollouts
@pytest.mark.slow
def test_rollouts_through_two_servers(servers, lake_root, token_env):
    a, b = servers
    tasks, seeds = ["click-test", "focus-text", "click-button"], [0, 1, 2, 3]
    s = run_rollouts(_remote_spec(lake_root, "two", [a.url, b.url], tasks, seeds, n_envs=4), progress=False)
    assert s.ran == 12 and s.errors == 0
    assert s.successes / s.ran >= 0.95
    con = connect(lake_root)
    envs = con.execute("SELECT DISTINCT env FROM episodes").fetchall()
    assert envs == [("miniwob",)]  # the same rows a local env writes
    per_server = dict(con.execute("SELECT env_version, count(*) FROM episodes GROUP BY 1").fetchall())
    assert set(per_server) == {f"miniwob 1.1.0 via {a.url}", f"miniwob 1.1.0 via {b.url}"}  # spread over both
    n_final, png, w = con.execute(
        "SELECT count(*) FILTER (is_final), bool_and(screenshot[1:4] = '\\x89PNG'::BLOB), min(screen_w) FROM steps"
    ).fetchone()
    assert n_final == 12 and png and w == 160
    assert (
        con.execute("SELECT sum(n_steps) FROM episodes").fetchone()[0]
        == con.execute("SELECT count(*) FROM steps WHERE NOT is_final").fetchone()[0]
    )
    for srv in (a, b):  # every slot was given back
        assert srv.wait_ready(2)["free"] == 2


@pytest.mark.slow
def _still_alive(pids: list[int], wait_s: float = 10) -> list[str]:
    """The command lines of `pids` still running (zombies count as gone) after up to `wait_s`: Chromium's helpers
    exit once their browser is gone, so this polls."""

    def alive() -> list[str]:
        out = []
        for p in pids:
            try:
                if Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(Path(f"/proc/{p}/cmdline").read_bytes()[:80].decode(errors="replace"))
            except OSError:
                pass
        return out

    deadline = time.monotonic() + wait_s
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive()


def test_server_killed_mid_run_loses_nothing_and_the_rest_finish_on_the_other(servers, lake_root, token_env, tmp_path):
    _, b = servers
    victim = Server(tmp_path, 2)
    reported: list[dict] = []
    at_kill: dict = {}
    three_done = threading.Event()

    def killer() -> None:
        """After 3 episodes, SIGKILL the victim while an episode is in flight there: a leased slot whose last
        call ended >= 0.2 s ago (none running) is past its reset and waiting on the policy (0.5 s per decision)."""
        three_done.wait(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(
            sl["state"] == "busy" and not sl["in_call"] and (sl["idle_s"] or 0) >= 0.2
            for sl in victim.health()["slots"]
        ):
            time.sleep(0.01)
        victim.kill()
        at_kill["t"] = datetime.now(timezone.utc)
        at_kill["rows"] = _episodes(lake_root)

    def on_result(r: dict) -> None:
        reported.append(r)
        if len(reported) == 3:
            three_done.set()

    thread = threading.Thread(target=killer, daemon=True)
    thread.start()
    try:
        # 0.5 s per decision: the killer sees the victim mid-episode
        spec = _remote_spec(
            lake_root, "kill", [victim.url, b.url], ["click-test", "focus-text"], range(6), n_envs=4, step_delay_s=0.5
        )
        s = run_rollouts(spec, progress=False, on_result=on_result)
        thread.join(30)
    finally:
        victim.stop()
    assert victim.proc.returncode == -signal.SIGKILL
    assert s.ran == 12 and s.errors == 0 and s.retries >= 1  # the victim's in-flight episodes were rerun
    rows = _episodes(lake_root)
    assert len(rows) == 12 and all(r[0] == "ok" for r in rows.values())
    assert sum(1 for r in rows.values() if r[2]) / 12 >= 0.95
    for eid, row in at_kill["rows"].items():  # every episode written by the time of the kill is still there
        if row[0] == "ok":
            assert rows[eid] == row
    on_victim = [eid for eid, r in rows.items() if r[1].endswith(victim.url)]
    # the victim finished episodes before it died and none after (1 s: its last score may have been
    # on the wire as it was killed)
    assert on_victim and all(rows[eid][3] < at_kill["t"] + timedelta(seconds=1) for eid in on_victim)
    after = [eid for eid in rows if eid not in at_kill["rows"] and eid not in on_victim]
    assert after and all(rows[eid][1].endswith(b.url) for eid in after)  # the rest finished on the other one


def _episodes(lake_root) -> dict[str, tuple]:
    con = connect(lake_root)
    q = "SELECT episode_id, status, env_version, success, ended_at FROM episodes"
    return {r[0]: r[1:] for r in con.execute(q).fetchall()}


def test_stuck_env_call_times_out_and_its_processes_end():
    """A slot's env call that runs past call_timeout_s is an env failure; closing ends the child and its browser."""
    from agents.actions import Wait
    from envs.slot_process import ProcessEnv, _descendants

    env = ProcessEnv("miniwob", {"max_wait_s": 30}, call_timeout_s=1.0)
    try:
        env.reset("click-test", 0)
        started = [env._proc.pid, *_descendants(env._proc.pid)]
        assert len(started) >= 3  # the child, chromedriver, chromium...
        with pytest.raises(EnvError, match="did not answer within 1s"):
            env.step(Wait(seconds=20))  # a real 20 s sleep in the child stands in for a hung browser or VM
        with pytest.raises(EnvError, match="env process is broken"):
            env.evaluate()  # the late answer of the stuck call must never be taken for this one
        with pytest.raises(EnvError, match="unexpected keyword argument 'no_such_option'"):
            ProcessEnv("miniwob", {"no_such_option": 1})
    finally:
        env.close()

    assert _still_alive(started) == []


def test_killed_slot_child_leaves_no_browser_behind():
    """A slot's child SIGKILLed (what the chaos run does) left its chromedriver and Chromium running, re-parented
    out of reach; every restart of the slot then added a browser. close() (the slot's restart) now ends them."""
    from envs.slot_process import ProcessEnv, _descendants

    env = ProcessEnv("miniwob", {})
    try:
        env.reset("click-test", 0)
        started = _descendants(env._proc.pid)
        assert len(started) >= 2  # chromedriver, chromium...
        os.kill(env._proc.pid, signal.SIGKILL)
        env._proc.join(timeout=10)
    finally:
        env.close()

    assert _still_alive(started) == []
