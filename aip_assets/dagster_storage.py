"""Dagster's SQLite storage for the CLI's runs, faster: engines kept, one connection held open,
commits without a disk flush.

Dagster's ``SqliteEventLogStorage`` and ``SqliteRunStorage`` build a new SQLAlchemy engine and
open a new SQLite connection for every statement (``_connect``, ``connect``): about 95 events per
evaluation run, each written to the run's database and, for asset events, to the index database
as well. Three costs came of it (a profiled demo replay, 2026-11-30):

- building the engines: 1.2 s of the 7.6 s spent storing events. One engine per database is
  kept (at most ``KEEP``);
- closing the last connection to a database in WAL mode checkpoints the log into the database
  and deletes it, and the next statement makes it again: 0.9 s. One connection per database
  (its anchor, at most ``KEEP`` in a process) is held open, idle, so a statement's connection is
  never the last; SQLite checkpoints as it writes (every 1,000 pages), as it always does;
- each commit waited for the disk (``synchronous=FULL``, SQLite's default): 0.9 s. The
  connections use ``synchronous=NORMAL``, which in WAL mode is still safe against a crash of the
  process; a power cut may lose the last commits (never corrupt the file).

A statement used to open its own connection (``NullPool``, as Dagster does); each engine now keeps
one between statements (``_engine(pooled=True)``: SQLite's files are shared by several processes
with connections kept open as well as with connections of their own). The UI follows a running run's events by watching its ``<run_id>.db`` (Dagster's
watchdog), which a write kept in the log no longer changes: after a write to a run's database the
file is touched (``os.utime``), so the UI's live view still sees each event as it comes. Measured on this machine: an insert and commit on a connection of its own
1.2 ms, 0.13 ms with an anchor and ``NORMAL``. Everything else, including the files, their format
and what the UI reads, is Dagster's own: ``dagster dev`` opens the same storage with its default
classes.

Three more costs of Dagster's own, per run (measured 2026-12-07, a small run against its 1.47 s of
"Dagster's own"):

- a new run's database made by ``_initdb``: the schema's DDL, and alembic's script directory read
  twice (checked, then stamped), 0.05-0.1 s. It is made once per Dagster version, by ``_initdb``
  itself, as a template (``TEMPLATE``, in the event log's folder), and each new run's database is a
  copy: fsynced under a name of its own, then given its name with ``os.link`` (never over a file
  another process made meanwhile), so a process killed midway leaves no database or a whole one.
  A database already made at the template's revision (a run's, the index) is not checked again:
  ``_initdb`` would do nothing. One of another revision is ``_initdb``'s, as before, and the index is
  never made from the template (Dagster makes it as the storage opens);
- opening and closing a connection (and its pragma) for each statement, about 390 a run: 0.40 ms
  of CPU a statement against 0.06 with the connection kept (``_engine``'s ``pooled``);
- ``has_table``, asked before most asset and partition statements (81 times a run, each on an
  engine and connection of its own: 60-80 ms): a table found (and an asset_keys column,
  ``_has_asset_key_col_on_connection``) is remembered; Dagster's migrations add, never drop.

The overrides rely on internals of Dagster's classes (``_connect``, ``_db_lock``,
``_initialized_dbs``, ``_initdb``, ``_base_dir``, ``conn_string_for_shard``, ``has_table``,
``_has_asset_key_col_on_connection``; ``connect``, ``_conn_string``; each module's
``create_engine``). Each is on only for the method it was written against (its source's
hash); otherwise ``FAST`` (or ``FAST_RUNS``) is False, the class behaves as Dagster's, and the CLI
writes Dagster's plain settings (``dagster_home.instance_settings``): an upgrade costs speed,
never a run.
"""

from __future__ import annotations

import atexit
import hashlib
import inspect
import logging
import os
import sqlite3
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Any

KEEP = 16  # engines kept per storage, and anchors per process: the index database and the latest runs'
SYNCHRONOUS = "NORMAL"  # the connections' PRAGMA synchronous (WAL mode: safe against a process crash)
# The sha256 of Dagster's ``_connect`` and ``connect`` (their source) these overrides were written
# against: another version, whatever changed, turns the override off (Dagster's own way, only slower).
AUDITED_CONNECT = "b8435f266568"
AUDITED_RUNS_CONNECT = "d343abae6e9b"


def _source_hash(method: Any) -> str:
    return hashlib.sha256(inspect.getsource(inspect.unwrap(method)).encode()).hexdigest()[:12]


try:
    from dagster._core.storage.event_log.sqlite import sqlite_event_log as _dagster_sqlite
    from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

    def _audited() -> bool:
        connect = getattr(SqliteEventLogStorage, "_connect", None)
        if connect is None or not all(
            callable(getattr(SqliteEventLogStorage, name, None))
            for name in ("_initdb", "conn_string_for_shard", "from_config_value")
        ):
            return False
        return (
            _source_hash(connect) == AUDITED_CONNECT
            and callable(getattr(_dagster_sqlite, "create_engine", None))
            and hasattr(_dagster_sqlite, "SQLITE_BUSY_TIMEOUT_SECONDS")
            and list(inspect.signature(SqliteEventLogStorage.__init__).parameters)[:2] == ["self", "base_dir"]
        )

    FAST = _audited()
    INDEX_SHARD = getattr(_dagster_sqlite, "INDEX_SHARD_NAME", "index")
except (ImportError, OSError, TypeError):  # another layout of Dagster's internals, or no source to read
    FAST = False
    SqliteEventLogStorage = None  # type: ignore[assignment,misc]
    INDEX_SHARD = "index"

try:
    from dagster._core.storage.runs.sqlite import sqlite_run_storage as _dagster_runs
    from dagster._core.storage.runs.sqlite.sqlite_run_storage import SqliteRunStorage

    def _audited_runs() -> bool:
        connect = getattr(SqliteRunStorage, "connect", None)
        return (
            connect is not None
            and callable(getattr(SqliteRunStorage, "from_local", None))
            and _source_hash(connect) == AUDITED_RUNS_CONNECT
            and callable(getattr(_dagster_runs, "create_engine", None))
            and list(inspect.signature(SqliteRunStorage.__init__).parameters)[:2] == ["self", "conn_string"]
        )

    FAST_RUNS = _audited_runs()
except (ImportError, OSError, TypeError):
    FAST_RUNS = False
    SqliteRunStorage = None  # type: ignore[assignment,misc]


def _pragmas(dbapi_conn: Any, _record: Any) -> None:
    cur = dbapi_conn.cursor()
    try:
        cur.execute(f"PRAGMA synchronous={SYNCHRONOUS}")
    finally:
        cur.close()


def _file_id(path: str | None) -> tuple[int, int] | None:
    try:
        st = os.stat(path) if path else None
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if st else None


_POOLS: weakref.WeakSet[Any] = weakref.WeakSet()  # the engines keeping a connection (``pooled``)
_INHERITED: list[Any] = []  # a forked child's copies of its parent's connections: kept, never used or closed


def _engine(make: Any, conn_string: str, pooled: bool = False, **kw: Any) -> Any:
    """An engine made as Dagster makes it (through its own ``create_engine``, ``NullPool``), whose
    connections commit without a disk flush.

    ``pooled``: its connection is kept between statements (``QueuePool``, one kept, more while
    several threads use it), not opened and closed for each: 0.06 ms of CPU a statement against
    0.40 (the connection, its pragma, its close), measured. A kept connection holds no
    transaction (returned, it is rolled back), like an anchor. Checked out, it is used only by the
    process that opened it and while the file at its path is still the one it opened: else it is
    let go (a replaced or removed file: opened again by its name, as Dagster's connection would
    be; a forked child's copy: kept, never used or closed, the anchors' way) and another opened."""
    from sqlalchemy import event, exc
    from sqlalchemy.pool import NullPool, QueuePool

    if not pooled:
        engine = make(conn_string, poolclass=NullPool, **kw)
        event.listen(engine, "connect", _pragmas)
        return engine
    kw["connect_args"] = {**kw.get("connect_args", {}), "check_same_thread": False}
    engine = make(conn_string, poolclass=QueuePool, pool_size=1, max_overflow=-1, **kw)
    path = engine.url.database

    def connected(dbapi_conn: Any, record: Any) -> None:
        _pragmas(dbapi_conn, record)
        record.info["aip_opened"] = (os.getpid(), _file_id(path))

    def checkout(dbapi_conn: Any, record: Any, proxy: Any) -> None:
        pid, file = record.info.get("aip_opened", (None, None))
        if pid != os.getpid():
            _INHERITED.append(dbapi_conn)
            record.dbapi_connection = proxy.dbapi_connection = None  # not closed (SQLAlchemy's recipe)
            raise exc.DisconnectionError("a connection of the parent process")
        if file is None or _file_id(path) != file:
            raise exc.DisconnectionError("the database file was replaced or removed")

    event.listen(engine, "connect", connected)
    event.listen(engine, "checkout", checkout)
    _POOLS.add(engine)
    return engine


def _close_kept() -> None:
    """The kept connections of every pooled engine closed (those in use stay): before a fork, as
    the anchors are, and at exit, before the anchors (the last connection out checkpoints)."""
    try:
        engines = list(_POOLS)
    except RuntimeError:  # the set changed meanwhile: nothing closed, as an anchor being opened
        return
    for engine in engines:
        try:
            engine.pool.dispose()
        except Exception:  # noqa: BLE001 - a connection that will not close: the process ends or forks anyway
            pass


class _Anchors:
    """One idle connection per database file, held open so that a statement's connection is never
    the last one to close (which checkpoints the WAL into the database and deletes it). At most
    KEEP files, the least recent closed first; the process's, whatever storage object asked."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: OrderedDict[tuple[str, int, int], sqlite3.Connection] = OrderedDict()
        self._inherited: list[sqlite3.Connection] = []  # a forked child's copies: kept, never used or closed

    def hold(self, path: str | None) -> None:
        if not path or path == ":memory:":
            return
        try:
            st = os.stat(path)
        except OSError:
            return
        key = (path, st.st_dev, st.st_ino)  # a file replaced at the same path gets its own anchor
        with self._lock:
            if key in self._held:
                self._held.move_to_end(key)
                return
            for old in [k for k in self._held if k[0] == path]:  # the replaced file's: let it go
                self._held.pop(old).close()
            try:
                conn = sqlite3.connect(path, timeout=5, check_same_thread=False)
                # a read maps the WAL index; the cursor is drained and closed, so no read stays open
                # (an open read would stop every checkpoint and the WAL would grow without end)
                conn.execute("SELECT count(*) FROM sqlite_master").fetchall()
            except sqlite3.Error:  # busy or unreadable: the statement's own connection will say so
                return
            self._held[key] = conn
            while len(self._held) > KEEP:
                self._held.popitem(last=False)[1].close()

    def release(self, path: str | None = None) -> None:
        """Close the anchors of ``path`` (of every file when None)."""
        with self._lock:
            for key in [k for k in self._held if path is None or k[0] == path]:
                self._held.pop(key).close()

    def close_if_idle(self) -> None:
        """Before a fork: close every anchor unless one is being opened (never waits). SQLite
        shares a file's state among a process's connections, so a child opening a database its
        parent holds would lean on the parent's anchor, which the parent may close (and then
        checkpoint and delete the log the child writes to)."""
        if self._lock.acquire(blocking=False):
            try:
                while self._held:
                    self._held.popitem(last=False)[1].close()
            finally:
                self._lock.release()

    def forget_in_child(self) -> None:
        """In a forked child: whatever was still held (opened while the fork came) is kept, never
        used or closed; the child makes its own."""
        self._lock = threading.Lock()
        self._inherited.extend(self._held.values())
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)


ANCHORS = _Anchors()
atexit.register(ANCHORS.release)  # the last connection out checkpoints the WAL into the database
atexit.register(_close_kept)  # before the anchors (atexit runs the last registered first)
if hasattr(os, "register_at_fork"):  # a forked child opens its own; the parent's are never closed there
    # ``before`` hooks run in the reverse order of registration: the kept connections close first,
    # then the anchors (the last connection out checkpoints the WAL into the database)
    os.register_at_fork(before=ANCHORS.close_if_idle, after_in_child=ANCHORS.forget_in_child)
    os.register_at_fork(before=_close_kept)


def _changes(conn: Any) -> int:
    """The SQLite connection's count of rows written so far (-1 when not at hand)."""
    try:
        return conn.connection.dbapi_connection.total_changes
    except AttributeError:
        return -1


# A new run's database, as Dagster's ``_initdb`` makes it (its tables, WAL mode, the alembic revision
# stamped), made once per Dagster version in the event log's folder and copied for each new run:
# 0.05-0.1 s of Dagster's own per run (the schema's DDL and alembic's script directory read twice).
TEMPLATE = ".aip-run-database-{version}.sqlite"  # not *.db: Dagster's glob of run databases skips it


def _revision(path: str) -> str | None:
    """The one alembic revision stamped in the SQLite file at ``path``, a file never written again
    (read as immutable: no lock, no log); None when there is not one."""
    from urllib.parse import quote

    try:
        conn = sqlite3.connect(f"file:{quote(path)}?mode=ro&immutable=1", uri=True)
        try:
            rows = conn.execute("SELECT version_num FROM alembic_version").fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return rows[0][0] if len(rows) == 1 and rows[0][0] else None


def _revision_of(engine: Any) -> str | None:
    """The one alembic revision stamped in the engine's database (as Dagster reads it: on a
    connection of the engine); None when there is not one, or the database is busy being made."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        with engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT version_num FROM alembic_version").fetchall()
    except SQLAlchemyError:
        return None
    return rows[0][0] if len(rows) == 1 and rows[0][0] else None


def _fsynced_copy(src: str, dst: str) -> None:
    import shutil

    shutil.copyfile(src, dst)
    fd = os.open(dst, os.O_RDONLY)
    try:
        os.fsync(fd)  # whole on disk before it is given its name
    finally:
        os.close(fd)


def _template_revision(storage: Any, make: bool = True) -> str | None:
    """The template's revision (its path and revision kept by the storage, read once), made with
    Dagster's own ``_initdb`` on a file of its own when missing and ``make``; None when there is none."""
    import uuid

    import dagster

    kept = storage.__dict__.get("_template")
    if kept is not None:
        return kept[1] or None
    base = getattr(storage, "_base_dir", None)
    if not isinstance(base, str):
        return None
    path = os.path.join(base, TEMPLATE.format(version=dagster.__version__))
    rev = _revision(path)  # never written once named
    if rev is None and not make:
        return None
    if rev is None:
        tmp = os.path.join(base, f".aip-run-database-{os.getpid()}-{uuid.uuid4().hex}.tmp")
        engine = _engine(_dagster_sqlite.create_engine, f"sqlite:///{tmp}")
        try:
            storage._initdb(engine)
            engine.dispose()  # the last connection out: the log checkpointed into the file and removed
            rev = _revision(tmp)
            if rev is None or os.path.exists(tmp + "-wal"):
                raise OSError("not a whole database")
            _fsynced_copy(tmp, tmp + ".copy")
            os.replace(tmp + ".copy", path)  # whole or not at all, whoever makes it
        except Exception as e:  # noqa: BLE001 - whatever went wrong: Dagster's own _initdb for each run then
            logging.getLogger("aip_assets").debug(f"no template for Dagster's run databases: {e}")
            rev = None
        finally:
            engine.dispose()
            for leftover in (tmp, tmp + ".copy", tmp + "-wal", tmp + "-shm"):
                with suppress(OSError):
                    os.unlink(leftover)
    storage._template = (path, rev or "")
    return rev


def _from_template(storage: Any, engine: Any, make: bool = True) -> bool:
    """Find the engine's database already made at the template's revision (Dagster's ``_initdb``
    would then do nothing), or, ``make``, make it, a new run's, from the template. False: not
    done, ``_initdb`` must run (a database of another revision or being made by another process, no
    template; the index: made by Dagster when the storage is opened, never from the template)."""
    import uuid

    path = engine.url.database
    if not path or path == ":memory:" or not (make or os.path.exists(path)):
        return False
    head = _template_revision(storage, make)
    if head is None:
        return False
    if os.path.exists(path):
        return _revision_of(engine) == head
    tmp = f"{path}.{os.getpid()}-{uuid.uuid4().hex}.tmp"
    try:
        _fsynced_copy(storage._template[0], tmp)
        os.link(tmp, path)  # never over a file another process made meanwhile
    except FileExistsError:
        return _revision_of(engine) == head
    except OSError:
        return False
    finally:
        with suppress(OSError):
            os.unlink(tmp)
    return True


if SqliteEventLogStorage is not None:

    class EngineKeepingSqliteEventLogStorage(SqliteEventLogStorage):
        """Dagster's SQLite event log, keeping one engine per database (see the module's docstring).
        Defined whatever ``FAST`` says, so a ``dagster.yaml`` naming it always loads; without
        ``FAST`` it is Dagster's class unchanged."""

        def __init__(self, base_dir: str, inst_data: Any = None):
            self._engines: OrderedDict[str, Any] = OrderedDict()
            super().__init__(base_dir, inst_data=inst_data)

        @classmethod
        def from_config_value(cls, inst_data, config_value):  # Dagster's names its own class
            return cls(inst_data=inst_data, **config_value)

        def _connect(self, shard: str):
            if not (FAST and hasattr(self, "_db_lock") and hasattr(self, "_initialized_dbs")):
                return super()._connect(shard)  # Dagster's own way
            return self._connect_kept(shard)

        @contextmanager
        def _connect_kept(self, shard: str) -> Iterator[Any]:
            with self._db_lock:
                engine = self._engines.pop(shard, None)
                if engine is None:  # made as Dagster makes it, through Dagster's own name for it
                    engine = _engine(
                        _dagster_sqlite.create_engine,
                        self.conn_string_for_shard(shard),
                        pooled=True,
                        connect_args={"timeout": _dagster_sqlite.SQLITE_BUSY_TIMEOUT_SECONDS},
                    )
                self._engines[shard] = engine  # the most recent last
                while len(self._engines) > KEEP:
                    self._engines.popitem(last=False)[1].dispose()
                if shard not in self._initialized_dbs:
                    if not _from_template(self, engine, make=shard != INDEX_SHARD):
                        self._initdb(engine)  # Dagster's own
                    self._initialized_dbs.add(shard)
                path = engine.url.database
                ANCHORS.hold(path)
                with engine.connect() as conn:
                    before = _changes(conn)
                    with conn.begin():
                        yield conn
                    if shard != INDEX_SHARD and path and _changes(conn) != before:
                        # the UI follows a run's events by watching its file (Dagster's watchdog on
                        # <run_id>.db); with the log kept, the write is in <run_id>.db-wal, so the
                        # file is touched to say so
                        try:
                            os.utime(path)
                        except OSError:
                            pass

        def _found_before(self, what: str, ask: Any) -> bool:
            """``ask()``, unless it found ``what`` before: what Dagster's migrations add (tables,
            columns) they never drop, so a yes is remembered (a no is asked again)."""
            seen: set[str] = self.__dict__.setdefault("_found", set())
            if FAST and what in seen:
                return True
            found = ask()
            if found:
                seen.add(what)
            return found

        def has_table(self, table_name: str) -> bool:
            """Dagster asks whether a table of the index exists before most asset and partition
            statements (81 times in a small run), each time on an engine and connection of its own
            (about 1 ms): a table found is remembered (``_found_before``)."""
            ask = super().has_table
            return self._found_before(f"table {table_name}", lambda: ask(table_name))

        def _has_asset_key_col_on_connection(self, conn: Any, column_name: str) -> bool:
            """Asked at each asset event (the asset_keys table's columns read again); a column found is
            remembered, as a table is."""
            ask = super()._has_asset_key_col_on_connection
            return self._found_before(f"asset_keys column {column_name}", lambda: ask(conn, column_name))

        def dispose(self) -> None:
            super().dispose()  # stops the file watchers first: nothing connects after this
            with self._db_lock:
                engines = list(self._engines.values())
                self._engines.clear()
            for engine in engines:
                engine.dispose()


if SqliteRunStorage is not None:

    class EngineKeepingSqliteRunStorage(SqliteRunStorage):
        """Dagster's SQLite run storage with its engine kept, an anchor and ``synchronous=NORMAL``
        (the module's docstring). Without ``FAST_RUNS`` it is Dagster's class unchanged."""

        @classmethod
        def from_config_value(cls, inst_data, config_value):  # Dagster's names its own class
            return cls.from_local(inst_data=inst_data, **config_value)

        def connect(self):
            if not (FAST_RUNS and hasattr(self, "_conn_string")):
                return super().connect()  # Dagster's own way
            return self._connect_kept()

        @contextmanager
        def _connect_kept(self) -> Iterator[Any]:
            engine = self.__dict__.get("_kept_engine")
            if engine is None:
                engine = self._kept_engine = _engine(_dagster_runs.create_engine, self._conn_string, pooled=True)
            ANCHORS.hold(engine.url.database)
            with engine.connect() as conn:
                with conn.begin():
                    yield conn

        def dispose(self) -> None:
            super().dispose()
            engine = self.__dict__.pop("_kept_engine", None)
            if engine is not None:
                engine.dispose()
