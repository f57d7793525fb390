"""One writer per (run, metric) partition, across processes and workers.

A stage of a partition runs under the partition's lease, taken before the stage starts and held
until its write commits (``pipeline.run_stage``). A second worker (another `aip-eval run --run-id`
of the same run, a daemon's run, a UI launch) that finds the lease taken waits for it, saying so
every ``NOTICE_S``; once it has the lease it asks whether the stage was done since its own
evaluation of the partition began (``Lease.done_since``: a stamp each stage leaves after its
commit), and if so goes on from that result instead of doing the stage again. A stage done before
that began is done again, from the call journal (no successful call is repeated): a new command
is a new evaluation.

- Shared mode (a lake): a lease row in the shared Postgres database (``aip_partition_lease``),
  renewed by its holder every third of ``AIP_LEASE_SECONDS`` (default 30). A holder that died
  (killed, its host gone, its connection lost) stops renewing: its lease expires and the next
  worker takes it over, repeating the stage from the journal. A holder that could not renew in
  time (the database unreachable for longer than the lease) and finds its lease taken over
  writes nothing: ``Lease.check`` before the commit raises ``OperationalError``.
- Local mode: an exclusive ``flock`` on a file beside the warehouse (``leases/``), which the
  kernel releases when its holder dies; the stamps in a file beside it.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import os
import random
import re
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from . import interrupts
from .errors import OperationalError

logger = logging.getLogger("aip_assets")
LEASE_ENV = "AIP_LEASE_SECONDS"
NOTICE_S = 5.0  # a waiting worker says so this often
POLL_S = 0.25  # and tries the lease this often (jittered)
Log = Callable[[str], None]
_MADE: set[str] = set()  # the shared-state databases whose lease tables this process has made

_PG_TABLES = (
    """CREATE TABLE IF NOT EXISTS aip_partition_lease (
    run_id text NOT NULL,
    metric text NOT NULL,
    holder text NOT NULL,         -- this holding's id (a uuid)
    info text NOT NULL,           -- who: pid, host and program, for the messages of those who wait
    stage text NOT NULL,
    taken_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    renewed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL,   -- the database's clock
    PRIMARY KEY (run_id, metric)
)""",
    """CREATE TABLE IF NOT EXISTS aip_stage_done (
    run_id text NOT NULL,
    metric text NOT NULL,
    stage text NOT NULL,
    done_at double precision NOT NULL,  -- when its write committed (epoch seconds, the writer's clock)
    info text NOT NULL,                 -- who wrote it
    PRIMARY KEY (run_id, metric, stage)
)""",
)


def lease_seconds() -> float:
    """``AIP_LEASE_SECONDS`` (settings.py: at least 1, 30 unless set)."""
    from .settings import current

    return current().lease_seconds


def program() -> str:
    """This process's program and, for aip-eval and Dagster, its subcommand: never another argument."""
    name = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    sub = sys.argv[1] if len(sys.argv) > 1 and re.fullmatch(r"[a-z][a-z_-]*", sys.argv[1]) else ""
    return f"{name} {sub}" if name in ("aip-eval", "dagster", "dagster-webserver") and sub else name


def who() -> str:
    """This process, for the messages of those who wait: pid, host and program (no arguments)."""
    return f"pid {os.getpid()} on {socket.gethostname()} ({program()})"


class Lease:
    """A partition's lease, held (see the module's docstring)."""

    def __init__(self, run_id: str, metric: str, stage: str):
        self.run_id, self.metric, self.stage = run_id, metric, stage
        self.where = f"{stage} [{run_id} × {metric}]"

    def done_since(self, since: float, before: str | None = None) -> dict[str, Any] | None:
        """The stage's stamp (``{"at", "by"}``) if its write committed after ``since`` (epoch seconds
        on this process's clock) and after the stage ``before`` it last committed (a stage done on
        inputs another worker has written again since is not this run's result), else None."""
        done = self._stamp(self.stage)
        if done is None or done["at"] <= since + self.offset():
            return None
        upstream = self._stamp(before) if before else None
        return done if upstream is None or done["at"] >= upstream["at"] else None

    def offset(self) -> float:
        """The stamps' clock minus this process's (0: they are this machine's)."""
        return 0.0

    def check(self) -> None:
        """Before the commit: raise OperationalError if the lease is no longer this worker's."""

    def mark_done(self) -> None:
        """After the commit: leave the stage's stamp."""
        raise NotImplementedError

    def _stamp(self, stage: str) -> dict[str, Any] | None:
        raise NotImplementedError


def _waiting(lease: Lease, t0: float, holder: str, log: Log, extra: str = "") -> None:
    log(
        f"{lease.where}: waiting {time.monotonic() - t0:.0f}s for another worker, {holder}, which holds this "
        f"partition{extra}; this one goes on once that worker's write commits or its lease ends"
    )


def _pause() -> None:
    interrupts.check()  # a Ctrl-C while waiting: the stage does not start
    time.sleep(POLL_S * (0.5 + random.random()))


# ---------------------------------------------------------------- local mode: a file lock
class FileLease(Lease):
    def __init__(self, run_id: str, metric: str, stage: str, folder: Path):
        super().__init__(run_id, metric, stage)
        safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{run_id}--{metric}")[:120]
        digest = hashlib.sha256(f"{run_id}\0{metric}".encode()).hexdigest()[:12]
        self.lock_file = folder / f"{safe}-{digest}.lock"
        self.done_file = folder / f"{safe}-{digest}.done.json"
        self._fh: Any = None

    def acquire(self, log: Log) -> None:
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        fh = open(self.lock_file, "a+")
        t0 = time.monotonic()
        notice = t0 + NOTICE_S
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= notice:
                    notice = time.monotonic() + NOTICE_S
                    fh.seek(0)
                    _waiting(self, t0, fh.read().strip() or "another process", log)
                try:
                    _pause()
                except BaseException:
                    fh.close()
                    raise
        fh.seek(0)
        fh.truncate()
        fh.write(f"{who()}, {self.stage}")
        fh.flush()
        self._fh = fh

    def release(self) -> None:
        if self._fh is not None:
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None

    def _stamps(self) -> dict[str, Any]:
        try:
            return json.loads(self.done_file.read_text())
        except (OSError, ValueError):
            return {}

    def _stamp(self, stage: str) -> dict[str, Any] | None:
        return self._stamps().get(stage)

    def mark_done(self) -> None:
        stamps = self._stamps()
        stamps[self.stage] = {"at": time.time(), "by": who()}
        tmp = self.done_file.with_name(f".{self.done_file.name}.{os.getpid()}")
        tmp.write_text(json.dumps(stamps))
        os.replace(tmp, self.done_file)


# ---------------------------------------------------------------- shared mode: a lease row in Postgres
class PgLease(Lease):
    def __init__(self, run_id: str, metric: str, stage: str, db, seconds: float):
        super().__init__(run_id, metric, stage)
        self.db, self.seconds = db, seconds
        self.holder = uuid.uuid4().hex
        self.info = who()
        self.lost = False
        self._offset = 0.0
        self._stop = threading.Event()
        self._beat: threading.Thread | None = None

    def _ensure(self) -> None:
        """The tables, made once per process and database (another worker may make them at once:
        ``shared_state.make_in_turn``)."""
        if self.db.url in _MADE:
            return
        from .shared_state import make_in_turn

        self.db.run("making the partition leases' tables", lambda c: make_in_turn(c, _PG_TABLES))
        _MADE.add(self.db.url)

    def _try(self) -> tuple[bool, tuple | None]:
        """Take the lease if it is free or expired: (taken, the row found before, if any: info, seconds
        since renewed, seconds until it expires)."""

        def go(c):
            t0 = time.time()
            now = float(c.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()[0])
            self._offset = now - (t0 + time.time()) / 2  # the database's clock against this host's
            before = c.execute(
                "SELECT info, extract(epoch FROM clock_timestamp() - renewed_at), "
                "extract(epoch FROM expires_at - clock_timestamp()) FROM aip_partition_lease "
                "WHERE run_id = %s AND metric = %s AND holder <> %s",
                [self.run_id, self.metric, self.holder],
            ).fetchone()
            got = c.execute(
                "INSERT INTO aip_partition_lease (run_id, metric, holder, info, stage, expires_at) "
                "VALUES (%s, %s, %s, %s, %s, clock_timestamp() + make_interval(secs => %s)) "
                "ON CONFLICT (run_id, metric) DO UPDATE SET holder = EXCLUDED.holder, info = EXCLUDED.info, "
                "stage = EXCLUDED.stage, taken_at = clock_timestamp(), renewed_at = clock_timestamp(), "
                "expires_at = EXCLUDED.expires_at WHERE aip_partition_lease.expires_at < clock_timestamp() "
                "OR aip_partition_lease.holder = EXCLUDED.holder "  # its own, taken by a try whose answer was lost
                "RETURNING holder",
                [self.run_id, self.metric, self.holder, self.info, self.stage, self.seconds],
            ).fetchone()
            return got is not None, before

        return self.db.run(f"the lease of {self.where}", go)

    def acquire(self, log: Log) -> None:
        self._ensure()
        t0 = time.monotonic()
        notice = t0 + NOTICE_S
        while True:
            taken, before = self._try()
            if taken:
                break
            if time.monotonic() >= notice and before is not None:
                notice = time.monotonic() + NOTICE_S
                _waiting(
                    self,
                    t0,
                    str(before[0]),
                    log,
                    f" (renewed {float(before[1]):.0f}s ago; it expires in "
                    f"{max(0.0, float(before[2])):.0f}s unless renewed)",
                )
            _pause()
        if before is not None:  # a row was there, expired: its holder stopped renewing it
            log(
                f"{self.where}: took over the lease of {before[0]}, which stopped renewing it {float(before[1]):.0f}s "
                f"ago (its worker ended without releasing it: killed, or its connection lost); the stage is done "
                "again here, from the call journal"
            )
        self._beat = threading.Thread(target=self._heartbeat, name=f"aip-lease-{self.stage}", daemon=True)
        self._beat.start()

    def _renew(self) -> bool:
        rows = self.db.run(
            f"renewing the lease of {self.where}",
            lambda c: c.execute(
                "UPDATE aip_partition_lease SET renewed_at = clock_timestamp(), "
                "expires_at = clock_timestamp() + make_interval(secs => %s) "
                "WHERE run_id = %s AND metric = %s AND holder = %s RETURNING 1",
                [self.seconds, self.run_id, self.metric, self.holder],
            ).fetchall(),
        )
        return bool(rows)

    def _heartbeat(self) -> None:
        wait = self.seconds / 3
        while not self._stop.wait(wait):
            try:
                if not self._renew():
                    self.lost = True
                    logger.warning(
                        f"{self.where}: this worker's lease was taken over by another worker; its write "
                        "will not be committed"
                    )
                    return
                wait = self.seconds / 3
            except Exception as e:  # noqa: BLE001 - the database away a moment: try again soon
                logger.warning(f"{self.where}: could not renew this worker's lease ({e}); trying again")
                wait = min(1.0, self.seconds / 3)

    def check(self) -> None:
        try:
            held = not self.lost and self._renew()
        except Exception as e:  # noqa: BLE001 - not known to be held: not committed
            raise OperationalError(
                f"{self.where}: the partition's lease could not be renewed before the write "
                f"({e}); nothing of the stage is written"
            ) from None
        if not held:
            self.lost = True
            raise OperationalError(
                f"{self.where}: another worker took over this partition's lease while this one "
                f"could not renew it for {self.seconds:.0f}s ({LEASE_ENV}); nothing of the stage "
                "is written here, and the other worker does it"
            )

    def release(self) -> None:
        self._stop.set()
        if self._beat is not None:
            self._beat.join(timeout=5)
        try:
            self.db.run(
                f"releasing the lease of {self.where}",
                lambda c: c.execute(
                    "DELETE FROM aip_partition_lease WHERE run_id = %s AND metric = %s AND holder = %s",
                    [self.run_id, self.metric, self.holder],
                ),
            )
        except Exception as e:  # noqa: BLE001 - it expires on its own
            logger.warning(f"{self.where}: the lease could not be released ({e}); it expires in {self.seconds:.0f}s")

    def _stamp(self, stage: str) -> dict[str, Any] | None:
        row = self.db.run(
            f"the stamp of {self.where}",
            lambda c: c.execute(
                "SELECT done_at, info FROM aip_stage_done WHERE run_id = %s AND metric = %s AND stage = %s",
                [self.run_id, self.metric, stage],
            ).fetchone(),
        )
        return {"at": float(row[0]), "by": row[1]} if row else None

    def offset(self) -> float:
        return self._offset

    def mark_done(self) -> None:  # the database's clock: one clock for the stamps of every worker's host
        self.db.run(
            f"the stamp of {self.where}",
            lambda c: c.execute(
                "INSERT INTO aip_stage_done (run_id, metric, stage, done_at, info) "
                "VALUES (%s, %s, %s, extract(epoch FROM clock_timestamp()), %s) "
                "ON CONFLICT (run_id, metric, stage) DO UPDATE SET done_at = EXCLUDED.done_at, info = EXCLUDED.info",
                [self.run_id, self.metric, self.stage, self.info],
            ),
        )


@contextmanager
def held(run_id: str, metric: str, stage: str, path: Path, log: Log) -> Iterator[Lease]:
    """The partition's lease for ``stage``, waited for and held for the block (see the module's
    docstring). ``path``: the warehouse file (local mode keeps its leases beside it)."""
    from .shared_state import SharedDb, lake_catalog_url, lake_enabled

    lease: FileLease | PgLease
    if lake_enabled():
        url = lake_catalog_url()  # the shared-state database (a clear error if it is not set)
        lease = PgLease(run_id, metric, stage, SharedDb.get(url), lease_seconds())
    else:
        lease = FileLease(run_id, metric, stage, Path(path).parent / "leases")
    lease.acquire(log)
    try:
        yield lease
    finally:
        with interrupts.handled(stop=False):
            lease.release()
