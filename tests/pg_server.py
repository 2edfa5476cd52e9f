"""A real PostgreSQL server for tests: Debian's `postgresql` package (scripts/setup.sh installs it), a fresh cluster
in a temp folder on a free port, trust auth on 127.0.0.1 only, stopped by its own pg_ctl (its pid, nothing else).

    with PostgresServer() as pg:
        url = pg.database("lake1")      # postgresql://flywheel@127.0.0.1:<port>/lake1

PostgreSQL refuses to run as root: as root, the cluster belongs to the package's `postgres` user (runuser).
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile


def _bin(name: str) -> str | None:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return found[-1] if found else shutil.which(name)


def available() -> str | None:
    """Why no server can start here (None when one can)."""
    if not _bin("initdb") or not _bin("pg_ctl"):
        return "PostgreSQL is not installed (./scripts/setup.sh installs Debian's postgresql package)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no 'postgres' user to run the server as"
    return None


class PostgresServer:
    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="flywheel-pg-")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]

    def _run(self, *cmd: str) -> None:
        r = subprocess.run([*self.as_user, *cmd], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {(r.stderr or r.stdout)[-800:]}")

    def __enter__(self) -> "PostgresServer":
        data = os.path.join(self.dir, "data")
        self._run(_bin("initdb"), "-D", data, "-U", "flywheel", "--auth=trust", "-E", "UTF8", "--no-sync")
        opts = f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(_bin("pg_ctl"), "-D", data, "-o", opts, "-l", os.path.join(self.dir, "log"), "-w", "start")
        return self

    def database(self, name: str) -> str:
        self._run(_bin("createdb") or "createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "flywheel", name)
        return f"postgresql://flywheel@127.0.0.1:{self.port}/{name}"

    def __exit__(self, *exc) -> None:
        try:
            self._run(_bin("pg_ctl"), "-D", os.path.join(self.dir, "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
