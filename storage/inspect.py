"""Lake health: per-table stats from Parquet footers, and a verifier for bad files.

stats = lake_stats(open_lake("lake"))      # rows, bytes, files, partitions per table (reads footers only)
report = verify_lake(open_lake("lake"))    # unreadable / schema-mismatched files, by path
for bad in report.bad: lake.quarantine(bad.path)   # moved aside, never deleted
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from storage.lake import Lake
from storage.schema import SCHEMA_VERSION, TABLES


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
        s = out[f.table]
        s.files += 1
        s.bytes += f.size
        s.partitions.add((f.iteration, f.stage))
        try:
            s.rows += lake.parquet_file(f.path).metadata.num_rows
        except Exception:  # noqa: BLE001 - any unreadable footer is counted, verify names it
            s.unreadable += 1
    return out


@dataclass
class BadFile:
    path: Path | str  # s3:// string in an object-store lake
    table: str
    problem: str


@dataclass
class VerifyReport:
    checked: int = 0
    bad: list[BadFile] = field(default_factory=list)
    older_version: int = 0  # readable files missing newer nullable columns (fine, reported)


def _schema_problem(table: str, got: pa.Schema) -> tuple[str | None, bool]:
    """(problem, is_older_version) for a file's schema against the table's current schema."""
    want = TABLES[table]
    unknown = [n for n in got.names if n not in want.names]
    if unknown:
        return f"unknown columns {unknown}", False
    for f in got:
        wf = want.field(f.name)
        if not f.type.equals(wf.type):
            return f"column {f.name!r} is {f.type}, expected {wf.type}", False
    missing = [f for f in want if f.name not in got.names]
    required = [f.name for f in missing if not f.nullable]
    if required:
        return f"missing required columns {required}", False
    return None, bool(missing)


def verify_file(
    path: Path | str, table: str, *, full: bool = True, lake: Lake | None = None
) -> tuple[str | None, bool]:
    try:
        pf = lake.parquet_file(path) if lake else pq.ParquetFile(path)
        problem, older = _schema_problem(table, pf.schema_arrow)
        if problem:
            return problem, False
        version = (pf.schema_arrow.metadata or {}).get(b"flywheel.schema_version")
        if version is not None and int(version) > SCHEMA_VERSION:
            return f"written by a newer schema version {int(version)} (this code knows {SCHEMA_VERSION})", False
        if full:  # decode every page: catches corrupt data, not just a bad footer
            for i in range(pf.num_row_groups):
                pf.read_row_group(i)
        return None, older
    except Exception as e:  # noqa: BLE001 - every failure mode of a bad file ends here, named
        return f"unreadable: {str(e).splitlines()[0][:200] if str(e) else type(e).__name__}", False


def verify_lake(lake: Lake, *, full: bool = True) -> VerifyReport:
    rep = VerifyReport()
    for f in lake.files():
        rep.checked += 1
        problem, older = verify_file(f.path, f.table, full=full, lake=lake)
        if problem:
            rep.bad.append(BadFile(f.path, f.table, problem))
        elif older:
            rep.older_version += 1
    return rep
