"""The call journal's stored form: its columns, how a request and its answer are deflated
against their part's dictionaries, call keys as stored and as marks (``key_mark``, ``Marks``), and
the tables of provider batches and structured-output forms (``journal`` writes and reads them,
``journal_pg`` in Postgres)."""

from __future__ import annotations

import zlib
from collections.abc import Iterable
from typing import Any

from ..hashing import wire_json

_COLS = [
    "run_id",
    "metric",
    "stage",
    "role",
    "call_key",
    "sample_index",
    "endpoint",
    "model",
    "request",
    "response_text",
    "status",
    "error",
    "http_status",
    "latency_ms",
    "prompt_tokens",
    "completion_tokens",
    "attempts",
    "response_model",
    "fingerprint",
    "source",
    "created_at",
]


_PART = ["run_id", "metric", "stage", "role", "endpoint", "model"]  # stored once per part in call_parts
_CALL = [c for c in _COLS if c not in _PART]  # stored per call in call_log (request deflated)
# where the stored forms go in a call_log row (part_id first)
_AT_KEY, _AT_REQUEST, _AT_ANSWER = (1 + _CALL.index(c) for c in ("call_key", "request", "response_text"))
# the view shows a call key as the hex it was given (stored as its 16 bytes)
_VIEW_COL = {
    "call_key": "CASE WHEN typeof(c.call_key) = 'blob' THEN lower(hex(c.call_key)) ELSE c.call_key END AS call_key"
}
_ZDICT_MAX = 32768  # zlib's window: a longer dictionary is cut to its last 32 KiB


def _request_text(request: Any) -> str:
    """A request as stored: as it was sent, ``wire_json`` of it (its own key order, compact, UTF-8
    as it is). A string is that JSON already (the client serialises a request once to send it)."""
    return request if isinstance(request, str) else wire_json(request)


def _deflate(text: str, zdict: bytes) -> bytes:
    """``text`` deflated against ``zdict``. The window covers the dictionary and the text (so
    every match zlib's defaults would find is in reach) and the hash table is small: zlib sets up
    and clears its tables for every stream, 60-75 us per call with its defaults (a 32 KiB window,
    memLevel 8), 5-25 us sized so. Any zlib inflater reads it."""
    data = text.encode("utf-8")
    wbits = min(15, max(10, (len(zdict) + len(data) + 262).bit_length()))  # 262: zlib's lookahead
    c = zlib.compressobj(6, zlib.DEFLATED, wbits, 4, zdict=zdict)
    return c.compress(data) + c.flush()


def _inflate(blob: bytes | None, zdict: bytes) -> str | None:
    if blob is None:
        return None
    d = zlib.decompressobj(zdict=zdict)
    return (d.decompress(blob) + d.flush()).decode("utf-8")


def _key_in(key: str) -> bytes | str:
    """A call key as stored: the 16 bytes its 32 hex digits spell (any other key as it is)."""
    try:
        return bytes.fromhex(key) if len(key) == 32 else key
    except ValueError:
        return key


def _key_out(key: bytes | str) -> str:
    return key.hex() if isinstance(key, bytes) else key


_U64 = (1 << 64) - 1


def key_mark(key: str) -> int:
    """A call key's first 64 bits (of its 32 hex digits; any other key: its hash), unsigned. Two
    keys sharing a mark cost a journal lookup that finds nothing, never a wrong answer."""
    try:
        return int(key[:16], 16) if len(key) == 32 else hash(key) & _U64
    except ValueError:
        return hash(key) & _U64


class Marks:
    """A set of 64-bit marks in 8 bytes each: the newest in a Python set, folded every 65,536 into
    a sorted numpy array (2,160,000 marks: 17 MB, where a set of ints takes 140 MB)."""

    FOLD = 65_536

    def __init__(self, marks: Iterable[int] = ()):
        import numpy as np

        self._np = np
        self._arr = np.unique(np.fromiter(marks, dtype=np.uint64))
        self._new: set[int] = set()

    def add(self, mark: int) -> None:
        if mark in self:  # already held (a key answered again): len() stays the count of marks
            return
        self._new.add(mark)
        if len(self._new) >= self.FOLD:
            np = self._np
            self._arr = np.union1d(self._arr, np.fromiter(self._new, dtype=np.uint64, count=len(self._new)))
            self._new.clear()

    def __contains__(self, mark: int) -> bool:
        if mark in self._new:
            return True
        if not len(self._arr):  # nothing folded yet (a new run): no numpy call (5-20 us each)
            return False
        i = int(self._np.searchsorted(self._arr, self._np.uint64(mark)))
        return i < len(self._arr) and int(self._arr[i]) == mark

    def __len__(self) -> int:
        return len(self._arr) + len(self._new)


# provider batches (models/batch.py): one row per batch, its requests' call keys as a JSON list
BATCH_COLS = [
    "batch_id",
    "run_id",
    "metric",
    "stage",
    "role",
    "endpoint",
    "input_file_id",
    "call_keys",
    "status",
    "created_at",
    "ended_at",
]
_BATCHES_DDL = (
    "CREATE TABLE IF NOT EXISTS batches (batch_id text PRIMARY KEY, run_id text, metric text, stage text, "
    "role text, endpoint text, input_file_id text, call_keys text, status text, created_at {real}, "
    "ended_at {real})"
)

# structured-output forms (models/structured.py): the form each endpoint of a run is asked in, as
# chosen before the run (preflight), by a stage that found none (lazily) or after a refusal (fallback)
FORM_COLS = ["run_id", "endpoint", "model", "role", "form", "previous", "how", "reason", "created_at"]
_FORMS_DDL = (
    "CREATE TABLE IF NOT EXISTS structured_forms (run_id text, endpoint text, model text, role text, "
    "form text, previous text, how text, reason text, created_at {real})"
)
