"""DuckDB over the lake: one view per table, plus a catalog file for the plain `duckdb` CLI.

    con = connect("lake")                  # in-memory DuckDB with views tasks, episodes, steps, ...
    con.sql("SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1").show()

    $ cd lake && duckdb -readonly catalog.duckdb   # the same views from the DuckDB CLI

Views glob `<table>/*/*/*.parquet` with hive partitioning (iteration, stage from the path)
and `union_by_name`, so files written by an older schema version (missing newer nullable
columns) read as NULL. A table with no files yet is an empty typed view. Parquet column
pruning means a query that does not name `screenshot` never reads its bytes.

The in-memory connection's views use absolute globs (any working directory). The catalog
file's views use globs relative to the lake root, which DuckDB resolves against the working
directory (or `SET file_search_path = '<lake>'`): so open it from inside the lake, and a
copied or moved lake's catalog still works without being rewritten.

An object-store lake (`s3://bucket/prefix`) has the same views over `s3://` globs. DuckDB reads them through the
lake's fsspec filesystem registered on the connection (`con.register_filesystem`): DuckDB's own `httpfs`
extension is downloaded from the extension repository on first use, which an offline machine cannot reach (and
the PyPI wheels that ship it are built for older DuckDB versions, which refuse to load it). Such a lake has no
catalog file: a plain `duckdb` CLI would need httpfs; use `flywheel query`.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from pathlib import Path
from typing import Any

import duckdb

from storage.lake import Lake, LakeError, open_lake
from storage.schema import PARTITION_COLUMNS, TABLES, duckdb_type

CATALOG_FILE = "catalog.duckdb"
_CATALOG_SIG = ".catalog.json"


class QueryError(Exception):
    """A user's SQL failed: the message is one clear line."""


def _q(s: str) -> str:
    return "'" + s.replace("'", "''") + "'"


def view_sql(lake: Lake, table: str, *, relative: bool = False) -> str:
    """The SELECT behind a table's view (empty typed SELECT when the table has no files).

    `relative`: glob relative to the lake root (the catalog file, which must survive a moved lake)."""
    if lake.has_data(table):
        if lake.remote:
            glob = f"{lake.uri}/{table}/*/*/*.parquet"
        else:
            glob = f"{table}/*/*/*.parquet" if relative else str(lake.root / table / "*" / "*" / "*.parquet")
        return _read(_q(glob))
    return _empty_sql(table)


def _read(files_sql: str, *, filename: bool = False) -> str:
    hive_types = ", ".join(f"'{k}': '{v}'" for k, v in PARTITION_COLUMNS.items())
    return (
        f"SELECT * FROM read_parquet({files_sql}, hive_partitioning=true, union_by_name=true, "
        f"hive_types={{{hive_types}}}{', filename=true' if filename else ''})"
    )


def _empty_sql(table: str) -> str:
    cols = [f'NULL::{duckdb_type(f.type)} AS "{f.name}"' for f in TABLES[table]]
    cols += [f"NULL::{t} AS {k}" for k, t in PARTITION_COLUMNS.items()]
    return f"SELECT {', '.join(cols)} WHERE false"


def runs_sql(lake: Lake, table: str, run_keys: list[str]) -> str:
    """The SELECT of `table`'s view restricted to these run keys, reading only their files (the view's glob opens
    every file of the table to filter it: seconds in a lake of thousands of per-episode files)."""
    files = [str(f) for f in lake.files_of_runs(table, run_keys)]
    if not files:
        return _empty_sql(table)
    keys = ", ".join(_q(k) for k in run_keys)
    return _read(f"[{', '.join(_q(f) for f in files)}]") + f" WHERE run_key IN ({keys})"


class FilteredRows:
    """The rows of one table that pass a fixed filter, read file by file and kept per file: a later `rows()` opens
    only the files added or rewritten since (told by size and, on disk, mtime), and forgets removed ones. For a
    question asked again and again of a growing lake of per-episode files (RL replay, every round): the view
    opens all of them each time (~5-10 s at 20k files), this only the round's new ones. Same rows, in file order.

        succ = FilteredRows(lake, "episodes", "episode_id, task_id", "success AND split = 'train'")
        succ.rows(con)   # list of dicts
    """

    CHUNK = 2000  # files per read_parquet call

    def __init__(self, lake: Lake, table: str, columns: str, where: str):
        self.lake, self.table, self.columns, self.where = lake, table, columns, where
        self.kept: dict[str, tuple[tuple[int, int], list[dict[str, Any]]]] = {}

    def rows(self, con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
        files = [(str(f.path), (f.size, f.mtime_ns)) for f in self.lake.files(self.table)]
        new = [p for p, sig in files if self.kept.get(p, (None,))[0] != sig]
        got: dict[str, list[dict[str, Any]]] = {p: [] for p in new}
        for k in range(0, len(new), self.CHUNK):
            part = ", ".join(_q(p) for p in new[k : k + self.CHUNK])
            cur = con.execute(
                f"SELECT filename AS _file, {self.columns} FROM ({_read(f'[{part}]', filename=True)}) "
                f"WHERE {self.where}"
            )
            names = [d[0] for d in cur.description]
            for row in cur.fetchall():
                got[row[0]].append(dict(zip(names[1:], row[1:])))
        self.kept = {p: (sig, got[p] if p in got else self.kept[p][1]) for p, sig in files}
        return [r for p, _ in files for r in self.kept[p][1]]


def create_views(con: duckdb.DuckDBPyConnection, lake: Lake, *, relative: bool = False) -> None:
    for table in TABLES:
        con.execute(f'CREATE OR REPLACE VIEW "{table}" AS {view_sql(lake, table, relative=relative)}')


def connect(
    root: str | os.PathLike | Lake | None = None, *, threads: int | None = None, write_catalog_file: bool = True
) -> duckdb.DuckDBPyConnection:
    """In-memory DuckDB connection with a view per lake table. The lake must exist."""
    lake = open_lake(root, create=False)
    con = duckdb.connect(":memory:")
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    if lake.remote:
        con.register_filesystem(lake.filesystem)  # s3:// globs and reads go through the lake's own client
    try:
        create_views(con, lake)
    except duckdb.Error as e:
        con.close()
        raise LakeError(explain_duckdb_error(e, lake)) from None
    if write_catalog_file and not lake.remote:
        try:
            ensure_catalog(lake)
        except (OSError, duckdb.Error):
            pass  # the catalog file is a convenience for the CLI; never fail a query over it
    return con


def ensure_catalog(lake: Lake) -> Path:
    """(Re)write `<root>/catalog.duckdb` when the set of non-empty tables changed.

    Its views glob relative to the lake root, so the signature holds no root: a moved or copied
    lake keeps its catalog as is. ("paths" marks the relative layout: a catalog written with
    absolute paths by an older version has another signature and is rewritten once.)
    Built under a temp name and renamed, so concurrent writers and readers never see half a file.
    """
    path = lake.root / CATALOG_FILE
    sig = json.dumps({"paths": "relative", "tables": {t: lake.has_data(t) for t in TABLES}}, sort_keys=True)
    sig_path = lake.root / _CATALOG_SIG
    if path.exists() and sig_path.exists() and sig_path.read_text() == sig:
        return path
    tmp = lake.root / f".catalog.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    con = duckdb.connect(str(tmp))
    try:
        # creating a view binds it, which globs now: resolve the relative globs against the lake root
        # (a session setting, not stored in the file) instead of this process's working directory
        con.execute(f"SET file_search_path = {_q(str(lake.root))}")
        create_views(con, lake, relative=True)
    finally:
        con.close()
    os.replace(tmp, path)
    wal = Path(str(tmp) + ".wal")
    wal.unlink(missing_ok=True)
    sig_tmp = sig_path.with_suffix(f".{uuid.uuid4().hex[:8]}.tmp")
    sig_tmp.write_text(sig)
    os.replace(sig_tmp, sig_path)
    return path


_FILE_RE = re.compile(r"""(?:file|File)\s*["']?([^"'\s]+\.parquet)""")


def explain_duckdb_error(e: Exception, lake: Lake | None = None) -> str:
    """Turn a DuckDB exception into one line a user can act on."""
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if isinstance(
        e, (duckdb.ParserException, duckdb.CatalogException, duckdb.BinderException, duckdb.ConversionException)
    ):
        return f"SQL error: {msg}"
    m = _FILE_RE.search(str(e))
    if m and isinstance(e, (duckdb.IOException, duckdb.InvalidInputException)):
        return (
            f"unreadable lake file {m.group(1)}: {msg[:200]} "
            f"(run `flywheel lake verify --quarantine` to move bad files aside)"
        )
    return f"query failed: {msg}"


def run_query(con: duckdb.DuckDBPyConnection, sql: str, lake: Lake | None = None):
    """Execute SQL and fetch the result as an Arrow table, with one-line QueryErrors."""
    if not sql or not sql.strip():
        raise QueryError("empty SQL statement")
    try:
        rel = con.sql(sql)
        if rel is None:  # a statement without a result (SET, CREATE ...)
            import pyarrow as pa

            return pa.table({})
        return rel.to_arrow_table()
    except duckdb.Error as e:
        raise QueryError(explain_duckdb_error(e, lake)) from None


def export_query(con: duckdb.DuckDBPyConnection, sql: str, out: Path, fmt: str, lake: Lake | None = None) -> Path:
    """COPY a query's result to a csv/json/parquet file (written atomically)."""
    opts = {"csv": "FORMAT CSV, HEADER", "json": "FORMAT JSON, ARRAY true", "parquet": "FORMAT PARQUET"}
    if fmt not in opts:
        raise QueryError(f"unknown format {fmt!r}; use one of {', '.join(opts)}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.{uuid.uuid4().hex[:8]}.tmp"
    body = sql.strip().rstrip(";")
    try:
        con.execute(f"COPY ({body}) TO {_q(str(tmp))} ({opts[fmt]})")
        os.replace(tmp, out)
    except duckdb.Error as e:
        raise QueryError(explain_duckdb_error(e, lake)) from None
    finally:
        tmp.unlink(missing_ok=True)
    return out
