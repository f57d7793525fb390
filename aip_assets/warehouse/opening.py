"""Opening the warehouse file: where it is, the inter-process file lock beside it, DuckDB's open.

DuckDB lets one process open a file for writing, and while it does no other process can open it
at all. So a process holds an exclusive file lock beside the database while it is open
(:func:`_file_lock`: who holds it is written in it; a waiter touches a marker so a holder that
lingers steps back), and :func:`_open` retries while a program outside the project holds the file.
Here too are the errors of both: a wait that ran out (:func:`_lock_timeout`) and a damaged file
(:func:`damaged`); and the schema made once per process and file (:func:`_ensure_once`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import random
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import duckdb

from .. import settings as aip_settings
from ..errors import WarehouseDamaged
from .schema import ensure_schema

_ENSURED: set[tuple[str, int]] = set()
# DuckDB's buffer pool defaults to 80% of RAM, and a stage's one-transaction write of a large
# partition then grows with the partition (1.8 GB peak at 100,000 rows of group interaction
# bias). Capped, DuckDB spills to disk instead: the same run peaks at 1.4 GB (benchmarks/).
# The cap is AIP_DUCKDB_MEMORY (settings.py: 1GB unless set; empty, no cap).
LOCK_NOTICE_S = 5.0  # a wait for the lock says so this often
logger = logging.getLogger("aip_assets")
WAIT_TRY_S = 0.01  # a waiter tries the lock every 10-20 ms (a try is a system call)
WAITER_FRESH_S = 0.1  # a waiter touches its marker at every try: fresh while it waits


def duckdb_memory() -> str:
    """DuckDB's memory cap for the warehouse, ``AIP_DUCKDB_MEMORY`` ("": no cap)."""
    return aip_settings.current().duckdb_memory


def lock_timeout_s() -> float:
    """How long a use waits for the warehouse, ``AIP_WAREHOUSE_LOCK_TIMEOUT`` (seconds)."""
    return aip_settings.current().warehouse_lock_timeout


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
