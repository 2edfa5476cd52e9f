"""`flywheel lake migrate OLD NEW`: an old-layout lake (one Parquet file per write, under
`<table>/iteration=<n>/stage=<stage>/<run_key>-<part>.parquet`) into a DuckLake lake.

    counts = migrate(Path("runs/old-lake"), open_lake("runs/new-lake"))   # {table: {"old": n, "new": n}}

Each table is copied in one transaction, so a killed migration leaves the table as it was, and a rerun replaces
the runs it copied before (same iteration, stage and run key) instead of duplicating them. A file that does not
read back is named and left out (its rows are not counted on either side); every other file is copied.
Side folders (exports, checkpoints) are copied as they are, so the rows' lake-relative paths still resolve.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq

from storage.duck import quote
from storage.lake import CATALOG_FILE, DATA_DIR, Lake, LakeError
from storage.schema import PARTITION_COLUMNS, TABLES

_OLD_SIDE_FILES = {"catalog.duckdb", ".catalog.json", ".flywheel.lock", "_quarantine", CATALOG_FILE, DATA_DIR}


def migrate(old: Path, lake: Lake, *, log: Callable[[str], None] = print) -> dict[str, dict[str, int]]:
    old = Path(old).expanduser().resolve()
    if not any((old / t).is_dir() for t in TABLES):
        raise LakeError(f"{old} has no table folders ({', '.join(TABLES)}): not a lake in the old layout")
    if lake.remote is False and old == lake.root:
        raise LakeError("migrate into another folder: the new lake cannot be the old one")
    out: dict[str, dict[str, int]] = {}
    hive = ", ".join(f"'{k}': '{v}'" for k, v in PARTITION_COLUMNS.items())
    for table in TABLES:
        good, n_old = [], 0
        for f in sorted((old / table).glob("iteration=*/stage=*/*.parquet")):
            try:
                n_old += pq.ParquetFile(f).metadata.num_rows
                good.append(str(f))
            except Exception as e:  # noqa: BLE001 - one bad file rejects only itself, by name
                log(f"skipped {f}: unreadable ({str(e).splitlines()[0][:160]})")
        if not good:
            out[table] = {"old": 0, "new": 0}
            continue
        files = "[" + ", ".join(quote(f) for f in good) + "]"
        src = (
            f"SELECT * EXCLUDE (filename), run_key || '/' || substr(regexp_extract(filename, '([^/]*)[.]parquet$', 1), "
            f"length(run_key) + 2) AS part FROM read_parquet({files}, hive_partitioning=true, union_by_name=true, "
            f"hive_types={{{hive}}}, filename=true)"
        )

        def copy(cur, table=table, src=src):
            cur.execute(f"CREATE OR REPLACE TEMP TABLE _old AS {src}")
            cur.execute(
                f"DELETE FROM {lake.ref(table)} WHERE (iteration, stage, part) IN "
                "(SELECT DISTINCT iteration, stage, part FROM _old)"
            )
            cur.execute(f"INSERT INTO {lake.ref(table)} BY NAME SELECT * FROM _old")
            cur.execute("DROP TABLE _old")

        lake.transaction(copy, f"migrating {table}")
        cur = lake.cursor()
        try:
            n_new = cur.execute(f"SELECT count(*) FROM {lake.ref(table)}").fetchone()[0]
        finally:
            cur.close()
        out[table] = {"old": n_old, "new": int(n_new)}
        log(f"{table}: {len(good)} file(s), {n_old:,} rows")
    for side in sorted(old.iterdir()):
        if side.name in TABLES or side.name in _OLD_SIDE_FILES or side.name.startswith("."):
            continue
        dest = lake.root / side.name
        if side.is_dir():
            shutil.copytree(side, dest, dirs_exist_ok=True)
        else:
            shutil.copy2(side, dest)
        lake.publish(dest)
    lake.compact()
    return out
