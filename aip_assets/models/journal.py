"""A crash-safe journal of model calls, beside the warehouse (SQLite in WAL mode).

Each call is recorded as it completes, without touching DuckDB's single write lock. Successful
calls answer identical later requests of the same run (the cache), so a stage that crashed
half-way resumes without paying again. When a stage writes its rows, the journal's records for
that (run, metric, stage) are folded into ``llm_calls``.

Writes are batched off the caller's thread: ``record`` only queues the call (the model client
calls it on its event loop, where one SQLite insert per call cost most of the client's CPU), and
a writer thread commits what is queued in one transaction at most every ``flush_s`` (50 ms).
What a crash (a kill, a power cut) can lose is therefore the calls in flight plus the calls
still queued: one flush interval's, and never more than ``MAX_QUEUED`` (at that many, ``record``
waits for the writer); a resumed stage makes those calls again. Until it is written, a queued
successful call still answers ``lookup`` (the cache), and every other reader (``ok_keys``,
``totals``, ``frames``) first waits for the queue to be written.

Compact on disk (format 2): what every call of one (run, metric, stage, role, endpoint, model)
shares is stored once in ``call_parts``, and each request body in ``call_log`` is deflated with
that part's first request as zlib's preset dictionary (the prompt templates, personas and
instructions the calls share cost almost nothing), and each answer with the part's first answer
(and the end of its first request) as another. The view ``call_index`` lists the calls with
their run, metric, stage and role for plain SQL. A journal of the first format (a ``calls``
table) is left as it is and not read: its calls are not reused.

This module holds the journal in a SQLite file (``Journal``: its writer thread and its readers);
the stored form is in ``journal_format``, the journal in Postgres and which one a run opens in
``journal_pg``.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from .journal_format import (
    _AT_ANSWER,
    _AT_KEY,
    _AT_REQUEST,
    _BATCHES_DDL,
    _CALL,
    _COLS,
    _FORMS_DDL,
    _PART,
    _VIEW_COL,
    _ZDICT_MAX,
    BATCH_COLS,
    FORM_COLS,
    Marks,
    _deflate,
    _inflate,
    _key_in,
    _key_out,
    _request_text,
    key_mark,
)

logger = logging.getLogger("aip_assets")


def journal_path(warehouse_path: str | Path) -> Path:
    p = Path(warehouse_path)
    return p.with_name(p.name.replace(".duckdb", "") + ".journal.sqlite")


class Journal:
    FLUSH_S = 0.05
    # At most this many calls wait for the writer. A busy event loop (the builtin model in-process)
    # leaves the writer thread little time with the GIL: without a bound the queue grew by a whole
    # stream batch's calls (60,000 records, 400 MiB, at 20,000 group-bias rows). At the bound,
    # record() waits for the queue to be written; the writer then has the GIL to itself.
    MAX_QUEUED = 2000
    path: Path | None = None  # the SQLite file (None: in Postgres)
    REMOTE = False  # a lookup is a round trip to a server (the client then makes it off its event loop)
    # where the SQL of the two stores differs (PgJournal below overrides them)
    _BEGIN = "BEGIN IMMEDIATE"  # the write lock first: other processes write here too
    _IS = "IS"  # equal, NULL to NULL
    _NO_CONFLICT = ""
    _key_in = staticmethod(_key_in)
    _key_out = staticmethod(_key_out)

    def __init__(self, path: str | Path, flush_s: float = FLUSH_S, max_queued: int = MAX_QUEUED):
        self.flush_s = flush_s
        self.max_queued = max_queued
        self._lock = threading.Lock()  # the connection: the writer thread and the readers
        self._con = self._open(path)
        self._parts: dict[tuple, tuple[int, bytes, bytes]] = {}  # part -> (part_id, zdict, rdict), as written
        self._zdicts: dict[int, tuple[bytes, bytes]] = {}  # part_id -> (zdict, rdict), as read
        # the queue: records not yet written, the successful ones by key (they answer lookups),
        # and how many were queued and written (flush waits for the second to reach the first)
        self._cv = threading.Condition()
        self._queue: list[dict[str, Any]] = []
        self._queued_ok: dict[str, dict[str, Any]] = {}
        self._n_queued = self._n_written = 0
        # the calls this journal was given that were sent to an endpoint by this process (a call
        # answered from another run's record was not), by stage, and those of them that failed:
        # what a stage reports as its network calls (judging ahead records the judging stage's in sampling)
        self.sent: Counter[str] = Counter()
        self.sent_failed: Counter[str] = Counter()
        self._closing = False
        self._flush_to = 0  # a reader waits for the calls queued up to here: write now, not at the interval's end
        self._failure: BaseException | None = None
        self._writer = threading.Thread(target=self._write_loop, name="aip-journal", daemon=True)
        self._writer.start()

    def _open(self, path: str | Path) -> Any:
        """The journal's connection, its tables made (SQLite: a file in WAL mode)."""
        self.path = Path(path)
        self.where = str(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False, isolation_level=None)
        con.execute("PRAGMA journal_mode=WAL")
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute(
            f"CREATE TABLE IF NOT EXISTS call_parts (part_id INTEGER PRIMARY KEY, {', '.join(_PART)}, "
            f"zdict BLOB, rdict BLOB, UNIQUE ({', '.join(_PART)}))"
        )
        con.execute(
            f"CREATE TABLE IF NOT EXISTS call_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, "
            f"part_id INTEGER, {', '.join(_CALL)})"
        )
        con.execute("CREATE INDEX IF NOT EXISTS call_log_key ON call_log (call_key, status)")
        con.execute("CREATE INDEX IF NOT EXISTS call_log_part ON call_log (part_id)")
        con.execute(
            f"CREATE VIEW IF NOT EXISTS call_index AS SELECT c.seq, {', '.join('p.' + c for c in _PART)}, "
            f"{', '.join(_VIEW_COL.get(c, 'c.' + c) for c in _CALL if c not in ('request', 'response_text'))} "
            "FROM call_log c JOIN call_parts p USING (part_id)"
        )
        con.execute(_BATCHES_DDL.format(real="REAL"))
        con.execute(_FORMS_DDL.format(real="REAL"))
        return con

    @staticmethod
    def _q(sql: str) -> str:
        """A statement in this store's parameter style (written with ``?``)."""
        return sql

    def _insert_many(self, sql: str, rows: list[list[Any]]) -> None:
        self._con.executemany(sql, rows)

    def _reconnected(self, e: BaseException, attempt: int = 0) -> bool:
        """After a failed write (the ``attempt``-th): whether the connection was lost and is made
        again (a server's journal; a file's is never lost)."""
        return False

    def _rollback(self) -> None:
        if self._con.in_transaction:
            self._con.execute("ROLLBACK")

    def _frame(self, sql: str, params: list[Any]) -> pd.DataFrame:
        return pd.read_sql_query(sql, self._con, params=params)

    # ------------------------------------------------------------------ writing
    def record(self, rec: dict[str, Any]) -> None:
        """Queue one call; the writer thread commits it within about ``flush_s``."""
        with self._cv:
            self._raise_if_failed()
            if self._closing:
                raise RuntimeError(f"{self.where}: the journal is closed")
            self._queue.append(rec)
            self._n_queued += 1
            if rec.get("source") in ("network", "batch"):
                self.sent[rec.get("stage") or ""] += 1
                self.sent_failed[rec.get("stage") or ""] += int(rec.get("status") != "ok")
            if rec.get("status") == "ok" and rec.get("call_key"):
                self._queued_ok[rec["call_key"]] = rec
            if len(self._queue) == 1:
                self._cv.notify_all()
            full = len(self._queue) >= self.max_queued
        if full:
            self.flush()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:  # closing, and everything is written
                    return
                batch, self._queue = self._queue, []
            parts_before = dict(self._parts)
            for attempt in range(4):  # a lost connection is made again (patiently: PgJournal), up to 3 times a batch
                try:
                    with self._lock:
                        self._con.execute(self._BEGIN)
                        rows = []
                        for rec in batch:
                            request = _request_text(rec.get("request"))
                            part_id, zdict, rdict = self._part(rec, request)
                            values = [part_id, *[rec.get(c) for c in _CALL]]
                            values[_AT_KEY] = self._key_in(rec.get("call_key") or "")
                            values[_AT_REQUEST] = _deflate(request, zdict)
                            answer = rec.get("response_text")
                            values[_AT_ANSWER] = None if answer is None else _deflate(answer, rdict)
                            rows.append(values)
                        self._insert_many(
                            self._q(
                                f"INSERT INTO call_log (part_id, {', '.join(_CALL)}) "
                                f"VALUES ({', '.join('?' * (1 + len(_CALL)))})"
                            ),
                            rows,
                        )
                        self._con.execute("COMMIT")
                    break
                except BaseException as e:  # noqa: BLE001 - kept, and raised to the next caller
                    with self._lock:
                        self._rollback()
                    self._parts = parts_before  # parts added in the rolled-back transaction do not exist
                    try:
                        again = attempt < 3 and self._reconnected(e, attempt)  # the batch again, on a new connection
                    except Exception as gave_up:  # noqa: BLE001 - the database stayed away: this is the error
                        e, again = gave_up, False
                    if again:
                        continue
                    with self._cv:
                        self._failure = e
                        self._n_written += len(batch)
                        self._cv.notify_all()
                    return
            with self._cv:
                self._n_written += len(batch)
                for rec in batch:
                    key = rec.get("call_key")
                    if key is not None and self._queued_ok.get(key) is rec:
                        del self._queued_ok[key]
                self._cv.notify_all()
                # let the next batch gather (one transaction per interval), unless a reader waits for it
                self._cv.wait_for(lambda: self._closing or self._flush_to > self._n_written, timeout=self.flush_s)

    def _part(self, rec: dict[str, Any], request: str) -> tuple[int, bytes, bytes]:
        """(part_id, zdict, rdict) of the record's part, added when new, with this request as the
        requests' dictionary and this answer (then the request's end) as the answers'. Called by the
        writer inside its transaction; another process may have added the part."""
        key = tuple(rec.get(c) for c in _PART)
        if key not in self._parts:
            where = " AND ".join(f"{c} {self._IS} ?" for c in _PART)
            req = request.encode("utf-8")
            rdict = ((rec.get("response_text") or "").encode("utf-8") + req[-4096:])[-_ZDICT_MAX:]
            self._con.execute(
                self._q(
                    f"INSERT INTO call_parts ({', '.join(_PART)}, zdict, rdict) "
                    f"SELECT {', '.join('?' * len(_PART))}, ?, ? "
                    f"WHERE NOT EXISTS (SELECT 1 FROM call_parts WHERE {where})" + self._NO_CONFLICT
                ),
                [*key, req[-_ZDICT_MAX:], rdict, *key],
            )
            part_id, zdict, rdict = self._con.execute(
                self._q(f"SELECT part_id, zdict, rdict FROM call_parts WHERE {where}"), key
            ).fetchone()
            self._parts[key] = (part_id, bytes(zdict), bytes(rdict))
        return self._parts[key]

    def _dicts(self, part_id: int) -> tuple[bytes, bytes]:
        """A part's (zdict, rdict) (the caller holds the connection's lock)."""
        if part_id not in self._zdicts:
            zdict, rdict = self._con.execute(
                self._q("SELECT zdict, rdict FROM call_parts WHERE part_id = ?"), [part_id]
            ).fetchone()
            self._zdicts[part_id] = (bytes(zdict), bytes(rdict))
        return self._zdicts[part_id]

    def _raise_if_failed(self) -> None:
        from ..errors import AipError

        if isinstance(self._failure, AipError):  # said already (the database stayed away: OperationalError)
            raise self._failure
        if self._failure is not None:
            raise RuntimeError(f"{self.where}: writing the call journal failed: {self._failure}") from self._failure

    def flush(self) -> None:
        """Wait until every call queued so far is written."""
        with self._cv:
            target = self._n_queued
            self._flush_to = max(self._flush_to, target)
            self._cv.notify_all()
            while self._n_written < target and self._failure is None:
                self._cv.wait(0.5)
            self._raise_if_failed()

    # ------------------------------------------------------------------ provider batches
    def _batch_sql(self, sql: str, params: list[Any], fetch: bool = False) -> list[tuple]:
        """One statement on the batches table, written at once (not queued): a batch is journaled
        before it is polled, so a stop or a crash finds it."""
        with self._lock:
            cur = self._con.execute(self._q(sql), params)
            return list(cur.fetchall()) if fetch else []

    def save_batch(self, rec: dict[str, Any]) -> None:
        """A batch (``BATCH_COLS``): its requests uploaded (status ``uploaded``, id ``upload:<file
        id>``) before the batch is created, then created (``pending``) before it is polled. Saved
        once: a statement run again after a lost connection changes nothing."""
        self._batch_sql(
            f"INSERT INTO batches ({', '.join(BATCH_COLS)}) VALUES ({', '.join('?' * len(BATCH_COLS))}) "
            "ON CONFLICT DO NOTHING",
            [rec.get(c) for c in BATCH_COLS],
        )

    def created_batch(self, upload_id: str, batch_id: str) -> None:
        """The uploaded requests' batch now exists at the provider: poll it from here on."""
        self._batch_sql("UPDATE batches SET batch_id = ?, status = 'pending' WHERE batch_id = ?", [batch_id, upload_id])

    def end_batch(self, batch_id: str, status: str) -> None:
        self._batch_sql(
            "UPDATE batches SET status = ?, ended_at = ? WHERE batch_id = ?", [status, time.time(), batch_id]
        )

    def open_batches(self, run_id: str, metric: str, stage: str, role: str, endpoint: str) -> list[dict[str, Any]]:
        """The part's batches not yet read back (oldest first), and uploads whose batch may or may
        not have been created: a resumed stage polls (or finds, or creates) these again instead of
        sending their requests twice."""
        rows = self._batch_sql(
            f"SELECT {', '.join(BATCH_COLS)} FROM batches WHERE run_id = ? AND metric = ? AND "
            "stage = ? AND role = ? AND endpoint = ? AND status IN ('pending', 'uploaded') "
            "ORDER BY created_at",
            [run_id, metric, stage, role, endpoint],
            fetch=True,
        )
        return [dict(zip(BATCH_COLS, r)) for r in rows]

    def batches(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._batch_sql(
            f"SELECT {', '.join(BATCH_COLS)} FROM batches WHERE run_id = ? ORDER BY created_at", [run_id], fetch=True
        )
        return [dict(zip(BATCH_COLS, r)) for r in rows]

    # ------------------------------------------------------------------ structured-output forms
    def record_form(self, rec: dict[str, Any]) -> None:
        """A structured-output form chosen for a run's endpoint (``FORM_COLS``: how is ``preflight``,
        ``lazily`` or ``fallback``), written at once: every stage of the run, in any process, and
        a resumed run ask in that form from then on."""
        self._batch_sql(
            f"INSERT INTO structured_forms ({', '.join(FORM_COLS)}) VALUES ({', '.join('?' * len(FORM_COLS))})",
            [rec.get(c, time.time() if c == "created_at" else None) for c in FORM_COLS],
        )

    def forms(self, run_id: str) -> list[dict[str, Any]]:
        """The run's structured-output events, oldest first."""
        rows = self._batch_sql(
            f"SELECT {', '.join(FORM_COLS)} FROM structured_forms WHERE run_id = ? ORDER BY created_at",
            [run_id],
            fetch=True,
        )
        return [dict(zip(FORM_COLS, r)) for r in rows]

    def form(self, run_id: str, endpoint: str, model: str) -> dict[str, Any] | None:
        """The form the run asks this endpoint's model in: its latest event's, or the furthest along
        ``structured.FORMS`` when two processes recorded one (a run only moves forward), else None."""
        from .structured import FORMS

        events = [e for e in self.forms(run_id) if e["endpoint"] == endpoint and e["model"] == model]
        if not events:
            return None
        return max(reversed(events), key=lambda e: FORMS.index(e["form"]) if e["form"] in FORMS else -1)

    def close(self) -> None:
        """Write what is queued, stop the writer, close the file."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._writer.join()
        with self._lock:
            self._con.close()
        with self._cv:
            self._raise_if_failed()

    def ok_keys(self, run_ids: list[str], stage: str) -> set[str]:
        """Keys of the successful calls of these runs in this stage (any metric). A SUT prompt
        never equals a judge prompt, so other stages' keys could never match and are not loaded."""
        return self._ok(run_ids, stage, self._key_out)

    def ok_marks(self, run_ids: list[str], stage: str) -> Marks:
        """:func:`key_mark` of every key ``ok_keys`` gives: the client's cheap in-memory test before
        ``lookup`` (2,160,000 of them take 17 MB; the keys as strings took 230 MB)."""
        return self._ok(
            run_ids, stage, lambda k: int.from_bytes(k[:8], "big") if isinstance(k, bytes) else key_mark(k), Marks
        )

    def _ok(self, run_ids: list[str], stage: str, as_: Callable[[Any], Any], into: Callable[[Iterable], Any] = set):
        self.flush()
        marks = ",".join("?" * len(run_ids))
        with self._lock:  # built from the cursor: no list of every key beside it
            cur = self._con.execute(
                self._q(
                    f"SELECT DISTINCT c.call_key FROM call_log c JOIN call_parts p USING (part_id) "
                    f"WHERE c.status = 'ok' AND p.stage = ? AND p.run_id IN ({marks})"
                ),
                [stage, *run_ids],
            )
            return into(as_(k) for (k,) in cur)

    def lookup(self, call_key: str, run_ids: list[str]) -> dict[str, Any] | None:
        """The latest successful call with this key among the given runs (this run's first), or None;
        its request as JSON text, as ``frames`` gives it."""
        with self._cv:
            queued = self._queued_ok.get(call_key)

        def from_queue() -> dict[str, Any]:
            assert queued is not None
            out = {c: queued.get(c) for c in _COLS}
            out["request"] = _request_text(queued.get("request"))
            return out

        if queued is not None and queued["run_id"] == run_ids[0]:  # the newest of this run: not written yet
            return from_queue()
        marks = ",".join("?" * len(run_ids))
        cols = [f"p.{c}" if c in _PART else f"c.{c}" for c in _COLS]
        with self._lock:
            row = self._con.execute(
                self._q(
                    f"SELECT c.part_id, {', '.join(cols)} FROM call_log c JOIN call_parts p USING (part_id) "
                    f"WHERE c.call_key = ? AND c.status = 'ok' AND p.run_id IN ({marks}) "
                    "ORDER BY (p.run_id = ?) DESC, c.seq DESC LIMIT 1"
                ),
                [self._key_in(call_key), *run_ids, run_ids[0]],
            ).fetchone()
            if row is not None:
                out = dict(zip(_COLS, row[1:]))
                zdict, rdict = self._dicts(row[0])
                out["request"] = _inflate(out["request"], zdict)
                out["response_text"] = _inflate(out["response_text"], rdict)
                out["call_key"] = self._key_out(out["call_key"])
                return out
        return from_queue() if queued is not None and queued["run_id"] in run_ids else None

    def totals(self, run_id: str) -> tuple[int, int]:
        """(calls paid for: live or in a provider batch, tokens) this run has spent so far, all metrics and stages."""
        self.flush()
        with self._lock:
            n, t = self._con.execute(
                self._q(
                    "SELECT count(*), coalesce(sum(coalesce(c.prompt_tokens, 0) + coalesce(c.completion_tokens, 0)), 0) "
                    "FROM call_log c JOIN call_parts p USING (part_id) WHERE p.run_id = ? AND c.source IN ('network', 'batch')"
                ),
                [run_id],
            ).fetchone()
        return int(n), int(t)

    def frames(self, run_id: str, metric: str, stage: str, chunk: int = 20000) -> Iterator[pd.DataFrame]:
        """This partition's calls in the order they completed, shaped for ``llm_calls``, in chunks."""
        self.flush()
        with self._lock:
            parts = {
                pid: (bytes(zd), bytes(rd))
                for pid, zd, rd in self._con.execute(
                    self._q(
                        "SELECT part_id, zdict, rdict FROM call_parts WHERE run_id = ? AND metric = ? AND stage = ?"
                    ),
                    [run_id, metric, stage],
                )
            }
        if not parts:
            return
        marks = ",".join("?" * len(parts))
        cols = [f"p.{c}" if c in _PART else f"c.{c}" for c in _COLS]
        last = 0
        while True:
            with self._lock:
                df = self._frame(
                    f"SELECT c.seq, c.part_id, {', '.join(cols)} FROM call_log c JOIN call_parts p USING (part_id) "
                    f"WHERE c.part_id IN ({marks}) AND c.seq > ? ORDER BY c.seq LIMIT ?",
                    [*parts, last, chunk],
                )
            if df.empty:
                return
            last = int(df["seq"].iloc[-1])
            df["request"] = [_inflate(b, parts[int(pid)][0]) for b, pid in zip(df["request"], df["part_id"])]
            df["response_text"] = [
                _inflate(b, parts[int(pid)][1]) for b, pid in zip(df["response_text"], df["part_id"])
            ]
            df["call_key"] = [self._key_out(k) for k in df["call_key"]]
            df = df.drop(columns=["seq", "part_id"])
            df["created_at"] = pd.to_datetime(df["created_at"], unit="s")
            yield df
