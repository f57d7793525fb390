"""A throwaway PostgreSQL server on loopback for the shared-mode tests (issue 14).

Debian's PostgreSQL (``initdb`` and ``pg_ctl`` on PATH or under /usr/lib/postgresql/*/bin): a
cluster in a temporary folder, trust authentication, a free port on 127.0.0.1, fsync off. As root
(``initdb`` refuses root) it runs as the ``postgres`` user. Without them the tests that need it are
skipped, saying why (`.ci/run` installs Debian's postgresql when it can).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path


def _tool(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    versions = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    return versions[-1] if versions else None


def unavailable() -> str | None:
    """Why no server can be started here (None: one can)."""
    if not (_tool("initdb") and _tool("pg_ctl")):
        return "PostgreSQL's initdb and pg_ctl are not installed (Debian: apt-get install postgresql)"
    if os.geteuid() == 0:
        try:
            import pwd

            pwd.getpwnam("postgres")
        except KeyError:
            return "running as root and there is no postgres user to run the server as"
        if not shutil.which("runuser"):
            return "running as root without runuser to start the server as the postgres user"
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return "psycopg is not installed (pip install -e '.[dev]')"
    return None


class Postgres:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="aip-pg-"))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, user="postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.url = f"postgresql://aip@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        p = subprocess.run([*self.as_user, *args], capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            log = (self.dir / "log").read_text() if (self.dir / "log").exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])}: exit {p.returncode}\n{p.stdout}\n{p.stderr}\n{log[-2000:]}")

    def start(self) -> Postgres:
        self._run(_tool("initdb") or "initdb", "-D", str(self.dir / "data"), "-U", "aip", "--auth=trust", "-E", "UTF8")
        self.up()
        return self

    def up(self) -> None:
        """Start the server on its data folder (made by ``start``) and wait until it accepts connections."""
        self._run(
            _tool("pg_ctl") or "pg_ctl",
            "-D",
            str(self.dir / "data"),
            "-l",
            str(self.dir / "log"),
            "-w",
            "-t",
            "60",
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c fsync=off",
            "start",
        )

    def down(self) -> None:
        """Stop the server as an operator's restart does (``-m fast``: every session is ended), and
        wait until it is gone; ``up`` starts it again on the same port and data."""
        self._run(_tool("pg_ctl") or "pg_ctl", "-D", str(self.dir / "data"), "-m", "fast", "-w", "-t", "60", "stop")

    def restart(self, pause: float = 0.0) -> None:
        """``down``, ``pause`` seconds with nothing listening on the port, then ``up``."""
        import time

        self.down()
        time.sleep(pause)
        self.up()

    def stop(self) -> None:
        try:  # a server that never started has nothing to stop
            if (self.dir / "data" / "postmaster.pid").exists():
                self._run(_tool("pg_ctl") or "pg_ctl", "-D", str(self.dir / "data"), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)
