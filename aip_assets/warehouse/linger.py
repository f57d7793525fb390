"""The database kept open a moment between uses (:class:`_Linger`), and this process's open lake (:class:`_Lake`).

The database stays open a quarter of a second after its last use (at most 2 s in all, and closed
at once for a waiting process of the project), so a burst of uses opens it once; the warehouse
lock is held that long too, also while the process goes on to other work (model calls included).
:func:`release` closes both now (at exit too); a forked child starts afresh.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from .. import settings as aip_settings
from . import lake
from .opening import (
    LOCK_NOTICE_S,
    _check_exists,
    _ensure_once,
    _file_lock,
    _lock_timeout,
    _open,
    _someone_waits,
    duckdb_memory,
    lock_timeout_s,
)
from .schema import ensure_schema

logger = logging.getLogger("aip_assets")
TUNING = {"memory_limit", "threads"}  # settings a session's connection may serve without


def linger_idle_s() -> float:
    """How long the database stays open after a use, ``AIP_DUCKDB_LINGER`` (seconds; 0: off)."""
    return aip_settings.current().duckdb_linger


# Opening a DuckDB database costs 9-15 ms here (an in-memory one 9 ms: each opening builds DuckDB's
# catalogue of functions), and a stage makes about ten short connections: 4.7 s of a 30 s demo
# replay went to opening and closing. So the database a process opened stays open a moment
# after its last use, holding the warehouse lock: a use within ``linger_idle_s()`` of the last one
# gets a connection to it in microseconds. It is closed once idle that long, at the latest
# LINGER_MAX_S after it was opened, and at the end of a use when another process of this project
# waits for the lock (it touches a marker file as it tries): this process then steps back for
# STEP_BACK_S, so the waiter gets its turn. A program outside the project (the DuckDB CLI) is not
# seen waiting; `release()` closes the database for it. AIP_DUCKDB_LINGER=0 turns this off.
LINGER_MAX_S = 2.0
STEP_BACK_S = 0.03  # after closing for a waiter, this process lets the lock be for longer than a waiter's try
TRIM_MEMORY = "16MB"  # the cap set between uses: DuckDB lets go of the blocks a use cached
# a write whose log (DuckDB's .wal) is smaller stays there until the database closes (its commit is
# already durable); a larger one is checkpointed into the file when its use ends. DuckDB's own
# checkpoint_threshold, which checkpoints at a commit past it, is the same 16 MiB by default.
CHECKPOINT_WAL_BYTES = 16 * 1024 * 1024


def _defaults(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """An open database's own memory limit and threads, as it opened (what a use's settings fall back to)."""
    row = con.execute("SELECT current_setting('memory_limit'), current_setting('threads')").fetchone()
    return {"memory_limit": str(row[0]), "threads": str(row[1])} if row else {}


def _tune(con: duckdb.DuckDBPyConnection, config: dict[str, Any], defaults: dict[str, str]) -> None:
    """A use's memory limit and threads: its ``config``, else ``AIP_DUCKDB_MEMORY`` (the memory),
    else the database's own. Both are set every use: they are the whole database's."""
    limit = config.get("memory_limit") or duckdb_memory() or defaults["memory_limit"]
    con.execute(f"SET memory_limit = '{limit}'")
    con.execute(f"SET threads = {int(config.get('threads') or defaults['threads'])}")


class _Linger:
    """The database this process opened last (one file at a time), kept open between uses.

    One use at a time, as the file lock serialised threads before; a reaper thread closes it when
    idle or old. Each use gets its own connection (a cursor: DuckDB's connections to one open
    database) with the memory cap and threads it asks for; between uses the cap is set low, so
    blocks a use cached do not stay in memory. A read-only use is served by an open writable
    database (the caller only reads); a writing use reopens a read-only one."""

    def __init__(self) -> None:
        self.cv = threading.Condition()
        self.base: duckdb.DuckDBPyConnection | None = None
        self.lock: Any = None  # the ExitStack holding the warehouse lock while open
        self.where: tuple[str, int, int] | None = None  # path, device, inode
        self.opened_as = ""  # the path as opened (DuckDB's log file is beside it)
        self.read_only = False
        self.defaults: dict[str, str] = {}
        self.busy = False
        self.owner: int | None = None  # the thread of the use in progress
        self.opened = self.last = self.step_back = self.locked_at = 0.0
        self.idle = 0.0  # linger_idle_s() as the last use read it (the reaper reads no settings)
        self.reaper: threading.Thread | None = None

    def mine(self) -> str | None:
        """The file of a use in progress in this thread, if any (a nested use must not wait for it)."""
        with self.cv:
            return self.where[0] if self.busy and self.owner == threading.get_ident() and self.where else None

    @contextmanager
    def use(
        self, path: Path, read_only: bool, create: bool, config: dict[str, Any]
    ) -> Iterator[duckdb.DuckDBPyConnection]:
        t0, timeout, idle = time.monotonic(), lock_timeout_s(), linger_idle_s()
        with self.cv:
            while self.busy:  # another thread's use: wait as for the file lock, saying so
                if time.monotonic() - t0 > timeout:
                    raise _lock_timeout(
                        path, f"another thread's use of the warehouse in this process (pid {os.getpid()})"
                    )
                if not self.cv.wait(LOCK_NOTICE_S):
                    logger.warning(f"waiting {time.monotonic() - t0:.0f}s for another thread's use of {path}")
            self.busy, self.owner, self.idle = True, threading.get_ident(), idle
        try:
            base = self._base(path, read_only, create)
            con = base.cursor()
            try:
                _tune(con, config, self.defaults)
                yield con
            finally:
                con.close()
                self._trim()
        finally:
            with self.cv:
                self.busy, self.owner = False, None
                self.last = time.monotonic()
                waits = self.where is not None and _someone_waits(self.where[0], self.locked_at)
                if waits or self.last - self.opened > LINGER_MAX_S:
                    self._close_locked()
                    if waits:
                        self.step_back = self.last + STEP_BACK_S  # the waiter's turn
                self.cv.notify_all()

    def _base(self, path: Path, read_only: bool, create: bool) -> duckdb.DuckDBPyConnection:
        """The open database of ``path`` (this thread holds the use): opened, or reopened when it
        is another file, the file was replaced or removed, or a write needs a read-only one."""
        try:
            st = path.stat()
            where = (str(path.resolve()), st.st_dev, st.st_ino)
        except FileNotFoundError:
            where = None
        with self.cv:
            if self.base is not None and (where != self.where or (self.read_only and not read_only)):
                self._close_locked()
            if self.base is not None:
                return self.base
        _check_exists(path, read_only, create)
        if (pause := self.step_back - time.monotonic()) > 0:
            time.sleep(pause)
        from contextlib import ExitStack

        stack = ExitStack()
        stack.enter_context(_file_lock(path))
        locked_at = time.time()
        try:
            base = _open(path, read_only, {})
            _ensure_once(base, path, read_only)
            defaults = _defaults(base)
            st = path.stat()
        except BaseException:
            stack.close()
            raise
        with self.cv:
            self.base, self.lock, self.read_only, self.defaults = base, stack, read_only, defaults
            self.where = (str(path.resolve()), st.st_dev, st.st_ino)
            self.opened_as, self.locked_at = str(path), locked_at
            self.opened = time.monotonic()
            if self.reaper is None or not self.reaper.is_alive():
                self.reaper = threading.Thread(target=self._reap, name="aip-duckdb-linger", daemon=True)
                self.reaper.start()
            self.cv.notify_all()
        return base

    def _trim(self) -> None:
        """After a use: the blocks it cached are let go (the memory cap set low), unless it left
        writes in DuckDB's log. Those are committed and durable (the log is flushed at commit;
        any connection that opens the file replays it) and go into the file when the database
        closes, once for a burst of small writes: a checkpoint and trim per write cost 40 ms,
        1.5 s of a demo replay. While such writes wait, no use is trimmed (whatever later uses
        cache stays until the database closes, at most LINGER_MAX_S after it opened): trimming
        would push the unwritten blocks out to temporary files. A log past CHECKPOINT_WAL_BYTES
        is checkpointed at once, as closing would. So a copy of the file alone, taken while the
        project holds it open, may lack the last writes: ``release()`` first."""
        try:
            if self.base is not None and not self.read_only and self.where is not None:
                wal = Path(self.opened_as + ".wal")
                size = wal.stat().st_size if wal.exists() else 0
                if 0 < size < CHECKPOINT_WAL_BYTES:
                    return  # the next use sets its own cap; closing checkpoints and frees it all
                if size:
                    self.base.execute("CHECKPOINT")
            if self.base is not None:
                self.base.execute(f"SET memory_limit = '{TRIM_MEMORY}'")
        except (duckdb.Error, OSError):  # blocks still pinned, or a checkpoint refused: close instead
            with self.cv:
                self._close_locked()

    def _reap(self) -> None:
        with self.cv:
            while True:
                if self.base is None:
                    self.cv.wait()
                    continue
                now = time.monotonic()
                due = min(max(self.last, self.opened) + self.idle, self.opened + LINGER_MAX_S)
                if not self.busy and now >= due:
                    self._close_locked()
                else:
                    self.cv.wait(max(due - now, 0.005) if not self.busy else None)

    def _close_locked(self) -> None:
        if self.base is None:
            return
        base, lock = self.base, self.lock
        self.base = self.lock = self.where = None
        try:
            base.close()
        finally:
            lock.close()
        self.cv.notify_all()

    def close(self, path: str | Path | None = None) -> None:
        """Close the open database now (only if it is ``path``'s, when given) unless a use is in
        progress in another thread: that use's database closes when idle, and whoever needs the
        file meanwhile waits for the warehouse lock it holds (and says so)."""
        with self.cv:
            if not self.busy and (
                path is None or (self.where is not None and self.where[0] == str(Path(path).resolve()))
            ):
                self._close_locked()

    def close_if_idle(self) -> None:
        """Close the open database unless a use is in progress (never waits: before a fork)."""
        if self.cv.acquire(blocking=False):
            try:
                if not self.busy:
                    self._close_locked()
            finally:
                self.cv.release()

    def forget_in_child(self) -> None:
        """In a forked child: start afresh. What the parent had open is left as it is, never
        closed here (closing would unlock the parent's warehouse lock, which the fork shares)."""
        if self.base is not None or self.lock is not None:
            _INHERITED.append((self.base, self.lock))
        self.cv = threading.Condition()
        self.base = self.lock = self.where = None
        self.busy, self.owner, self.reaper = False, None, None


class _Lake:
    """This process's open lake (``lake.open_lake``: 0.2 s to open), its tables made once; each
    use gets a cursor of its own (``USE lake`` on it: a cursor does not inherit the default
    database). A use with settings beyond memory and threads opens a lake of its own."""

    def __init__(self) -> None:
        self.base: duckdb.DuckDBPyConnection | None = None
        self.pid = 0
        self.defaults: dict[str, str] = {}
        self.lock = threading.RLock()  # one use at a time (a nested use in the same thread shares it)

    @contextmanager
    def use(self, read_only: bool, create: bool, config: dict[str, Any] | None) -> Iterator[duckdb.DuckDBPyConnection]:
        if config and not set(config) <= TUNING:
            own = lake.open_lake(read_only, config)
            try:
                yield own
            finally:
                own.close()
            return
        with self.lock:  # the settings are the whole database's: each use sets both, as _Linger does
            cur = lake.patiently("using the lake", lambda: self._cursor(create, config))
            try:
                yield cur
            except duckdb.Error as e:
                if lake.catalog_lost(e):  # a read that met the catalog's database away: said, not a bug
                    raise lake.outage(e, "a read of the warehouse") from e
                raise
            finally:
                cur.close()

    def _cursor(self, create: bool, config: dict[str, Any] | None) -> duckdb.DuckDBPyConnection:
        cur = self._base(create).cursor()
        try:
            cur.execute(f"USE {lake.ALIAS}")  # reads the catalog's latest snapshot
            _tune(cur, config or {}, self.defaults)
        except BaseException:
            cur.close()
            raise
        return cur

    def _base(self, create: bool) -> duckdb.DuckDBPyConnection:
        if self.base is None or self.pid != os.getpid():  # a forked child opens its own
            if not create and not lake.exists():
                raise FileNotFoundError(f"{lake.where()}: no warehouse yet; run `aip-eval run <spec>` first")
            base = lake.open_lake()  # waited for by use() when the catalog's database is away
            try:
                self.defaults = _defaults(base)
                ensure_schema(base, in_lake=True)
            except BaseException:
                base.close()
                raise
            self.base, self.pid = base, os.getpid()
        return self.base

    def forget_in_child(self) -> None:
        """In a forked child: start afresh, keeping (never closing) the parent's lake. Closing it
        here tears down the postgres extension's pool under a parent thread's wait and hangs."""
        if self.base is not None:
            _INHERITED.append(self.base)
        self.lock = threading.RLock()
        self.base = None

    def close(self) -> None:
        with self.lock:
            if self.base is not None and self.pid == os.getpid():
                self.base.close()
            self.base = None


_LINGER = _Linger()
_LAKE = _Lake()
_INHERITED: list[Any] = []  # a forked child's copies of the parent's database and lock: kept, never closed


def release(path: str | Path | None = None) -> None:
    """Close the open database now (at exit, or before another program opens it): the lingering
    file (only ``path``'s, when given), and this process's lake."""
    _LINGER.close(path)
    if path is None:
        _LAKE.close()


atexit.register(release)
if hasattr(os, "register_at_fork"):  # a forked child must not inherit an open database and its lock
    os.register_at_fork(before=_LINGER.close_if_idle, after_in_child=_LINGER.forget_in_child)
    os.register_at_fork(after_in_child=_LAKE.forget_in_child)
