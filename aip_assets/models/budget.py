"""A run's limits on network calls and tokens (``limits.max_calls`` / ``limits.max_tokens``):
counted in this process from the journal, or in Postgres for every worker of a shared run."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import LimitReached
from ..shared_state import SharedDb, shared_state_url

if TYPE_CHECKING:
    from .journal import Journal


class BudgetExhausted(LimitReached):
    """The run reached its limits.max_calls / max_tokens: the stage stops, nothing is written."""


class Budget:
    """A run's caps on network calls and tokens, counted from the journal (so across stages and
    resumed runs) and reserved before each call."""

    def __init__(self, run_id: str, journal: Journal | None, max_calls: int | None, max_tokens: int | None):
        self.max_calls, self.max_tokens = max_calls, max_tokens
        self.calls, self.tokens = (
            journal.totals(run_id) if journal is not None and (max_calls or max_tokens) else (0, 0)
        )

    def reserve(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            raise BudgetExhausted(
                f"the run reached limits.max_calls = {self.max_calls}; the calls made so far are "
                "kept: raise the limit (aip-eval run SPEC --run-id RUN --max-calls N) to resume"
            )
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            raise BudgetExhausted(
                f"the run reached limits.max_tokens = {self.max_tokens} ({self.tokens} spent); "
                "raise the limit (aip-eval run SPEC --run-id RUN --max-tokens N) to resume"
            )
        self.calls += 1

    async def areserve(self) -> None:
        self.reserve()

    def spend(self, tokens: int) -> None:
        self.tokens += tokens

    @staticmethod
    def for_run(run_id: str, journal: Journal | None, max_calls: int | None, max_tokens: int | None) -> Budget:
        """The run's budget: in Postgres when ``AIP_SHARED_STATE_URL`` names one (every worker of
        the run draws from it), else counted in this process from the journal."""
        url = shared_state_url()
        if url:
            return PgBudget(run_id, journal, max_calls, max_tokens, url)
        return Budget(run_id, journal, max_calls, max_tokens)


class PgBudget(Budget):
    """A run's budget shared by its workers (shared mode): one row per run id in
    Postgres, a call reserved by one atomic ``UPDATE … WHERE calls < max_calls RETURNING``, so the
    workers together never send more than ``max_calls``. The row starts from the journal's totals
    of the first worker to open it (the local journal without a lake, the lake's with one, where
    ``aip-eval migrate`` copies a run's calls), and it stays: a later resume of
    the same run id, on any worker, goes on from it. Statements
    run on the database's own thread (``SharedDb``); ``spend`` is queued without waiting."""

    SHARED = True  # its count lives in Postgres: a resumed batch's calls are in it already

    def __init__(self, run_id: str, journal: Journal | None, max_calls: int | None, max_tokens: int | None, url: str):
        self.run_id, self.max_calls, self.max_tokens = run_id, max_calls, max_tokens
        self.db = SharedDb.get(url)
        self._seed = journal.totals(run_id) if journal is not None else (0, 0)
        self.calls, self.tokens = self.db.run(f"the budget of run {run_id}", self._row)

    def _row(self, conn) -> tuple[int, int]:
        """The run's row, made from this worker's journal totals if there is none yet."""
        conn.execute(
            "INSERT INTO aip_run_budget (run_id, calls, tokens) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
            [self.run_id, *self._seed],
        )
        return conn.execute("SELECT calls, tokens FROM aip_run_budget WHERE run_id = %s", [self.run_id]).fetchone()

    def _take(self, conn) -> tuple[int, int] | None:
        return conn.execute(
            "UPDATE aip_run_budget SET calls = calls + 1 WHERE run_id = %s AND (%s::bigint IS NULL OR calls < %s) "
            "AND (%s::bigint IS NULL OR tokens < %s) RETURNING calls, tokens",
            [self.run_id, self.max_calls, self.max_calls, self.max_tokens, self.max_tokens],
        ).fetchone()

    def reserve(self) -> None:
        def take(conn) -> tuple[tuple[int, int], bool]:
            row = self._take(conn)
            if row is None:  # the cap is reached, or the row was deleted while the run went on: make it, try again
                self._row(conn)
                row = self._take(conn)
            return (row, True) if row is not None else (self._row(conn), False)

        (self.calls, self.tokens), ok = self.db.run(f"the budget of run {self.run_id}", take)
        if not ok:
            super().reserve()  # raises BudgetExhausted with the message of the cap reached
            raise BudgetExhausted(f"the run reached its limits ({self.calls} calls, {self.tokens} tokens)")

    async def areserve(self) -> None:
        await self.db.call(self.reserve)

    def spend(self, tokens: int) -> None:
        if tokens:
            self.db.queue(
                self.db.run,
                f"the budget of run {self.run_id}",
                lambda conn: conn.execute(
                    "UPDATE aip_run_budget SET tokens = tokens + %s WHERE run_id = %s", [tokens, self.run_id]
                ),
            )
