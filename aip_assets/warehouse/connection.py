"""Connections to the warehouse, serialised across processes by a file lock.

DuckDB lets one process open a file for writing, and while it does no other process can open
it at all. So every access goes through :func:`connect`, which holds an exclusive file lock
beside the database while it is open and retries on lock errors (``opening``). The database stays
open a moment after its last use (``linger``: :class:`_Linger`), so a burst of uses opens it once;
in shared mode every use is a cursor of this process's open lake. :func:`session` holds one
connection for a block of many short reads. A stage replaces its partition's rows in one transaction.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from . import lake
from .linger import _LAKE, _LINGER, TUNING, linger_idle_s
from .opening import _check_exists, _ensure_once, _file_lock, _open, _settings, default_path


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
