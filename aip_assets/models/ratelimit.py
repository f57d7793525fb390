"""An endpoint's request and token rates, shared by every process on this machine.

``requests_per_minute`` and ``tokens_per_minute`` on a connection are the endpoint's limits, not
one client's: the metrics of ``aip-eval run --parallel N``, the partitions the Dagster UI runs at
once and a second ``aip-eval run`` against the same endpoint all draw from one schedule. The
schedule is a GCRA ("virtual time"): two timestamps, the next free request start and the time the
tokens spent so far are paid off, kept in a 16-byte file per endpoint under an exclusive
``flock`` (held for a read and a write, microseconds). A request is sent at
``max(next request start, tokens paid off)``; taking it moves the first on by ``60 / rpm`` s and
the second by ``tokens × 60 / tpm`` s. Request starts are therefore spaced evenly, never more than
``rpm`` in a minute, and the tokens of any minute stay within ``tpm`` plus the request that began
it (a request is charged when it starts); there is no burst allowance.

Tokens are counted before the request is sent (the prompt's characters / 4, plus the request's
``max_tokens`` or ``max_completion_tokens`` when set, as providers reserve it) and settled when
the answer comes, with the ``usage`` the endpoint reports (a count it leaves out: characters / 4);
a request the endpoint refused (429) or that was never sent settles at 0, one that failed
otherwise at its prompt. The schedule moves by the difference, so the long-run rate follows what
the endpoint counted.

The schedule belongs to the endpoint's URL: connections to it with other limits share it (each
spacing by its own), and one without limits neither waits nor counts.

The files live in ``AIP_LIMITS_DIR`` (default: ``$XDG_RUNTIME_DIR/aip-limits``, else
``<temp dir>/aip-limits-<uid>``), one per endpoint, named by the sha256 of its id (never its key
or headers). The folder must be this user's own (mode 0700, not a link): another user's folder
in a shared temp dir is refused, and files are opened without following links. A stored time
that is not a number or lies more than a day ahead (a clock stepped back, a corrupt file) is
taken as free. A process that dies holds nothing: the lock goes with its file descriptor.

With ``AIP_SHARED_STATE_URL`` the same schedule is kept in Postgres instead (``PgRate``), shared by
workers on several machines (``shared_state.py``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import math
import os
import stat
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

from .. import interrupts
from ..errors import AipError
from ..shared_state import SharedDb, shared_state_url

logger = logging.getLogger("aip_assets")
_STATE = struct.Struct("<dd")  # next request start, tokens paid off (Unix time, seconds)
HORIZON_S = 86_400.0  # a stored time further ahead than this is not trusted
WARN_WAIT_S = 30.0  # a longer wait for the rate is logged (at most once a minute per endpoint)


def limits_dir() -> Path:
    from ..settings import current

    d = current().limits_dir
    if d is not None:
        return d
    run = os.environ.get("XDG_RUNTIME_DIR")
    if run and os.path.isdir(run):
        return Path(run) / "aip-limits"
    return Path(tempfile.gettempdir()) / f"aip-limits-{os.getuid()}"


def _own_folder(d: Path) -> None:
    """Create ``d`` (0700) or accept it only if it is this user's, not a link, and writable by no one else."""
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(d)
    if (
        stat.S_ISLNK(st.st_mode)
        or not stat.S_ISDIR(st.st_mode)
        or st.st_uid != os.getuid()
        or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    ):
        raise AipError(
            f"{d}: the rate-limit folder must be a folder of this user that nobody else can write "
            f"(owner uid {st.st_uid}, mode {stat.filemode(st.st_mode)}); remove it or set AIP_LIMITS_DIR"
        )


def prompt_tokens_estimate(body: dict[str, Any]) -> int:
    """A request's prompt in tokens before its answer says: characters / 4, rounded up."""
    chars = 0
    for m in body.get("messages") or ():
        c = m.get("content")
        if isinstance(c, str):
            chars += len(c)
        elif isinstance(c, list):
            chars += sum(len(p.get("text") or "") for p in c if isinstance(p, dict))
    return -(-chars // 4)


def estimate_tokens(body: dict[str, Any]) -> int:
    """The tokens a request is charged before it is sent: its prompt estimate plus the completion
    tokens it reserves (``max_tokens`` or ``max_completion_tokens``), as providers count it."""
    return prompt_tokens_estimate(body) + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)


def counted_tokens(body: dict[str, Any], prompt: int | None, completion: int | None, text: str | None) -> int:
    """The tokens an answered request cost: the endpoint's ``usage``, estimated where it says nothing."""
    return (prompt if prompt is not None else prompt_tokens_estimate(body)) + (
        completion if completion is not None else -(-len(text or "") // 4)
    )


def _step(fn, req_next: float, tok_next: float, t: float) -> tuple[float, float, Any]:
    """``fn`` applied to a stored schedule at time ``t``, wherever it is kept: a stored time that is
    not a number or lies more than ``HORIZON_S`` ahead is taken as free."""
    ahead = t + HORIZON_S
    req_next, tok_next = (x if math.isfinite(x) and x <= ahead else 0.0 for x in (req_next, tok_next))
    return fn(req_next, tok_next, t)


class SharedRate:
    """The shared schedule of one endpoint (see the module's docstring)."""

    _open: dict[tuple[str, str], SharedRate] = {}

    def __init__(self, endpoint: str, rpm: int | None, tpm: int | None, directory: Path | None = None):
        self._set_limits(endpoint, rpm, tpm)
        d = directory or limits_dir()
        _own_folder(d)
        self.path = d / (hashlib.sha256(endpoint.encode()).hexdigest()[:32] + ".rate")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)

    def _set_limits(self, endpoint: str, rpm: int | None, tpm: int | None) -> None:
        """The endpoint and its spacing (seconds per request, per token), wherever the schedule is kept."""
        if not rpm and not tpm:
            raise ValueError("a shared rate needs requests_per_minute or tokens_per_minute")
        self.endpoint = endpoint
        self.request_s = 60.0 / rpm if rpm else 0.0
        self.token_s = 60.0 / tpm if tpm else 0.0
        self._warned = 0.0

    @classmethod
    def for_endpoint(cls, endpoint: str, rpm: int | None, tpm: int | None) -> SharedRate:
        """One instance per endpoint, limits and place in this process (its file stays open): in
        Postgres when ``AIP_SHARED_STATE_URL`` names one (every worker of a shared deployment draws
        from one schedule), else in this machine's limits folder."""
        url = shared_state_url()
        key = (f"{endpoint}\0{rpm}\0{tpm}\0{os.getpid()}", url or str(limits_dir()))  # a forked child: its own
        if key not in cls._open:
            cls._open[key] = PgRate(endpoint, rpm, tpm, url) if url else cls(endpoint, rpm, tpm)
        return cls._open[key]

    def _update(self, fn, now: float | None) -> tuple[Any, float]:
        """Apply ``fn(req_next, tok_next, t) -> (req_next, tok_next, out)`` to the stored schedule
        under its lock; ``t`` is ``now``, else the schedule's clock (here this machine's). Returns
        ``(out, t)``."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            t = time.time() if now is None else now
            raw = os.pread(self._fd, _STATE.size, 0)
            req_next, tok_next = _STATE.unpack(raw) if len(raw) == _STATE.size else (0.0, 0.0)
            req_next, tok_next, out = _step(fn, req_next, tok_next, t)
            os.pwrite(self._fd, _STATE.pack(req_next, tok_next), 0)
            return out, t
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def reserve(self, tokens: int = 0, now: float | None = None) -> float:
        """Take the next request start that both limits allow; returns it (Unix time: on this
        machine's clock, or ``now``'s when given)."""

        def take(req_next: float, tok_next: float, t: float):
            start = max(t, req_next if self.request_s else t, tok_next if self.token_s else t)
            req_next = start + self.request_s if self.request_s else req_next
            if self.token_s:
                tok_next = max(tok_next, start) + tokens * self.token_s
            return req_next, tok_next, start

        start, t = self._update(take, now)
        # the schedule's clock may be another machine's (Postgres): the wait, on this one's
        return start if now is not None else time.time() + (start - t)

    def settle(self, estimated: int, counted: int) -> None:
        """The endpoint counted ``counted`` tokens for a request reserved at ``estimated``."""
        if not self.token_s or counted == estimated:
            return
        self._update(lambda r, tk, t: (r, tk + (counted - estimated) * self.token_s, None), None)

    async def _areserve(self, tokens: int) -> float:
        return self.reserve(tokens)  # a file under flock: microseconds

    async def wait(self, tokens: int = 0) -> None:
        start = await self._areserve(tokens)
        now = time.time()
        delay = start - now
        if delay > WARN_WAIT_S and now - self._warned > 60:
            self._warned = now
            logger.warning(
                f"{self.endpoint}: waiting {delay:.0f}s for the endpoint's requests_per_minute / "
                f"tokens_per_minute ({self.where()})"
            )
        if delay > 0:
            await interrupts.sleep(delay)  # a Ctrl-C ends the wait

    def where(self) -> str:
        return f"shared on this machine through {self.path.parent}"

    def close(self) -> None:
        os.close(self._fd)


# ---------------------------------------------------------------- shared across machines
class PgRate(SharedRate):
    """The same schedule kept in Postgres, for workers on several machines: a row per endpoint,
    read and written under ``SELECT ... FOR UPDATE`` in one transaction, on the database's clock
    (the workers' clocks may differ; each waits the difference on its own). The statements run on
    the database's own thread (``SharedDb``): ``wait`` does not block the event loop, and
    ``settle`` is queued without waiting."""

    def __init__(self, endpoint: str, rpm: int | None, tpm: int | None, url: str):
        self._set_limits(endpoint, rpm, tpm)
        self.db = SharedDb.get(url)
        self.key = hashlib.sha256(endpoint.encode()).hexdigest()[:32]

    def _update(self, fn, now: float | None) -> tuple[Any, float]:
        def txn(conn):
            with conn.transaction():
                # the row is made here if missing (first use, or deleted while a run went on)
                conn.execute("INSERT INTO aip_rate_schedule (endpoint) VALUES (%s) ON CONFLICT DO NOTHING", [self.key])
                req_next, tok_next, db_now = conn.execute(
                    "SELECT req_next, tok_next, extract(epoch FROM clock_timestamp())::double precision "
                    "FROM aip_rate_schedule WHERE endpoint = %s FOR UPDATE",
                    [self.key],
                ).fetchone()
                t = db_now if now is None else now
                req_next, tok_next, out = _step(fn, req_next, tok_next, t)
                conn.execute(
                    "UPDATE aip_rate_schedule SET req_next = %s, tok_next = %s WHERE endpoint = %s",
                    [req_next, tok_next, self.key],
                )
            return out, t

        return self.db.run(f"the rate schedule of {self.endpoint}", txn)

    async def _areserve(self, tokens: int) -> float:
        return await self.db.call(self.reserve, tokens)

    def settle(self, estimated: int, counted: int) -> None:
        if self.token_s and counted != estimated:
            self.db.queue(SharedRate.settle, self, estimated, counted)

    def where(self) -> str:
        return f"shared by every worker through Postgres at {self.db.name}"

    def close(self) -> None:
        pass  # the connection is the process's (SharedDb), kept for the next user
