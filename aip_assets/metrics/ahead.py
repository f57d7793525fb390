"""Judging ahead: a pair's judge is asked while the SUT is still being sampled, as soon as both
of the pair's answers are in, so the judge's calls overlap the SUT's instead of following them.

A pair judged ahead is judged whole, exactly as the judging stage judges it: the same code
(:meth:`Metric.pair_judge`), the same requests, the judgement's whole budget (``judge_retries``:
retries, re-asks, 429 waits). Its judgement is kept in this process (:func:`take`) and the judging
stage, in the same process, takes it as its own instead of asking again: the same records, attempts
and budget as if it had asked. A judgement the stage does not find kept (another process judges:
a worker that took the partition over) is asked by the stage, and the run's journal answers the
requests that succeeded (an answer from the cache counts one attempt, as on a resume). The calls
are the judging stage's in the journal and in ``llm_calls``.

A judge that refuses the run's structured-output form stops judging ahead at once and that
judgement is not kept: moving to the next form is the judging stage's. After :data:`MAX_FAILURES`
judgements ahead that failed, no more are started (those that failed are kept: the judge failed
within their budget, as it would have in the judging stage); the stage judges the rest.

The judging stage's endpoint check of each judge is made here, before the first judgement ahead
(beside the SUT's first calls), so that every judge call is still preceded by a check in its process.
When every judge answered it and judging ahead ran to the end, the judging stage does not check them
again (:func:`checked`); otherwise it checks, and says what it finds.

On unless ``AIP_JUDGE_DURING_SAMPLING`` is 0. Not done with a call or token cap (a judge
call made early could take budget the SUT needed), for a judge on a provider's Batch API, in shared
mode (another worker may judge), above :data:`MAX_KEPT` pairs in the partition (their judgements
are held in memory until the judging stage), or for a metric without :meth:`Metric.pair_judge`."""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..handover import Handover
from ..models.deadline import CURRENT_ROW
from ..models.endpoint_check import check_endpoint
from . import check_policy
from .answers import answer_keys, pair_batch
from .base import Metric
from .judging import panel_role
from .running import run_bounded

if TYPE_CHECKING:
    from .base import StageContext

logger = logging.getLogger("aip_assets")

MAX_FAILURES = 3  # judgements ahead that failed before no more are started
MAX_KEPT = 20_000  # pairs of a partition whose judgements may be kept for the judging stage

# judgements made ahead, by (run, metric), then pair id: the judging stage takes them (``take``)
_KEPT = Handover()
# the judges (their llm_calls roles) checked during sampling, by (run, metric): the judging stage takes them (``checked``)
_CHECKED = Handover()
_PAIR: contextvars.ContextVar[str | None] = contextvars.ContextVar("aip_ahead_pair", default=None)


def take(ctx: StageContext) -> dict[str, Any]:
    """The judgements made ahead for this partition, by pair id, handed over once (the judging stage)."""
    return _KEPT.take((ctx.run_id, ctx.metric), {})


def checked(ctx: StageContext) -> set[str]:
    """The judges (``panel_role``) whose endpoint check this partition's judging ahead made, in this
    process, and which answered, with judging ahead run to its end; handed over once (the judging
    stage, which checks the others)."""
    return _CHECKED.take((ctx.run_id, ctx.metric), set())


def seen(pair: dict, resp: dict[tuple[str, int], dict]) -> tuple:
    """What a pair's judgement was made of: its answers' statuses and texts."""
    return tuple(
        (r.get("status"), r.get("response")) if (r := resp.get(k)) is not None else None for k in answer_keys(pair)
    )


def kept_first(
    kept: dict[str, Any], one: Callable[[dict], Awaitable[Any]], resp: dict[tuple[str, int], dict]
) -> Callable[[dict], Awaitable[Any]]:
    """The judging stage's work item: a pair's judgement made ahead (``take``) when it was made of
    the answers the stage reads (``resp``), else ``one(pair)``."""
    if not kept:
        return one

    async def judged(pair: dict) -> Any:
        got = kept.pop(pair["pair_id"], None)
        if got is not None and got[0] == seen(pair, resp):
            return got[1]
        return await one(pair)

    return judged


async def judge_pairs(
    ctx: StageContext, plugin: Metric, title: str, limit: int, outcome: Callable[[Any], Any]
) -> AsyncIterator[list[Any]]:
    """The judging stage of a metric that judges pairs (:meth:`Metric.pair_judge`): each batch's
    pairs judged, ``limit`` at a time, a judgement made during sampling taken where it was made of
    the same answers (:func:`kept_first`); yields each batch's results in its pairs' order.
    ``title``: the progress line's; ``outcome``: a result's outcome for it (``run_bounded``)."""
    progress = ctx.progress(title, ctx.count("probe_pairs"))
    kept = take(ctx)
    async with ctx.client("judge", "judging", limit) as client:
        progress.in_flight = lambda: client.stats["in_flight"]
        for ids in ctx.batches():
            pairs, probes, resp = pair_batch(ctx, ids)
            one = plugin.pair_judge(ctx, client, ids, pairs, probes, resp, ctx.spec.judge_retries)
            yield await run_bounded(pairs, kept_first(kept, one, resp), limit, progress, outcome)


def judge_ahead(ctx: StageContext, plugin: Metric, limit: int) -> JudgeAhead | None:
    """A :class:`JudgeAhead` for this sampling stage (``sample_probes``' ``ahead``), or None when
    its pairs are not judged ahead (:func:`wanted`)."""
    return JudgeAhead(ctx, plugin, limit) if wanted(ctx, plugin) else None


def wanted(ctx: StageContext, plugin: Metric) -> bool:
    """Whether this sampling stage judges its pairs ahead (see the module)."""
    from ..settings import current

    spec = ctx.spec
    if spec is None or not current().judge_during_sampling or type(plugin).pair_judge is Metric.pair_judge:
        return False
    if spec.limits.max_calls or spec.limits.max_tokens:
        return False
    from ..shared_state import shared_state_url

    if shared_state_url() is not None or ctx.count("probe_pairs") > MAX_KEPT:
        return False
    panel = [c for c in spec.panel() if c is not None]
    return bool(panel) and not any(c.batch.enabled for c in panel)


class JudgeAhead:
    """The pairs of the batches being sampled, judged as their answers come in (see the module).
    ``async with`` opens the judge's client (its calls journaled under stage ``judging``) and, at
    the end, waits for every judgement started, so none is in flight when the judging stage begins."""

    def __init__(self, ctx: StageContext, plugin: Metric, limit: int):
        # the judge's client reports no progress into the sampling stage's metadata; its notes (the
        # structured-output form, a rate limit, an outage) are the sampling stage's run notes
        self.ctx = dataclasses.replace(ctx, observe=None)
        self.plugin, self.limit = plugin, limit
        self.client: Any = None
        self.sem = asyncio.Semaphore(max(1, limit))
        self.tasks: set[asyncio.Task] = set()
        # an answer's (probe, sample index) -> the pairs waiting for it: (pair, its judge, its batch's answers)
        self.waiting: dict[tuple[str, int], list[tuple[dict, Callable[[dict], Awaitable[Any]], dict]]] = {}
        self.missing: dict[str, int] = {}
        self.started = self.failures = 0
        self.refused: set[str] = set()  # pairs whose judge refused the form: left to the judging stage
        self.kept: dict[str, Any] = {}  # a new sampling: what an earlier one judged is stale
        _KEPT.put((ctx.run_id, ctx.metric), self.kept)
        _CHECKED.take((ctx.run_id, ctx.metric))  # and so are the checks it made
        self.check: asyncio.Future[bool] | None = None  # the judges' endpoint checks (``_check``)
        self.passed: set[str] = set()

    async def __aenter__(self) -> JudgeAhead:
        self.client = self.ctx.client("judge", "judging", self.limit)
        for c in getattr(self.client, "clients", [self.client]):  # a panel's judges, or the judge
            c.on_refusal = self._refused
        await self.client.__aenter__()
        self.check = asyncio.ensure_future(self._check())
        return self

    async def _check(self) -> bool:
        """The judging stage's endpoint check of each judge (``check_endpoint``, retried as the
        stage's, its waits logged at debug level): True when every judge answered. Else judging
        ahead stops, and the judging stage checks them itself and says what it finds."""
        spec = self.ctx.spec
        judges = [(panel_role(i), conn) for i, conn in enumerate(spec.panel()) if conn is not None]
        got = await asyncio.gather(
            *(
                check_endpoint(conn, role, log=logger.debug, **check_policy(spec, role, [self.ctx.metric]))
                for role, conn in judges
            ),
            return_exceptions=True,
        )
        if failed := [g for g in got if isinstance(g, BaseException)]:
            self._stop(f"the judge's endpoint check: {failed[0]}")
            return False
        self.passed = {role for role, _ in judges}
        return True

    def _refused(self) -> None:
        """A judge refused the run's structured-output form: no more judgements ahead, and the
        refused one is not kept (the judging stage moves the run to the next form, and asks in it)."""
        self.failures = MAX_FAILURES
        if (pair := _PAIR.get()) is not None:
            self.refused.add(pair)

    async def __aexit__(self, *exc) -> None:
        try:
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            check = self.check
            if check is not None and not check.done():  # still waiting on a judge: the judging stage checks it
                check.cancel()
                await asyncio.gather(check, return_exceptions=True)
            await self.client.__aexit__(*exc)
            if exc and exc[0] is not None:  # the sampling failed: nothing kept for a judging stage
                _KEPT.take((self.ctx.run_id, self.ctx.metric))
            elif self.passed and self.failures < MAX_FAILURES:  # the judges answered throughout
                _CHECKED.put((self.ctx.run_id, self.ctx.metric), self.passed)
        if self.started:
            self.ctx.log(
                f"judged during sampling: {len(self.kept)} of {self.ctx.count('probe_pairs')} pairs "
                f"({self.failures} failed; the judging stage takes them, and judges the others)"
            )

    def batch(self, ids: list[str]) -> None:
        """The pairs of a batch of rows about to be sampled: each waits for its two answers. An
        error here stops judging ahead, never the sampling (the judging stage judges them)."""
        try:
            self._batch(ids)
        except Exception as e:  # noqa: BLE001 - an optimisation only: the judging stage judges every pair
            self._stop(f"reading the batch's pairs: {e!r}")

    def _stop(self, why: str) -> None:
        logger.debug(f"judging ahead stopped [{self.ctx.run_id} × {self.ctx.metric}]: {why}")
        self.failures = MAX_FAILURES
        self.waiting.clear()

    def _batch(self, ids: list[str]) -> None:
        pairs, probes, _ = pair_batch(self.ctx, ids, answers=False)
        resp: dict[tuple[str, int], dict] = {}  # the batch's answers, filled as they come
        one = self.plugin.pair_judge(self.ctx, self.client, ids, pairs, probes, resp, self.ctx.spec.judge_retries)
        for pair in pairs:
            keys = set(answer_keys(pair))
            self.missing[pair["pair_id"]] = len(keys)
            for k in keys:
                self.waiting.setdefault(k, []).append((pair, one, resp))

    def answered(self, record: dict[str, Any]) -> None:
        """A ``sut_responses`` record: the pairs it completes are judged now (never an error: see ``batch``)."""
        try:
            self._answered(record)
        except Exception as e:  # noqa: BLE001 - an optimisation only
            self._stop(f"an answer of probe {record.get('probe_id')!r}: {e!r}")

    def _answered(self, record: dict[str, Any]) -> None:
        key = (record["probe_id"], int(record["sample_index"]))
        for pair, one, resp in self.waiting.pop(key, ()):
            resp[key] = record
            self.missing[pair["pair_id"]] -= 1
            if self.missing[pair["pair_id"]] == 0 and self.failures < MAX_FAILURES:
                del self.missing[pair["pair_id"]]
                task = asyncio.ensure_future(self._judge(pair, one, resp))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _judge(self, pair: dict, one: Callable[[dict], Awaitable[Any]], resp: dict) -> None:
        if self.check is None or not await self.check:  # no judge call before the judges' endpoint check
            return
        async with self.sem:
            if self.failures >= MAX_FAILURES:
                return
            self.started += 1
            token, mark = CURRENT_ROW.set(pair["input_id"]), _PAIR.set(pair["pair_id"])
            try:
                out = await one(pair)
            except Exception as e:  # noqa: BLE001 - not kept: the judging stage judges it, and reports what fails
                logger.debug(f"judging ahead: pair {pair['pair_id']}: {e!r}")
                self.failures += 1
                return
            finally:
                CURRENT_ROW.reset(token)
                _PAIR.reset(mark)
        if pair["pair_id"] in self.refused:
            return
        records = out if isinstance(out, list) else [out]
        if any(r.get("status") == "judge_failed" for r in records):
            self.failures += 1
        self.kept[pair["pair_id"]] = (seen(pair, resp), out)
