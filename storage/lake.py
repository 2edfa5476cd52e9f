"""The Parquet lake: atomic, idempotent writes under deterministic run keys.

Layout: `<root>/<table>/iteration=<n>/stage=<stage>/<run_key>-<part>.parquet`.

    lake = open_lake("lake")      # or open_lake(cfg): $FLYWHEEL_LAKE, else cfg.lake.root
    lake.write("episodes", rows, iteration=0, stage="rollouts", run_key="rollouts-ab12", part="ep-0007")
    lake.replace_run("datasets", [table], iteration=1, stage="curate", run_key="curate-1")

- Every file is written to a temp name in the same directory, fsync'd and `os.replace`d:
  readers (DuckDB globs `*.parquet`) never see a partial file.
- Same (table, iteration, stage, run_key, part) => same file name, so a rerun replaces
  instead of duplicating. `replace_run` also removes parts a previous attempt wrote that
  this attempt did not.
- Writers in different processes never share a file name (parts are unique per writer),
  so concurrent appends need no lock and lose nothing.

The root may also be an object store, `open_lake("s3://bucket/prefix", endpoint=...)` (storage.objstore): the tables
live in the bucket under the same layout, each file written as one whole object (a PUT is atomic: readers see
all of it or nothing) under the same deterministic key, so reruns replace. `root` is then a local folder for the
side files (downloaded exports and checkpoints, reports, the parent lock), `uri` the bucket's, and `publish` /
`fetch` carry an export or checkpoint folder to and from the bucket under its lake-relative path, so a row's
stored path means the same on every machine. Table file paths are `Path`s on disk and `s3://` strings in a bucket.
"""

from __future__ import annotations

import io
import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from storage.errors import LakeError
from storage.objstore import ObjectStore, default_cache_dir, is_object_uri
from storage.schema import BLOB_COLUMNS, SCHEMA_VERSION, TABLES, schema_for

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,160}$")
_TMP_SUFFIX = ".tmp"


__all__ = ["Lake", "LakeError", "LakeFile", "open_lake", "resolve_root", "to_table", "write_parquet_atomic"]


def _check_key(what: str, value: str) -> str:
    if not _KEY_RE.match(value) or ".." in value:
        raise LakeError(f"invalid {what} {value!r}: use letters, digits and _ . = + - (no slashes)")
    return value


def resolve_root(root: str | os.PathLike | None = None) -> Path:
    """Lake root: the explicit argument, else $FLYWHEEL_LAKE, else ./lake."""
    return Path(root or os.environ.get("FLYWHEEL_LAKE") or "lake").expanduser().resolve()


def to_table(table: str, rows: Sequence[dict] | pa.Table) -> pa.Table:
    """Conform rows to the table's schema; unknown keys and missing required columns are errors."""
    schema = schema_for(table)
    if isinstance(rows, pa.Table):
        extra = set(rows.column_names) - set(schema.names)
        if extra:
            raise LakeError(f"{table}: unknown columns {sorted(extra)}")
        cols = {f.name: (rows[f.name] if f.name in rows.column_names else pa.nulls(len(rows), f.type)) for f in schema}
        try:
            return pa.Table.from_arrays([c.cast(schema.field(n).type) for n, c in cols.items()], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError) as e:
            raise LakeError(f"{table}: rows do not match the schema: {e}") from None
    names = set(schema.names)
    for i, r in enumerate(rows):
        extra = set(r) - names
        if extra:
            raise LakeError(f"{table} row {i}: unknown columns {sorted(extra)}")
    try:
        return pa.Table.from_pylist(list(rows), schema=schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, ValueError, TypeError) as e:
        raise LakeError(f"{table}: rows do not match the schema: {e}") from None


def _write_parquet(t: pa.Table, where, table_name: str | None) -> None:
    """The lake's Parquet encoding of a table, to a path or a buffer."""
    blobs = set(BLOB_COLUMNS.get(table_name or "", []))
    meta = dict(t.schema.metadata or {})
    meta[b"flywheel.schema_version"] = str(SCHEMA_VERSION).encode()
    if table_name:
        meta[b"flywheel.table"] = table_name.encode()
    t = t.replace_schema_metadata(meta)
    pq.write_table(
        t,
        where,
        compression="zstd",
        use_dictionary=[c for c in t.column_names if c not in blobs],
        # Small row groups for blob tables keep a single-row lookup from decoding
        # megabytes of screenshots; text-only tables take the default.
        row_group_size=2048 if blobs else None,
    )


def write_parquet_atomic(t: pa.Table, path: Path, *, table_name: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
    try:
        _write_parquet(t, tmp, table_name)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


@dataclass(frozen=True)
class LakeFile:
    table: str
    iteration: int
    stage: str
    path: Path | str  # a Path on disk, an s3:// string in a bucket
    size: int = 0
    mtime_ns: int = 0  # on disk (0 in a bucket): with the size, tells a rewritten file from the one read before

    @property
    def run_part(self) -> str:
        return _name(self.path).removesuffix(".parquet")


def _name(path: Path | str) -> str:
    return path.name if isinstance(path, Path) else str(path).rsplit("/", 1)[-1]


class Lake:
    def __init__(
        self,
        root: str | os.PathLike | None = None,
        *,
        create: bool = True,
        endpoint: str | None = None,
        cache_dir: str | os.PathLike | None = None,
    ):
        """A lake on disk (a folder) or on an object store (`s3://bucket/prefix`; `endpoint`: an S3-compatible
        server's URL, default $FLYWHEEL_S3_ENDPOINT; `cache_dir`: local folder for its side files)."""
        raw = root if root is not None else (os.environ.get("FLYWHEEL_LAKE") or "lake")
        self.store: ObjectStore | None = None
        if is_object_uri(raw):
            self.store = ObjectStore(str(raw), endpoint=endpoint)  # checks the bucket: one line if it can't
            self.root = (
                Path(cache_dir).expanduser().resolve()
                if cache_dir
                else default_cache_dir(self.store.bucket, self.store.prefix)
            )
            self.root.mkdir(parents=True, exist_ok=True)
            if not create and not self.store.list_dir(self.store.uri):
                raise LakeError(f"no lake at {self.store.uri} (nothing under that prefix: run a stage to create one)")
            return
        self.root = resolve_root(raw)
        if not self.root.exists():
            if not create:
                raise LakeError(f"no lake at {self.root} (set --lake or FLYWHEEL_LAKE, or run a stage to create one)")
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise LakeError(f"lake root {self.root} is not a directory")

    def __repr__(self) -> str:
        return f"Lake({self.location!r})"

    @property
    def remote(self) -> bool:
        return self.store is not None

    @property
    def uri(self) -> str:
        """Where the tables are: the s3:// URI of an object-store lake, else the root folder."""
        return self.store.uri if self.store else str(self.root)

    location = uri  # for messages

    @property
    def endpoint(self) -> str | None:
        return self.store.endpoint if self.store else None

    # ------------------------------------------------------------------ paths
    def table_dir(self, table: str) -> Path | str:
        schema_for(table)
        return self.store.join(table) if self.store else self.root / table

    def partition_dir(self, table: str, iteration: int, stage: str) -> Path | str:
        if not isinstance(iteration, int) or iteration < 0:
            raise LakeError(f"iteration must be a non-negative integer, got {iteration!r}")
        parts = (f"iteration={iteration}", f"stage={_check_key('stage', stage)}")
        base = self.table_dir(table)
        return "/".join([base, *parts]) if self.store else base.joinpath(*parts)

    def file_path(self, table: str, *, iteration: int, stage: str, run_key: str, part: int | str = 0) -> Path | str:
        part_s = f"{part:05d}" if isinstance(part, int) else _check_key("part", str(part))
        name = f"{_check_key('run_key', run_key)}-{part_s}.parquet"
        d = self.partition_dir(table, iteration, stage)
        return f"{d}/{name}" if self.store else d / name

    def key(self, path: Path | str) -> str:
        """A table file's path relative to the lake (POSIX form), on disk or in a bucket."""
        return self.store.key(str(path)) if self.store else Path(path).resolve().relative_to(self.root).as_posix()

    # ------------------------------------------------------------------ paths in rows
    # Rows that name a file or folder of the lake (checkpoints, dataset exports) store it relative to the
    # root, so a copied or moved lake still resolves them; a path outside the lake is stored absolute.
    # An object-store lake keeps the same relative paths: under the local root and, once published, in the bucket.
    def rel(self, path: str | os.PathLike) -> str:
        """How a row stores `path`: relative to the root (POSIX form) when inside the lake, else absolute."""
        p = Path(path).expanduser().resolve()
        return p.relative_to(self.root).as_posix() if p.is_relative_to(self.root) else str(p)

    def resolve(self, stored: str | os.PathLike) -> Path:
        """A path as a row stores it (see `rel`), made absolute: a relative one lies under the root."""
        p = Path(stored).expanduser()
        return p if p.is_absolute() else self.root / p

    def publish(self, path: str | os.PathLike) -> int:
        """Make a file or folder under the root visible to every machine: upload it to the bucket under its
        lake-relative path (an object-store lake; a no-op on disk, where the root is the shared place).
        Call it before writing the row that names the path. Returns the number of files uploaded."""
        if not self.store:
            return 0
        local = Path(path).expanduser().resolve()
        if not local.is_relative_to(self.root):
            raise LakeError(f"{local} is outside the lake's local root {self.root}: only lake folders are published")
        return self.store.upload(local, local.relative_to(self.root).as_posix())

    def fetch(self, stored: str | os.PathLike) -> Path:
        """`resolve`, and for an object-store lake download a relative path's published copy when it is not here
        yet (another machine wrote it). A path missing in both places is returned as is (the caller says why)."""
        local = self.resolve(stored)
        if self.store and not Path(stored).is_absolute() and not local.exists():
            self.store.download(Path(stored).as_posix(), local)
        return local

    # ------------------------------------------------------------------ writes
    def write(
        self,
        table: str,
        rows: Sequence[dict] | pa.Table,
        *,
        iteration: int,
        stage: str,
        run_key: str,
        part: int | str = 0,
    ) -> Path | str:
        """Atomically write one part of a stage run (replacing the same part of an earlier attempt)."""
        t = to_table(table, rows)
        path = self.file_path(table, iteration=iteration, stage=stage, run_key=run_key, part=part)
        if not self.store:
            return write_parquet_atomic(t, path, table_name=table)
        buf = io.BytesIO()  # the whole object, then one PUT: never a partial object under the key
        _write_parquet(t, buf, table)
        self.store.put_bytes(path, buf.getvalue())
        return path

    def replace_run(
        self, table: str, parts: Iterable[Sequence[dict] | pa.Table], *, iteration: int, stage: str, run_key: str
    ) -> list[Path | str]:
        """Write a whole stage run as parts 0..n-1, then drop parts of earlier attempts not rewritten."""
        written = [
            self.write(table, p, iteration=iteration, stage=stage, run_key=run_key, part=i) for i, p in enumerate(parts)
        ]
        keep = set(written)
        for f in self.run_files(table, iteration=iteration, stage=stage, run_key=run_key):
            if f not in keep:
                self.remove(f)
        return written

    def run_files(self, table: str, *, iteration: int, stage: str, run_key: str) -> list[Path | str]:
        d = self.partition_dir(table, iteration, stage)
        prefix = f"{_check_key('run_key', run_key)}-"
        if self.store:
            names = self.store.list_dir(d)
        else:
            names = list(d.glob("*.parquet")) if d.exists() else []
        return sorted(p for p in names if _name(p).startswith(prefix) and _name(p).endswith(".parquet"))

    def files_of_runs(self, table: str, run_keys: Iterable[str]) -> list[Path | str]:
        """Every file of these run keys in `table`, whatever their iteration and stage (a run's files are named
        `<run_key>-<part>.parquet`): what a query about a few runs needs to read in a lake of thousands of files.
        A longer run key that starts with one of these plus "-" is matched too: filter on `run_key` as well."""
        prefixes = tuple(f"{_check_key('run_key', k)}-" for k in sorted(set(run_keys)))
        if not prefixes:
            return []
        if self.store:
            return [
                p
                for p, _ in self.store.list_files(self.store.join(table))
                if _name(p).startswith(prefixes) and _name(p).endswith(".parquet")
            ]
        d = self.root / table
        return sorted(p for k in prefixes for p in d.glob(f"iteration=*/stage=*/{k}*.parquet"))

    def delete_run(self, table: str, *, iteration: int, stage: str, run_key: str) -> int:
        files = self.run_files(table, iteration=iteration, stage=stage, run_key=run_key)
        for f in files:
            self.remove(f)
        return len(files)

    def remove(self, path: Path | str) -> None:
        if self.store:
            self.store.delete(str(path))
        else:
            Path(path).unlink(missing_ok=True)

    def exists(self, path: Path | str) -> bool:
        return self.store.exists(str(path)) if self.store else Path(path).exists()

    # ------------------------------------------------------------------ reads
    def files(self, table: str | None = None) -> list[LakeFile]:
        out: list[LakeFile] = []
        for name in [table] if table else TABLES:
            if self.store:
                found = [
                    (p, (size, 0), p[len(self.store.join(name)) + 1 :].split("/"))
                    for p, size in self.store.list_files(self.store.join(name))
                ]
            else:
                d = self.root / name
                paths = sorted(d.glob("iteration=*/stage=*/*.parquet")) if d.exists() else []
                stats = [(p, p.stat()) for p in paths]
                found = [(p, (st.st_size, st.st_mtime_ns), p.relative_to(d).parts) for p, st in stats]
            for p, (size, mtime), parts in found:
                if len(parts) != 3 or not parts[2].endswith(".parquet") or not parts[1].startswith("stage="):
                    continue
                try:
                    it = int(parts[0].split("=", 1)[1]) if parts[0].startswith("iteration=") else -1
                except ValueError:
                    continue
                if it >= 0:
                    out.append(LakeFile(name, it, parts[1].split("=", 1)[1], p, size, mtime))
        return out

    def has_data(self, table: str) -> bool:
        if self.store:
            return bool(self.files(table))
        d = self.root / table
        return d.exists() and next(d.glob("iteration=*/stage=*/*.parquet"), None) is not None

    @property
    def filesystem(self):
        """The fsspec filesystem of an object-store lake (None on disk): for pyarrow's `filesystem=`."""
        return self.store.fs if self.store else None

    def parquet_file(self, path: Path | str) -> pq.ParquetFile:
        return pq.ParquetFile(str(path), filesystem=self.filesystem)

    def read_table(self, path: Path | str, columns: list[str] | None = None) -> pa.Table:
        return pq.read_table(str(path), columns=columns, filesystem=self.filesystem)

    def quarantine(self, path: Path | str) -> Path | str:
        """Move an unreadable file out of the queryable tree (kept, never deleted)."""
        if self.store:
            dest = self.store.join("_quarantine", self.key(path))
            self.store.move(str(path), dest)
            return dest
        rel = Path(path).resolve().relative_to(self.root)
        dest = self.root / "_quarantine" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
        return dest


def open_lake(
    source: Any = None,
    *,
    root: str | os.PathLike | None = None,
    endpoint: str | None = None,
    create: bool = True,
) -> Lake:
    """The one way to open a lake: every stage, command, worker and report opens it here.

        open_lake(cfg)                      # a FlywheelConfig: $FLYWHEEL_LAKE, else cfg.lake.root
        open_lake(cfg.lake, root=lake_arg)  # a LakeConfig, with a command's --lake for the root
        open_lake("runs/lake", create=False)
        open_lake(spec.lake_root, endpoint=spec.lake_endpoint)   # a rollout worker: the spec's root and endpoint

    source: a config with a `lake` section (FlywheelConfig), a lake section (LakeConfig: root, s3_endpoint,
    cache_dir), a Lake (returned as it is), or a folder / s3:// URI (None: $FLYWHEEL_LAKE, else ./lake).
    From a config, the root is `root` (a command's --lake), else $FLYWHEEL_LAKE (which --lake sets, so it reaches
    every process the command starts), else lake.root; the endpoint is `endpoint`, else $FLYWHEEL_S3_ENDPOINT, else
    lake.s3_endpoint; an s3:// lake keeps its side files in lake.cache_dir. A path is opened as given (an s3:// one
    at `endpoint`, else $FLYWHEEL_S3_ENDPOINT's). create=False: a missing lake is a LakeError."""
    if isinstance(source, Lake):
        return source
    section = getattr(source, "lake", source)  # duck-typed: storage imports no config model
    if not hasattr(section, "root") or isinstance(section, (str, os.PathLike)):  # a Path has a .root too
        return Lake(source, create=create, endpoint=endpoint)
    return Lake(
        root or os.environ.get("FLYWHEEL_LAKE") or section.root,
        create=create,
        endpoint=endpoint or os.environ.get("FLYWHEEL_S3_ENDPOINT") or section.s3_endpoint,
        cache_dir=section.cache_dir,
    )
