"""Running a stage's calls: at most ``limit`` work items in flight, each for its dataset row
(:func:`run_bounded`), every awaitable run to its end before an error is raised
(:func:`gather_all`), progress logged as it goes (:class:`Progress`)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from ..models.batch import BATCHING
from ..models.deadline import CURRENT_ROW

logger = logging.getLogger("aip_assets")


# outcomes of a work item that failed (a SUT call, a judge that never answered in form); every other
# status but ``ok`` is an exclusion (an empty answer, a refusal, no decision, an unjudgeable pair)
FAILED_OUTCOMES = frozenset({"error", "sut_failed", "judge_failed"})


class Progress:
    """done/total, calls in flight, failures and exclusions, logged at most every few seconds, the
    first after a few seconds (a stage done sooner logs none), the last when an earlier one was.

    A work item's outcome (:meth:`tick`) is ``True`` or ``"ok"`` (done), ``False`` or a failure
    status (:data:`FAILED_OUTCOMES`: failed), or any other status (excluded: a refusal, an empty or
    unreadable answer is not a failure)."""

    def __init__(self, what: str, total: int, log: Callable[[str], None] | None = None, every_s: float = 2.0):
        self.what, self.total, self.done, self.failed, self.excluded = what, total, 0, 0, 0
        self.log = log or logger.info
        self.every_s = every_s
        self.t0 = time.monotonic()
        self._last = self.t0  # the first line once ``every_s`` has passed: a quick stage says nothing
        self._said = False
        self.in_flight: Callable[[], int] = lambda: 0

    def tick(self, outcome: bool | str | None = True) -> None:
        self.done += 1
        if outcome is False or (isinstance(outcome, str) and outcome in FAILED_OUTCOMES):
            self.failed += 1
        elif outcome is not True and outcome != "ok":
            self.excluded += 1
        now = time.monotonic()
        # the last line only after an earlier one (the stage's counts follow it, in the detail log)
        if now - self._last >= self.every_s or (self.done == self.total and self._said):
            self._last, self._said = now, True
            rate = self.done / max(now - self.t0, 1e-9)
            self.log(
                f"{self.what}: {self.done}/{self.total} done, {self.in_flight()} in flight, "
                f"{self.failed} failed, {self.excluded} excluded, {rate:.1f}/s"
            )


HEARTBEAT_S = 10.0  # a long step with no work items to count says what it is doing this often


class Heartbeat:
    """A long step that has no calls to count (an aggregation: reading, scoring, intervals,
    writing) says what it is doing and for how long, every :data:`HEARTBEAT_S` seconds, from a
    thread of its own, so a 50,000-row aggregation is not a minute of silence. Set :attr:`phase`
    as the step moves on. Logs to the ``aip_assets`` logger only (a Dagster context's log is not
    for other threads)."""

    def __init__(self, what: str, phase: str = "", every_s: float | None = None):
        self.what, self.phase = what, phase
        self.every_s = HEARTBEAT_S if every_s is None else every_s
        self.t0 = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="aip-heartbeat", daemon=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            logger.info(f"{self.what}: {self.phase}, {time.monotonic() - self.t0:.0f}s so far")

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def worst_outcome(statuses: Iterable[str], any_ok: bool = False) -> str:
    """One outcome for a work item of several records: a failure first, then an exclusion, else
    ``ok``; with ``any_ok``, ``ok`` when any record is (the item has a score)."""
    statuses = [str(s) for s in statuses]
    if any_ok and "ok" in statuses:
        return "ok"
    return next((s for s in statuses if s in FAILED_OUTCOMES), next((s for s in statuses if s != "ok"), "ok"))


async def gather_all(*aws: Awaitable[Any]) -> list[Any]:
    """Like asyncio.gather, but every awaitable runs to its end before the first error is raised,
    so no call in flight is abandoned (its answer would be lost to the journal)."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return list(results)


def row_of(item: Any) -> str | None:
    """The dataset row a work item belongs to: a row id, a record with ``input_id``, a
    :class:`DatasetRow`, or a tuple led by one of those (e.g. ``(row, sample)``). A work item
    that calls for several rows sets :data:`CURRENT_ROW` per call itself (perturbation judging)."""
    if isinstance(item, str):
        return item
    if isinstance(item, dict):
        return item.get("input_id")
    if isinstance(item, tuple) and item:
        return row_of(item[0])
    return getattr(item, "input_id", None)


async def run_bounded(
    items: Iterable[Any],
    fn: Callable[[Any], Awaitable[Any]],
    limit: int,
    progress: Progress | None = None,
    ok: Callable[[Any], bool | str] = lambda r: True,
) -> list[Any]:
    """Apply ``fn`` to every item with at most ``limit`` in flight; results in item order.

    Each item's calls are made for its dataset row (:func:`row_of`, set as
    :data:`~aip_assets.models.deadline.CURRENT_ROW`), which a client's row deadline counts by.
    When one item fails (e.g. the run reached its call cap), no new item starts, the items in
    flight finish (and are journaled), then the first error is raised."""
    items = list(items)
    results: list[Any] = [None] * len(items)
    next_i = 0
    error: BaseException | None = None
    limit = max(limit, BATCHING.get())  # a batching client: every item's calls go to the batch at once

    async def worker():
        nonlocal next_i, error
        while next_i < len(items) and error is None:
            i = next_i
            next_i += 1
            token = CURRENT_ROW.set(row_of(items[i]))
            try:
                results[i] = await fn(items[i])
            except Exception as e:  # noqa: BLE001 - re-raised below, after the others finish
                error = error or e
                return
            finally:
                CURRENT_ROW.reset(token)
            if progress:
                progress.tick(ok(results[i]))

    await asyncio.gather(*(worker() for _ in range(max(1, min(limit, len(items))))))
    if error is not None:
        raise error
    return results
