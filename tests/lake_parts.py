"""What each write left in a lake, for tests that check a rerun rewrote nothing it had finished.

    parts = written_parts(lake_root)   # {"episodes/iteration=0/stage=bootstrap/<run_key>-<part>": (row ids...)}

The keys mirror the old one-file-per-write layout (a partition, then the write); the values are the rows' DuckLake
row ids, which a rewrite (a rerun's delete + insert) changes and compaction keeps.
"""

from __future__ import annotations

from storage.lake import Lake
from storage.schema import TABLES


def written_parts(root) -> dict[str, tuple[int, ...]]:
    lake = Lake(root, create=False)
    cur = lake.cursor()
    try:
        out = {}
        for t in TABLES:
            rows = cur.execute(
                f"SELECT iteration, stage, part, list(rowid ORDER BY rowid) FROM {lake.ref(t)} GROUP BY ALL"
            ).fetchall()
            for it, stage, part, ids in rows:
                out[f"{t}/iteration={it}/stage={stage}/{part.replace('/', '-')}"] = tuple(ids)
        return out
    finally:
        cur.close()
