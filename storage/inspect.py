"""Lake health: per-table stats from the catalog, and a verifier that reads every data file.

stats = lake_stats(open_lake("lake"))      # rows, bytes, data files, partitions per table
report = verify_lake(open_lake("lake"))    # data files that do not read back, by path
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq

from storage.duck import quote
from storage.lake import Lake
from storage.schema import TABLES


@dataclass
class TableStats:
    table: str
    rows: int = 0
    bytes: int = 0
    files: int = 0
    partitions: set[tuple[int, str]] = field(default_factory=set)
    unreadable: int = 0


def lake_stats(lake: Lake) -> dict[str, TableStats]:
    out = {t: TableStats(t) for t in TABLES}
    for f in lake.files():
        out[f.table].files += 1
        out[f.table].bytes += f.size
    cur = lake.cursor()
    try:
        for t, s in out.items():
            try:
                parts = cur.execute(f"SELECT iteration, stage, count(*) FROM {lake.ref(t)} GROUP BY ALL").fetchall()
            except duckdb.Error:  # a data file does not read: count the bad ones (verify names them)
                s.unreadable = sum(_problem(lake, f.path, False) is not None for f in lake.files(t))
                continue
            s.partitions = {(i, st) for i, st, _ in parts}
            s.rows = sum(n for *_, n in parts)
    finally:
        cur.close()
    return out


@dataclass
class BadFile:
    path: str  # s3:// string in an object-store lake
    table: str
    problem: str


@dataclass
class VerifyReport:
    checked: int = 0
    bad: list[BadFile] = field(default_factory=list)


def _problem(lake: Lake, path: str, full: bool) -> str | None:
    try:
        pf = pq.ParquetFile(str(path), filesystem=lake.store.fs if lake.store else None)
        if full:  # decode every page: catches corrupt data, not just a bad footer
            for i in range(pf.num_row_groups):
                pf.read_row_group(i)
        return None
    except (OSError, pa.ArrowException, ValueError) as e:
        return f"unreadable: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}"


def verify_lake(lake: Lake, *, full: bool = True) -> VerifyReport:
    """Every data file of every table, read back; then every table scanned through DuckLake."""
    rep = VerifyReport()
    for f in lake.files():
        rep.checked += 1
        problem = _problem(lake, f.path, full)
        if problem:
            rep.bad.append(BadFile(f.path, f.table, problem))
    cur = lake.cursor()
    try:
        for t in TABLES:
            try:
                cur.execute(f"SELECT count(*) FROM {lake.ref(t)}").fetchone()
            except Exception as e:  # noqa: BLE001 - any catalog failure is named
                rep.bad.append(BadFile(quote(t), t, f"the table does not scan: {str(e).splitlines()[0][:200]}"))
    finally:
        cur.close()
    return rep
