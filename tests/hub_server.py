"""A local stand-in for the Hugging Face Hub API, for push tests: it answers the calls huggingface_hub makes for
`HfApi.create_repo` and `HfApi.upload_folder` in the Hub's format, and records every request.

    with HubServer(token="hf_test") as hub:        # env: HF_ENDPOINT=hub.url, HF_TOKEN=hf_test, HF_HUB_OFFLINE=0
        ...; hub.requests                          # [{"method", "path", "auth", "json" | "ndjson"}]

Routes (the Hub API as huggingface_hub 2.x calls it):
- POST /api/repos/create {name, organization, type, visibility?} -> {"url": ...}
- POST /api/validate-yaml {content, repoType} -> {"errors": [], "warnings": []} (400 with errors if the README's
  YAML header does not parse)
- POST /api/{type}s/{org}/{name}/preupload/{rev} {files: [{path, sample, size}]} -> every file "regular" (the
  server decides between regular and LFS; regular keeps the content inline in the commit)
- POST /api/{type}s/{org}/{name}/commit/{rev} (NDJSON: a header line, then one "file" line per file with base64
  content) -> {"commitUrl", "commitOid"}
A request without "Authorization: Bearer <token>" gets 401; anything else gets 404 (and is recorded).
"""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

_REPO = r"/api/(model|dataset|space)s/([^/]+/[^/]+)/(preupload|commit)/([^/?]+)"


class HubServer:
    def __init__(self, token: str):
        self.token = token
        self.requests: list[dict] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def _reply(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                hub.requests.append({"method": "GET", "path": self.path, "auth": self.headers.get("Authorization")})
                self._reply(404, {"error": "not found"})

            def do_POST(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                req = {"method": "POST", "path": path, "auth": self.headers.get("Authorization")}
                if self.headers.get("Content-Type", "").startswith("application/x-ndjson"):
                    req["ndjson"] = [json.loads(ln) for ln in raw.splitlines() if ln.strip()]
                else:
                    req["json"] = json.loads(raw or b"null")
                hub.requests.append(req)
                if req["auth"] != f"Bearer {hub.token}":
                    return self._reply(401, {"error": "Invalid credentials in Authorization header"})
                if path == "/api/repos/create":
                    body = req["json"]
                    kind = body.get("type") or "model"
                    prefix = "" if kind == "model" else f"{kind}s/"
                    return self._reply(
                        200,
                        {
                            "url": f"{hub.url}/{prefix}{body['organization']}/{body['name']}",
                            "name": f"{body['organization']}/{body['name']}",
                        },
                    )
                if path == "/api/validate-yaml":  # the card's YAML header must parse to a mapping
                    try:
                        ok = isinstance(yaml.safe_load(req["json"]["content"].split("---")[1]), dict)
                    except (yaml.YAMLError, IndexError):
                        ok = False
                    return self._reply(
                        200 if ok else 400, {"errors": [] if ok else [{"message": "invalid YAML"}], "warnings": []}
                    )
                m = re.fullmatch(_REPO, path)
                if m and m.group(3) == "preupload":
                    files = [
                        {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                        for f in req["json"]["files"]
                    ]
                    return self._reply(200, {"files": files, "commitOid": "0" * 40})
                if m and m.group(3) == "commit":
                    prefix = "" if m.group(1) == "model" else f"{m.group(1)}s/"
                    return self._reply(
                        200, {"commitUrl": f"{hub.url}/{prefix}{m.group(2)}/commit/{'a' * 40}", "commitOid": "a" * 40}
                    )
                self._reply(404, {"error": f"no route {path}"})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
