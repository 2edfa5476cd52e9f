"""One flywheel parent per lake: a lease row in the lake's catalog database, renewed by a heartbeat.

    with parent_lock(lake, "flywheel run"):      # LakeBusy (one line: who holds it, since when) if taken
        ...

The lock is a row in the lake's catalog (the SQLite file, or the PostgreSQL database many machines share), taken in
one transaction when it is free, expired or ours. The holder renews its lease every third of it; a holder killed
with -9 is taken over once its lease (`FLYWHEEL_LOCK_LEASE_S`, default 60 s) has expired, or at once when it ran on
this machine and its pid is gone. Stage workers never take it: they write disjoint run keys, and two parents
would run the same iteration twice. Times are each machine's clock: keep them in sync (NTP).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from contextlib import contextmanager
from typing import Any, Iterator

import duckdb

from storage.duck import database, is_conflict, load, quote, transaction
from storage.lake import MAINTENANCE, Lake, LakeError

log = logging.getLogger(__name__)
LEASE_S = float(os.environ.get("FLYWHEEL_LOCK_LEASE_S", "60"))
_NAME = "parent"
_ATTACH = threading.Lock()
_TABLE = "flywheel_lock"


class LakeBusy(LakeError):
    """Another flywheel parent holds this lake."""


def _dead_here(holder: str) -> bool:
    """A holder on this machine whose process is gone (killed, crashed): its lease need not run out first."""
    host, _, rest = holder.partition(":")
    pid = rest.partition(":")[0]
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


class _Meta:
    """The catalog database attached to this process's DuckDB (SQLite or PostgreSQL), for the lock row.

    Through DuckDB's own sqlite extension, never Python's sqlite3: two SQLite libraries in one process on one file
    break SQLite's POSIX locks (closing one library's handle drops the other's locks) and corrupt the catalog."""

    def __init__(self, lake: Lake):
        self.lake = lake
        db = database()
        self.name = f"flylock_{lake.id}"
        self.table = f"{self.name}.{_TABLE}"
        kind = "sqlite" if lake._sqlite is not None else "postgres"
        lake.alias  # noqa: B018 - a new lake's catalog exists before we attach it
        with _ATTACH:
            cur = db.cursor()
            try:
                load(db, kind)
                if not cur.execute("SELECT 1 FROM duckdb_databases() WHERE database_name = ?", [self.name]).fetchone():
                    target = str(lake._sqlite) if kind == "sqlite" else lake.catalog.removeprefix("postgres:")
                    cur.execute(f"ATTACH {quote(target)} AS {self.name} (TYPE {kind})")
                cur.execute(
                    f"CREATE TABLE IF NOT EXISTS {self.table} (name VARCHAR PRIMARY KEY, holder VARCHAR NOT "
                    "NULL, info VARCHAR, expires DOUBLE NOT NULL)"
                )
            finally:
                cur.close()

    def row(self, cur=None) -> dict[str, Any] | None:
        """The lock row as it is now (through `cur`, inside a transaction; else a cursor of its own)."""
        c = cur or database().cursor()
        try:
            got = c.execute(f"SELECT holder, info, expires FROM {self.table} WHERE name = ?", [_NAME]).fetchone()
        finally:
            if cur is None:
                c.close()
        return None if got is None else {"holder": got[0], "info": got[1], "expires": float(got[2])}

    def claim(self, me: str, info: str, lease: float) -> dict[str, Any] | None:
        """Take the row when it is free, expired or ours, in one transaction; returns the row as it now is. A lost
        race (two parents inserting the free row at once, a busy database) reads the row again and decides again."""

        def take(cur) -> None:
            now = time.time()
            got = self.row(cur)
            if got is None:
                cur.execute(f"INSERT INTO {self.table} VALUES (?, ?, ?, ?)", [_NAME, me, info, now + lease])
            elif got["expires"] < now or got["holder"] == me or _dead_here(got["holder"]):
                cur.execute(
                    f"UPDATE {self.table} SET holder = ?, info = ?, expires = ? "
                    "WHERE name = ? AND holder = ? AND expires = ?",
                    [me, info, now + lease, _NAME, got["holder"], got["expires"]],
                )

        # a constraint error is the other parent's insert of the free row; is_conflict covers the rest
        transaction(take, retry_if=lambda e: isinstance(e, duckdb.ConstraintException) or is_conflict(e), deadline_s=10)
        return self.row()

    def run(self, sql: str, params: list) -> None:
        transaction(lambda cur: cur.execute(sql.format(t=self.table), params), begin=False, deadline_s=10)


def holder(lake: Lake) -> dict | None:
    """Who holds the lake's parent lock now (None when free or expired)."""
    r = _Meta(lake).row()
    if r is None or r["expires"] < time.time():
        return None
    return {**json.loads(r["info"] or "{}"), "expires": r["expires"]}


@contextmanager
def parent_lock(lake: Lake, what: str = "flywheel run", lease_s: float | None = None) -> Iterator[None]:
    lease = float(lease_s or LEASE_S)
    me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    info = json.dumps({"what": what, "pid": os.getpid(), "host": socket.gethostname(), "started": time.time()})
    try:
        meta = _Meta(lake)
        got = meta.claim(me, info, lease)
    except duckdb.Error as e:  # the catalog database cannot be reached or written: one line
        raise LakeError(f"cannot take the lake lock of {lake.location}: {str(e).splitlines()[0][:200]}") from None
    if not got or got["holder"] != me:
        h = json.loads((got or {}).get("info") or "{}")
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h["started"])) if h.get("started") else "?"
        left = max(0.0, (got or {}).get("expires", time.time()) - time.time())
        raise LakeBusy(
            f"another {h.get('what', 'flywheel run')} is running on the lake {lake.location} "
            f"(pid {h.get('pid', '?')} on {h.get('host', '?')}, since {since}; its lease ends in {left:.0f} s "
            "unless renewed); wait for it to end, or give this run its own --lake"
        )
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(lease / 3):
            try:
                with MAINTENANCE:  # never beside a flush or merge of this process (storage.lake.MAINTENANCE)
                    renew = [time.time() + lease, _NAME, me]  # the lease counts from the write, not from the wait
                    meta.run("UPDATE {t} SET expires = ? WHERE name = ? AND holder = ?", renew)
            except duckdb.Error as e:  # a missed beat is retried; the lease covers two more
                log.warning("lake lock heartbeat failed: %s", str(e).splitlines()[0][:200])

    t = threading.Thread(target=beat, name="lake-lock-heartbeat", daemon=True)
    t.start()
    try:
        yield
    finally:
        stop.set()
        t.join(timeout=5)
        meta.run("DELETE FROM {t} WHERE name = ? AND holder = ?", [_NAME, me])
