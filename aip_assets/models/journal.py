"""A crash-safe journal of model calls, beside the warehouse (SQLite in WAL mode).

Each call is recorded as it completes, without touching DuckDB's single write lock. Successful
calls answer identical later requests of the same run (the cache), so a stage that crashed
half-way resumes without paying again. When a stage writes its rows, the journal's records for
that (run, metric, stage) are folded into ``llm_calls``.
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
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._con = sqlite3.connect(str(self.path), timeout=60, check_same_thread=False, isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=NORMAL")
        self._con.execute(
            f"CREATE TABLE IF NOT EXISTS calls (seq INTEGER PRIMARY KEY AUTOINCREMENT, {', '.join(_COLS)})"
        )
        self._con.execute("CREATE INDEX IF NOT EXISTS calls_key ON calls (call_key, status)")
        self._con.execute("CREATE INDEX IF NOT EXISTS calls_part ON calls (run_id, metric, stage)")
        self._con.execute("CREATE INDEX IF NOT EXISTS calls_ok ON calls (run_id, stage, status)")

    def close(self) -> None:
        self._con.close()

    def ok_keys(self, run_ids: list[str], stage: str) -> set[str]:
        """Keys of the successful calls of these runs in this stage (any metric): a cheap in-memory
        test before ``lookup``. A SUT prompt never equals a judge prompt, so other stages'
        keys could never match and are not loaded."""
        marks = ",".join("?" * len(run_ids))
        with self._lock:
            cur = self._con.execute(f"SELECT DISTINCT call_key FROM calls WHERE status = 'ok' AND stage = ? "
                                    f"AND run_id IN ({marks})", [stage, *run_ids])
            return {k for (k,) in cur}

    def lookup(self, call_key: str, run_ids: list[str]) -> dict[str, Any] | None:
        """The latest successful call with this key among the given runs, or None."""
        marks = ",".join("?" * len(run_ids))
        with self._lock:
            cur = self._con.execute(
                f"SELECT {', '.join(_COLS)} FROM calls WHERE call_key = ? AND status = 'ok' AND run_id IN ({marks})"
                " ORDER BY (run_id = ?) DESC, seq DESC LIMIT 1",
                [call_key, *run_ids, run_ids[0]],
            )
            row = cur.fetchone()
        return dict(zip(_COLS, row)) if row else None

    def record(self, rec: dict[str, Any]) -> None:
        values = [rec.get(c) for c in _COLS]
        values[_COLS.index("request")] = json.dumps(rec.get("request"), ensure_ascii=False, sort_keys=True)
        with self._lock:
            self._con.execute(f"INSERT INTO calls ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})", values)

    def totals(self, run_id: str) -> tuple[int, int]:
        """(network calls, tokens) this run has spent so far, all metrics and stages."""
        with self._lock:
            n, t = self._con.execute(
                "SELECT count(*), coalesce(sum(coalesce(prompt_tokens, 0) + coalesce(completion_tokens, 0)), 0) "
                "FROM calls WHERE run_id = ? AND source = 'network'", [run_id]).fetchone()
        return int(n), int(t)

    def frames(self, run_id: str, metric: str, stage: str, chunk: int = 20000) -> Iterator[pd.DataFrame]:
        """This partition's calls in the order they completed, shaped for ``llm_calls``, in chunks."""
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
