"""The Dagster instance the CLI shares with `dagster dev`, in the project's data folder.

The data folder (``settings.data_dir``: ``$AIP_DATA_DIR``, else the project's ``data/``, else the
user's) holds the warehouse, its call journal, reports and Dagster's storage (``dagster_home``).

``$AIP_WAREHOUSE`` (or ``--warehouse``) still picks the warehouse file, and ``$DAGSTER_HOME``
Dagster's storage; a DAGSTER_HOME set by the user wins for the CLI and `dagster dev` alike.
`dagster dev` in the project root reads ``dagster.yaml`` there, which points its storage at
``data/dagster_home``; the CLI opens that same storage, so runs launched from either show in both.

Shared mode (a lake: ``AIP_LAKE_DATA_PATH`` with ``AIP_SHARED_STATE_URL``): Dagster's run,
event-log and schedule storage is the shared-state Postgres database (``dagster-postgres``, the ``shared`` extra), so every worker, the daemon and the
UI see the same runs, partitions and queue. The settings name the URL only by its environment
variable, ``AIP_DAGSTER_STORAGE_URL``: the CLI sets it, for itself and the processes it starts
(``aip-eval daemon``, ``aip-eval ui``), from ``AIP_SHARED_STATE_URL`` with SQLAlchemy's psycopg2
driver named (SQLAlchemy 2.1 would pick psycopg 3, which dagster-postgres does not handle); set
it yourself to keep Dagster's storage in another database. No password is written to a file.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from .settings import current, data_dir

# The specs' execution manifests allow 8 executions of one metric at once. Every evaluation run
# covers one (run, metric) partition, so at most 8 queued runs at once keeps that bound for every
# metric (stricter: 8 in all). A per-metric run-queue limit would need a run tag that carries the
# metric, and runs launched from the asset graph in the UI carry only `dagster/partition`.
MAX_CONCURRENCY = 8
STORAGE_URL_ENV = "AIP_DAGSTER_STORAGE_URL"


def configured_storage_url() -> str:
    """``$AIP_DAGSTER_STORAGE_URL`` as libpq reads it (the psycopg2 driver's name taken out); "" unset."""
    return (current().secret("dagster_storage_url") or "").replace("postgresql+psycopg2://", "postgresql://", 1)


def use_project_of(spec_path: str | Path) -> Path:
    """Fix the data folder for this process from the spec's project (``AIP_DATA_DIR``), so every
    stage, check and report of the run finds the same warehouse and Dagster storage. Written to the
    environment (with the marker ``AIP_DATA_DIR_SET``: ours, not the user's), so the worker
    processes a run starts (``--parallel``) find it too. A folder the user set is kept, run after
    run, and never marked ours."""
    now = os.environ.get("AIP_DATA_DIR")
    ours = bool(now) and now == os.environ.get("AIP_DATA_DIR_SET")
    if ours:
        del os.environ["AIP_DATA_DIR"]  # set by an earlier run in this process, not by the user: find it again
    d = data_dir(Path(spec_path).resolve().parent)
    if now and not ours:  # the user's: left as set, unmarked
        return d
    os.environ["AIP_DATA_DIR"] = os.environ["AIP_DATA_DIR_SET"] = str(d)
    return d


def shared() -> bool:
    """Dagster's storage is shared (Postgres) when the warehouse is: a lake (``AIP_LAKE_DATA_PATH``)
    with its catalog in the shared-state database. With ``AIP_SHARED_STATE_URL`` alone each
    machine's warehouse is its own, and so is its Dagster history."""
    settings = current()
    return bool(settings.lake_data_path) and settings.shared_state_url is not None


def storage_url() -> str:
    """Shared mode: the URL of Dagster's storage, as SQLAlchemy reads it (``$AIP_DAGSTER_STORAGE_URL``,
    else ``$AIP_SHARED_STATE_URL`` with the psycopg2 driver named), put in the environment for the
    processes this one starts. Never logged."""
    from .errors import AipError
    from .shared_state import SHARED_STATE_ENV, check_url, shared_state_url

    users = current().secret("dagster_storage_url")
    if users and users != os.environ.get(STORAGE_URL_ENV + "_SET"):
        return users  # the user's
    url = shared_state_url() or ""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme not in ("postgresql", "postgres"):
        raise AipError(
            f"{SHARED_STATE_ENV} is not a postgresql:// URL, which Dagster's storage needs "
            f"(postgresql://user:password@host:port/database); or set {STORAGE_URL_ENV} to "
            "Dagster's own database as postgresql+psycopg2://..."
        )
    check_url(url, SHARED_STATE_ENV)
    try:
        import dagster_postgres  # noqa: F401
    except ImportError:
        raise AipError(
            f"shared mode ({SHARED_STATE_ENV}) keeps Dagster's runs in Postgres, which needs "
            "dagster-postgres: pip install 'aip-assets[shared]'"
        ) from None
    # derived here (remembered as such: the shared-state URL may change within one process, e.g. between
    # tests), and written for Dagster: its settings name the URL by this variable, read by this process's
    # instance and by the processes it starts (the daemon, the UI, their run workers)
    os.environ[STORAGE_URL_ENV] = os.environ[STORAGE_URL_ENV + "_SET"] = "postgresql+psycopg2://" + rest
    return os.environ[STORAGE_URL_ENV]


class _ScrubPassword:
    """A filter for the root logger: dagster-postgres logs its retries there with the driver's
    message, which may quote the connection's parameters."""

    def filter(self, record) -> bool:
        from .shared_state import _scrub

        url = configured_storage_url()
        if url:
            try:
                text = record.getMessage()
            except Exception:  # noqa: BLE001 - a record that cannot be formatted: its handler says so, as without us
                return True
            record.msg, record.args = _scrub(text, url), ()
        return True


_SCRUB = _ScrubPassword()


def instance_settings(home: Path, shared: bool = False, max_runs: int = MAX_CONCURRENCY) -> str:
    """``dagster.yaml`` for ``home``: the layout of the project's own dagster.yaml (storage under
    ``home/storage``), with absolute paths, so it holds from any working directory. The storage is
    spelled out as the three SQLite storages ``storage: sqlite`` makes, in the same folders, with
    the event log and run storage faster (dagster_storage.py) when this Dagster allows.

    ``shared``: the storage is Postgres, named by ``$AIP_DAGSTER_STORAGE_URL`` (see the module's
    docstring). The queue runs one run of a partition at a time, and its daemon looks for queued
    runs every ``AIP_DEQUEUE_INTERVAL_SECONDS`` (Dagster's default when unset). ``max_runs``: runs
    at once (a benchmark's worker count)."""
    from .dagster_storage import FAST, FAST_RUNS

    h = home.resolve()
    st = h / "storage"
    # one run of a partition at a time: two runs evaluating one partition at once would write the
    # same rows and, in a lake, conflict
    one_per_partition = (
        "    tag_concurrency_limits:\n      - key: dagster/partition\n"
        "        value:\n          applyLimitPerUniqueValue: true\n        limit: 1\n"
    )
    if shared:
        storage = f"storage:\n  postgres:\n    postgres_url:\n      env: {STORAGE_URL_ENV}\n"
    elif FAST or FAST_RUNS:
        runs = (
            "module: aip_assets.dagster_storage\n  class: EngineKeepingSqliteRunStorage"
            if FAST_RUNS
            else "module: dagster._core.storage.runs\n  class: SqliteRunStorage"
        )
        events = (
            "module: aip_assets.dagster_storage\n  class: EngineKeepingSqliteEventLogStorage"
            if FAST
            else "module: dagster._core.storage.event_log\n  class: SqliteEventLogStorage"
        )
        storage = (
            f"run_storage:\n  {runs}\n  config:\n    base_dir: {st / 'history'}\n"
            f"event_log_storage:\n  {events}\n  config:\n    base_dir: {st / 'history' / 'runs'}\n"
            f"schedule_storage:\n  module: dagster._core.storage.schedules\n  class: SqliteScheduleStorage\n"
            f"  config:\n    base_dir: {st / 'schedules'}\n"
        )
    else:
        storage = f"storage:\n  sqlite:\n    base_dir: {st}\n"
    header = (
        "Dagster's storage in the shared Postgres database (shared mode)"
        if shared
        else "the same storage as the project's dagster.yaml"
    )
    every = current().dequeue_interval_seconds  # AIP_DEQUEUE_INTERVAL_SECONDS; unset: Dagster's 5 s
    queue = f"  config:\n    dequeue_interval_seconds: {every}\n" if every is not None else ""
    return (
        f"# written by aip-assets for the CLI: {header}\n"
        f"{storage}"
        f"local_artifact_storage:\n  module: dagster._core.storage.root\n  class: LocalArtifactStorage\n"
        f"  config:\n    base_dir: {h}\n"
        f"compute_logs:\n  module: dagster._core.storage.local_compute_log_manager\n"
        f"  class: LocalComputeLogManager\n  config:\n    base_dir: {h / 'compute_logs'}\n"
        f"telemetry:\n  enabled: false\n"
        f"run_coordinator:\n  module: dagster._core.run_coordinator\n  class: QueuedRunCoordinator\n{queue}"
        f"concurrency:\n  runs:\n    max_concurrent_runs: {max_runs}\n{one_per_partition}"
    )


def prepare_home() -> Path:
    """This process's DAGSTER_HOME: ``$DAGSTER_HOME`` when the user set it, else ``data/dagster_home``
    with the settings above (Postgres in shared mode), written when they differ, and set as
    DAGSTER_HOME for this process and the ones it starts."""
    import logging

    from .errors import AipError

    users = (
        bool(os.environ.get("DAGSTER_HOME")) and os.environ.get("AIP_DAGSTER_HOME_SET") != os.environ["DAGSTER_HOME"]
    )
    is_shared = shared()
    if is_shared:
        try:
            storage_url()  # a clear error before Dagster's own; and the variable the settings name
        except AipError:
            if not users:  # the user's settings may not name it
                raise
        if _SCRUB not in logging.getLogger().filters:
            logging.getLogger().addFilter(_SCRUB)
    if users:
        return Path(os.environ["DAGSTER_HOME"])
    home = (data_dir() / "dagster_home").resolve()  # DAGSTER_HOME must be absolute
    home.mkdir(parents=True, exist_ok=True)
    settings = home / "dagster.yaml"
    text = instance_settings(home, shared=is_shared)
    if not settings.exists() or settings.read_text() != text:  # whole or not at all: another process may read it
        tmp = settings.with_name(f".dagster.yaml.{os.getpid()}")
        try:
            tmp.write_text(text)
            os.replace(tmp, settings)
        except BaseException as e:
            tmp.unlink(missing_ok=True)  # a full disk (or a Ctrl-C) leaves no half-written copy behind
            from .errors import disk_full

            if isinstance(e, OSError) and (full := disk_full(e, settings)) is not None:
                raise full from None
            raise
    # DagsterInstance.get() reads $DAGSTER_HOME; remember that we set it (the data folder may change
    # within one process, e.g. between tests, and then so does the home)
    os.environ["DAGSTER_HOME"] = os.environ["AIP_DAGSTER_HOME_SET"] = str(home)
    return home


# Dagster's Postgres storages open a connection per statement (a NullPool: 4.2 ms a statement on
# loopback against 0.35 ms pooled, measured) except in its webserver, which asks them to keep one
# (``optimize_for_webserver``). A run's few hundred statements are worth the same: the instances
# this project uses in shared mode keep one connection per storage (and up to POOL_OVERFLOW more
# while busy), with Postgres's statement timeout at STATEMENT_TIMEOUT_MS.
POOL_OVERFLOW = 4
STATEMENT_TIMEOUT_MS = 60_000
_POOLED: weakref.WeakSet[Any] = weakref.WeakSet()


def pooled(instance) -> None:
    """Keep connections to Dagster's Postgres storage open in this process (shared mode; once per
    instance; nothing for SQLite), riding out a restart of the database (``_ride_out``)."""
    if instance in _POOLED or not shared():
        return
    instance.optimize_for_webserver(
        statement_timeout=STATEMENT_TIMEOUT_MS, pool_recycle=3600, max_overflow=POOL_OVERFLOW
    )
    url = configured_storage_url()
    for name in ("run_storage", "event_log_storage", "schedule_storage"):
        engine = getattr(getattr(instance, name, None), "_engine", None)
        if engine is not None and url:
            _ride_out(engine, url)
    _POOLED.add(instance)


STORAGE_LABEL = "Dagster's storage in Postgres"


def _ride_out(engine, url: str) -> None:
    """Dagster's Postgres storage through a restart of the database. Two of SQLAlchemy's public
    pool events on the storage's engine (the one ``optimize_for_webserver`` made), and nothing of
    dagster-postgres changed:

    - ``checkout``: a kept connection is tried (``SELECT 1``) before a statement uses it, and one
      the database dropped is replaced (``DisconnectionError``: SQLAlchemy's pessimistic
      disconnect handling, what ``pool_pre_ping`` does). Without it the first statement after a
      restart fails on the dead connection, outside the connect that dagster-postgres retries;
    - ``do_connect``: a new connection that the database refuses while it restarts is tried again
      with backoff for ``AIP_SHARED_RETRY_SECONDS`` (``shared_state.patiently``, logged), then an
      ``errors.OperationalError`` naming the database. dagster-postgres' own retry of a connect
      (``retry_pg_connection_fn``: five tries in about six seconds, not configurable) sees only
      SQLAlchemy's errors, so it does not wait again on top.
    A statement in flight at the moment the database stops still fails; the CLI says so (exit 5,
    ``storage_outage``)."""
    from sqlalchemy import event, exc

    from .shared_state import Unreachable, _first_line, describe, lost, patiently, reached

    reached(url)  # get_instance reached it (or a run of it is under way)

    def ping(dbapi_conn, _record, _proxy) -> None:
        try:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
        except Exception as e:  # noqa: BLE001 - psycopg2's: the connection is gone; the pool makes another
            raise exc.DisconnectionError(_first_line(e, url)) from None

    def connect(dialect, _record, cargs, cparams):
        def once():
            try:
                return dialect.connect(*cargs, **cparams)
            except dialect.loaded_dbapi.OperationalError as e:
                if not lost(e):
                    raise
                raise Unreachable(f"{STORAGE_LABEL} ({describe(url)}): cannot connect", _first_line(e, url)) from None

        return patiently(url, "reading or writing Dagster's runs and events", once, label=STORAGE_LABEL)

    event.listen(engine, "checkout", ping)
    event.listen(engine, "do_connect", connect)


def storage_outage(e: BaseException):
    """An ``OperationalError`` for an error of Dagster's Postgres storage that is the database going
    away (a statement cut off by a restart, dagster-postgres giving up its connects), naming the
    database (no password) and what failed; None for anything else, or outside shared mode."""
    if not shared():
        return None
    import re

    from .errors import OperationalError
    from .shared_state import _first_line, describe, lost

    url = configured_storage_url()
    seen: set[int] = set()
    todo: list[BaseException | None] = [e]
    while todo:
        err = todo.pop()
        if err is None or id(err) in seen:
            continue
        seen.add(id(err))
        orig = getattr(err, "orig", None)  # SQLAlchemy's DBAPIError: the driver's error
        name = type(err).__name__
        outage = (
            getattr(err, "connection_invalidated", False)
            or (orig is not None and type(orig).__name__ == "OperationalError" and lost(orig))
            or (name == "OperationalError" and type(err).__module__.startswith("psycopg2") and lost(err))
            or (name == "DagsterPostgresException" and "retries for DB connection" in str(err))
        )
        if outage:
            statement = getattr(err, "statement", None) or ""
            table = re.search(r"\b(?:INTO|UPDATE|FROM)\s+([a-z_]+)", statement)
            what = f"a statement on table {table.group(1)}" if table else "a statement"
            cause = orig if orig is not None else (err.__cause__ or err)
            return OperationalError(
                f"{STORAGE_LABEL} ({describe(url)}, {STORAGE_URL_ENV}): {what} failed, the "
                f"database went away: {_first_line(cause, url)}"
            )
        todo += [err.__cause__, None if err.__suppress_context__ else err.__context__]
    return None


@contextmanager
def _making_storage(home: Path) -> Iterator[None]:
    """One process at a time opens the instance's SQLite storage (an exclusive ``flock`` on
    ``home/.storage.lock``, held while Dagster makes its tables). Two processes opening a home never
    used before each found a table missing and made it, and the slower one failed: "table
    jobs/runs already exists" (2 of 16 double starts). Held for milliseconds once the storage is
    made; nothing in shared mode (Postgres), or where the lock file cannot be made (a read-only
    home of the user's): as before."""
    import fcntl

    if shared():
        yield
        return
    try:
        fh = open(home / ".storage.lock", "a")
    except OSError:
        yield
        return
    try:
        fcntl.flock(fh, fcntl.LOCK_EX)  # a Ctrl-C ends the wait
        yield
    finally:
        fh.close()  # lets the lock go


class _NewFilesQuickly:
    """A SQLAlchemy ``connect`` listener, on while ``get_instance`` opens the storage: a connection to
    a SQLite file under ``home`` that was new when the first connection to it came (0 bytes) is put
    in WAL mode with ``synchronous=NORMAL``, for the statements that make its tables.

    Dagster makes each of its databases (runs.db, the event log's index.db, schedules.db) in
    SQLite's default mode, about 90 statements in all, each its own commit with its files synced
    and a journal file made and deleted (3.6 ms a statement on this machine's disk: 0.8-1.0 s of a
    new project's first run, waiting), and puts the file in WAL mode just after. In WAL mode from
    the start (the mode Dagster leaves it in) with ``synchronous=NORMAL`` (what dagster_storage.py's
    connections use for every later write: safe against a crash of the process; a power cut may
    lose the last commits, never corrupt the file) they are written without a sync each. The
    file gets an anchor (``dagster_storage.ANCHORS``), so that closing each statement's connection
    does not checkpoint the log into the file and delete it (about 55 connections). The tables,
    the alembic stamp and every later statement are Dagster's own, as before; a file that was
    there already is left alone, and so are the other connections (Dagster's own settings)."""

    def __init__(self, home: Path):
        self.root = str(home.resolve()) + os.sep
        self.new: set[str] = set()
        self.old: set[str] = set()

    def __call__(self, dbapi_conn: Any, _record: Any) -> None:
        import sqlite3

        if not isinstance(dbapi_conn, sqlite3.Connection):
            return
        row = dbapi_conn.execute("PRAGMA database_list").fetchone()  # (seq, "main", file)
        path = row[2] if row else ""
        if not path or not path.startswith(self.root) or path in self.old:
            return
        if path not in self.new:
            try:
                fresh = os.path.getsize(path) == 0
            except OSError:
                fresh = False
            (self.new if fresh else self.old).add(path)
            if not fresh:
                return
        dbapi_conn.execute("PRAGMA journal_mode=WAL")
        dbapi_conn.execute("PRAGMA synchronous=NORMAL")
        from .dagster_storage import ANCHORS

        ANCHORS.hold(path)  # the statements' connections are never the last to close (dagster_storage.py)


@contextmanager
def _quick_new_files(home: Path, ours: bool) -> Iterator[None]:
    """``_NewFilesQuickly`` listening on every engine's connections for the block: for the home this
    module set up (``ours``: not a DAGSTER_HOME of the user's, whose settings may name other
    storage), and not in shared mode."""
    if not ours or shared():
        yield
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    listener = _NewFilesQuickly(home)
    event.listen(Engine, "connect", listener)
    try:
        yield
    finally:
        event.remove(Engine, "connect", listener)


_KEPT_SCRIPTS: dict[Any, Any] = {}  # (what from_config reads) -> ScriptDirectory; "class" -> the subclass
_KEPT_LOCK = threading.Lock()


def _keep_alembic_scripts() -> None:
    """Dagster's alembic migration scripts read once per process, not once per use.

    Each of Dagster's SQLite storages checks its database's alembic revision when it opens
    (``check_alembic_revision``) and stamps a new one (``alembic.command.stamp``), and each of those
    reads the ~40 migration scripts again (``ScriptDirectory.from_config``, then its revision
    map): 30 ms a time, twice for an instance of a project that has run before, seven times for a
    new one, twice for every Dagster run's new event-log file. The ``ScriptDirectory`` made for
    Dagster's own scripts (``dagster._core.storage.sql.ALEMBIC_SCRIPTS_LOCATION``) is kept, for
    the same options, and given again; any other location is read as alembic does. The two names
    this uses, ``ScriptDirectory`` in ``dagster._core.storage.sql`` and in ``alembic.command``, are
    bound to a subclass whose ``from_config`` does that; if either is not there, nothing changes."""
    try:
        import alembic.command as alembic_command
        from alembic.script import ScriptDirectory
        from dagster._core.storage import sql as dagster_sql
    except ImportError:
        return
    location = getattr(dagster_sql, "ALEMBIC_SCRIPTS_LOCATION", None)
    with _KEPT_LOCK:
        kept = _KEPT_SCRIPTS.get("class")
        if kept is None:
            kept = _KEPT_SCRIPTS["class"] = _kept_scripts_class(ScriptDirectory)
    if not isinstance(location, str) or not all(
        getattr(m, "ScriptDirectory", None) in (ScriptDirectory, kept) for m in (dagster_sql, alembic_command)
    ):
        return
    kept.location = location
    for module in (dagster_sql, alembic_command):
        setattr(module, "ScriptDirectory", kept)  # noqa: B010 - a module's name, bound again


def _kept_scripts_class(base: Any) -> Any:
    """A subclass of alembic's ``ScriptDirectory`` whose ``from_config`` keeps what it made for
    Dagster's location (``_keep_alembic_scripts``)."""

    class KeptScriptDirectory(base):
        location = ""

        @classmethod
        def from_config(cls, config):
            try:
                key = (
                    config.get_alembic_option("script_location"),
                    *(
                        config.get_alembic_option(o)
                        for o in ("file_template", "truncate_slug_length", "output_encoding", "timezone")
                    ),
                    config.get_alembic_boolean_option("sourceless"),
                    config.get_alembic_boolean_option("recursive_version_locations"),
                    tuple(config.get_version_locations_list() or ()),
                    repr(config.get_hooks_list()),
                )
                plain = key[0] == cls.location and not config.get_prepend_sys_paths_list()
            except AttributeError:  # another alembic's Config
                plain = False
            if not plain:
                return base.from_config(config)
            with _KEPT_LOCK:
                scripts = _KEPT_SCRIPTS.get(key)
                if scripts is None:
                    scripts = _KEPT_SCRIPTS[key] = base.from_config(config)
            return scripts

    return KeptScriptDirectory


def get_instance():
    """The project's Dagster instance (public API only), from ``prepare_home()``. Its storage is
    reached here, so a database that cannot be used is an AipError naming it (never the password).
    A new storage's files are made in WAL mode (``_NewFilesQuickly``), and Dagster's migration
    scripts are read once in the process (``_keep_alembic_scripts``)."""
    from dagster import DagsterInstance

    from .errors import AipError
    from .shared_state import _first_line, describe

    home = prepare_home()
    url = configured_storage_url()
    ours = os.environ.get("AIP_DAGSTER_HOME_SET") == str(home)
    try:
        with _making_storage(home), _quick_new_files(home, ours):
            _keep_alembic_scripts()
            instance = DagsterInstance.get()
            pooled(instance)
            instance.get_runs(limit=1)  # the storage is opened lazily: reach it now
        return instance
    except Exception as e:  # noqa: BLE001 - Dagster's or the driver's error, said with the database and without the password
        cause = e.__cause__ or e
        what = (
            f"Dagster's storage in Postgres ({describe(url)}, {STORAGE_URL_ENV})"
            if ours and shared() and url
            else f"the Dagster instance in {home} ($DAGSTER_HOME)"
        )
        raise AipError(
            f"{what} cannot be used: {_first_line(cause, url) if url else str(cause).splitlines()[0]}"
        ) from None
