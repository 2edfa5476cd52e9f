"""Attaching a lake's DuckLake catalog to this process's database: once per process, by `Lake.alias`.

The catalog is a SQLite file (made in WAL mode, so readers never wait for a writer's commit) or a PostgreSQL
database (`lake.catalog: postgresql://...`; the password comes from $PGPASSWORD, never the URL). An s3:// lake's
data is read and written through httpfs, with a secret built from the standard $AWS_* variables. Attaching creates
the tables of storage.schema that are missing, and adds a newer schema version's columns to an older lake's tables.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

import duckdb

from storage.duck import database, load, quote, transaction
from storage.errors import LakeError
from storage.schema import PARTITION_COLUMNS, TABLES, duckdb_type

_LOCK = threading.RLock()
_ATTACHED: dict[tuple[int, str], tuple[str, Any]] = {}  # (pid, lake id) -> (alias, catalog file identity)


def catalog_spec(catalog: str) -> tuple[str, str]:
    """(DuckLake metadata spec, extension) of `lake.catalog`: a postgresql:// URL or a SQLite file."""
    if catalog.startswith(("postgresql://", "postgres://")):
        u = urllib.parse.urlsplit(catalog)
        parts = {"dbname": u.path.lstrip("/") or "postgres", "host": u.hostname, "port": u.port}
        parts.update({"user": urllib.parse.unquote(u.username or "") or None})
        parts.update({"password": urllib.parse.unquote(u.password or "") or None})
        parts.update(dict(urllib.parse.parse_qsl(u.query)))
        return "postgres:" + " ".join(f"{k}={v}" for k, v in parts.items() if v not in (None, "")), "postgres"
    path = catalog.removeprefix("sqlite:")
    return f"sqlite:{Path(path).expanduser().resolve()}", "sqlite"


def attach(lake: Any) -> str:
    """The alias `lake` (a storage.lake.Lake) is attached under in this process's database, attaching it first
    when needed (again when its catalog file was replaced: a lake deleted and made again)."""
    pid = os.getpid()
    sqlite = lake._sqlite
    ident = sqlite.stat().st_ino if sqlite is not None and sqlite.exists() else None
    with _LOCK:
        got = _ATTACHED.get((pid, lake.id))
        if got and (got[1] == ident or ident is None and sqlite is None):
            return got[0]
        db = database()
        if got:
            try:
                db.execute(f"DETACH {got[0]}")
            except duckdb.Error:
                pass
        alias = f"lake_{lake.id}_{uuid.uuid4().hex[:6]}"
        load(db, lake._ext)
        if lake.store:
            _s3_secret(db, lake)
        if sqlite is not None and not sqlite.exists():
            _new_wal_catalog(sqlite)
        try:  # retried while busy: two processes making one new lake both set up DuckLake, and SQLite locks one out
            sql = f"ATTACH {quote('ducklake:' + lake.catalog)} AS {alias} (DATA_PATH {quote(lake.data_path)}, "
            transaction(lambda cur: cur.execute(sql + "OVERRIDE_DATA_PATH true)"), begin=False, deadline_s=60)
            transaction(lambda cur: _create_tables(cur, alias))
        except duckdb.Error as e:
            msg = str(e).splitlines()[0][:300].replace(lake.catalog, "<lake.catalog>")
            raise LakeError(f"cannot open the lake catalog of {lake.location}: {msg}") from None
        _ATTACHED[(pid, lake.id)] = (alias, sqlite.stat().st_ino if sqlite is not None else None)
        return alias


def _new_wal_catalog(sqlite: Path) -> None:
    """Make the empty catalog file in WAL mode, atomically: a file made and switched to WAL beside it, then linked
    into place (the link fails when another process made it first, and then theirs is the catalog). Switching a
    shared new file to WAL raced: `PRAGMA journal_mode=WAL` needs SQLite's exclusive lock and gave up with
    `database is locked`, busy timeout or not, while another process was setting up DuckLake in it."""
    sqlite.parent.mkdir(parents=True, exist_ok=True)
    tmp = sqlite.with_name(f".{sqlite.name}.{os.getpid()}.{uuid.uuid4().hex[:6]}.new")
    try:
        with sqlite3.connect(tmp) as sq:  # WAL is recorded in the file's header, so it outlives this connection
            sq.execute("PRAGMA journal_mode=WAL")
        sq.close()
        try:
            os.link(tmp, sqlite)
        except FileExistsError:
            pass
        except OSError:  # a filesystem without hard links: not atomic, but only a new lake's first open can race
            if not sqlite.exists():
                os.replace(tmp, sqlite)
    finally:
        for p in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            p.unlink(missing_ok=True)


def _s3_secret(db, lake: Any) -> None:
    load(db, "httpfs")
    url = urllib.parse.urlsplit(lake.endpoint) if lake.endpoint else None
    opts = {
        "TYPE": "s3",
        "KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", ""),
        "SECRET": os.environ.get("AWS_SECRET_ACCESS_KEY", ""),
        "REGION": os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        "SCOPE": f"s3://{lake.store.bucket}",
    }
    if os.environ.get("AWS_SESSION_TOKEN"):
        opts["SESSION_TOKEN"] = os.environ["AWS_SESSION_TOKEN"]
    if url:
        opts.update({"ENDPOINT": url.netloc, "URL_STYLE": "path", "USE_SSL": url.scheme == "https"})
    body = ", ".join(f"{k} {v if isinstance(v, bool) else quote(v)}" for k, v in opts.items())
    db.execute(f"CREATE OR REPLACE SECRET lake_{lake.id} ({body})")


def _create_tables(cur, alias: str) -> None:
    """Every table of storage.schema, and a newer schema version's nullable columns on an older lake's tables.
    (Asks this lake's catalog only: information_schema would open every lake attached in this process.)"""
    have = {r[0] for r in cur.execute(f"SELECT table_name FROM ducklake_table_info({quote(alias)})").fetchall()}
    for table, schema in TABLES.items():
        cols = [(f.name, duckdb_type(f.type)) for f in schema] + list(PARTITION_COLUMNS.items())
        cols.append(("part", "VARCHAR"))
        if table not in have:
            body = ", ".join(f'"{n}" {t}' for n, t in cols)
            cur.execute(f'CREATE TABLE {alias}."{table}" ({body})')
            continue
        present = {d[0] for d in cur.execute(f'SELECT * FROM {alias}."{table}" LIMIT 0').description}
        for n, t in cols:
            if n not in present:
                cur.execute(f'ALTER TABLE {alias}."{table}" ADD COLUMN "{n}" {t}')


def upgrade(lake: Any) -> None:
    """Add a newer schema's columns to the tables of an attached lake (what attaching in a new process does)."""
    alias = lake.alias
    transaction(lambda cur: _create_tables(cur, alias))
