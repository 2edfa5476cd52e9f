"""One flywheel parent per lake: a lease row in the lake's catalog database, renewed by a heartbeat.

    with parent_lock(lake, "flywheel run"):      # LakeBusy (one line: who holds it, since when) if taken
        ...

The lock lives where the lake lives: the catalog (the SQLite file, or the PostgreSQL database that many machines
share), so two machines on one lake see the same row. Taking it is one atomic upsert that succeeds only when the
row is free, expired, or already ours. The holder renews the lease every third of it; a holder killed with -9
stops renewing, and the next parent takes the lock over once the lease has expired (`FLYWHEEL_LOCK_LEASE_S`,
default 60 s). Stage workers never take it: they write disjoint run keys, and the parent is what must not race
(two parents would run the same iteration twice). Times are each machine's clock: keep them in sync (NTP).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

from storage.duck import database, load, quote
from storage.lake import Lake, LakeError

log = logging.getLogger(__name__)
LEASE_S = float(os.environ.get("FLYWHEEL_LOCK_LEASE_S", "60"))
_NAME = "parent"
_ATTACH = threading.Lock()
_TABLE = "flywheel_lock"
_CREATE = (
    f"CREATE TABLE IF NOT EXISTS {_TABLE} (name TEXT PRIMARY KEY, holder TEXT NOT NULL, info TEXT, "
    "expires DOUBLE PRECISION NOT NULL)"
)


class LakeBusy(LakeError):
    """Another flywheel parent holds this lake."""


class _Meta:
    """Plain SQL on the catalog database: SQLite through the standard library, PostgreSQL through DuckDB."""

    def __init__(self, lake: Lake):
        self.lake = lake
        if lake._sqlite is not None:
            lake.alias  # noqa: B018 - creates the catalog file on a new lake
            self.sq = sqlite3.connect(str(lake._sqlite), timeout=30, isolation_level=None)
        else:
            self.sq = None
            db = database()
            load(db, "postgres")
            self.pg = f"flylock_{lake.id}"
            with _ATTACH:
                cur = db.cursor()
                try:
                    if not cur.execute(
                        "SELECT 1 FROM duckdb_databases() WHERE database_name = ?", [self.pg]
                    ).fetchone():
                        spec = quote(lake.catalog.removeprefix("postgres:"))
                        cur.execute(f"ATTACH {spec} AS {self.pg} (TYPE postgres)")
                finally:
                    cur.close()
        self.run(_CREATE)

    def run(self, sql: str, params: tuple = ()) -> None:
        if self.sq is not None:
            self.sq.execute(sql, params)
            return
        for p in params:  # PostgreSQL through postgres_execute takes one literal statement
            sql = sql.replace("?", quote(p) if isinstance(p, str) else repr(float(p)), 1)
        cur = database().cursor()
        try:
            cur.execute(f"CALL postgres_execute({quote(self.pg)}, {quote(sql)})")
        finally:
            cur.close()

    def row(self) -> dict[str, Any] | None:
        sql = f"SELECT holder, info, expires FROM {_TABLE} WHERE name = '{_NAME}'"
        if self.sq is not None:
            got = self.sq.execute(sql).fetchone()
        else:
            cur = database().cursor()
            try:
                got = cur.execute(f"SELECT * FROM postgres_query({quote(self.pg)}, {quote(sql)})").fetchone()
            finally:
                cur.close()
        return None if got is None else {"holder": got[0], "info": got[1], "expires": got[2]}

    def close(self) -> None:
        if self.sq is not None:
            self.sq.close()


def holder(lake: Lake) -> dict | None:
    """Who holds the lake's parent lock now (None when free or expired)."""
    meta = _Meta(lake)
    try:
        r = meta.row()
    finally:
        meta.close()
    if r is None or r["expires"] < time.time():
        return None
    return {**json.loads(r["info"] or "{}"), "expires": r["expires"]}


@contextmanager
def parent_lock(lake: Lake, what: str = "flywheel run", lease_s: float | None = None) -> Iterator[None]:
    lease = float(lease_s or LEASE_S)
    me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    info = json.dumps({"what": what, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    meta = _Meta(lake)
    try:
        now = time.time()
        meta.run(
            f"INSERT INTO {_TABLE} (name, holder, info, expires) VALUES ('{_NAME}', ?, ?, ?) "
            "ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, info = excluded.info, "
            f"expires = excluded.expires WHERE {_TABLE}.expires < ? OR {_TABLE}.holder = ?",
            (me, info, now + lease, now, me),
        )
        got = meta.row()
        if not got or got["holder"] != me:
            h = json.loads((got or {}).get("info") or "{}")
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"])) if h.get("started") else "?"
            left = max(0.0, (got or {}).get("expires", now) - now)
            raise LakeBusy(
                f"another {h.get('what', 'flywheel run')} is running on the lake {lake.location} "
                f"(pid {h.get('pid', '?')} on {h.get('host', '?')}, since {since}; its lease ends in {left:.0f} s "
                "unless renewed); wait for it to end, or give this run its own --lake"
            )
    except LakeBusy:
        meta.close()
        raise
    except Exception as e:  # noqa: BLE001 - sqlite3 / DuckDB errors become one line
        meta.close()
        raise LakeError(f"cannot take the lake lock of {lake.location}: {str(e).splitlines()[0][:200]}") from None
    stop = threading.Event()

    def beat() -> None:
        hb = _Meta(lake)
        try:
            while not stop.wait(lease / 3):
                try:
                    hb.run(
                        f"UPDATE {_TABLE} SET expires = ? WHERE name = '{_NAME}' AND holder = ?",
                        (time.time() + lease, me),
                    )
                except Exception as e:  # noqa: BLE001 - a missed beat is retried; the lease covers two more
                    log.warning("lake lock heartbeat failed: %s", str(e).splitlines()[0][:200])
        finally:
            hb.close()

    t = threading.Thread(target=beat, name="lake-lock-heartbeat", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)
        try:
            meta.run(f"DELETE FROM {_TABLE} WHERE name = '{_NAME}' AND holder = ?", (me,))
        finally:
            meta.close()
