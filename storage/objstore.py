"""The lake on an object store: `lake.root: s3://bucket/prefix` on any S3-compatible endpoint (AWS, MinIO, moto).

    store = ObjectStore("s3://flywheel/lake", endpoint="http://minio:9000")   # checks the bucket, one-line errors
    store.upload(Path("lake/_datasets/d1"), "_datasets/d1")      # a folder beside the tables, file by file
    store.download("_datasets/d1", Path("cache/_datasets/d1"))   # atomically; never from a stale listing cache

The tables' data is not here: DuckDB reads and writes it through httpfs (storage.attach). This module checks the
bucket when a lake opens and carries the side folders (exports, checkpoints) that rows name, through s3fs.
Credentials come from the standard AWS chain ($AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY, ~/.aws, an instance
role): never from the config, and never in a message, a row or a repr. The endpoint: `lake.s3_endpoint`, else
$FLYWHEEL_S3_ENDPOINT, else botocore's own. An object appears whole or not at all, so a folder is uploaded file by
file *before* the lake row that names it is written: the row is the manifest, and a reader that goes through the
lake's tables never sees a half-uploaded folder.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

from storage.errors import LakeError

SCHEMES = ("s3://", "s3a://")
_URI_RE = re.compile(r"^s3a?://([a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(/[A-Za-z0-9_.=+/-]*)?$")
ENDPOINT_ENV = "FLYWHEEL_S3_ENDPOINT"
CACHE_ENV = "FLYWHEEL_LAKE_CACHE"
# Fail fast on a wrong endpoint instead of botocore's 60 s connect timeout and several retries.
_CONFIG = {"connect_timeout": 5, "read_timeout": 60, "retries": {"max_attempts": 3, "mode": "standard"}}


def is_object_uri(root: str | os.PathLike | None) -> bool:
    return root is not None and str(root).startswith(SCHEMES)


def parse_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix without slashes at either end) of an s3:// URI, or a LakeError saying what is wrong."""
    m = _URI_RE.match(uri.rstrip("/"))
    if not m:
        raise LakeError(
            f"invalid lake URI {uri!r}: use s3://bucket/prefix (bucket: lowercase letters, digits, "
            "dots and hyphens; prefix: letters, digits and _ . = + - /)"
        )
    prefix = (m.group(2) or "").strip("/")
    if ".." in prefix.split("/"):
        raise LakeError(f"invalid lake URI {uri!r}: '..' is not allowed in the prefix")
    return m.group(1), prefix


_CAUSES = (  # (what the error's type name or text holds, what it means, what to check)
    (
        ("EndpointConnectionError", "ConnectTimeout", "ConnectionError", "TimeoutError"),
        "cannot reach the object store",
        f"check lake.s3_endpoint / ${ENDPOINT_ENV}",
    ),
    (
        ("PermissionError", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"),
        "access denied by the object store",
        "check $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY or the profile in use",
    ),
)


def explain(e: BaseException, where: str, endpoint: str | None) -> str:
    """One line for a failed object-store call (no credentials: botocore's messages name none)."""
    at = f" at {endpoint}" if endpoint else ""
    name = type(e).__name__
    text = str(e).splitlines()[0][:200] if str(e) else name
    kinds = " ".join(c.__name__ for c in type(e).__mro__)  # ConnectionRefusedError is a ConnectionError
    for marks, what, check in _CAUSES:
        if any(m in kinds or m in text for m in marks):
            return f"{what}{at} for {where}: {text} ({check})"
    if isinstance(e, FileNotFoundError) and "bucket" in text.lower():
        return f"no bucket for {where}{at}: {text} (create the bucket first; the lake never creates buckets)"
    return f"object store error{at} for {where}: {name}: {text}"


class ObjectStore:
    """One lake's bucket + prefix. Every call's failure is a LakeError with one line."""

    def __init__(self, uri: str, *, endpoint: str | None = None, check: bool = True):
        self.bucket, self.prefix = parse_uri(uri)
        self.uri = f"s3://{self.bucket}" + (f"/{self.prefix}" if self.prefix else "")
        self.endpoint = endpoint or os.environ.get(ENDPOINT_ENV) or None
        try:
            import s3fs
        except ImportError:
            raise LakeError(
                f"lake {self.uri} is on an object store: install the s3 extra (pip install -e '.[s3]')"
            ) from None
        # No listing cache: other machines write to the same prefix, and a cached listing would hide their files.
        # No read-ahead cache either: DuckDB asks for exactly the column chunks a query needs (and caches them
        # itself), and a read-ahead block would pull in the screenshot bytes next to them.
        self.fs = s3fs.S3FileSystem(
            endpoint_url=self.endpoint,
            use_listings_cache=False,
            skip_instance_cache=True,
            config_kwargs=_CONFIG,
            default_cache_type="none",
        )
        if check:
            self.call("the bucket check", self.fs.ls, self.bucket, refresh=True)

    def __repr__(self) -> str:  # never the filesystem's, which holds the session
        return f"ObjectStore({self.uri!r}, endpoint={self.endpoint!r})"

    def call(self, where: str, fn, *args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except LakeError:
            raise
        except FileNotFoundError as e:
            if "bucket" in str(e).lower():
                raise LakeError(explain(e, where, self.endpoint)) from None
            raise
        except Exception as e:  # noqa: BLE001 - botocore/aiohttp/OSError: all become one line
            raise LakeError(explain(e, where, self.endpoint)) from None

    def join(self, *parts: str) -> str:
        return "/".join([self.uri, *[str(p).strip("/") for p in parts if str(p)]])

    # ------------------------------------------------------------------ objects
    def list_files(self, uri: str) -> list[tuple[str, int]]:
        """(s3:// uri, size) of every object under `uri` (recursive), sorted; [] when there are none."""
        try:
            found = self.call(f"listing {uri}", self.fs.find, uri, detail=True)
        except FileNotFoundError:
            return []
        return sorted(("s3://" + k, int(v.get("size") or 0)) for k, v in found.items() if v.get("type") != "directory")

    # ------------------------------------------------------------------ folders beside the tables
    def upload(self, local: Path, rel: str) -> int:
        """Upload a local file or folder to `<prefix>/<rel>`, file by file; returns the number of files."""
        files = [local] if local.is_file() else sorted(p for p in local.rglob("*") if p.is_file())
        for p in files:
            sub = "" if p == local else p.relative_to(local).as_posix()
            self.call(f"uploading {p}", self.fs.put_file, str(p), self.join(rel, sub))
        return len(files)

    def download(self, rel: str, local: Path) -> bool:
        """Download `<prefix>/<rel>` (a file or a folder) to `local`, atomically (a temp sibling, then a rename).
        False when nothing is stored under that key."""
        src = self.join(rel)
        objs = self.list_files(src)
        if not objs:
            return False
        tmp = local.parent / f".{local.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
        tmp.parent.mkdir(parents=True, exist_ok=True)
        try:
            if len(objs) == 1 and objs[0][0] == src:  # a single object
                self.call(f"downloading {src}", self.fs.get_file, src, str(tmp))
            else:
                for uri, _ in objs:
                    dest = tmp / uri[len(src) + 1 :]
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    self.call(f"downloading {uri}", self.fs.get_file, uri, str(dest))
            if local.exists():  # another process won the race: keep its copy
                return True
            os.replace(tmp, local)
        finally:
            if tmp.is_dir():
                shutil.rmtree(tmp, ignore_errors=True)
            elif tmp.exists():
                tmp.unlink()
        return True


def default_cache_dir(bucket: str, prefix: str) -> Path:
    """Local folder for an object-store lake's side files (downloaded exports and checkpoints, reports, lock)."""
    base = os.environ.get(CACHE_ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "flywheel", "lakes"
    )
    return (Path(base).expanduser() / bucket / (prefix or "_root")).resolve()
