"""DuckDB over the lake: a connection whose unqualified table names are the lake's tables.

    con = connect("lake")                  # views tasks, episodes, steps, ... over the DuckLake tables
    con.sql("SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1").show()
    old = connect("lake", at=12)           # the lake as of snapshot 12 (time travel)

Each view is `SELECT * EXCLUDE (part) FROM <lake>.<table>`: the table's columns plus `iteration` and `stage`.
DuckDB reads only the columns a query names, so a query that does not name `screenshot` never reads its bytes.

The plain `duckdb` CLI opens the same lake: docs/SCHEMA.md says how.
"""

from __future__ import annotations

import os
import re
import threading
from typing import Any

import duckdb

from storage.duck import database, quote
from storage.lake import Lake, LakeError, open_lake
from storage.schema import TABLES

_VIEWS_LOCK = threading.Lock()
_VIEWS: set[tuple[int, str]] = set()  # (pid, schema) already made


def _views(lake: Lake, at: int | None) -> str:
    """The in-memory schema holding this lake's views (as of snapshot `at`), made once per process."""
    alias = lake.alias
    schema = f"v_{alias}" + (f"_at{int(at)}" if at is not None else "")
    with _VIEWS_LOCK:
        if (os.getpid(), schema) not in _VIEWS:
            cur = database().cursor()
            try:
                cur.execute(f"CREATE SCHEMA IF NOT EXISTS memory.{schema}")
                for table in TABLES:
                    cur.execute(
                        f'CREATE OR REPLACE VIEW memory.{schema}."{table}" AS '
                        f"SELECT * EXCLUDE (part) FROM {lake.ref(table, at)}"
                    )
            except duckdb.Error as e:
                raise LakeError(explain_duckdb_error(e, lake)) from None
            finally:
                cur.close()
            _VIEWS.add((os.getpid(), schema))
    return schema


def runs_sql(lake: Lake, table: str, run_keys: list[str]) -> str:
    """The SELECT of `table`'s view restricted to these run keys."""
    keys = ", ".join(quote(k) for k in run_keys) or "NULL"
    return f"SELECT * EXCLUDE (part) FROM {lake.ref(table)} WHERE run_key IN ({keys})"


class FilteredRows:
    """The rows of one table that pass a fixed filter, asked again and again of a growing lake (RL replay, every
    round). DuckLake answers it from its catalog and a few compacted files, so it is one query each time.

        succ = FilteredRows(lake, "episodes", "episode_id, task_id", "success AND split = 'train'")
        succ.rows(con)   # list of dicts
    """

    def __init__(self, lake: Lake, table: str, columns: str, where: str):
        self.lake, self.table, self.columns, self.where = lake, table, columns, where

    def rows(self, con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
        cur = con.execute(f"SELECT {self.columns} FROM {self.lake.ref(self.table)} WHERE {self.where}")
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def connect(
    root: str | os.PathLike | Lake | None = None, *, threads: int | None = None, at: int | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection whose tasks, episodes, steps, ... are the lake's tables (as of snapshot `at`).
    The lake must exist."""
    lake = open_lake(root, create=False)
    if at is not None:
        last = lake.snapshot()
        if not 0 <= int(at) <= last:
            raise LakeError(f"no snapshot {at} in the lake {lake.location} (its snapshots are 0..{last})")
    schema = _views(lake, at)
    con = database().cursor()
    if threads:
        con.execute(f"SET threads = {int(threads)}")
    con.execute(f"USE memory.{schema}")
    return con


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
        return f"unreadable lake file {m.group(1)}: {msg[:200]} (run `flywheel lake verify` to name every bad file)"
    return f"query failed: {msg}"
