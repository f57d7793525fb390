"""Connections to the warehouse, serialised across processes by a file lock.

DuckDB lets one process open a file for writing, and while it does no other process can open
it at all. So every access goes through :func:`connect`, which holds an exclusive file lock
beside the database while it is open and retries on lock errors. The database stays open a
quarter of a second after its last use (at most 2 s in all, and closed at once for a waiting
process of the project, :class:`_Linger`), so a burst of uses opens it once; the lock is held
that long too, also while the process goes on to other work (model calls included). A stage
replaces its partition's rows in one transaction.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import random
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from .. import settings as aip_settings
from ..errors import WarehouseDamaged
from . import lake
from .schema import ensure_schema

_ENSURED: set[tuple[str, int]] = set()
# DuckDB's buffer pool defaults to 80% of RAM, and a stage's one-transaction write of a large
# partition then grows with the partition (1.8 GB peak at 100,000 rows of group interaction
# bias). Capped, DuckDB spills to disk instead: the same run peaks at 1.4 GB (benchmarks/).
# The cap is AIP_DUCKDB_MEMORY (settings.py: 1GB unless set; empty, no cap).
LOCK_NOTICE_S = 5.0  # a wait for the lock says so this often
logger = logging.getLogger("aip_assets")


def duckdb_memory() -> str:
    """DuckDB's memory cap for the warehouse, ``AIP_DUCKDB_MEMORY`` ("": no cap)."""
    return aip_settings.current().duckdb_memory


def lock_timeout_s() -> float:
    """How long a use waits for the warehouse, ``AIP_WAREHOUSE_LOCK_TIMEOUT`` (seconds)."""
    return aip_settings.current().warehouse_lock_timeout


def linger_idle_s() -> float:
    """How long the database stays open after a use, ``AIP_DUCKDB_LINGER`` (seconds; 0: off)."""
    return aip_settings.current().duckdb_linger


def _holder(fh) -> str:
    """Who holds the warehouse lock, as its holder wrote it in the lock file."""
    try:
        fh.seek(0)
        text = fh.read().strip()
    except OSError:
        text = ""
    return text or "another process"


def default_path() -> Path:
    """The warehouse chosen for this process (``settings.override``: ``--warehouse``, the
    ``warehouse`` resource), else ``$AIP_WAREHOUSE``, else ``warehouse.duckdb`` in the project's data
    folder (``settings.data_dir``)."""
    chosen = aip_settings.current().warehouse
    if chosen is not None:
        return chosen.resolve()
    return aip_settings.data_dir() / "warehouse.duckdb"


def _waiting_marker(db_path: Path) -> Path:
    return Path(str(db_path) + ".lock.waiting")


def _say_waiting(db_path: Path) -> None:
    """Tell the holder that someone waits (a process holding the database open between uses
    closes it then, and steps back, instead of keeping it: _Linger)."""
    try:
        _waiting_marker(db_path).touch()
    except OSError:
        pass


def _someone_waits(db_path: str, since: float) -> bool:
    """Whether a process touched the marker after ``since`` (when this one took the lock: its own
    touches while it waited are older) and recently."""
    try:
        mtime = _waiting_marker(Path(db_path)).stat().st_mtime
    except OSError:
        return False
    return mtime > since and time.time() - mtime < WAITER_FRESH_S


def _lock_timeout(db_path: Path, what: str) -> Exception:
    """The error for a wait for the warehouse that ran out (``lock_timeout_s``): an operational
    failure (exit 5) naming the file, what held it, the wait and the variable that sets it; the
    command that stops on it says how to resume (`aip-eval run` adds its ``--run-id``)."""
    from ..errors import OperationalError

    return OperationalError(
        f"{db_path}: waited {lock_timeout_s():g}s for {what}; it was not released in time "
        f"(AIP_WAREHOUSE_LOCK_TIMEOUT sets the wait, in seconds): run the command again once "
        f"it is"
    )


@contextmanager
def _file_lock(db_path: Path) -> Iterator[None]:
    db_path.parent.mkdir(parents=True, exist_ok=True)
    with open(str(db_path) + ".lock", "a+") as fh:
        t0, timeout = time.monotonic(), lock_timeout_s()
        deadline, notice = t0 + timeout, t0 + LOCK_NOTICE_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError as e:
                _say_waiting(db_path)
                now = time.monotonic()
                if now > deadline:
                    raise _lock_timeout(db_path, f"the warehouse lock ({db_path}.lock), held by {_holder(fh)}") from e
                if now >= notice:
                    notice = now + LOCK_NOTICE_S
                    logger.warning(
                        f"waiting {now - t0:.0f}s for the warehouse lock on {db_path}, held by "
                        f"{_holder(fh)} (gives up after {timeout:.0f}s)"
                    )
                time.sleep(WAIT_TRY_S * (1 + random.random()))
        try:  # say who holds it, for anyone waiting: pid, program and subcommand (no arguments, no environment)
            fh.seek(0)
            fh.truncate()
            from ..leases import program

            fh.write(f"pid {os.getpid()} ({program()})")
            fh.flush()
        except OSError:
            pass
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextmanager
def connect(
    path: str | Path | None = None, read_only: bool = False, create: bool = False, config: dict[str, Any] | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection, serialised with every other user of the file.

    Only ``create=True`` (registering a run) makes a new warehouse: every other use of a missing
    one is an error, so a mistyped ``--warehouse`` or a bad input leaves no file behind.
    Retries when another program (outside this project's lock, e.g. a DuckDB UI) holds the file.
    ``config`` may tune ``memory_limit`` and ``threads`` (served by the lingering database, see
    :class:`_Linger`); any other setting opens the file on its own. ``read_only`` says the caller
    only reads: a database this process holds open for writing serves it as it is (DuckDB has no
    read-only connection to a writable database); a sandbox (``sandboxed``) is truly read-only.
    A connection inside another of the same file in one thread is refused (it would wait for
    itself); inside one of another file, it opens that file on its own.
    """
    path = Path(path) if path else default_path()
    held = _sessions().get(str(path.resolve()))
    if held is not None:  # inside session(): the open connection serves every plain use of this file
        con_held, held_ro = held
        if config and not set(config) <= TUNING:  # a memory or thread setting only tunes: the session's serves
            raise RuntimeError(
                f"{path}: a connection with its own configuration inside a session of the same "
                "warehouse (it would wait for the session's own lock)"
            )
        if held_ro and (not read_only or create):
            raise RuntimeError(f"{path}: a writing connection inside a read-only session of the same warehouse")
        yield con_held
        return
    if lake.enabled():  # shared mode: the DuckLake every worker writes, no file lock
        with _LAKE.use(read_only, create, config) as con:
            yield con
        return
    mine = _LINGER.mine()
    if mine is not None and mine == str(path.resolve()):
        raise RuntimeError(
            f"{path}: a connection inside a connection of the same warehouse in one thread (it would wait for itself)"
        )
    if not (config and not set(config) <= TUNING) and linger_idle_s() > 0 and mine is None:
        with _LINGER.use(path, read_only, create, config or {}) as con:
            yield con
        return
    _LINGER.close(path)  # DuckDB refuses a second configuration of an open database
    _check_exists(path, read_only, create)
    with _file_lock(path):
        con = _open(path, read_only, _settings(config))
        try:
            _ensure_once(con, path, read_only)
            yield con
        finally:
            con.close()


def exists(path: str | Path | None = None) -> bool:
    """Whether there is a warehouse yet: the file, or in shared mode the lake's catalog."""
    return lake.exists() if lake.enabled() else Path(path or default_path()).exists()


def _check_exists(path: Path, read_only: bool, create: bool) -> None:
    if not path.exists() and (read_only or not create):
        raise FileNotFoundError(f"{path}: no warehouse yet; run `aip-eval run <spec>` first")


def _settings(config: dict[str, Any] | None) -> dict[str, Any]:
    memory = duckdb_memory()
    settings: dict[str, Any] = {"memory_limit": memory} if memory else {}
    settings.update(config or {})
    return settings


def _open(path: Path, read_only: bool, settings: dict[str, Any]) -> duckdb.DuckDBPyConnection:
    """Open the file (this process holds the warehouse lock), retrying while a program outside
    aip-eval holds it open."""
    t0 = time.monotonic()
    deadline, notice = t0 + lock_timeout_s(), t0 + LOCK_NOTICE_S
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only, config=settings)
        except duckdb.IOException as e:
            now = time.monotonic()
            if (bad := damaged(e, path)) is not None:
                raise bad from None
            if "lock" not in str(e).lower():
                raise
            if now > deadline:
                raise _lock_timeout(
                    path, f"the file, held open by a program outside aip-eval ({str(e).splitlines()[0][:300]})"
                ) from None
            if now >= notice:
                notice = now + LOCK_NOTICE_S
                logger.warning(
                    f"waiting {now - t0:.0f}s for {path}, held open by a program outside aip-eval: "
                    f"{str(e).splitlines()[0][:200]}"
                )
            time.sleep(0.1 + random.random() * 0.2)


# what DuckDB says of a file that is not (or no longer) a whole database: zero bytes or a garbage
# header, a truncated file, a block whose checksum fails, a write-ahead log that cannot be replayed
DAMAGE_MARKERS = (
    "not a valid duckdb database file",
    "could not read enough bytes from file",
    "corrupt database file",
    "does not match stored checksum",
    "failure while replaying wal",
)


def damaged(e: BaseException, path: str | Path | None = None) -> WarehouseDamaged | None:
    """A DuckDB error (``e`` or one of its causes) that says the warehouse file is damaged, as an
    error that names the file and what to do (exit 2); None for any other error. ``path``: the
    file, when the caller knows it (else the one DuckDB's message names, else the default)."""
    err: BaseException | None = e
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        msg = str(err)
        if isinstance(err, WarehouseDamaged):
            return err
        if isinstance(err, duckdb.Error) and any(m in msg.lower() for m in DAMAGE_MARKERS):
            named = re.search(r'file "([^"]+)"', msg)
            where = Path(path) if path is not None else Path(named.group(1)) if named else default_path()
            return WarehouseDamaged(where, msg.splitlines()[0].strip())
        err = err.__cause__ or err.__context__
    return None


def _ensure_once(con: duckdb.DuckDBPyConnection, path: Path, read_only: bool) -> None:
    if not read_only:
        key = (str(path), path.stat().st_ino)
        if key not in _ENSURED:  # once per process and file: DDL on every connection is slow
            ensure_schema(con)
            _ENSURED.add(key)


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
WAIT_TRY_S = 0.01  # a waiter tries the lock every 10-20 ms (a try is a system call)
WAITER_FRESH_S = 0.1  # a waiter touches its marker at every try: fresh while it waits
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


TUNING = {"memory_limit", "threads"}  # settings a session's connection may serve without
_SESSION = threading.local()  # .held: {warehouse file: (the connection session() holds, read_only)}, per thread


def _sessions() -> dict[str, tuple[duckdb.DuckDBPyConnection, bool]]:
    if not hasattr(_SESSION, "held"):
        _SESSION.held = {}
    return _SESSION.held


@contextmanager
def session(
    path: str | Path | None = None, read_only: bool = False, config: dict[str, Any] | None = None
) -> Iterator[None]:
    """Hold one connection (and the warehouse lock) for a block of many short reads, such as
    building a report: every ``connect()`` of this file inside it gets that connection. Opening
    a DuckDB database costs 10-15 ms here, and a report made 15-20 of them. Only for blocks that
    make no model call and end in seconds: everyone else waits for the lock meanwhile. Nested
    sessions of one file are one session. A session is its thread's: another thread connects as
    usual (and waits for the lock). A partition write inside a session is refused."""
    path = Path(path) if path else default_path()
    key = str(path.resolve())
    held = _sessions()
    if key in held:
        if held[key][1] and not read_only:
            raise RuntimeError(f"{path}: a writing session inside a read-only session of the same warehouse")
        yield
        return
    with connect(path, read_only=read_only, config=config) as con:
        held[key] = (con, read_only)
        try:
            yield
        finally:
            del held[key]
