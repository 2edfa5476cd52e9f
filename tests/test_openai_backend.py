"""OpenAIBackend against a real local HTTP server that replays recorded vLLM exchanges.

No model server can run here, so `Replay` (stdlib ThreadingHTTPServer on 127.0.0.1, port 0) stands in
for `vllm serve`: it answers from tests/fixtures/vllm/*.json (vLLM's wire format), records every
request it gets (so the tests check what was sent: images, logprob options, model name, key), and can
be scripted to fail: 503s, 429s, 404 for an unknown model, 400, a stall past the timeout, a dropped
connection, a non-JSON body.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import socket
import struct
import threading
import time
import traceback
import zlib
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from agents.backends import BackendError, Sampling
from agents.backends.openai import OpenAIBackend, api_root, parse_completion, to_openai_messages
from agents.prompts import Prompt

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"
KEY = "sk-flywheel-FAKE-7f3a9c1e5b2d"  # recognisable: must never show up outside the Bearer header
MODEL = "small-qwen3vl"
CHAT = "/v1/chat/completions"
MODELS = "/v1/models"
SAMPLING = Sampling(temperature=0.0, top_p=1.0, max_new_tokens=64, seed=7)


# ---- prompt helpers (tests/fixtures/vllm/chat_tool_call.json was made from exactly these) ----------


def png(rgb: tuple[int, int, int]) -> bytes:
    """A valid 1x1 PNG, byte-for-byte stable (zlib level 0 = stored blocks, no compressor variance)."""

    def chunk(tag: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))

    ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(b"\x00" + bytes(rgb), 0))
        + chunk(b"IEND", b"")
    )


EARLIER, CURRENT = png((255, 0, 0)), png((0, 0, 255))


def make_prompt(task: str = "Click the Submit button.") -> Prompt:
    user = [
        {"type": "text", "text": f"Task: {task}"},
        {"type": "text", "text": "\nScreen before step 1:"},
        {"type": "image"},
        {"type": "text", "text": "\nCurrent screen:"},
        {"type": "image"},
        {"type": "text", "text": "\nUI elements:\n[1] button 'Submit' @ (500,520) [120x40]"},
    ]
    system = [{"type": "text", "text": "You operate a computer through the computer_use tool to complete the task."}]
    return Prompt([{"role": "system", "content": system}, {"role": "user", "content": user}], [EARLIER, CURRENT])


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


# ---- the replay server ---------------------------------------------------------------------------


class Replay(ThreadingHTTPServer):
    """Answers each path from its plan (a queue of actions), else from the path's default fixture."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plans: dict[str, deque] = {CHAT: deque(), MODELS: deque()}
        self.defaults = {CHAT: ("fixture", "chat_tool_call"), MODELS: ("fixture", "models")}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)  # notified whenever in_flight grows
        self.in_flight = self.max_in_flight = 0
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def plan(self, path: str, *actions: tuple) -> None:
        self.plans[path].extend(actions)

    def sent(self, path: str) -> list[dict]:
        return [r for r in self.requests if r["path"] == path]

    def handle_error(self, request, client_address) -> None:
        pass  # a client that timed out hangs up on a stalled handler: expected here, not noise


class _Handler(BaseHTTPRequestHandler):
    server: Replay

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._serve(None)

    def do_POST(self) -> None:
        self._serve(json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0)))))

    def _serve(self, body: dict | None) -> None:
        srv = self.server
        with srv.lock:
            srv.requests.append(
                {"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
            )
            plan = srv.plans.get(self.path)
            action = plan.popleft() if plan else srv.defaults.get(self.path, ("error", 404, "Not Found"))
            srv.in_flight += 1
            srv.max_in_flight = max(srv.max_in_flight, srv.in_flight)
            srv.arrived.notify_all()
        self._counted = True
        try:
            self._act(action, body)
        finally:
            self._uncount()

    def _uncount(self) -> None:
        """Leave the in-flight count before the reply's bytes go out: a client that has its answer may send its
        next request at once, and that one must not find this one still counted."""
        if getattr(self, "_counted", False):
            self._counted = False
            with self.server.lock:
                self.server.in_flight -= 1

    def _act(self, action: tuple, body: dict | None) -> None:
        kind = action[0]
        if kind == "fixture":
            resp = fixture(action[1])["response"]
            self._send(resp["status"], json.dumps(resp["body"]).encode(), "application/json")
        elif kind == "error":  # vLLM's ErrorResponse shape
            err = {"error": {"message": action[2], "type": "Error", "param": None, "code": action[1]}}
            self._send(action[1], json.dumps(err).encode(), "application/json")
        elif kind == "raw":
            self._send(action[1], action[2].encode(), "text/html")
        elif kind == "json":
            self._send(action[1], json.dumps(action[2]).encode(), "application/json")
        elif kind == "drop":  # close the socket without a status line
            self.close_connection = True
        elif kind == "stall":
            self.server.stopping.wait(action[1])
            self._act(("fixture", "chat_tool_call"), body)
        elif kind == "gather":  # hold every reply until `n` requests are in flight at once (or `timeout` s pass)
            srv = self.server
            with srv.arrived:
                srv.arrived.wait_for(lambda: srv.max_in_flight >= action[1] or srv.stopping.is_set(), action[2])
            self._act(("fixture", "chat_tool_call"), body)
        elif kind == "echo":  # reply with the prompt's task text, after a per-prompt delay
            task = body["messages"][1]["content"][0]["text"]
            self.server.stopping.wait(float(re.search(r"delay=([\d.]+)", task).group(1)))
            resp = fixture("chat_tool_call")["response"]["body"]
            resp["choices"][0]["message"]["content"] = task
            self._send(200, json.dumps(resp).encode(), "application/json")
        elif kind == "echo_key":  # a careless server that quotes the Authorization header back
            msg = f"bad header Authorization: {self.headers.get('Authorization')}"
            self._act(("error", 400, msg), body)

    def _send(self, status: int, data: bytes, ctype: str) -> None:
        self._uncount()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture
def server():
    srv = Replay()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.stopping.set()
    with srv.arrived:
        srv.arrived.notify_all()  # release held "gather" replies
    srv.shutdown()
    srv.server_close()
    thread.join(5)


@pytest.fixture
def make_backend(server):
    made: list[OpenAIBackend] = []

    def make(model: str = MODEL, **kw) -> OpenAIBackend:
        kw.setdefault("api_key", KEY)
        kw.setdefault("backoff_s", 0.01)
        backend = OpenAIBackend(server.url + "/v1", model, **kw)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- requests and replies ------------------------------------------------------------------------


def test_request_matches_the_recorded_vllm_request(server, make_backend):
    make_backend().generate([make_prompt()], SAMPLING)
    (req,) = server.sent(CHAT)
    body = req["body"]
    assert body == fixture("chat_tool_call")["request"]["body"]
    assert req["headers"]["authorization"] == f"Bearer {KEY}"
    assert body["model"] == MODEL
    assert body["logprobs"] is True and body["top_logprobs"] == 0
    assert body["return_tokens_as_token_ids"] is True and body["skip_special_tokens"] is False
    assert body["include_stop_str_in_output"] is True and body["stop"] == ["</tool_call>"]
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.0, 64, 7)
    parts = [p for m in body["messages"] for p in m["content"]]
    assert all(p["type"] in ("text", "image_url") for p in parts)
    urls = [p["image_url"]["url"] for p in parts if p["type"] == "image_url"]
    assert [u.split(",")[0] for u in urls] == ["data:image/png;base64"] * 2
    assert [base64.b64decode(u.split(",", 1)[1]) for u in urls] == [EARLIER, CURRENT]  # placeholder order


def test_reply_becomes_a_generation_with_token_ids_and_logprobs(make_backend):
    (gen,) = make_backend().generate([make_prompt()], SAMPLING)
    recorded = fixture("chat_tool_call")["response"]["body"]
    entries = recorded["choices"][0]["logprobs"]["content"]
    assert gen.text == recorded["choices"][0]["message"]["content"]
    assert gen.text.endswith("</tool_call>")
    assert gen.token_ids == [int(e["token"].removeprefix("token_id:")) for e in entries]
    assert gen.logprobs == [e["logprob"] for e in entries] and all(isinstance(x, float) for x in gen.logprobs)
    assert len(gen.token_ids) == len(gen.logprobs) == gen.completion_tokens == recorded["usage"]["completion_tokens"]
    assert gen.prompt_tokens == recorded["usage"]["prompt_tokens"]
    assert gen.finish_reason == "stop" and gen.extra["stop_reason"] == "</tool_call>"
    assert gen.latency_ms is not None and gen.latency_ms > 0 and gen.extra["attempts"] == 1


def test_length_finish_reason(server, make_backend):
    server.plan(CHAT, ("fixture", "chat_length"))
    (gen,) = make_backend().generate([make_prompt()], SAMPLING)
    assert gen.finish_reason == "length" and gen.completion_tokens == len(gen.token_ids) == 16


def test_parallel_requests_come_back_in_prompt_order(server, make_backend):
    n = 6
    server.plan(CHAT, *[("echo",)] * n)
    # Earlier prompts answer later, so completion order is the reverse of prompt order.
    prompts = [make_prompt(f"prompt {i} delay={0.05 * (n - i):.2f}") for i in range(n)]
    gens = make_backend(concurrency=3).generate(prompts, SAMPLING)
    assert [g.text for g in gens] == [f"Task: prompt {i} delay={0.05 * (n - i):.2f}" for i in range(n)]
    assert 1 < server.max_in_flight <= 3


def test_base_url_with_or_without_v1_and_health(server):
    for url in (server.url, server.url + "/", server.url + "/v1", server.url + "/v1/"):
        with OpenAIBackend(url, MODEL) as backend:
            assert backend.base_url == server.url + "/v1"
            assert backend.health() == ["small-qwen3vl", "student-lora"]
    with pytest.raises(ValueError, match="base_url"):
        api_root("gpu-1:8000")


def test_placeholder_image_mismatch_fails_before_sending(server, make_backend):
    prompt = make_prompt()
    prompt.images = prompt.images[:1]
    with pytest.raises(ValueError, match="placeholders"):
        make_backend().generate([prompt], SAMPLING)
    assert server.requests == []


def test_messages_from_the_real_prompt_builder_keep_screenshot_order():
    from agents.base import StepRecord
    from agents.prompts import PromptOptions, build_prompt, transform_for

    shots = [png((i, 0, 0)) for i in range(1, 4)]
    history = [StepRecord(i, None, None, None, "ok", shots[i]) for i in range(2)]
    prompt = build_prompt(
        "Click OK", shots[2], None, history, PromptOptions(history_images=3), transform_for("qwen3-vl", 160, 160)
    )
    parts = [p for m in to_openai_messages(prompt) for p in m["content"] if p["type"] == "image_url"]
    assert [base64.b64decode(p["image_url"]["url"].split(",", 1)[1]) for p in parts] == shots


def test_servers_without_token_id_strings_fall_back_to_choice_token_ids():
    body = fixture("chat_tool_call")["response"]["body"]
    choice = body["choices"][0]
    ids = [int(e["token"].removeprefix("token_id:")) for e in choice["logprobs"]["content"]]
    for entry in choice["logprobs"]["content"]:
        entry["token"] = "x"  # tokens as text: the server ignored return_tokens_as_token_ids
    assert parse_completion(body).token_ids is None
    choice["token_ids"] = ids
    gen = parse_completion(body)
    assert gen.token_ids == ids and len(gen.logprobs) == len(ids)
    choice["logprobs"] = None
    assert parse_completion(body).logprobs is None


# ---- failures ------------------------------------------------------------------------------------


def test_503_twice_then_success_is_retried(server, make_backend):
    server.plan(CHAT, ("error", 503, "Service Unavailable"), ("error", 503, "Service Unavailable"))
    (gen,) = make_backend().generate([make_prompt()], SAMPLING)
    assert gen.text.endswith("</tool_call>") and gen.extra["attempts"] == 3
    assert len(server.sent(CHAT)) == 3


def test_429_until_retries_run_out(server, make_backend):
    server.plan(CHAT, *[("error", 429, "Too many requests")] * 3)
    with pytest.raises(BackendError, match=r"kept failing: HTTP 429: Too many requests \(gave up after 3 attempts\)"):
        make_backend(max_retries=2).generate([make_prompt()], SAMPLING)
    assert len(server.sent(CHAT)) == 3


def test_dropped_connection_is_retried_then_reported(server, make_backend):
    server.plan(CHAT, ("drop",))
    (gen,) = make_backend().generate([make_prompt()], SAMPLING)
    assert gen.extra["attempts"] == 2
    server.plan(CHAT, *[("drop",)] * 2)
    with pytest.raises(BackendError, match="kept failing: connection dropped"):
        make_backend(max_retries=1).generate([make_prompt()], SAMPLING)


def test_unknown_model_names_it_and_lists_served_models(server, make_backend):
    server.plan(CHAT, ("fixture", "error_model_not_found"))
    with pytest.raises(BackendError) as err:
        make_backend(model="qwen-wrong").generate([make_prompt()], SAMPLING)
    msg = str(err.value)
    assert "'qwen-wrong' is not served" in msg and "served models: small-qwen3vl, student-lora" in msg
    assert "\n" not in msg
    assert len(server.sent(CHAT)) == 1 and len(server.sent(MODELS)) == 1  # 404 is not retried


def test_bad_request_carries_the_server_message(server, make_backend):
    server.plan(CHAT, ("fixture", "error_too_many_images"))
    with pytest.raises(
        BackendError,
        match=r"HTTP 400\): At most 1 image\(s\) may be provided in one prompt\."
        r".*--limit-mm-per-prompt",
    ):
        make_backend().generate([make_prompt()], SAMPLING)
    assert len(server.sent(CHAT)) == 1


def test_timeout_is_reported_not_retried(server, make_backend):
    server.plan(CHAT, ("stall", 3.0))
    t0 = time.monotonic()
    with pytest.raises(BackendError, match=r"timed out after 0.3s"):
        make_backend(timeout_s=0.3).generate([make_prompt()], SAMPLING)
    assert time.monotonic() - t0 < 2.0 and len(server.sent(CHAT)) == 1


@pytest.mark.parametrize(
    "action, why",
    [
        (("raw", 200, "<html>gateway says hi</html>"), "not JSON: '<html>gateway says hi</html>'"),
        (("json", 200, {"object": "chat.completion", "choices": []}), "no choices"),
        (
            (
                "json",
                200,
                {"choices": [{"message": {"content": "a"}, "logprobs": {"content": [{"token": "token_id:1"}]}}]},
            ),
            "bad logprobs entry",
        ),
    ],
)
def test_malformed_replies(server, make_backend, action, why):
    server.plan(CHAT, action)
    with pytest.raises(BackendError, match=f"malformed response from .*{re.escape(why)}"):
        make_backend().generate([make_prompt()], SAMPLING)


def test_closed_port():
    port = closed_port()
    backend = OpenAIBackend(f"http://127.0.0.1:{port}", MODEL, max_retries=1, backoff_s=0.01)
    with pytest.raises(
        BackendError,
        match=re.escape(f"cannot reach the model server at http://127.0.0.1:{port}/v1 (is `vllm serve` running?)"),
    ):
        backend.generate([make_prompt()], SAMPLING)
    with pytest.raises(BackendError, match="cannot reach"):
        backend.health()
    backend.close()


def test_unauthorized_points_at_the_key_variable(server, make_backend):
    server.plan(CHAT, ("error", 401, "Unauthorized"))
    with pytest.raises(BackendError, match="HTTP 401: Unauthorized.*FLYWHEEL_OPENAI_API_KEY"):
        make_backend().generate([make_prompt()], SAMPLING)


# ---- the API key ---------------------------------------------------------------------------------


def test_api_key_never_leaves_the_header(server, make_backend, caplog):
    caplog.set_level(logging.DEBUG)
    backend = make_backend(max_retries=1, timeout_s=0.3)
    seen: list[str] = [repr(backend), str(vars(backend)), repr(backend._client.headers)]
    failures = [
        [("error", 503, "down")] * 2,
        [("drop",)] * 2,
        [("fixture", "error_model_not_found")],
        [("fixture", "error_too_many_images")],
        [("echo_key",)],
        [("error", 401, "Unauthorized")],
        [("stall", 3.0)],
        [("raw", 200, "not json")],
        [("error", 404, "Not Found")],
    ]
    for actions in failures:
        server.plan(CHAT, *actions)
        with pytest.raises(BackendError) as err:
            backend.generate([make_prompt()], SAMPLING)
        seen += [str(err.value), repr(err.value), "".join(traceback.format_exception(err.value))]
    with OpenAIBackend(f"http://127.0.0.1:{closed_port()}", MODEL, api_key=KEY, max_retries=1, backoff_s=0.01) as down:
        seen.append(repr(down))
        with pytest.raises(BackendError) as err:
            down.generate([make_prompt()], SAMPLING)
        seen += [str(err.value), "".join(traceback.format_exception(err.value))]
    (gen,) = backend.generate([make_prompt()], SAMPLING)
    seen += [repr(gen), caplog.text]
    assert any("Authorization: Bearer ***" in s for s in seen)  # the echoed header was masked, not dropped
    assert all(r["headers"]["authorization"] == f"Bearer {KEY}" for r in server.requests)  # it was sent
    leaks = [s[:200] for s in seen if KEY in s]
    assert not leaks


def test_api_key_from_environment(server, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "from-openai-var")
    monkeypatch.setenv("FLYWHEEL_OPENAI_API_KEY", "from-flywheel-var")
    with OpenAIBackend(server.url, MODEL) as backend:
        backend.health()
    monkeypatch.delenv("FLYWHEEL_OPENAI_API_KEY")
    with OpenAIBackend(server.url, MODEL) as backend:
        backend.health()
    monkeypatch.delenv("OPENAI_API_KEY")
    with OpenAIBackend(server.url, MODEL) as backend:
        backend.health()
    auth = [r["headers"].get("authorization") for r in server.sent(MODELS)]
    assert auth == ["Bearer from-flywheel-var", "Bearer from-openai-var", None]


# ---- end to end: the student policy over this backend in real MiniWoB rollouts ----------------


@pytest.mark.browser
def test_student_rollouts_through_the_openai_backend(server, tmp_path, monkeypatch):
    """Rollout workers build a StudentPolicy on the openai backend from the config, the replayed vLLM
    reply is parsed (Qwen3-VL 0-1000 space -> screen px), executed in Chromium and lands in the lake."""
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts
    from storage.catalog import connect

    monkeypatch.setenv("FLYWHEEL_OPENAI_API_KEY", KEY)  # workers inherit the environment, never the lake
    cfg = {"model": MODEL, "backend": "openai", "base_url": server.url + "/v1", "arch": "qwen3-vl"}
    spec = RolloutSpec(
        run_key="oa",
        iteration=0,
        stage="rollouts",
        lake_root=str(tmp_path / "lake"),
        jobs=make_jobs("oa", ["click-test"], [0, 1], policy_tag="student"),
        policy=PolicySpec("student", {"model": MODEL, "config": cfg}, version=MODEL),
        n_envs=1,
        max_steps=2,
        episode_timeout_s=60,
    )
    s = run_rollouts(spec, progress=False)
    assert s.ran == 2 and s.errors == 0
    con = connect(tmp_path / "lake")
    rows = con.execute("""SELECT action, raw_action, len(token_ids), len(logprobs), response_text
                          FROM steps WHERE NOT is_final ORDER BY episode_id, step_idx""").fetchall()
    assert rows, "no steps recorded"
    action, raw, n_ids, n_lp, text = rows[0]
    assert json.loads(raw) == {"action": "click", "x": 500, "y": 520}  # as the model wrote it
    assert json.loads(action)["x"] == pytest.approx(80.0) and json.loads(action)["y"] == pytest.approx(109.2)
    assert n_ids == n_lp > 0 and "<tool_call>" in text
    # the key never reaches the lake
    for table in ("steps", "episodes"):
        dump = con.execute(
            f"SELECT * EXCLUDE ({'screenshot' if table == 'steps' else 'episode_id'}) FROM {table}"
        ).fetchall()
        assert KEY not in repr(dump)


@pytest.mark.browser
def test_every_env_keeps_a_request_in_flight(server, tmp_path, monkeypatch):
    """With a remote server, throughput comes from concurrency: N workers x E lockstep envs keep N*E requests
    in flight at once (each worker sends its E prompts together; the workers do not wait on each other)."""
    from flywheel.runtime.rollout import PolicySpec, RolloutSpec, make_jobs, run_rollouts

    monkeypatch.setenv("FLYWHEEL_OPENAI_API_KEY", KEY)
    # the server answers no one until six requests are in flight together, so the count does not depend on how far
    # apart the two workers start (a fixed 8 s stall saw 5 of 6 on a loaded CI box). Code that sent fewer requests
    # at once would wait out the 45 s and fail the count below.
    server.defaults[CHAT] = ("gather", 6, 45.0)
    cfg = {"model": MODEL, "backend": "openai", "base_url": server.url + "/v1", "arch": "qwen3-vl"}
    spec = RolloutSpec(
        run_key="oa-c",
        iteration=0,
        stage="rollouts",
        lake_root=str(tmp_path / "lake"),
        jobs=make_jobs("oa-c", ["click-test"], list(range(6)), policy_tag="student"),
        policy=PolicySpec("student", {"model": MODEL, "config": cfg}, version=MODEL),
        n_envs=2,
        envs_per_worker=3,
        max_steps=1,
        episode_timeout_s=120,
    )
    s = run_rollouts(spec, progress=False)
    assert s.ran == 6 and s.errors == 0
    assert server.max_in_flight == 6
