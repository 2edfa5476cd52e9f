"""A local stand-in for the Anthropic API: replays recorded Messages API exchanges at the HTTP boundary.

The official `anthropic` SDK is pointed at it with `base_url`, so everything above the socket is the real
client: request building, headers, retries with backoff, error classes, response parsing. Replies come from
tests/fixtures/anthropic/*.json, each `{"status", "headers", "body"}` in the documented wire format
(Messages API: https://platform.claude.com/docs/en/api/messages, errors: .../docs/en/api/errors, models:
.../docs/en/api/models/retrieve). Every request is recorded (path, headers, JSON body) so tests check what
was sent.

    srv = ClaudeReplay(); srv.start()
    srv.plan("error_rate_limit", "click_ct_seed0")   # next POST /v1/messages replies, in order
    ...; srv.stop()
"""

from __future__ import annotations

import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures" / "anthropic"
MESSAGES = "/v1/messages"


def fixture(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


class ClaudeReplay(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.queue: deque[str] = deque()
        self.model_reply = "model"  # GET /v1/models/{id}
        self.requests: list[dict] = []
        self.lock = threading.Lock()
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def plan(self, *names: str) -> None:
        self.queue.extend(names)

    def sent(self, path: str = MESSAGES) -> list[dict]:
        return [r for r in self.requests if r["path"] == path]

    def start(self) -> "ClaudeReplay":
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
        if self._thread:
            self._thread.join(5)


class _Handler(BaseHTTPRequestHandler):
    server: ClaudeReplay
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self._serve(None)

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", 0))
        self._serve(json.loads(self.rfile.read(n)) if n else None)

    def _serve(self, body: dict | None) -> None:
        path = self.path.split("?", 1)[0]
        srv = self.server
        with srv.lock:
            srv.requests.append(
                {
                    "path": path,
                    "query": self.path.partition("?")[2],
                    "headers": {k.lower(): v for k, v in self.headers.items()},
                    "body": body,
                }
            )
            if path == MESSAGES:
                name = srv.queue.popleft() if srv.queue else "error_invalid_request"  # unplanned: fail loudly
            elif path.startswith("/v1/models/"):
                name = srv.model_reply
            else:
                name = None
        if name is None:
            reply = {
                "status": 404,
                "headers": {},
                "body": {"type": "error", "error": {"type": "not_found_error", "message": f"no route {path}"}},
            }
        else:
            reply = fixture(name)
        data = json.dumps(reply["body"]).encode()
        self.send_response(reply["status"])
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in reply.get("headers", {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)
