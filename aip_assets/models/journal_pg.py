"""The call journal in Postgres (``PgJournal``, shared mode), which journal a run opens
(``open_journal``), and the copy of a SQLite journal's runs into Postgres (``copy_runs``)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd

from .journal import Journal, journal_path
from .journal_format import _BATCHES_DDL, _CALL, _FORMS_DDL, _PART

logger = logging.getLogger("aip_assets")


class PgJournal(Journal):
    """The journal in the shared-state database (``AIP_SHARED_STATE_URL``, shared
    mode), so every worker of a run reads the calls the others made: a stage resumed on another
    machine answers each successful call from it instead of paying again. The same tables, in
    the schema ``aip_journal`` (``call_parts``, ``call_log``, the view ``call_index``); call keys
    as their hex text. Each process writes through its own connection, a part's row made once by
    ``ON CONFLICT DO NOTHING`` (the first worker's request and answer are its dictionaries)."""

    REMOTE = True
    _BEGIN = "BEGIN"
    _IS = "IS NOT DISTINCT FROM"
    _NO_CONFLICT = " ON CONFLICT DO NOTHING"
    _key_in = staticmethod(lambda key: key)
    _key_out = staticmethod(lambda key: key)
    SCHEMA = "aip_journal"

    def _open(self, url: str | Path) -> Any:
        from ..shared_state import connect, describe

        url = str(url)
        self._url = url
        self.where = f"the call journal in {describe(url)} (schema {self.SCHEMA})"
        con = connect(
            url,
            "make the call journal's tables",
            [
                f"CREATE SCHEMA IF NOT EXISTS {self.SCHEMA}",
                f"SET search_path = {self.SCHEMA}",
                f"CREATE TABLE IF NOT EXISTS call_parts (part_id bigserial PRIMARY KEY, "
                f"{', '.join(c + ' text' for c in _PART)}, zdict bytea, rdict bytea, "
                f"UNIQUE NULLS NOT DISTINCT ({', '.join(_PART)}))",
                "CREATE TABLE IF NOT EXISTS call_log (seq bigserial PRIMARY KEY, part_id bigint, "
                f"{', '.join(c + ' ' + _PG_TYPES.get(c, 'text') for c in _CALL)})",
                "CREATE INDEX IF NOT EXISTS call_log_key ON call_log (call_key, status)",
                "CREATE INDEX IF NOT EXISTS call_log_part ON call_log (part_id)",
                f"CREATE OR REPLACE VIEW call_index AS SELECT c.seq, {', '.join('p.' + c for c in _PART)}, "
                f"{', '.join('c.' + c for c in _CALL if c not in ('request', 'response_text'))} "
                "FROM call_log c JOIN call_parts p USING (part_id)",
                _BATCHES_DDL.format(real="double precision"),
                _FORMS_DDL.format(real="double precision"),
            ],
        )
        return con

    def _batch_sql(self, sql: str, params: list[Any], fetch: bool = False) -> list[tuple]:
        return self._again(super()._batch_sql, sql, params, fetch)

    @staticmethod
    def _q(sql: str) -> str:
        return sql.replace("?", "%s")

    def _insert_many(self, sql: str, rows: list[list[Any]]) -> None:
        # Postgres text cannot hold NUL (an endpoint's error page may): kept as U+FFFD
        rows = [[v.replace("\x00", "\ufffd") if isinstance(v, str) and "\x00" in v else v for v in row] for row in rows]
        with self._con.cursor() as cur:
            cur.executemany(sql, rows)

    def _rollback(self) -> None:
        if not (self._con.closed or self._con.broken):
            self._con.rollback()

    def _reconnected(self, e: BaseException, attempt: int = 0) -> bool:
        """After a failed statement (the ``attempt``-th): whether to try it again, the connection
        made again if it was lost (by whichever of the writer and the readers finds it so first),
        waiting for the database as ``shared_state.patiently`` does (a restart); raises the
        ``OperationalError`` when it stays away, or the AipError of a refused connection."""
        import psycopg

        from ..shared_state import lost, patiently

        if not isinstance(e, psycopg.OperationalError):
            return False
        with self._lock:
            if not (self._con.closed or self._con.broken):
                return attempt == 0  # made again meanwhile, or not lost (a timeout): once more
            if not lost(e):
                return False
            logger.warning(f"{self.where}: the connection was lost; connecting again")
            con = patiently(
                self._url, f"the call journal (schema {self.SCHEMA}): connecting again", lambda: self._open(self._url)
            )
            self._con.close()
            self._con = con
            self._parts, self._zdicts = {}, {}  # part ids are read again on the new connection
        return True

    def _again(self, read: Callable[..., Any], *args: Any) -> Any:
        for attempt in range(4):  # as the writer: a connection lost again after it was made again, up to 3 times
            try:
                return read(*args)
            except Exception as e:
                if attempt == 3 or not self._reconnected(e, attempt):
                    raise
        raise AssertionError("unreachable")

    def _ok(self, run_ids: list[str], stage: str, as_: Callable[[Any], Any], into: Callable[[Iterable], Any] = set):
        return self._again(super()._ok, run_ids, stage, as_, into)

    def lookup(self, call_key: str, run_ids: list[str]) -> dict[str, Any] | None:
        return self._again(super().lookup, call_key, run_ids)

    def totals(self, run_id: str) -> tuple[int, int]:
        return self._again(super().totals, run_id)

    def frames(self, run_id: str, metric: str, stage: str, chunk: int = 20000) -> Iterator[pd.DataFrame]:
        """As the SQLite journal's; a connection lost between pages is made again and the reading
        goes on after the pages already given (pages follow ``seq``, so they come out the same)."""
        given = 0
        for attempt in range(4):
            try:
                for i, df in enumerate(super().frames(run_id, metric, stage, chunk)):
                    if i >= given:
                        given += 1
                        yield df
                return
            except Exception as e:
                if attempt == 3 or not self._reconnected(e, attempt):
                    raise

    def _frame(self, sql: str, params: list[Any]) -> pd.DataFrame:
        cur = self._con.execute(self._q(sql), params)
        return pd.DataFrame.from_records(cur.fetchall(), columns=[d.name for d in cur.description], coerce_float=True)


# a call_log column's type in Postgres (others: text)
_PG_TYPES = {
    "request": "bytea",
    "response_text": "bytea",
    "sample_index": "bigint",
    "http_status": "integer",
    "latency_ms": "double precision",
    "prompt_tokens": "bigint",
    "completion_tokens": "bigint",
    "attempts": "integer",
    "created_at": "double precision",
}


def open_journal(warehouse_path: str | Path) -> Journal:
    """The run's journal: with the warehouse, so a run's id names one run wherever its calls are
    read. In a lake (shared mode: ``AIP_LAKE_DATA_PATH``), in the shared-state database; else the
    SQLite file beside the warehouse file (also when only ``AIP_SHARED_STATE_URL`` is set: each
    machine's warehouse and its runs are its own)."""
    from ..shared_state import lake_enabled, shared_state_url

    url = shared_state_url()
    return PgJournal(url) if url and lake_enabled() else Journal(journal_path(warehouse_path))


def copy_runs(source: str | Path, target: PgJournal, runs: list[str]) -> int:
    """Copy these runs' calls from a SQLite journal file into the Postgres one (``aip-eval
    migrate``), in the order they were written; calls of these runs already there are replaced
    (a migrate that stopped half-way, run again). Returns the calls copied."""
    src = Path(source)
    if not runs or not src.exists():
        return 0
    target.flush()
    with target._lock:
        target._con.execute(
            "DELETE FROM call_log WHERE part_id IN (SELECT part_id FROM call_parts WHERE run_id = ANY(%s))", [runs]
        )
    journal = Journal(src)
    n = 0
    try:
        with journal._lock:
            parts = journal._con.execute(
                f"SELECT DISTINCT run_id, metric, stage FROM call_parts WHERE run_id IN ({','.join('?' * len(runs))}) "
                "ORDER BY run_id, metric, stage",
                runs,
            ).fetchall()
        for run_id, metric, stage in parts:
            for frame in journal.frames(run_id, metric, stage):
                frame = frame.astype(object).where(frame.notna(), None)
                for rec in frame.to_dict("records"):
                    rec["created_at"] = rec["created_at"].timestamp() if rec["created_at"] is not None else None
                    target.record(rec)
                    n += 1
        target.flush()
    finally:
        journal.close()
    return n
