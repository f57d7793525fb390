"""The Postgres database workers on several machines share state through (issue 14's shared mode).

``AIP_SHARED_STATE_URL=postgresql://user:password@host:5432/db``, from the environment only: with
it, every endpoint's request and token schedule (``aip_rate_schedule``) and every capped run's
call and token count (``aip_run_budget``) live there instead of in this machine's files and this
process. Without it nothing here is used.

One connection per process and database (``SharedDb.get``), used by one thread of its own, so a
statement never blocks an event loop (the client awaits ``SharedDb.call``) and statements from
one process are applied in the order they were issued. The connection has keepalives, a
``lock_timeout`` and a ``statement_timeout`` (``LOCK_TIMEOUT_S``, ``STATEMENT_TIMEOUT_S``), so a stalled database or a worker
holding a row's lock fails a statement instead of hanging a run. A connection lost between
statements is made again once; a second failure is an ``AipError`` that names the variable and
says what failed, and stops the stage (the limits cannot be held without the database). A
statement repeated after a reconnect may count a call or a request twice: the limits err on the
safe side.

Messages show the database as ``postgresql://user@host:port/db``, built from the parsed URL, and
never the password, the raw URL or a driver message that could quote either.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterable, TypeVar
from urllib.parse import quote, urlsplit

from ..errors import AipError

logger = logging.getLogger("aip_assets")
SHARED_STATE_ENV = "AIP_SHARED_STATE_URL"
LOCK_TIMEOUT_S = 30  # the longest a statement waits for a row another worker holds
STATEMENT_TIMEOUT_S = 60  # the longest a statement may take
CONNECT_TIMEOUT_S = 10
T = TypeVar("T")

# every table of the shared state, made at the first connection (and so by the check before a run)
_PG_TABLES = ("""CREATE TABLE IF NOT EXISTS aip_rate_schedule (
    endpoint text PRIMARY KEY,   -- the sha256 of the endpoint's id, as the files are named
    req_next double precision NOT NULL DEFAULT 0,  -- the next free request start (the database's clock)
    tok_next double precision NOT NULL DEFAULT 0   -- when the tokens spent so far are paid off
)""", """CREATE TABLE IF NOT EXISTS aip_run_budget (
    run_id text PRIMARY KEY,
    calls bigint NOT NULL,   -- network calls the run's workers have sent (reserved before sending)
    tokens bigint NOT NULL   -- tokens they have spent (as the answers counted them)
)""")


def shared_state_url() -> str | None:
    """The shared-state database's URL from ``AIP_SHARED_STATE_URL``; None: shared mode is off.
    Read from the environment only, never stored or logged (see ``describe``)."""
    return os.environ.get(SHARED_STATE_ENV) or None


def _parts(url: str) -> dict[str, str] | None:
    """The URL's connection parameters as libpq reads them (None: it cannot read them)."""
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # said elsewhere; read a URL's plain parts for the message
        try:
            u = urlsplit(url)
            out = {"user": u.username or "", "host": u.hostname or "", "dbname": u.path.lstrip("/"),
                   "password": u.password or ""}
            if u.port:
                out["port"] = str(u.port)
            return out if u.scheme.startswith("postgres") else None
        except ValueError:
            return None
    try:
        return {k: str(v) for k, v in conninfo_to_dict(url).items()}
    except Exception:
        return None


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


def connect(url: str, what: str, setup: Iterable[str] = ()) -> Any:
    """A new autocommit connection to the shared-state database, with keepalives and the lock and
    statement timeouts, after running ``setup`` (``what`` it does, for its error). Failures raise
    AipError naming the variable, never showing the password."""
    check_url(url, SHARED_STATE_ENV)
    try:
        import psycopg
    except ImportError:
        raise AipError(f"{SHARED_STATE_ENV} is set, but psycopg is not installed: pip install 'aip-assets[shared]'") \
            from None
    if _parts(url) is None:
        raise AipError(f"{SHARED_STATE_ENV} is not a PostgreSQL URL libpq can read: expected "
                       "postgresql://user:password@host:5432/db")
    try:
        conn = psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT_S, autocommit=True, keepalives=1,
                               keepalives_idle=30, keepalives_interval=10, keepalives_count=3)
    except psycopg.Error as e:
        raise _error(url, "cannot connect to the shared-state database", e) from None
    try:
        conn.execute(f"SET statement_timeout = '{STATEMENT_TIMEOUT_S}s'")
        conn.execute(f"SET lock_timeout = '{LOCK_TIMEOUT_S}s'")
        for statement in setup:
            try:
                conn.execute(statement)
            except (psycopg.errors.UniqueViolation, psycopg.errors.DuplicateObject):
                pass  # another worker made it at the same moment
    except psycopg.Error as e:
        conn.close()
        raise _error(url, f"cannot {what}", e) from None
    return conn


class SharedDb:
    """The process's connection to one shared-state database (see the module's docstring)."""

    _open: dict[tuple[int, str], "SharedDb"] = {}
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
    def get(cls, url: str) -> "SharedDb":
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
        if need be; a connection found broken is made again and ``fn`` repeated once. Failures
        raise AipError saying ``what`` failed."""
        if not getattr(self._inside, "yes", False):
            return self._pool.submit(self.run, what, fn).result()
        import psycopg

        for attempt in (0, 1):
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            try:
                return fn(self._conn)
            except psycopg.OperationalError as e:  # the connection is gone (or a timeout hit)
                broken = self._conn.closed or self._conn.broken
                if broken:
                    self._conn.close()
                    self._conn = None
                if attempt or not broken:
                    raise self.error(f"{what} failed", e) from None
                logger.warning(f"{SHARED_STATE_ENV} ({self.name}): the connection was lost; connecting again")
            except psycopg.Error as e:
                raise self.error(f"{what} failed", e) from None
        raise AssertionError("unreachable")

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
    SharedDb.get(url).run("the check before the run", lambda c: c.execute("SELECT 1"))
    return f"shared state (rate schedules, run budgets) in Postgres at {describe(url)} ({SHARED_STATE_ENV})"
