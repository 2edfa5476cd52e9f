"""A user's SQL over the lake (`flywheel query`, `flywheel lake query`): one result, or one QueryError line.

con = storage.catalog.connect("lake")
table = run_query(con, "SELECT task_id, avg(success::INT) FROM episodes GROUP BY 1")
export_query(con, "SELECT * FROM evals", Path("evals.csv"), "csv")
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import duckdb
import pyarrow as pa

from storage.catalog import explain_duckdb_error
from storage.duck import quote
from storage.lake import Lake


class QueryError(Exception):
    """A user's SQL failed: the message is one clear line."""


def run_query(con: duckdb.DuckDBPyConnection, sql: str, lake: Lake | None = None):
    """Execute SQL and fetch the result as an Arrow table, with one-line QueryErrors."""
    if not sql or not sql.strip():
        raise QueryError("empty SQL statement")
    try:
        rel = con.sql(sql)
        if rel is None:  # a statement without a result (SET, CREATE ...)
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
        con.execute(f"COPY ({body}) TO {quote(str(tmp))} ({opts[fmt]})")
        os.replace(tmp, out)
    except duckdb.Error as e:
        raise QueryError(explain_duckdb_error(e, lake)) from None
    finally:
        tmp.unlink(missing_ok=True)
    return out
