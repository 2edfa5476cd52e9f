"""The lake: a DuckLake catalog plus Parquet data, written in transactions under deterministic run keys.

    lake = open_lake("lake")      # or open_lake(cfg): $FLYWHEEL_LAKE, else cfg.lake.root
    lake.write("episodes", rows, iteration=0, stage="rollouts", run_key="rollouts-ab12", part="ep-0007")
    lake.replace_run("datasets", [table], iteration=1, stage="curate", run_key="curate-1")

Layout of a local lake (a folder): `catalog.sqlite` (the DuckLake catalog: tables, snapshots, small inlined
inserts) and `data/` (Parquet files DuckLake writes and compacts). Every table has the columns of
storage.schema plus `iteration`, `stage` and `part` (`<run_key>/<part>` of the write that made the row): where a
row came from, and what a rerun replaces.

- A write is one transaction: the rows of (table, iteration, stage, run_key, part) are deleted and the new
  ones inserted, so a rerun replaces instead of duplicating, and a reader sees all of a write or none of it.
  `write_many` puts several tables' rows (an episode and its steps) in one transaction.
- Several processes write at once (rollout workers): the SQLite catalog serialises commits, and a commit that
  loses a race is retried (`_retry`) until it lands or a deadline passes. No row is written twice: a retried
  transaction starts over from its DELETE.
- Every commit is a snapshot: `snapshot()` is the current one, and `connect(lake, at=n)` reads the lake as of n.
- `compact()` flushes inlined rows to Parquet and merges small files (after every stage; `flywheel lake compact`).

Catalog: `lake.catalog` (a `postgresql://...` URL for many machines, or a SQLite file), default
`<root>/catalog.sqlite`. The data of an `s3://bucket/prefix` root lives under `s3://bucket/prefix/data/`, read
and written by DuckDB's httpfs; `root` is then a local folder for side files, and `publish` / `fetch` carry an
export or checkpoint folder to and from the bucket under its lake-relative path, so a row's stored path means the
same on every machine.
"""

from __future__ import annotations

import hashlib
import os
import random
import re
import sqlite3
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.duck import database, load, quote
from storage.errors import LakeError
from storage.objstore import ObjectStore, default_cache_dir, is_object_uri
from storage.schema import BLOB_COLUMNS, PARTITION_COLUMNS, SCHEMA_VERSION, TABLES, duckdb_type, schema_for

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,160}$")
CATALOG_FILE = "catalog.sqlite"
DATA_DIR = "data"
COMMIT_DEADLINE_S = float(os.environ.get("FLYWHEEL_LAKE_COMMIT_DEADLINE_S", "300"))
INLINE_ROWS = 10  # DuckLake's default data_inlining_row_limit: inserts of at most this many rows stay in the catalog
FLUSH_ROWS = int(os.environ.get("FLYWHEEL_LAKE_FLUSH_ROWS", "1000"))  # a writer's inlined rows per Parquet file


__all__ = ["Lake", "LakeError", "LakeFile", "open_lake", "resolve_root", "to_table", "write_parquet"]


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


def write_parquet(t: pa.Table, where, table_name: str | None = None) -> None:
    """A Parquet file of lake rows (exports, migrations): zstd, screenshots never dictionary-encoded."""
    blobs = set(BLOB_COLUMNS.get(table_name or "", []))
    meta = dict(t.schema.metadata or {})
    meta[b"flywheel.schema_version"] = str(SCHEMA_VERSION).encode()
    t = t.replace_schema_metadata(meta)
    pq.write_table(
        t,
        where,
        compression="zstd",
        use_dictionary=[c for c in t.column_names if c not in blobs],
        row_group_size=2048 if blobs else None,
    )


def _catalog_spec(catalog: str) -> tuple[str, str]:
    """(DuckLake metadata spec, extension) of `lake.catalog`: a postgresql:// URL or a SQLite file."""
    if catalog.startswith(("postgresql://", "postgres://")):
        u = urllib.parse.urlsplit(catalog)
        parts = {"dbname": u.path.lstrip("/") or "postgres", "host": u.hostname, "port": u.port}
        parts.update({"user": urllib.parse.unquote(u.username or "") or None})
        parts.update({"password": urllib.parse.unquote(u.password or "") or None})
        parts.update(dict(urllib.parse.parse_qsl(u.query)))
        return "postgres:" + " ".join(f"{k}={v}" for k, v in parts.items() if v not in (None, "")), "postgres"
    path = catalog.removeprefix("sqlite:")
    return f"sqlite:{Path(path).expanduser().resolve()}", "sqlite"


def _is_conflict(e: Exception) -> bool:
    text = str(e)
    return isinstance(e, duckdb.TransactionException) or any(
        s in text
        for s in (
            "Failed to commit",
            "conflict",
            "Conflict",
            "database is locked",
            "SQLITE_BUSY",
            "could not serialize",
        )
    )


@dataclass(frozen=True)
class LakeFile:
    """One Parquet data file of a table (DuckLake's list)."""

    table: str
    path: str
    size: int = 0


_ATTACH_LOCK = threading.RLock()
_ATTACHED: dict[tuple[int, str], tuple[str, Any]] = {}  # (pid, lake id) -> (alias, catalog file identity)


class Lake:
    def __init__(
        self,
        root: str | os.PathLike | None = None,
        *,
        create: bool = True,
        endpoint: str | None = None,
        cache_dir: str | os.PathLike | None = None,
        catalog: str | None = None,
    ):
        """A lake on disk (a folder) or with its data on an object store (`s3://bucket/prefix`; `endpoint`: an
        S3-compatible server's URL, default $FLYWHEEL_S3_ENDPOINT; `cache_dir`: local folder for its side files).
        `catalog`: a postgresql:// URL or a SQLite file (default `<root>/catalog.sqlite`)."""
        raw = root if root is not None else (os.environ.get("FLYWHEEL_LAKE") or "lake")
        self.store: ObjectStore | None = None
        catalog = catalog or os.environ.get("FLYWHEEL_LAKE_CATALOG") or None
        self.catalog_setting = catalog  # as configured (None: the default file), for a worker opening the same lake
        if is_object_uri(raw):
            self.store = ObjectStore(str(raw), endpoint=endpoint)  # checks the bucket: one line if it can't
            self.root = (
                Path(cache_dir).expanduser().resolve()
                if cache_dir
                else default_cache_dir(self.store.bucket, self.store.prefix)
            )
            self.root.mkdir(parents=True, exist_ok=True)
            self.data_path = self.store.join(DATA_DIR) + "/"
        else:
            self.root = resolve_root(raw)
            if self.root.exists() and not self.root.is_dir():
                raise LakeError(f"lake root {self.root} is not a directory")
            self.data_path = str(self.root / DATA_DIR) + "/"
        self.catalog, self._ext = _catalog_spec(catalog or str(self.root / CATALOG_FILE))
        self._sqlite = Path(self.catalog.removeprefix("sqlite:")) if self._ext == "sqlite" else None
        if not create and self.store is None and self.root.is_dir() and not any(self.root.iterdir()):
            create = True  # an existing empty folder is an empty lake
        if self._sqlite is not None and not self._sqlite.exists():
            old = [t for t in TABLES if next((self.root / t).glob("iteration=*"), None) is not None]
            if old:
                raise LakeError(
                    f"{self.root} is a lake in the old one-file-per-write layout ({', '.join(old)}): convert it "
                    f"with `flywheel lake migrate {self.root} NEW`"
                )
            if not create:
                raise LakeError(
                    f"no lake at {self.location} (no {self._sqlite.name}: set --lake or FLYWHEEL_LAKE, "
                    "or run a stage to create one)"
                )
        if create and not self.store:
            self.root.mkdir(parents=True, exist_ok=True)
        self.id = hashlib.sha1(f"{self.catalog}|{self.data_path}".encode()).hexdigest()[:12]
        self._inlined: dict[str, int] = {}  # table -> rows this process inlined since its last flush
        if create and self._sqlite is not None and not self._sqlite.exists():
            self.alias  # noqa: B018 - a new lake: its catalog and tables now, so that readers find it

    def __repr__(self) -> str:
        return f"Lake({self.location!r})"

    @property
    def remote(self) -> bool:
        return self.store is not None

    @property
    def uri(self) -> str:
        """Where the tables' data is: the s3:// URI of an object-store lake, else the root folder."""
        return self.store.uri if self.store else str(self.root)

    location = uri  # for messages

    @property
    def endpoint(self) -> str | None:
        return self.store.endpoint if self.store else None

    # ------------------------------------------------------------------ the catalog
    @property
    def alias(self) -> str:
        """The name this lake is attached under in this process's database (attaching it on first use)."""
        pid = os.getpid()
        ident = self._sqlite.stat().st_ino if self._sqlite is not None and self._sqlite.exists() else None
        with _ATTACH_LOCK:
            got = _ATTACHED.get((pid, self.id))
            if got and (got[1] == ident or ident is None and self._sqlite is None):
                return got[0]
            db = database()
            if got:  # the catalog file was replaced (a lake deleted and made again): attach the new one
                try:
                    db.execute(f"DETACH {got[0]}")
                except duckdb.Error:
                    pass
            alias = f"lake_{self.id}_{uuid.uuid4().hex[:6]}"
            load(db, self._ext)
            if self.store:
                self._s3_secret(db)
            if self._sqlite is not None and not self._sqlite.exists():
                self._sqlite.parent.mkdir(parents=True, exist_ok=True)
                with sqlite3.connect(self._sqlite) as sq:  # WAL: readers never wait for a writer's commit
                    sq.execute("PRAGMA journal_mode=WAL")
            try:
                db.execute(
                    f"ATTACH {quote('ducklake:' + self.catalog)} AS {alias} "
                    f"(DATA_PATH {quote(self.data_path)}, OVERRIDE_DATA_PATH true)"
                )
            except duckdb.Error as e:
                msg = str(e).splitlines()[0][:300].replace(self.catalog, "<lake.catalog>")
                raise LakeError(f"cannot open the lake catalog of {self.location}: {msg}") from None
            self._retry(lambda cur: self._create_tables(cur, alias), "creating the lake's tables", begin=True)
            ident = self._sqlite.stat().st_ino if self._sqlite is not None else None
            _ATTACHED[(pid, self.id)] = (alias, ident)
            return alias

    def _s3_secret(self, db) -> None:
        load(db, "httpfs")
        url = urllib.parse.urlsplit(self.endpoint) if self.endpoint else None
        opts = {
            "TYPE": "s3",
            "KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", ""),
            "SECRET": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
            "REGION": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
            "SCOPE": f"s3://{self.store.bucket}",
        }
        if os.environ.get("AWS_SESSION_TOKEN"):
            opts["SESSION_TOKEN"] = os.environ["AWS_SESSION_TOKEN"]
        if url:
            opts.update({"ENDPOINT": url.netloc, "URL_STYLE": "path", "USE_SSL": url.scheme == "https"})
        body = ", ".join(f"{k} {v if isinstance(v, bool) else quote(v)}" for k, v in opts.items())
        db.execute(f"CREATE OR REPLACE SECRET lake_{self.id} ({body})")

    def _create_tables(self, cur, alias: str) -> None:
        """Every table of storage.schema, and a newer schema version's nullable columns on an older lake's tables.
        (Asks this lake's catalog only: information_schema would open every lake attached in this process.)"""
        have = {r[0] for r in cur.execute(f"SELECT table_name FROM ducklake_table_info({quote(alias)})").fetchall()}
        for table, schema in TABLES.items():
            cols = [(f.name, duckdb_type(f.type)) for f in schema] + list(PARTITION_COLUMNS.items())
            cols.append(("part", "VARCHAR"))
            if table not in have:
                body = ", ".join(f'"{n}" {t}' for n, t in cols)
                cur.execute(f'CREATE TABLE {alias}."{table}" ({body})')
                continue
            present = {d[0] for d in cur.execute(f'SELECT * FROM {alias}."{table}" LIMIT 0').description}
            for n, t in cols:
                if n not in present:
                    cur.execute(f'ALTER TABLE {alias}."{table}" ADD COLUMN "{n}" {t}')

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of this process's database, with the lake attached (as `self.alias`)."""
        self.alias  # noqa: B018 - attaches the lake on first use
        return database().cursor()

    def ref(self, table: str, at: int | None = None) -> str:
        """SQL name of a table (as of snapshot `at`, when given)."""
        schema_for(table)
        return f'{self.alias}."{table}"' + (f" AT (VERSION => {int(at)})" if at is not None else "")

    def _retry(self, fn: Callable[[Any], Any], what: str, *, begin: bool = True):
        """Run fn(cursor) in one transaction, again from the start when the commit loses a race."""
        deadline = time.monotonic() + COMMIT_DEADLINE_S
        delay = 0.01
        while True:
            cur = database().cursor()
            try:
                if begin:
                    cur.execute("BEGIN TRANSACTION")
                out = fn(cur)
                if begin:
                    cur.execute("COMMIT")
                return out
            except duckdb.Error as e:
                try:
                    cur.execute("ROLLBACK")
                except duckdb.Error:
                    pass
                if not _is_conflict(e) or time.monotonic() > deadline:
                    msg = str(e).splitlines()[0][:300]
                    raise LakeError(f"lake {self.location}: {what} failed: {msg}") from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 1.0)
            finally:
                cur.close()

    def snapshot(self) -> int:
        """The lake's current snapshot id (every commit makes one)."""
        cur = self.cursor()
        try:
            return int(cur.execute(f"FROM {self.alias}.current_snapshot()").fetchone()[0])
        finally:
            cur.close()

    def compact(self) -> dict[str, int]:
        """Flush inlined rows to Parquet and merge small files: data files before and after."""
        before = len(self.files())
        alias = self.alias

        def run(cur):
            cur.execute(f"CALL ducklake_flush_inlined_data({quote(alias)})")
            cur.execute(f"CALL ducklake_merge_adjacent_files({quote(alias)})")

        self._retry(run, "compaction", begin=False)
        return {"files_before": before, "files_after": len(self.files())}

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
    def _insert(self, cur, table: str, t: pa.Table, *, iteration: int, stage: str, run_key: str, part: str) -> int:
        """Insert rows already conformed by to_table (write_many and replace_run conform before the transaction)."""
        if "lake_snapshot" in t.column_names and t["lake_snapshot"].null_count:  # the snapshot the stage read
            now = cur.execute(f"FROM {self.alias}.current_snapshot()").fetchone()[0]
            i = t.schema.get_field_index("lake_snapshot")
            t = t.set_column(i, t.schema.field(i), t["lake_snapshot"].fill_null(int(now)))
        name = f"_rows_{uuid.uuid4().hex[:10]}"
        cur.register(name, t)
        try:
            extra = (
                f"{int(iteration)}::INTEGER AS iteration, {quote(stage)} AS stage, {quote(f'{run_key}/{part}')} AS part"
            )
            cur.execute(f"INSERT INTO {self.ref(table)} BY NAME SELECT *, {extra} FROM {name}")
        finally:
            cur.unregister(name)
        return len(t)

    @staticmethod
    def where(iteration: int, stage: str, run_key: str, part: str | None = None) -> str:
        """SQL condition for the rows one writer call made: `part` holds `<run_key>/<part>` (keys have no '/')."""
        w = f"iteration = {int(iteration)} AND stage = {quote(stage)} AND "
        if part is not None:
            return w + f"part = {quote(run_key + '/' + part)}"
        return w + f"starts_with(part, {quote(run_key + '/')})"

    @staticmethod
    def _check(iteration, stage: str, run_key: str, part: int | str | None = None) -> str | None:
        if not isinstance(iteration, int) or iteration < 0:
            raise LakeError(f"iteration must be a non-negative integer, got {iteration!r}")
        _check_key("stage", stage)
        _check_key("run_key", run_key)
        if part is None:
            return None
        return f"{part:05d}" if isinstance(part, int) else _check_key("part", str(part))

    def write_many(
        self,
        tables: Sequence[tuple[str, Sequence[dict] | pa.Table]],
        *,
        iteration: int,
        stage: str,
        run_key: str,
        part: int | str = 0,
        replace: bool = True,
    ) -> str:
        """One transaction: for each (table, rows), replace that table's rows of this part of the run.

        replace=False: the caller knows no row of this part exists (a rollout runner read the run's episodes
        before handing out a new episode id), so the DELETE, whose scan costs more than the insert, is skipped."""
        part_s = self._check(iteration, stage, run_key, part)
        conformed = [(table, to_table(table, rows)) for table, rows in tables]

        def run(cur):
            for table, t in conformed:
                if replace:
                    cur.execute(f"DELETE FROM {self.ref(table)} WHERE {self.where(iteration, stage, run_key, part_s)}")
                self._insert(cur, table, t, iteration=iteration, stage=stage, run_key=run_key, part=part_s)

        self._retry(run, f"writing {run_key}/{part_s}")
        self._flush_when_due(conformed)
        return f"{run_key}-{part_s}"

    def _flush_when_due(self, written: Sequence[tuple[str, pa.Table]]) -> None:
        """Small inserts are inlined in the catalog, and every read of a table scans its inlined rows whole: once
        this process has inlined FLUSH_ROWS rows of a table since its last flush, they go to one Parquet file."""
        for table, t in written:
            if 0 < len(t) <= INLINE_ROWS:  # DuckLake inlines an insert of this many rows; more go to a file
                self._inlined[table] = self._inlined.get(table, 0) + len(t)
        due = [table for table, n in self._inlined.items() if n >= FLUSH_ROWS]
        for table in due:
            call = f"CALL ducklake_flush_inlined_data({quote(self.alias)}, table_name => {quote(table)})"
            self._retry(
                lambda cur: cur.execute(call),
                f"flushing {table}",
                begin=False,
            )
            self._inlined[table] = 0

    def write(
        self,
        table: str,
        rows: Sequence[dict] | pa.Table,
        *,
        iteration: int,
        stage: str,
        run_key: str,
        part: int | str = 0,
    ) -> str:
        """Write one part of a stage run in one transaction (replacing the same part of an earlier attempt)."""
        return self.write_many([(table, rows)], iteration=iteration, stage=stage, run_key=run_key, part=part)

    def replace_run(
        self, table: str, parts: Iterable[Sequence[dict] | pa.Table], *, iteration: int, stage: str, run_key: str
    ) -> list[str]:
        """Write a whole stage run as parts 0..n-1, replacing everything an earlier attempt wrote: one transaction."""
        self._check(iteration, stage, run_key)
        conformed = [to_table(table, p) for p in parts]

        def run(cur):
            cur.execute(f"DELETE FROM {self.ref(table)} WHERE {self.where(iteration, stage, run_key)}")
            for i, t in enumerate(conformed):
                self._insert(cur, table, t, iteration=iteration, stage=stage, run_key=run_key, part=f"{i:05d}")

        self._retry(run, f"writing {table} of {run_key}")
        return [f"{table}/{run_key}-{i:05d}" for i in range(len(conformed))]

    def delete_run(self, table: str, *, iteration: int, stage: str, run_key: str) -> int:
        self._check(iteration, stage, run_key)

        def run(cur):
            return cur.execute(
                f"DELETE FROM {self.ref(table)} WHERE {self.where(iteration, stage, run_key)}"
            ).fetchone()[0]

        return int(self._retry(run, f"deleting {table} of {run_key}") or 0)

    # ------------------------------------------------------------------ reads
    def files(self, table: str | None = None) -> list[LakeFile]:
        """The tables' current Parquet data files (inlined rows live in the catalog and have none)."""
        out: list[LakeFile] = []
        cur = self.cursor()
        try:
            for name in [table] if table else TABLES:
                rows = cur.execute(
                    f"SELECT data_file, data_file_size_bytes FROM ducklake_list_files({quote(self.alias)}, "
                    f"{quote(name)})"
                ).fetchall()
                out += [LakeFile(name, str(p), int(n or 0)) for p, n in rows]
        finally:
            cur.close()
        return out

    def has_data(self, table: str) -> bool:
        cur = self.cursor()
        try:
            return cur.execute(f"SELECT 1 FROM {self.ref(table)} LIMIT 1").fetchone() is not None
        finally:
            cur.close()

    def rows(self, table: str, where: str = "true", columns: str = "*", at: int | None = None) -> list[dict]:
        """Rows of a table as dicts (a small lookup; use storage.catalog.connect for queries)."""
        cur = self.cursor()
        try:
            res = cur.execute(f"SELECT {columns} FROM {self.ref(table, at)} WHERE {where}")
            names = [d[0] for d in res.description]
            return [dict(zip(names, r)) for r in res.fetchall()]
        finally:
            cur.close()

    @property
    def filesystem(self):
        """The fsspec filesystem of an object-store lake (None on disk): for pyarrow's `filesystem=`."""
        return self.store.fs if self.store else None

    def parquet_file(self, path: str) -> pq.ParquetFile:
        return pq.ParquetFile(str(path), filesystem=self.filesystem)


def open_lake(
    source: Any = None,
    *,
    root: str | os.PathLike | None = None,
    endpoint: str | None = None,
    create: bool = True,
    catalog: str | None = None,
) -> Lake:
    """The one way to open a lake: every stage, command, worker and report opens it here.

        open_lake(cfg)                      # a FlywheelConfig: $FLYWHEEL_LAKE, else cfg.lake.root
        open_lake(cfg.lake, root=lake_arg)  # a LakeConfig, with a command's --lake for the root
        open_lake("runs/lake", create=False)
        open_lake(spec.lake_root, endpoint=spec.lake_endpoint)   # a rollout worker: the spec's root and endpoint

    source: a config with a `lake` section (FlywheelConfig), a lake section (LakeConfig: root, s3_endpoint,
    cache_dir, catalog), a Lake (returned as it is), or a folder / s3:// URI (None: $FLYWHEEL_LAKE, else ./lake).
    From a config, the root is `root` (a command's --lake), else $FLYWHEEL_LAKE (which --lake sets, so it reaches
    every process the command starts), else lake.root; the endpoint is `endpoint`, else $FLYWHEEL_S3_ENDPOINT, else
    lake.s3_endpoint; an s3:// lake keeps its side files in lake.cache_dir. A path is opened as given (an s3:// one
    at `endpoint`, else $FLYWHEEL_S3_ENDPOINT's). create=False: a missing lake is a LakeError."""
    if isinstance(source, Lake):
        return source
    section = getattr(source, "lake", source)  # duck-typed: storage imports no config model
    if not hasattr(section, "root") or isinstance(section, (str, os.PathLike)):  # a Path has a .root too
        return Lake(source, create=create, endpoint=endpoint, catalog=catalog)
    where = root or os.environ.get("FLYWHEEL_LAKE") or section.root
    return Lake(
        where,
        create=create,
        endpoint=endpoint or os.environ.get("FLYWHEEL_S3_ENDPOINT") or section.s3_endpoint,
        cache_dir=section.cache_dir,
        catalog=getattr(section, "catalog", None) if str(where) == str(section.root) else None,  # another lake's not
    )
