"""An endpoint's request and token rates, shared by every process on this machine.

``requests_per_minute`` and ``tokens_per_minute`` on a connection are the endpoint's limits, not
one client's: the metrics of ``aip-eval run --parallel N``, the partitions the Dagster UI runs at
once and a second ``aip-eval run`` against the same endpoint all draw from one schedule. The
schedule is a GCRA ("virtual time"): two timestamps, the next free request start and the time the
tokens spent so far are paid off, kept in a 16-byte file per endpoint under an exclusive
``flock`` (held for a read and a write, microseconds). A request is sent at
``max(next request start, tokens paid off)``; taking it moves the first on by ``60 / rpm`` s and
the second by ``tokens × 60 / tpm`` s. Request starts are therefore spaced evenly and never more
than the limits in any minute; there is no burst allowance.

Tokens are counted before the request is sent (the prompt's characters / 4, plus the
connection's ``max_tokens`` when set, as providers reserve it) and settled when the answer comes
with the ``usage`` the endpoint reports (or its characters / 4): the schedule moves by the
difference, so the long-run rate follows what the endpoint counted.

The files live in ``AIP_LIMITS_DIR`` (default: ``<temp dir>/aip-limits-<uid>``), one per
endpoint, named by the sha256 of its id (never its key or headers). A process that dies holds
nothing: the lock goes with its file descriptor.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import os
import struct
import tempfile
import time
from pathlib import Path
from typing import Any

_STATE = struct.Struct("<dd")  # next request start, tokens paid off (Unix time, seconds)


def limits_dir() -> Path:
    d = os.environ.get("AIP_LIMITS_DIR")
    return Path(d) if d else Path(tempfile.gettempdir()) / f"aip-limits-{os.getuid()}"


def estimate_tokens(body: dict[str, Any]) -> int:
    """The tokens a request will be counted for before its answer says: prompt characters / 4
    (rounded up), plus ``max_tokens`` when the request sets it."""
    chars = 0
    for m in body.get("messages") or ():
        c = m.get("content")
        if isinstance(c, str):
            chars += len(c)
        elif isinstance(c, list):
            chars += sum(len(p.get("text") or "") for p in c if isinstance(p, dict))
    return -(-chars // 4) + int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)


class SharedRate:
    """The shared schedule of one endpoint (see the module's docstring)."""

    _open: dict[tuple[str, str], "SharedRate"] = {}

    def __init__(self, endpoint: str, rpm: int | None, tpm: int | None, directory: Path | None = None):
        if not rpm and not tpm:
            raise ValueError("a shared rate needs requests_per_minute or tokens_per_minute")
        self.endpoint = endpoint
        self.request_s = 60.0 / rpm if rpm else 0.0
        self.token_s = 60.0 / tpm if tpm else 0.0
        d = directory or limits_dir()
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / (hashlib.sha256(endpoint.encode()).hexdigest()[:32] + ".rate")
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)

    @classmethod
    def for_endpoint(cls, endpoint: str, rpm: int | None, tpm: int | None) -> "SharedRate":
        """One instance per endpoint, limits and directory in this process (its file stays open)."""
        key = (f"{endpoint}\0{rpm}\0{tpm}", str(limits_dir()))
        if key not in cls._open:
            cls._open[key] = cls(endpoint, rpm, tpm)
        return cls._open[key]

    def _update(self, fn) -> Any:
        fcntl.flock(self._fd, fcntl.LOCK_EX)
        try:
            raw = os.pread(self._fd, _STATE.size, 0)
            req_next, tok_next = _STATE.unpack(raw) if len(raw) == _STATE.size else (0.0, 0.0)
            req_next, tok_next, out = fn(req_next, tok_next)
            os.pwrite(self._fd, _STATE.pack(req_next, tok_next), 0)
            return out
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)

    def reserve(self, tokens: int = 0, now: float | None = None) -> float:
        """Take the next request start that both limits allow; returns it (Unix time)."""
        t = time.time() if now is None else now

        def take(req_next: float, tok_next: float):
            start = max(t, req_next if self.request_s else t, tok_next if self.token_s else t)
            req_next = start + self.request_s if self.request_s else req_next
            if self.token_s:
                tok_next = max(tok_next, start) + tokens * self.token_s
            return req_next, tok_next, start

        return self._update(take)

    def settle(self, estimated: int, counted: int) -> None:
        """The endpoint counted ``counted`` tokens for a request reserved at ``estimated``."""
        if not self.token_s or counted == estimated:
            return
        self._update(lambda r, tk: (r, tk + (counted - estimated) * self.token_s, None))

    async def wait(self, tokens: int = 0) -> None:
        start = self.reserve(tokens)
        delay = start - time.time()
        if delay > 0:
            await asyncio.sleep(delay)

    def close(self) -> None:
        os.close(self._fd)
