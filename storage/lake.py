"""The lake: a DuckLake catalog plus Parquet data, written in transactions under deterministic run keys.

    lake = open_lake("lake")      # or open_lake(cfg): $FLYWHEEL_LAKE, else cfg.lake.root
    lake.write("episodes", rows, iteration=0, stage="rollouts", run_key="rollouts-ab12", part="ep-0007")
    lake.replace_run("datasets", [table], iteration=1, stage="curate", run_key="curate-1")

The layout (catalog file or PostgreSQL, `data/`, side folders; the `iteration`, `stage` and `part` columns) is in
docs/SCHEMA.md. A write is one transaction that deletes the rows of (table, iteration, stage, run_key, part) and
inserts the new ones: a rerun replaces instead of duplicating, and a reader sees all of a write or none of it.
Writers in several processes race on the catalog, and a commit that loses is retried from its DELETE
(storage.duck.transaction). Every commit is a snapshot (`snapshot()`; `connect(lake, at=n)` reads the lake as of
n). An s3:// lake's tables live in the bucket (httpfs); its `root` is a local folder for side files, and
`publish` / `fetch` carry an export or checkpoint folder to and from the bucket under its lake-relative path.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import duckdb
import pyarrow as pa

from storage.attach import attach, catalog_spec
from storage.duck import database, quote, transaction
from storage.errors import LakeError
from storage.objstore import ObjectStore, default_cache_dir, is_object_uri
from storage.rows import to_table
from storage.schema import TABLES, schema_for

_KEY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.=+-]{0,160}$")
CATALOG_FILE = "catalog.sqlite"
DATA_DIR = "data"
INLINE_ROWS = 10  # DuckLake's default data_inlining_row_limit: inserts of at most this many rows stay in the catalog
FLUSH_ROWS = int(os.environ.get("FLYWHEEL_LAKE_FLUSH_ROWS", "1000"))  # a writer's inlined rows per Parquet file
# Held by the catalog's maintenance calls (flush, merge) and by the lake lock's heartbeat (storage/lock.py), so that
# the heartbeat's write to the catalog never runs beside them in this process: one fresh-clone suite aborted natively
# inside ducklake_merge_adjacent_files while the heartbeat wrote the same SQLite catalog (session 27, docs/LOG.md).
MAINTENANCE = threading.Lock()


__all__ = ["Lake", "LakeError", "LakeFile", "open_lake", "to_table"]


def _check_key(what: str, value: str) -> str:
    if not _KEY_RE.match(value) or ".." in value:
        raise LakeError(f"invalid {what} {value!r}: use letters, digits and _ . = + - (no slashes)")
    return value


@dataclass(frozen=True)
class LakeFile:
    """One Parquet data file of a table (DuckLake's list)."""

    table: str
    path: str
    size: int = 0


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
        """A folder, or `s3://bucket/prefix` at `endpoint` with side files in `cache_dir`; `catalog`: a postgresql://
        URL or a SQLite file (default `<root>/catalog.sqlite`)."""
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
            self.root = Path(raw).expanduser().resolve()
            if self.root.exists() and not self.root.is_dir():
                raise LakeError(f"lake root {self.root} is not a directory")
            self.data_path = str(self.root / DATA_DIR) + "/"
        self.catalog, self._ext = catalog_spec(catalog or str(self.root / CATALOG_FILE))
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
        return attach(self)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of this process's database, with the lake attached (as `self.alias`)."""
        self.alias  # noqa: B018 - attaches the lake on first use
        return database().cursor()

    def ref(self, table: str, at: int | None = None) -> str:
        """SQL name of a table (as of snapshot `at`, when given)."""
        schema_for(table)
        return f'{self.alias}."{table}"' + (f" AT (VERSION => {int(at)})" if at is not None else "")

    def transaction(self, fn: Callable[[Any], Any], what: str, *, begin: bool = True) -> Any:
        """fn(cursor) in one transaction, run again from the start while its commit loses a race to another
        writer (storage.duck.transaction); a failure is one LakeError line naming `what`."""
        try:
            return transaction(fn, begin=begin)
        except duckdb.Error as e:
            raise LakeError(f"lake {self.location}: {what} failed: {str(e).splitlines()[0][:300]}") from None

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

        with MAINTENANCE:
            self.transaction(run, "compaction", begin=False)
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

        self.transaction(run, f"writing {run_key}/{part_s}")
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
            with MAINTENANCE:
                self.transaction(lambda cur: cur.execute(call), f"flushing {table}", begin=False)
            self._inlined[table] = 0

    def write(self, table: str, rows: Sequence[dict] | pa.Table, **key: Any) -> str:
        """One table's rows of one part of a stage run (keys as in write_many), in one transaction."""
        return self.write_many([(table, rows)], **key)

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

        self.transaction(run, f"writing {table} of {run_key}")
        return [f"{table}/{run_key}-{i:05d}" for i in range(len(conformed))]

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


def open_lake(
    source: Any = None,
    *,
    root: str | os.PathLike | None = None,
    endpoint: str | None = None,
    create: bool = True,
    catalog: str | None = None,
) -> Lake:
    """The one way to open a lake: every stage, command, worker and report opens it here.

        open_lake(cfg)                      # a FlywheelConfig (or its LakeConfig section)
        open_lake(cfg.lake, root=lake_arg)  # with a command's --lake for the root
        open_lake("runs/lake", create=False)  # a folder or s3:// URI (its endpoint: `endpoint`, else the env's)

    From a config, the root is `root`, else $FLYWHEEL_LAKE (which --lake sets, so it reaches every process the
    command starts), else lake.root; the endpoint is `endpoint`, else $FLYWHEEL_S3_ENDPOINT, else lake.s3_endpoint.
    A Lake is returned as it is. create=False: a missing lake is a LakeError."""
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
