"""Judging ahead: a pair's judge is asked while the SUT is still being sampled, as soon as both
of the pair's answers are in, so the judge's calls overlap the SUT's instead of following them.

The judging stage stays the place where verdicts are made and stored: it asks the judge the same
requests (the same code builds them, :meth:`Metric.pair_judge`), and the run's journal answers each
one the judge already answered here (a cache hit of this run: no second call, the same
``llm_calls`` row, with stage ``judging``). What is asked ahead is asked exactly as the judging
stage asks it, except that a judgement gets one request here (no re-ask of an unusable answer, no
retry of a failed call): whatever did not succeed is asked again by the judging stage, within its
own budget, so a judge's outage costs the sampling stage no backoff. A judge that refuses the run's
structured-output form stops judging ahead at once: moving to the next form is the judging stage's.

Off by default (the setting ``AIP_JUDGE_DURING_SAMPLING``): a request that failed ahead is asked
again by the judging stage within the judgement's whole budget (a judge failing during sampling gets
up to :data:`MAX_FAILURES` more requests in the run, and those in flight), and a judgement answered
from the journal records one attempt, not the retries and rate-limit waits its call took (they stay
on the call's ``llm_calls`` row). Charging the failed requests to their judgements' budgets is what
would let it be on by default.

Not done (the judging stage asks as before) when the setting is off,
when the run has a call or token cap (a judge call made early could take budget the SUT needed),
when a judge uses a provider's Batch API, or when the metric has no :meth:`Metric.pair_judge`. After
:data:`MAX_FAILURES` judgements ahead that did not succeed, no more are started."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from ..models.deadline import CURRENT_ROW
from .answers import answer_keys, pair_batch

if TYPE_CHECKING:
    from .base import Metric, StageContext

logger = logging.getLogger("aip_assets")

MAX_FAILURES = 3  # judgements ahead that did not succeed before no more are started


def judge_ahead(ctx: StageContext, plugin: Metric, limit: int) -> JudgeAhead | None:
    """A :class:`JudgeAhead` for this sampling stage (``sample_probes``' ``ahead``), or None when
    its pairs are not judged ahead (:func:`wanted`)."""
    return JudgeAhead(ctx, plugin, limit) if wanted(ctx, plugin) else None


def wanted(ctx: StageContext, plugin: Metric) -> bool:
    """Whether this sampling stage judges its pairs ahead (see the module)."""
    from ..settings import current

    spec = ctx.spec
    if spec is None or not current().judge_during_sampling or not plugin.judges_ahead:
        return False
    if spec.limits.max_calls or spec.limits.max_tokens:
        return False
    panel = [c for c in spec.panel() if c is not None]
    return bool(panel) and not any(c.batch.enabled for c in panel)


class JudgeAhead:
    """The pairs of the batches being sampled, judged as their answers come in (see the module).
    ``async with`` opens the judge's client (its calls journaled under stage ``judging``) and, at
    the end, waits for every judgement started, so none is in flight when the judging stage begins."""

    def __init__(self, ctx: StageContext, plugin: Metric, limit: int):
        # the judge's client reports no progress into the sampling stage's metadata, and its notes
        # (the structured-output form, a rate limit) are the judging stage's to make when it asks
        self.ctx = dataclasses.replace(ctx, observe=None, notes=[])
        self.plugin, self.limit = plugin, limit
        self.client: Any = None
        self.sem = asyncio.Semaphore(max(1, limit))
        self.tasks: set[asyncio.Task] = set()
        # an answer's (probe, sample index) -> the pairs waiting for it: (pair, its judge, its batch's answers)
        self.waiting: dict[tuple[str, int], list[tuple[dict, Callable[[dict], Awaitable[Any]], dict]]] = {}
        self.missing: dict[str, int] = {}
        self.started = self.succeeded = self.failures = 0

    async def __aenter__(self) -> JudgeAhead:
        self.client = self.ctx.client("judge", "judging", self.limit)
        for c in getattr(self.client, "clients", [self.client]):  # a panel's judges, or the judge
            c.on_refusal = self._refused
        await self.client.__aenter__()
        return self

    def _refused(self) -> None:
        """A judge refused the run's structured-output form: no more judgements ahead (the judging
        stage moves the run to the next form, and asks in it)."""
        self.failures = MAX_FAILURES

    async def __aexit__(self, *exc) -> None:
        try:
            if self.tasks:
                await asyncio.gather(*self.tasks, return_exceptions=True)
        finally:
            await self.client.__aexit__(*exc)
        if self.started:
            self.ctx.log(
                f"judged during sampling: {self.succeeded} of {self.started} pairs (the judging stage reads their "
                f"answers from the journal and asks again what did not succeed)"
            )

    def batch(self, ids: list[str]) -> None:
        """The pairs of a batch of rows about to be sampled: each waits for its two answers."""
        pairs, probes, _ = pair_batch(self.ctx, ids, answers=False)
        resp: dict[tuple[str, int], dict] = {}  # the batch's answers, filled as they come
        one = self.plugin.pair_judge(self.ctx, self.client, ids, pairs, probes, resp, retries=0)
        for pair in pairs:
            keys = set(answer_keys(pair))
            self.missing[pair["pair_id"]] = len(keys)
            for k in keys:
                self.waiting.setdefault(k, []).append((pair, one, resp))

    def answered(self, record: dict[str, Any]) -> None:
        """A ``sut_responses`` record: the pairs it completes are judged now."""
        key = (record["probe_id"], int(record["sample_index"]))
        for pair, one, resp in self.waiting.pop(key, ()):
            resp[key] = record
            self.missing[pair["pair_id"]] -= 1
            if self.missing[pair["pair_id"]] == 0 and self.failures < MAX_FAILURES:
                del self.missing[pair["pair_id"]]
                task = asyncio.ensure_future(self._judge(pair, one))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)

    async def _judge(self, pair: dict, one: Callable[[dict], Awaitable[Any]]) -> None:
        async with self.sem:
            if self.failures >= MAX_FAILURES:
                return
            self.started += 1
            token = CURRENT_ROW.set(pair["input_id"])
            try:
                out = await one(pair)
            except Exception as e:  # noqa: BLE001 - the judging stage asks again, and reports what fails
                logger.debug(f"judging ahead: pair {pair['pair_id']}: {e!r}")
                self.failures += 1
                return
            finally:
                CURRENT_ROW.reset(token)
        records = out if isinstance(out, list) else [out]
        if any(r.get("status") == "judge_failed" for r in records):
            self.failures += 1
        else:
            self.succeeded += 1
