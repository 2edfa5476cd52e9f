"""The Parquet lake: atomic, idempotent writes under deterministic run keys.

Layout: `<root>/<table>/iteration=<n>/stage=<stage>/<run_key>-<part>.parquet`.

    lake = Lake("lake")
    lake.write("episodes", rows, iteration=0, stage="rollouts", run_key="rollouts-ab12", part="ep-0007")
    lake.replace_run("datasets", [table], iteration=1, stage="curate", run_key="curate-1")

- Every file is written to a temp name in the same directory, fsync'd and `os.replace`d:
  readers (DuckDB globs `*.parquet`) never see a partial file.
- Same (table, iteration, stage, run_key, part) => same file name, so a rerun replaces
  instead of duplicating. `replace_run` also removes parts a previous attempt wrote that
  this attempt did not.
- Writers in different processes never share a file name (parts are unique per writer),
  so concurrent appends need no lock and lose nothing.
"""

from __future__ import annotations

import os
import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from storage.schema import BLOB_COLUMNS, SCHEMA_VERSION, TABLES, schema_for

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,160}$")
_TMP_SUFFIX = ".tmp"


class LakeError(Exception):
    """A user-facing lake problem (bad path, bad rows, unreadable file): one clear line."""


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
        cols = {f.name: (rows[f.name] if f.name in rows.column_names else pa.nulls(len(rows), f.type))
                for f in schema}
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


def write_parquet_atomic(t: pa.Table, path: Path, *, table_name: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}{_TMP_SUFFIX}"
    blobs = set(BLOB_COLUMNS.get(table_name or "", []))
    meta = dict(t.schema.metadata or {})
    meta[b"flywheel.schema_version"] = str(SCHEMA_VERSION).encode()
    if table_name:
        meta[b"flywheel.table"] = table_name.encode()
    t = t.replace_schema_metadata(meta)
    try:
        pq.write_table(
            t, tmp, compression="zstd",
            use_dictionary=[c for c in t.column_names if c not in blobs],
            # Small row groups for blob tables keep a single-row lookup from decoding
            # megabytes of screenshots; text-only tables take the default.
            row_group_size=2048 if blobs else None,
        )
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
    path: Path

    @property
    def run_part(self) -> str:
        return self.path.stem


class Lake:
    def __init__(self, root: str | os.PathLike | None = None, *, create: bool = True):
        self.root = resolve_root(root)
        if not self.root.exists():
            if not create:
                raise LakeError(f"no lake at {self.root} (set --lake or FLYWHEEL_LAKE, or run a stage to create one)")
            self.root.mkdir(parents=True, exist_ok=True)
        elif not self.root.is_dir():
            raise LakeError(f"lake root {self.root} is not a directory")

    # ------------------------------------------------------------------ paths
    def table_dir(self, table: str) -> Path:
        schema_for(table)
        return self.root / table

    def partition_dir(self, table: str, iteration: int, stage: str) -> Path:
        if not isinstance(iteration, int) or iteration < 0:
            raise LakeError(f"iteration must be a non-negative integer, got {iteration!r}")
        return self.table_dir(table) / f"iteration={iteration}" / f"stage={_check_key('stage', stage)}"

    def file_path(self, table: str, *, iteration: int, stage: str, run_key: str, part: int | str = 0) -> Path:
        part_s = f"{part:05d}" if isinstance(part, int) else _check_key("part", str(part))
        return self.partition_dir(table, iteration, stage) / f"{_check_key('run_key', run_key)}-{part_s}.parquet"

    # ------------------------------------------------------------------ paths in rows
    # Rows that name a file or folder of the lake (checkpoints, dataset exports) store it relative to the
    # root, so a copied or moved lake still resolves them; a path outside the lake is stored absolute.
    def rel(self, path: str | os.PathLike) -> str:
        """How a row stores `path`: relative to the root (POSIX form) when inside the lake, else absolute."""
        p = Path(path).expanduser().resolve()
        return p.relative_to(self.root).as_posix() if p.is_relative_to(self.root) else str(p)

    def resolve(self, stored: str | os.PathLike) -> Path:
        """A path as a row stores it (see `rel`), made absolute: a relative one lies under the root."""
        p = Path(stored).expanduser()
        return p if p.is_absolute() else self.root / p

    # ------------------------------------------------------------------ writes
    def write(self, table: str, rows: Sequence[dict] | pa.Table, *, iteration: int, stage: str,
              run_key: str, part: int | str = 0) -> Path:
        """Atomically write one part of a stage run (replacing the same part of an earlier attempt)."""
        t = to_table(table, rows)
        return write_parquet_atomic(t, self.file_path(table, iteration=iteration, stage=stage,
                                                      run_key=run_key, part=part), table_name=table)

    def replace_run(self, table: str, parts: Iterable[Sequence[dict] | pa.Table], *, iteration: int,
                    stage: str, run_key: str) -> list[Path]:
        """Write a whole stage run as parts 0..n-1, then drop parts of earlier attempts not rewritten."""
        written = [self.write(table, p, iteration=iteration, stage=stage, run_key=run_key, part=i)
                   for i, p in enumerate(parts)]
        keep = set(written)
        for f in self.run_files(table, iteration=iteration, stage=stage, run_key=run_key):
            if f not in keep:
                f.unlink(missing_ok=True)
        return written

    def run_files(self, table: str, *, iteration: int, stage: str, run_key: str) -> list[Path]:
        d = self.partition_dir(table, iteration, stage)
        if not d.exists():
            return []
        prefix = f"{_check_key('run_key', run_key)}-"
        return sorted(p for p in d.glob("*.parquet") if p.name.startswith(prefix))

    def delete_run(self, table: str, *, iteration: int, stage: str, run_key: str) -> int:
        files = self.run_files(table, iteration=iteration, stage=stage, run_key=run_key)
        for f in files:
            f.unlink(missing_ok=True)
        return len(files)

    # ------------------------------------------------------------------ reads
    def files(self, table: str | None = None) -> list[LakeFile]:
        out: list[LakeFile] = []
        for name in ([table] if table else TABLES):
            d = self.root / name
            if not d.exists():
                continue
            for p in sorted(d.glob("iteration=*/stage=*/*.parquet")):
                try:
                    it = int(p.parent.parent.name.split("=", 1)[1])
                except ValueError:
                    continue
                out.append(LakeFile(name, it, p.parent.name.split("=", 1)[1], p))
        return out

    def has_data(self, table: str) -> bool:
        d = self.root / table
        return d.exists() and next(d.glob("iteration=*/stage=*/*.parquet"), None) is not None

    def quarantine(self, path: Path) -> Path:
        """Move an unreadable file out of the queryable tree (kept, never deleted)."""
        rel = Path(path).resolve().relative_to(self.root)
        dest = self.root / "_quarantine" / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.replace(path, dest)
        return dest
