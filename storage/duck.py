"""The DuckDB engine under the lake: one in-memory database per process with DuckLake loaded, offline.

    db = database()                      # extensions loaded once per process; cursors share them
    cur = db.cursor()
    transaction(lambda cur: cur.execute(...))   # one transaction, run again while its commit loses a race

DuckDB installs extensions from its online repository by default, which no offline machine reaches. The lake uses
the extension builds that PyPI ships as packages (`duckdb-extension-<name>`, pinned with `duckdb` itself in
pyproject.toml: the packages exist for the 1.5 line only) and loads each by its file path. SQLite's package ships
`sqlite.duckdb_extension` whose entry point is `sqlite_scanner`: DuckDB derives the entry point from the file
name, so it is loaded from a copy named `sqlite_scanner.duckdb_extension` in a cache folder.

One database per process: loading the two extensions costs ~0.4 s, and every `storage.catalog.connect()` would pay
it. A lake is attached to that database once (`storage.attach`), and each caller gets its own cursor.
After a fork, the child builds its own database (a DuckDB instance must not cross a fork).
"""

from __future__ import annotations

import importlib.util
import os
import random
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable

import duckdb

from storage.errors import LakeError

# Package name -> file name the entry point needs.
_EXTENSIONS = {"ducklake": "ducklake", "sqlite": "sqlite_scanner", "postgres": "postgres_scanner", "httpfs": "httpfs"}
_LOCK = threading.RLock()
_DB: dict[int, duckdb.DuckDBPyConnection] = {}  # pid -> database
_LOADED: dict[int, set[str]] = {}


def extension_path(name: str) -> str:
    """The file of extension `name` (ducklake, sqlite, postgres, httpfs) from its PyPI package, loadable offline."""
    pkg = f"duckdb_extension_{name}"
    spec = importlib.util.find_spec(pkg)
    found = []
    if spec and spec.submodule_search_locations:
        root = Path(next(iter(spec.submodule_search_locations)))
        found = sorted(root.glob(f"extensions/v{duckdb.__version__}/*.duckdb_extension"))
    if not found:
        raise LakeError(
            f"the DuckDB extension {name!r} for duckdb {duckdb.__version__} is not installed: "
            f"pip install 'duckdb-extension-{name}=={duckdb.__version__}' (./scripts/setup.sh installs the pinned set)"
        )
    entry = _EXTENSIONS[name]
    if found[0].stem == entry:
        return str(found[0])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "flywheel" / "duckdb-extensions"
    copy = cache / duckdb.__version__ / f"{entry}.duckdb_extension"
    if not copy.exists() or copy.stat().st_size != found[0].stat().st_size:
        copy.parent.mkdir(parents=True, exist_ok=True)
        tmp = copy.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(found[0], tmp)
        os.replace(tmp, copy)
    return str(copy)


def database() -> duckdb.DuckDBPyConnection:
    """This process's in-memory database, with DuckLake and SQLite loaded."""
    pid = os.getpid()
    with _LOCK:
        db = _DB.get(pid)
        if db is None:
            db = duckdb.connect(":memory:")
            _DB.clear()
            _LOADED.clear()
            _DB[pid] = db
            _LOADED[pid] = set()
            load(db, "ducklake", "sqlite")
        return db


def load(db: duckdb.DuckDBPyConnection, *names: str) -> None:
    """Load extensions into the process database (once each)."""
    with _LOCK:
        loaded = _LOADED.setdefault(os.getpid(), set())
        for name in names:
            if name not in loaded:
                db.execute(f"LOAD '{extension_path(name)}'")
                loaded.add(name)


def quote(s: str) -> str:
    """A SQL string literal."""
    return "'" + str(s).replace("'", "''") + "'"


COMMIT_DEADLINE_S = float(os.environ.get("FLYWHEEL_LAKE_COMMIT_DEADLINE_S", "300"))
_CONFLICTS = ("Failed to commit", "conflict", "Conflict", "database is locked", "SQLITE_BUSY", "could not serialize")


def is_conflict(e: Exception) -> bool:
    """A commit that lost a race with another writer (DuckLake's conflict check, a busy SQLite or PostgreSQL)."""
    return isinstance(e, duckdb.TransactionException) or any(s in str(e) for s in _CONFLICTS)


def transaction(
    fn: Callable[[duckdb.DuckDBPyConnection], Any],
    *,
    begin: bool = True,
    retry_if: Callable[[Exception], bool] = is_conflict,
    deadline_s: float | None = None,
) -> Any:
    """fn(cursor) in one transaction of this process's database, run again from the start while it fails with an
    error that `retry_if` calls a lost race, until `deadline_s` (default $FLYWHEEL_LAKE_COMMIT_DEADLINE_S, 300 s)
    has passed. Any other error, or the last one, is raised (a duckdb.Error). begin=False: fn runs outside an
    explicit transaction (DuckLake's maintenance calls commit on their own)."""
    deadline = time.monotonic() + (COMMIT_DEADLINE_S if deadline_s is None else deadline_s)
    delay = 0.01
    while True:
        cur = database().cursor()
        try:
            if begin:
                cur.execute("BEGIN TRANSACTION")
            out = fn(cur)
            if begin:
                cur.execute("COMMIT")
            return out
        except duckdb.Error as e:
            try:
                cur.execute("ROLLBACK")
            except duckdb.Error:
                pass
            if not retry_if(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay * (0.5 + random.random()))
            delay = min(delay * 2, 1.0)
        finally:
            cur.close()
