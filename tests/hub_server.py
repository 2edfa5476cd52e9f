"""A local stand-in for the Hugging Face Hub API, for push tests: it answers the calls huggingface_hub makes for
`HfApi.create_repo` and `HfApi.upload_folder` in the Hub's format, and records every request.

    with HubServer(token="hf_test") as hub:        # env: HF_ENDPOINT=hub.url, HF_TOKEN=hf_test, HF_HUB_OFFLINE=0
        ...; hub.requests                          # [{"method", "path", "auth", "json" | "ndjson"}]

Routes (the Hub API as huggingface_hub 2.x calls it):
- POST /api/repos/create {name, organization, type, visibility?} -> {"url": ...}
- POST /api/validate-yaml {content, repoType} -> {"errors": [], "warnings": []} (400 with errors if the README's
  YAML header does not parse)
- POST /api/{type}s/{org}/{name}/preupload/{rev} {files: [{path, sample, size}]} -> per file "regular" (content
  inline in the commit) or "lfs": as the Hub decides, by the default .gitattributes' binary suffixes
  (.safetensors, .bin, .pt, ...) or a size of 10 MiB or more (`lfs_over`)
- POST /{type prefix}{org}/{name}.git/info/lfs/objects/batch (the git-lfs Batch API: {operation: "upload",
  objects: [{oid, size}], hash_algo: "sha256"}) -> per object an upload action (a PUT href) and a verify action,
  or no actions when the object is already stored
- PUT /lfs/{oid}: the file's bytes; 400 unless their sha256 is the oid and their size the batch's size
- POST /lfs/verify {oid, size}: 200 when stored with that size, else 404
- POST /api/{type}s/{org}/{name}/commit/{rev} (NDJSON: a header line, then one "file" line per regular file with
  base64 content and one "lfsFile" line {path, algo, oid, size} per LFS file) -> {"commitUrl", "commitOid"}; 400
  when an lfsFile names an object never uploaded (the Hub refuses such a commit)
A request without "Authorization: Bearer <token>" gets 401; anything else gets 404 (and is recorded).
`lfs` holds the stored objects (oid -> bytes). huggingface_hub sends large files by Xet when `hf_xet` is installed;
set HF_HUB_DISABLE_XET=1 to take this LFS path (the Xet CAS protocol is not stood in for).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml

_REPO = r"/api/(model|dataset|space)s/([^/]+/[^/]+)/(preupload|commit)/([^/?]+)"
_BATCH = r"/(?:datasets/|spaces/)?[^/]+/[^/]+\.git/info/lfs/objects/batch"
_LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".onnx", ".msgpack", ".parquet", ".arrow")


class HubServer:
    def __init__(self, token: str, lfs_over: int = 10 * 1024 * 1024):
        self.token = token
        self.lfs_over = lfs_over
        self.requests: list[dict] = []
        self.lfs: dict[str, bytes] = {}
        self._sizes: dict[str, int] = {}  # oid -> size promised in a batch request
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

            def do_PUT(self):
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                path = self.path.split("?")[0]
                hub.requests.append({"method": "PUT", "path": path, "auth": self.headers.get("Authorization")})
                oid = path.removeprefix("/lfs/")
                if not path.startswith("/lfs/") or oid not in hub._sizes:
                    return self._reply(404, {"error": f"no upload href {path}"})
                if hashlib.sha256(raw).hexdigest() != oid or len(raw) != hub._sizes[oid]:
                    return self._reply(400, {"error": "content does not match its oid and size"})
                hub.lfs[oid] = raw
                self._reply(200, {})

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
                if re.fullmatch(_BATCH, path):
                    objects = []
                    for o in req["json"]["objects"]:
                        hub._sizes[o["oid"]] = o["size"]
                        actions = {
                            "upload": {"href": f"{hub.url}/lfs/{o['oid']}"},
                            "verify": {"href": f"{hub.url}/lfs/verify"},
                        }
                        objects.append({**o, **({} if o["oid"] in hub.lfs else {"actions": actions})})
                    return self._reply(200, {"transfer": "basic", "objects": objects})
                if path == "/lfs/verify":
                    o = req["json"]
                    ok = len(hub.lfs.get(o["oid"], b"")) == o["size"] and o["oid"] in hub.lfs
                    return self._reply(200 if ok else 404, {} if ok else {"error": "object not found"})
                m = re.fullmatch(_REPO, path)
                if m and m.group(3) == "preupload":
                    files = [
                        {"path": f["path"], "uploadMode": _mode(f, hub.lfs_over), "shouldIgnore": False}
                        for f in req["json"]["files"]
                    ]
                    return self._reply(200, {"files": files, "commitOid": "0" * 40})
                if m and m.group(3) == "commit":
                    missing = [
                        ln["value"]["path"]
                        for ln in req["ndjson"]
                        if ln["key"] == "lfsFile" and ln["value"]["oid"] not in hub.lfs
                    ]
                    if missing:
                        return self._reply(400, {"error": f"LFS objects not uploaded: {missing}"})
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


def _mode(f: dict, lfs_over: int) -> str:
    return "lfs" if f["size"] >= lfs_over or f["path"].endswith(_LFS_SUFFIXES) else "regular"
