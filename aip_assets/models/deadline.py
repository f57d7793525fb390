"""The row deadline: the time one dataset row's calls may be in flight in one stage.

The calls one dataset row makes in one stage may be in flight for ``row_timeout_s`` seconds in
all (the execution manifest's ``timeout_seconds``): the row's clock runs while at least one of
its calls is sent, retried or waiting out a Retry-After, not while it waits for a free slot
behind other rows. A call it would outlast is cut at the deadline, and none is sent or retried
after it (see :data:`CURRENT_ROW`).
"""

from __future__ import annotations

import contextvars
import time
from typing import Any

# the dataset row a call is made for (set per work item by ``metrics.running.run_bounded``); a
# client with a row timeout gives each row its own clock (:class:`RowClock`)
CURRENT_ROW: contextvars.ContextVar[str | None] = contextvars.ContextVar("aip_current_row", default=None)


class RowClock:
    """The time one row has had a call in flight (the union of its calls' spans, so calls of one
    row in flight together count once), against the row's limit."""

    __slots__ = ("limit", "used", "active", "since")

    def __init__(self, limit: float):
        self.limit, self.used, self.active, self.since = limit, 0.0, 0, 0.0

    def start(self) -> None:
        if self.active == 0:
            self.since = time.monotonic()
        self.active += 1

    def stop(self) -> None:
        self.active -= 1
        if self.active == 0:
            self.used += time.monotonic() - self.since

    def left(self) -> float:
        """Seconds left. While the row has a call in flight its clock runs at wall-clock speed, so
        a call started now with this much left reaches the deadline exactly when it runs out."""
        return self.limit - self.used - (time.monotonic() - self.since if self.active else 0.0)


class RowDeadlines:
    """A client's row clocks (one per row, made at the row's first call) and the calls and rows
    cut at their deadline, counted in the client's ``stats`` (``deadline_cut``, ``deadline_rows``)."""

    def __init__(self, row_timeout_s: float | None, stage: str, stats: dict[str, Any]):
        self.row_timeout_s = row_timeout_s  # None: no row deadline
        self.stage = stage
        self.stats = stats
        self._row_clock: dict[str, RowClock] = {}
        self._rows_cut: set[str] = set()

    def clock(self) -> RowClock | None:
        """The current row's clock (None without a row timeout or outside a row's work item)."""
        row = CURRENT_ROW.get()
        if self.row_timeout_s is None or row is None:
            return None
        if row not in self._row_clock:
            self._row_clock[row] = RowClock(self.row_timeout_s)
        return self._row_clock[row]

    def count_cut(self) -> None:
        row = CURRENT_ROW.get() or ""
        self.stats["deadline_cut"] += 1
        if row not in self._rows_cut:
            self._rows_cut.add(row)
            self.stats["deadline_rows"] += 1

    def error(self, what: str) -> str:
        """Why a call stopped at its row's deadline (counted for the run note)."""
        self.count_cut()
        return (
            f"row deadline: row {CURRENT_ROW.get()}'s calls in the {self.stage} stage reached their "
            f"{self.row_timeout_s:g}s limit of time in flight {what} (execution timeout_seconds; "
            f"limits.row_timeout_seconds sets it)"
        )
