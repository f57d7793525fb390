"""A crash-safe journal of model calls, beside the warehouse (SQLite in WAL mode).

Each call is recorded as it completes, without touching DuckDB's single write lock. Successful
calls answer identical later requests of the same run (the cache), so a stage that crashed
half-way resumes without paying again. When a stage writes its rows, the journal's records for
that (run, metric, stage) are folded into ``llm_calls``.

Writes are batched off the caller's thread: ``record`` only queues the call (the model client
calls it on its event loop, where one SQLite insert per call cost most of the client's CPU), and
a writer thread commits what is queued in one transaction at most every ``flush_s`` (50 ms).
What a crash (a kill, a power cut) can lose is therefore the calls in flight plus the calls of
one flush interval; a resumed stage makes those calls again. Until it is written, a queued
successful call still answers ``lookup`` (the cache), and every other reader (``ok_keys``,
``totals``, ``frames``) first waits for the queue to be written.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path
from typing import Any, Iterator

import pandas as pd

_COLS = [
    "run_id", "metric", "stage", "role", "call_key", "sample_index", "endpoint", "model", "request",
    "response_text", "status", "error", "http_status", "latency_ms", "prompt_tokens", "completion_tokens",
    "attempts", "response_model", "fingerprint", "source", "created_at",
]


def journal_path(warehouse_path: str | Path) -> Path:
    p = Path(warehouse_path)
    return p.with_name(p.name.replace(".duckdb", "") + ".journal.sqlite")


class Journal:
    FLUSH_S = 0.05

    def __init__(self, path: str | Path, flush_s: float = FLUSH_S):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_s = flush_s
        self._lock = threading.Lock()  # the connection: the writer thread and the readers
        self._con = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False, isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=NORMAL")
        self._con.execute(
            f"CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, {', '.join(_COLS)})"
        )
        self._con.execute("CREATE INDEX IF NOT EXISTS calls_key ON calls (call_key, status)")
        self._con.execute("CREATE INDEX IF NOT EXISTS calls_part ON calls (run_id, metric, stage)")
        self._con.execute("CREATE INDEX IF NOT EXISTS calls_ok ON calls (run_id, stage, status)")
        # the queue: records not yet written, the successful ones by key (they answer lookups),
        # and how many were queued and written (flush waits for the second to reach the first)
        self._cv = threading.Condition()
        self._queue: list[dict[str, Any]] = []
        self._queued_ok: dict[str, dict[str, Any]] = {}
        self._n_queued = self._n_written = 0
        self._closing = False
        self._flush_to = 0  # a reader waits for the calls queued up to here: write now, not at the interval's end
        self._failure: BaseException | None = None
        self._writer = threading.Thread(target=self._write_loop, name=f"aip-journal-{self.path.name}", daemon=True)
        self._writer.start()

    # ------------------------------------------------------------------ writing
    def record(self, rec: dict[str, Any]) -> None:
        """Queue one call; the writer thread commits it within about ``flush_s``."""
        with self._cv:
            self._raise_if_failed()
            if self._closing:
                raise RuntimeError(f"{self.path}: the journal is closed")
            self._queue.append(rec)
            self._n_queued += 1
            if rec.get("status") == "ok" and rec.get("call_key"):
                self._queued_ok[rec["call_key"]] = rec
            if len(self._queue) == 1:
                self._cv.notify_all()

    def _write_loop(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closing:
                    self._cv.wait()
                if not self._queue:  # closing, and everything is written
                    return
                batch, self._queue = self._queue, []
            try:
                rows = []
                for rec in batch:
                    values = [rec.get(c) for c in _COLS]
                    values[_COLS.index("request")] = json.dumps(rec.get("request"), ensure_ascii=False, sort_keys=True)
                    rows.append(values)
                with self._lock:
                    self._con.execute("BEGIN")
                    self._con.executemany(
                        f"INSERT INTO calls ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})", rows)
                    self._con.execute("COMMIT")
            except BaseException as e:  # noqa: BLE001 - kept, and raised to the next caller
                with self._lock:
                    if self._con.in_transaction:
                        self._con.execute("ROLLBACK")
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

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise RuntimeError(f"{self.path}: writing the call journal failed: {self._failure}") from self._failure

    def flush(self) -> None:
        """Wait until every call queued so far is written."""
        with self._cv:
            target = self._n_queued
            self._flush_to = max(self._flush_to, target)
            self._cv.notify_all()
            while self._n_written < target and self._failure is None:
                self._cv.wait(0.5)
            self._raise_if_failed()

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
        """Keys of the successful calls of these runs in this stage (any metric): a cheap in-memory
        test before ``lookup``. A SUT prompt never equals a judge prompt, so other stages'
        keys could never match and are not loaded."""
        self.flush()
        marks = ",".join("?" * len(run_ids))
        with self._lock:
            cur = self._con.execute(f"SELECT DISTINCT call_key FROM calls WHERE status = 'ok' AND stage = ? "
                                    f"AND run_id IN ({marks})", [stage, *run_ids])
            return {k for (k,) in cur}

    def lookup(self, call_key: str, run_ids: list[str]) -> dict[str, Any] | None:
        """The latest successful call with this key among the given runs (this run's first), or None."""
        with self._cv:
            queued = self._queued_ok.get(call_key)
        if queued is not None and queued["run_id"] == run_ids[0]:  # the newest of this run: not written yet
            return {c: queued.get(c) for c in _COLS}
        marks = ",".join("?" * len(run_ids))
        with self._lock:
            cur = self._con.execute(
                f"SELECT {', '.join(_COLS)} FROM calls WHERE call_key = ? AND status = 'ok' AND run_id IN ({marks})"
                " ORDER BY (run_id = ?) DESC, seq DESC LIMIT 1",
                [call_key, *run_ids, run_ids[0]],
            )
            row = cur.fetchone()
        if row is None and queued is not None and queued["run_id"] in run_ids:
            return {c: queued.get(c) for c in _COLS}
        return dict(zip(_COLS, row)) if row else None

    def totals(self, run_id: str) -> tuple[int, int]:
        """(network calls, tokens) this run has spent so far, all metrics and stages."""
        self.flush()
        with self._lock:
            n, t = self._con.execute(
                "SELECT count(*), coalesce(sum(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0)), 0) "
                "FROM calls WHERE run_id = ? AND source = 'network'", [run_id]).fetchone()
        return int(n), int(t)

    def frames(self, run_id: str, metric: str, stage: str, chunk: int = 20000) -> Iterator[pd.DataFrame]:
        """This partition's calls in the order they completed, shaped for ``llm_calls``, in chunks."""
        self.flush()
        last = 0
        while True:
            with self._lock:
                df = pd.read_sql_query(
                    f"SELECT seq, {', '.join(_COLS)} FROM calls WHERE run_id = ? AND metric = ? AND stage = ? AND seq > ?"
                    " ORDER BY seq LIMIT ?", self._con, params=[run_id, metric, stage, last, chunk])
            if df.empty:
                return
            last = int(df["seq"].iloc[-1])
            df = df.drop(columns=["seq"])
            df["created_at"] = pd.to_datetime(df["created_at"], unit="s")
            yield df
