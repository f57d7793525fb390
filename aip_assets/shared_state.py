"""The Postgres database workers on several machines share state through (shared mode: docs/shared-mode.md).

``AIP_SHARED_STATE_URL=postgresql://user:password@host:5432/db``, from the environment only: with
it, every endpoint's request and token schedule (``aip_rate_schedule``) and every capped run's
call and token count (``aip_run_budget``) live there instead of in this machine's files and this
process. Without it nothing here is used.

One connection per process and database (``SharedDb.get``), used by one thread of its own, so a
statement never blocks an event loop (the client awaits ``SharedDb.call``) and statements from
one process are applied in the order they were issued. The connection has keepalives, a
``lock_timeout`` and a ``statement_timeout`` (``LOCK_TIMEOUT_S``, ``STATEMENT_TIMEOUT_S``), so a stalled database or a worker
holding a row's lock fails a statement instead of hanging a run. A connection lost between
statements (a restart of the database, a dropped connection) is made again, retried with backoff
for at most ``AIP_SHARED_RETRY_SECONDS`` (default 60; ``patiently``), saying so in the log; past
that, an ``errors.OperationalError`` (exit 5) names the database and what failed, and stops the
stage (the limits cannot be held without the database). The same patience serves every Postgres
connection of shared mode: the call journal's, the lake's catalog and Dagster's storage
(``dagster_home.pooled``). A database this process never reached is not waited for: at the
first contact (the checks before a run) a refused connection is a configuration to check, said at
once. A statement repeated after a reconnect may count a call or a request twice: the limits err
on the safe side.

Messages show the database as ``postgresql://user@host:port/db``, built from the parsed URL, and
never the password, the raw URL or a driver message that could quote either.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from . import settings as aip_settings
from .errors import AipError, OperationalError

logger = logging.getLogger("aip_assets")
SHARED_STATE_ENV = "AIP_SHARED_STATE_URL"
LOCK_TIMEOUT_S = 30  # the longest a statement waits for a row another worker holds
STATEMENT_TIMEOUT_S = 60  # the longest a statement may take
CONNECT_TIMEOUT_S = 10
RETRY_ENV = "AIP_SHARED_RETRY_SECONDS"
RETRY_NOTICE_S = 10.0  # a wait for the database says so this often
T = TypeVar("T")

# every table of the shared state, made at the first connection (and so by the check before a run)
_PG_TABLES = (
    """CREATE TABLE IF NOT EXISTS aip_rate_schedule (
    endpoint text PRIMARY KEY,   -- the sha256 of the endpoint's id, as the files are named
    req_next double precision NOT NULL DEFAULT 0,  -- the next free request start (the database's clock)
    tok_next double precision NOT NULL DEFAULT 0   -- when the tokens spent so far are paid off
)""",
    """CREATE TABLE IF NOT EXISTS aip_run_budget (
    run_id text PRIMARY KEY,
    calls bigint NOT NULL,   -- network calls the run's workers have sent (reserved before sending)
    tokens bigint NOT NULL   -- tokens they have spent (as the answers counted them)
)""",
)


_SETUP_LOCK = 0x41495053  # the advisory lock key under which a connection makes the tables ("AIPS")


def shared_state_url() -> str | None:
    """The shared-state database's URL from ``AIP_SHARED_STATE_URL``; None: shared mode is off.
    Read from the environment only, never stored or logged (see ``describe``)."""
    return aip_settings.current().secret("shared_state_url")


def _parts(url: str) -> dict[str, str] | None:
    """The URL's connection parameters as libpq reads them (None: it cannot read them)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # said elsewhere; read a URL's plain parts for the message
        try:
            u = urlsplit(url)
            out = {
                "user": u.username or "",
                "host": u.hostname or "",
                "dbname": u.path.lstrip("/"),
                "password": u.password or "",
            }
            if u.port:
                out["port"] = str(u.port)
            return out if u.scheme.startswith("postgres") else None
        except ValueError:
            return None
    try:
        return {k: str(v) for k, v in conninfo_to_dict(url).items()}
    except Exception:
        return None


@functools.lru_cache(maxsize=64)  # on every statement's path (patiently): parsed once per URL
def describe(url: str) -> str:
    """The database for a message: ``postgresql://user@host:port/db``, never the password."""
    p = _parts(url)
    if p is None:
        return "(not a PostgreSQL URL libpq can read)"
    user = f"{p['user']}@" if p.get("user") else ""
    host = p.get("host") or "localhost"
    host = f"[{host}]" if ":" in host else host
    port = f":{p['port']}" if p.get("port") else ""
    return f"postgresql://{user}{host}{port}/{p.get('dbname', '')}"


def _scrub(text: str, url: str) -> str:
    """A driver's message with the URL and its password taken out, whatever spelling it quotes."""
    p = _parts(url) or {}
    secrets = {url}
    pw = p.get("password")
    if pw:
        secrets |= {pw, quote(pw, safe=""), quote(pw)}
    for s in sorted(secrets, key=len, reverse=True):
        text = text.replace(s, "***")
    return text


def _first_line(e: BaseException, url: str) -> str:
    s = str(e).strip()
    return _scrub(s.splitlines()[0], url) if s else type(e).__name__


def _error(url: str, what: str, e: BaseException | None = None) -> AipError:
    why = f": {_first_line(e, url)}" if e is not None else ""
    return AipError(f"{SHARED_STATE_ENV} ({describe(url)}): {what}{why}")


class Unreachable(AipError):
    """The database did not answer: a connection refused, closed, timed out or ended by a restart,
    which may recover (``lost``), unlike a refused login or a missing database. ``patiently`` tries
    again; anywhere else it is the AipError it always was."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason  # the driver's first line, scrubbed


# a refusal, not an outage: these are not waited for
_REFUSALS = (
    "authentication",
    "password",
    "not permitted to log in",
    "does not exist",
    "pg_hba.conf",
    "permission denied",
    "invalid connection option",
    "invalid dsn",
    "invalid integer value",
    "invalid port",
    "could not parse",
)


def lost(e: BaseException) -> bool:
    """Whether a driver's error (psycopg, psycopg2, or DuckDB's postgres extension) is the database
    going away or not answering (a restart, a dropped, refused or timed-out connection): something
    that may recover. A refusal (authentication, a missing database or role) or a statement's own
    failure (a timeout, a lock, a constraint: an SQLSTATE outside connection failures) is not."""
    code = getattr(e, "sqlstate", None) or getattr(e, "pgcode", None)
    if code and not (str(code).startswith("08") or code in ("57P01", "57P02", "57P03")):
        return False
    text = str(e).lower()
    return not any(r in text for r in _REFUSALS)


def retry_seconds() -> float:
    """``AIP_SHARED_RETRY_SECONDS``: how long a lost connection to a shared-mode database is tried
    again before the run stops (exit 5); read when needed, so a change in the environment holds
    (a bad value: ``settings.current`` says so, naming the variable)."""
    return aip_settings.current().shared_retry_seconds


_REACHED: set[str] = set()  # the databases (``describe``) this process has reached
_GAVE_UP: dict[str, float] = {}  # a database waited for in vain: when (monotonic); cleared when it answers


def reached(url: str) -> None:
    """Say that this process has used the database: a lost connection to it is waited for."""
    _REACHED.add(describe(url))


def patiently(url: str, what: str, fn: Callable[[], T], label: str = SHARED_STATE_ENV) -> T:
    """``fn()``, tried again while it raises ``Unreachable``, with backoff (0.1 s doubling to 2 s,
    jittered), for at most ``AIP_SHARED_RETRY_SECONDS``, logging the wait; then an
    ``OperationalError`` naming ``label`` (the variable, or Dagster's storage), the database and
    ``what`` failed. A database this process has not reached yet (``reached``) is not waited for,
    and nor is one that another wait of this process gave up on (until it answers again): a second
    component meeting the same outage fails after a second try at once (a kept connection that
    died is made again first) instead of adding its own wait."""
    key = describe(url)
    if key not in _REACHED:
        out = fn()
        _REACHED.add(key)
        return out
    t0 = time.monotonic()
    delay, told = 0.1, 0.0
    bound: float | None = None
    for attempt in itertools.count():
        try:
            out = fn()
        except Unreachable as e:
            bound = retry_seconds() if bound is None else bound
            now = time.monotonic()
            waited = now - t0
            if attempt == 0:
                continue  # a kept connection the database dropped (a restart, an idle timeout): made again at once
            if key in _GAVE_UP or waited >= bound:
                _GAVE_UP[key] = now
                how = (
                    f"it has not answered for {waited:.0f}s"
                    if waited >= bound
                    else f"it still does not answer (this process waited {bound:g}s for it already)"
                )
                raise OperationalError(
                    f"{label} ({key}): {what} failed: {how}: {e.reason}. {RETRY_ENV} "
                    f"(now {bound:g}) sets how long a run waits for the database"
                ) from None
            if not told or now - told >= RETRY_NOTICE_S:
                logger.warning(
                    f"{label} ({key}): {what}: the database does not answer ({e.reason}); "
                    f"waited {waited:.0f}s, trying again for up to {bound:g}s ({RETRY_ENV})"
                )
                told = now
            time.sleep(max(0.0, min(delay * random.uniform(0.75, 1.25), t0 + bound - now)))
            delay = min(delay * 2, 2.0)
            continue
        if told:
            logger.warning(
                f"{label} ({key}): the database answers again after {time.monotonic() - t0:.1f}s; {what} goes on"
            )
        _GAVE_UP.pop(key, None)
        return out
    raise AssertionError("unreachable")


def connect(url: str, what: str, setup: Sequence[str] = ()) -> Any:
    """A new autocommit connection to the shared-state database, with keepalives and the lock and
    statement timeouts, after running ``setup`` (``what`` it does, for its error). Failures raise
    AipError naming the variable, never showing the password."""
    check_url(url, SHARED_STATE_ENV)
    try:
        import psycopg
    except ImportError:
        raise AipError(
            f"{SHARED_STATE_ENV} is set, but psycopg is not installed: pip install 'aip-assets[shared]'"
        ) from None
    if _parts(url) is None:
        raise AipError(
            f"{SHARED_STATE_ENV} is not a PostgreSQL URL libpq can read: expected "
            "postgresql://user:password@host:5432/db"
        )
    try:
        conn = psycopg.connect(
            url,
            connect_timeout=CONNECT_TIMEOUT_S,
            autocommit=True,
            keepalives=1,
            keepalives_idle=30,
            keepalives_interval=10,
            keepalives_count=3,
        )
    except psycopg.Error as e:
        raise _failed(url, "cannot connect to the shared-state database", e) from None
    try:
        conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT_S}s'")
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
        if setup:
            make_in_turn(conn, setup)
    except psycopg.Error as e:
        broken = conn.broken
        conn.close()
        raise (_failed(url, f"cannot {what}", e) if broken else _error(url, f"cannot {what}", e)) from None
    return conn


def make_in_turn(conn: Any, statements: Sequence[str]) -> None:
    """Run ``statements`` (tables, schemas, views made if missing) in one transaction, under the
    setup lock. CREATE ... IF NOT EXISTS is not safe against another session making the same table at
    the same moment: one of them fails (a duplicate pg_type key, "type ... already exists" or
    "relation ... already exists", measured). Workers starting together take turns instead, and each
    finds what the one before it made. The lock is the transaction's: its commit or rollback lets it go."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [_SETUP_LOCK])
        for statement in statements:
            conn.execute(statement)


def _failed(url: str, what: str, e: BaseException) -> AipError:
    """A connection's failure as an AipError: ``Unreachable`` when the database went away (``lost``)."""
    import psycopg

    err = _error(url, what, e)
    return Unreachable(str(err), _first_line(e, url)) if isinstance(e, psycopg.OperationalError) and lost(e) else err


class SharedDb:
    """The process's connection to one shared-state database (see the module's docstring)."""

    _open: dict[tuple[int, str], SharedDb] = {}
    _open_lock = threading.Lock()

    def __init__(self, url: str):
        self.url = url
        self.name = describe(url)
        self._conn: Any = None
        self._inside = threading.local()  # set on this database's own thread
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="aip-shared-state", initializer=self._mark)

    def _mark(self) -> None:
        self._inside.yes = True

    @classmethod
    def get(cls, url: str) -> SharedDb:
        """This process's instance for ``url`` (a forked child makes its own: a connection and a
        thread do not survive a fork)."""
        key = (os.getpid(), url)
        with cls._open_lock:
            if key not in cls._open:
                cls._open[key] = cls(url)
            return cls._open[key]

    def error(self, what: str, e: BaseException | None = None) -> AipError:
        return _error(self.url, what, e)

    def _connect(self) -> Any:
        return connect(self.url, "make the shared-state tables", _PG_TABLES)

    def run(self, what: str, fn: Callable[[Any], T]) -> T:
        """``fn(connection)`` on this database's own thread (called from another, it waits its
        turn there, so every statement of the process is applied in issue order), connecting first
        if need be; a connection found broken is made again and ``fn`` repeated, for as long as
        ``patiently`` waits for the database. Failures raise AipError saying ``what`` failed
        (``OperationalError`` when the database stayed away)."""
        if not getattr(self._inside, "yes", False):
            return self._pool.submit(self.run, what, fn).result()
        import psycopg

        def once() -> T:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            try:
                return fn(self._conn)
            except psycopg.OperationalError as e:  # the connection is gone (or a timeout hit)
                broken = self._conn.closed or self._conn.broken
                if not broken:
                    raise self.error(f"{what} failed", e) from None
                self._conn.close()
                self._conn = None
                logger.warning(f"{SHARED_STATE_ENV} ({self.name}): the connection was lost; connecting again")
                raise _failed(self.url, f"{what} failed", e) from None
            except psycopg.Error as e:
                raise self.error(f"{what} failed", e) from None

        return patiently(self.url, what, once)

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` (which uses ``run``) on this database's own thread, so the event loop
        goes on meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def queue(self, fn: Callable[..., Any], *args: Any) -> None:
        """``fn(*args)`` on this database's thread without waiting for it: still in issue order,
        so a later ``call`` from this process sees it applied; a failure is logged."""

        def done(f: Future) -> None:
            if f.exception() is not None:
                logger.warning(str(f.exception()))

        self._pool.submit(fn, *args).add_done_callback(done)


def check_url(url: str, variable: str) -> None:
    """Refuse a URL whose user or password holds a bare '@': the driver would read the rest of the
    password as the host name, and quote it in its messages."""
    if "://" in url and url.split("://", 1)[1].count("@") > 1:  # an '@' in a path or query is as unusual
        raise AipError(f"{variable}: the user or password holds an '@': write it percent-encoded (%40)")


def check_shared_state() -> str | None:
    """Before a run: the shared-state database answers and has its tables (raises AipError saying
    why not); what to log."""
    url = shared_state_url()
    if url is None:
        return None
    check_url(url, SHARED_STATE_ENV)
    retry_seconds()  # a bad value is said now, not at the first lost connection
    SharedDb.get(url).run("the check before the run", lambda c: c.execute("SELECT 1"))
    return f"shared state (rate schedules, run budgets) in Postgres at {describe(url)} ({SHARED_STATE_ENV})"


LAKE_ENV = "AIP_LAKE_DATA_PATH"


def lake_enabled() -> bool:
    """Whether this process works in shared mode: a lake (``AIP_LAKE_DATA_PATH``) is set."""
    return bool(aip_settings.current().lake_data_path)


def lake_catalog_url() -> str:
    """The shared-state database the lake's catalog (and shared mode's leases) live in; a clear
    error when the lake is set without it."""
    url = shared_state_url()
    if not url:
        raise AipError(
            f"{LAKE_ENV} is set, but {SHARED_STATE_ENV} is not: the lake's catalog lives in the "
            f"shared-state Postgres database; set {SHARED_STATE_ENV}=postgresql://user:password@host:5432/db"
        )
    check_url(url, SHARED_STATE_ENV)
    return url
