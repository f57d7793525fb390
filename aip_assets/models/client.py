"""One async chat client for every role (SUT, judge, synthesis): cache -> provider -> journal.

A call (``ModelClient.chat``) is built (``request``: body and key), answered from the journal when
a successful call of this run (or of a run the spec reuses) had its key, else sent: through the
connection's Batch API (``batch``), or live, within the client's bounds (``concurrency``: calls in
flight; ``slots``: the endpoint's connections shared on this machine; ``deadline``: the row's
time; ``budget``: the run's caps), by its provider (``provider``), tried again as ``retry`` says.
Every call sent is recorded in the journal as it completes. The client also follows the
endpoint's health (found down after ``DOWN_AFTER_CALLS`` failed calls in a row), the
structured-output form it asks JSON in (``client_forms``; found by ``negotiate`` when none is
recorded), and writes the stage's run notes about all of these. The endpoint check before a run
is in ``endpoint_check``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import random
import time
from collections.abc import Callable
from typing import Any

from .. import interrupts
from ..connections import Connection
from ..errors import EndpointError
from ..hashing import wire_json
from . import retry, structured
from .batch import BATCHING, UNBOUNDED, BatchRunner
from .budget import Budget
from .builtin import STRUCTURED_PROBE
from .client_forms import Negotiation, StructuredForms
from .concurrency import AdaptiveLimit
from .deadline import RowClock, RowDeadlines
from .journal import Journal
from .journal_format import Marks, key_mark
from .provider import Provider
from .providers import provider_for
from .ratelimit import SharedRate
from .request import build_body, call_key
from .result import ChatResult
from .slots import REBALANCE_S, SharedSlots

logger = logging.getLogger("aip_assets")

# The endpoint is down once this many calls in a row failed after all their retries without any
# answer from it (no connection, a timeout, 502/503/504): from then on one call at a time is sent
# (with its retries) to see whether it is back, and the others fail at once without being sent,
# until an answer comes (ModelClient._live). Measured (benchmarks/bench_outage.py, 2 cores): a SUT
# refusing connections for a whole demo sampling stage, decision flip's 826 calls with 2 retries
# each, took 157 s without it and 5.8 s with it (16 calls sent); the demo's six SUT metrics 345 s
# and 39 s. A SUT that accepts and never answers costs (1 + retries) x timeout_seconds per round.
DOWN_AFTER_CALLS = 8
DOWN_STATUS = {502, 503, 504}  # answers that say the endpoint (or what is behind it) is down


class ModelClient(StructuredForms):
    """Use as ``async with ModelClient(...) as client: await client.chat(...)``.

    ``provider``: what answers the requests (``provider.Provider``); default: the connection's
    (``provider.provider_for``). The structured-output form it asks for JSON in: ``client_forms``."""

    def __init__(
        self,
        conn: Connection,
        *,
        role: str,
        run_id: str,
        metric: str,
        stage: str,
        journal: Journal | None,
        reuse_runs: list[str] | tuple[str, ...] = (),
        concurrency: int = 5,
        backoff_s: float = 0.5,
        budget: Budget | None = None,
        on_note: Callable[[dict[str, str]], None] | None = None,
        row_timeout_s: float | None = None,
        share_connections: bool = True,
        batchable: bool = True,
        on_progress: Callable[[dict[str, Any]], None] | None = None,
        on_wait: Callable[[str], None] | None = None,
        retry_after_uses_retries: bool = False,
        provider: Provider | None = None,
    ):
        self.conn = conn
        # told, before each wait of a call, why it waits and for how long (the endpoint check prints it)
        self.on_wait = on_wait
        # a 429/503's Retry-After is waited out as one of the call's retries, never as a free wait up
        # to max_rate_limit_wait_seconds (the endpoint check: its wait is bounded by the retry budget)
        self.retry_after_uses_retries = retry_after_uses_retries
        self.row_timeout_s = row_timeout_s  # None: no row deadline
        self.on_note = on_note  # run notes (e.g. structured output refused) go to the stage's run_notes
        self.on_progress = on_progress  # a provider batch's status while it is polled (Dagster: an observation)
        self.role = role
        self.run_id = run_id
        self.metric = metric
        self.stage = stage
        self.journal = journal
        self.cache_runs = [run_id, *reuse_runs]
        concurrency = min(concurrency, conn.max_connections)
        self.sem = AdaptiveLimit(concurrency, conn.adaptive_concurrency)
        # the endpoint's max_connections, shared with every client on this machine (slots.py):
        # taken at the first call sent, so a run answered from the cache takes none
        self.slots: SharedSlots | None = None
        self._slots_lock: asyncio.Lock | None = None  # made in the running loop
        self._slots_held = not share_connections  # True once the first acquisition is done
        self._rebalancer: asyncio.Task | None = None
        self._closing: asyncio.Event  # made with the rebalancer, in the running loop
        self._want = concurrency
        self.backoff_s = backoff_s
        self.budget = budget
        # the endpoint's request and token rates, shared with every process on this machine
        self.limiter = (
            SharedRate.for_endpoint(conn.endpoint_id(), conn.requests_per_minute, conn.tokens_per_minute)
            if conn.requests_per_minute or conn.tokens_per_minute
            else None
        )
        # what answers the requests (provider.py: the connection's, unless one is given), opened on __aenter__
        self.provider = provider if provider is not None else provider_for(conn)
        self.caps = self.provider.capabilities
        self.endpoint_id = conn.endpoint_id()
        # keys of successful calls this run may answer from the journal (kept current as calls
        # succeed), so a call with nothing to reuse costs no SQL lookup
        self._known_ok: Marks | set[int] = journal.ok_marks(self.cache_runs, stage) if journal is not None else set()
        self.stats = {
            "network_calls": 0,
            "cached": 0,
            "failed": 0,
            "in_flight": 0,
            "deadline_cut": 0,
            "deadline_rows": 0,
            "not_sent_down": 0,
        }
        self.deadlines = RowDeadlines(row_timeout_s, stage, self.stats)  # each row's clock (deadline.py)
        # the endpoint's health as this client's calls find it (``_health``): calls in a row that
        # failed after their retries with no answer from it, when it was found down (None: up), the
        # last such failure, whether a call is in flight to see if it is back, and the outages seen
        self._down_streak = 0
        self._down_since: float | None = None
        self._down_last = ""
        self._probing = False
        # until the first call sent to see whether it is back has failed too, the endpoint is only
        # suspected down: the calls meanwhile wait for that call's end (an outage of a few seconds
        # costs them nothing); once it failed (confirmed), they fail at once
        self._confirmed = False
        self._probe_done: asyncio.Event | None = None
        self._outages: list[tuple[float, float | None]] = []  # (found down, back or None), monotonic
        self._last_answer = time.monotonic()  # the endpoint's last answer (rate-limit waits end after a silent window)
        self._rng = random.Random()
        # the provider's Batch API (batch.enabled), for a stage's calls; never for one call such as the endpoint check
        self.batcher: BatchRunner | None = BatchRunner(self) if self.caps.batch and batchable else None
        self._batching: contextvars.Token | None = None
        # requests being sent, by key: the same request asked again meanwhile waits for its answer
        # (journaled, then read as the cache's) instead of being sent twice
        self._sending: dict[str, asyncio.Event] = {}
        self._form = None  # the structured-output form, once known (structured_form)
        self._form_lock = None

    async def __aenter__(self) -> ModelClient:
        self.provider.open()
        if self.batcher is not None:  # this task's work items all at once: the stage's calls make one batch
            self._batching = BATCHING.set(UNBOUNDED)
        return self

    async def __aexit__(self, *exc) -> None:
        if self._batching is not None:
            BATCHING.reset(self._batching)
            self._batching = None
        if self.batcher is not None:
            await self.batcher.aclose()
            b = self.batcher.stats
            if (b["batches"] or b["resumed"]) and self.on_note:  # what the Batch API did, in the run's notes
                self.on_note(
                    {
                        "level": "info",
                        "code": "batch",
                        "message": (
                            f"{self.metric} {self.stage}: {self.role} calls through the Batch API: {b['batches']} batch(es) "
                            f"sent ({b['requests']} requests), {b['resumed']} resumed; {b['ok']} answered, {b['live']} sent "
                            f"live after the batch failed or expired, {b['failed']} recorded as failed"
                        ),
                    }
                )
        try:
            await self.provider.aclose()
        finally:
            if self._rebalancer is not None:
                self._closing.set()
                self._rebalancer.cancel()
            if self.slots is not None:
                self.slots.close()
        if self.sem.cuts:
            msg = (
                f"{self.metric} {self.stage}: {self.role} endpoint {self.endpoint_id} answered with rate limits; "
                f"calls in flight were lowered {self.sem.cuts} time(s) from {self.sem.ceiling} to as few as "
                f"{self.sem.lowest} and were {self.sem.limit} at the end (adaptive_concurrency)"
            )
            logger.warning(msg)
            if self.on_note:
                self.on_note({"level": "warning", "code": "adaptive_concurrency", "message": msg})
        if self._outages and self.on_note:
            back = sum(1 for _, end in self._outages if end is not None)
            msg = (
                f"{self.metric} {self.stage}: {self.role} endpoint {self.endpoint_id} was down "
                f"{len(self._outages)} time(s) ({DOWN_AFTER_CALLS} calls in a row failed after their retries, the "
                f"last: {self._down_last}); {self.stats['not_sent_down']} call(s) were not sent while it was down "
                f"and are recorded as failed on their rows; "
                + (f"it answered again {back} time(s)" if back else "it did not answer again")
                + (", and was still down at the end of the stage" if self._down_since is not None and back else "")
            )
            logger.warning(msg)
            self.on_note({"level": "warning", "code": "endpoint_down", "message": msg})
        if self.stats["deadline_cut"] and self.on_note:
            msg = (
                f"{self.metric} {self.stage}: {self.stats['deadline_rows']} row(s) passed the {self.row_timeout_s:g}s "
                f"row deadline (the execution manifest's timeout_seconds, or limits.row_timeout_seconds); "
                f"{self.stats['deadline_cut']} {self.role} call(s) were cut or not sent, and each is an error on its "
                f"row (excluded and counted, never scored)"
            )
            logger.warning(msg)
            self.on_note({"level": "warning", "code": "row_deadline", "message": msg})

    def _from_record(self, rec: dict[str, Any], key: str) -> ChatResult:
        return ChatResult(
            rec["response_text"],
            "ok",
            None,
            rec["latency_ms"],
            rec["prompt_tokens"],
            rec["completion_tokens"],
            rec["response_model"],
            rec["fingerprint"],
            rec["attempts"],
            key,
            cached=True,
            http_status=rec["http_status"],
        )

    async def chat(
        self,
        messages: list[dict[str, str]],
        *,
        temperature: float,
        sample_index: int = 0,
        retries: int = 0,
        timeout: float = 60.0,
        template_version: str = "",
        max_tokens: int | None = None,
        attempt: int = 0,
        response_format: dict[str, Any] | None = None,
    ) -> ChatResult:
        """One answer. ``retries`` caps the failed requests retried for it (transient errors);
        a 429/503 with ``Retry-After`` is waited out without using it, up to the connection's
        ``max_rate_limit_wait_seconds`` in total. ``attempt`` > 0 marks a re-ask (its own key)."""
        interrupts.check()  # after a Ctrl-C no call starts (not even one the journal would answer)
        body = build_body(self.conn, messages, temperature, max_tokens, sample_index)
        if response_format is not None:
            body["response_format"] = response_format
        # the request sent and journaled keeps the body's own key order (a schema's properties as
        # declared: reasoning first); the key is made of its canonical, sorted form (cache and resume)
        body_json = wire_json(body)
        key = call_key(self.endpoint_id, body, sample_index, template_version, attempt)
        if self.journal is not None and (hit := await self._cached(key, body, sample_index)) is not None:
            return hit
        if self.batcher is not None:  # the provider's Batch API (models/batch.py)
            return await self.batcher.call(key, body, body_json, sample_index, retries, timeout)
        if self.journal is None:  # no cache to answer a repeated request from
            return await self._live(body, key, sample_index, retries, timeout, body_json)
        while (same := self._sending.get(key)) is not None:  # the same request in flight: its answer is this one's
            await same.wait()
            if (hit := await self._cached(key, body, sample_index)) is not None:
                return hit
            interrupts.check()  # the one sent failed: this one is sent, unless a Ctrl-C came meanwhile
        done = self._sending[key] = asyncio.Event()
        try:
            return await self._live(body, key, sample_index, retries, timeout, body_json)
        finally:
            del self._sending[key]
            done.set()

    async def _cached(self, key: str, body: dict[str, Any], sample_index: int) -> ChatResult | None:
        """The journal's answer to this call (this run's, or a reused run's), or None."""
        assert self.journal is not None
        if key_mark(key) not in self._known_ok:
            return None
        if self.journal.REMOTE:  # a round trip to the database: not on the event loop
            rec = await asyncio.to_thread(self.journal.lookup, key, self.cache_runs)
        else:
            rec = self.journal.lookup(key, self.cache_runs)
        if rec is None:
            return None
        self.stats["cached"] += 1
        if rec["run_id"] != self.run_id:  # reused from an earlier run: record it in this run
            self._record(key, body, sample_index, self._from_record(rec, key), source=f"reused:{rec['run_id']}")
        return self._from_record(rec, key)

    async def _live(
        self,
        body: dict[str, Any],
        key: str,
        sample_index: int,
        retries: int,
        timeout: float,
        body_json: str,
        counted: bool = False,
    ) -> ChatResult:
        """A call the cache does not answer, sent now (as ``chat`` says), journaled as it ends.
        ``counted``: the budget has it already (a batch's request sent again live)."""
        clock = self.deadlines.clock()
        text = body_json if self.caps.sends_text else None
        if not self._slots_held and self.caps.shares_connections:
            await self._share_connections()
        async with self.sem:
            if clock is not None and clock.left() <= 0:  # not sent: not a model call, not journaled
                return ChatResult(
                    None,
                    "error",
                    self.deadlines.error("before this call was sent"),
                    None,
                    None,
                    None,
                    None,
                    None,
                    0,
                    key,
                )
            probe = False
            if self._down_since is not None and self.caps.may_be_down:
                if self._probing and not self._confirmed and self._probe_done is not None:
                    await self._probe_done.wait()  # only suspected down: this call follows what that one finds
                if self._down_since is not None:
                    if self._probing:  # down, and a call is finding out whether it is back
                        self.stats["not_sent_down"] += 1
                        return ChatResult(
                            None, "error", self._down_error(), None, None, None, None, None, 0, key, transient=True
                        )
                    self._probing = probe = True  # this call finds out (sent as any call, with its retries)
                    self._probe_done = asyncio.Event()
            self.stats["in_flight"] += 1
            if clock is not None:
                clock.start()
            try:
                result = await self._call(body, key, retries, timeout, clock, text, counted)
            except BaseException:
                if probe:  # the calls waiting for it go on (one of them finds out next)
                    self._probing = False
                    self._probe_done.set()  # type: ignore[union-attr]
                raise
            finally:
                self.stats["in_flight"] -= 1
                if clock is not None:
                    clock.stop()
            self._health(result)
            if probe:
                self._probing = False
                self._confirmed = self._down_since is not None and result.attempts > 0  # still down after its retries
                self._probe_done.set()  # type: ignore[union-attr]
            if self.budget is not None:
                self.budget.spend((result.prompt_tokens or 0) + (result.completion_tokens or 0))
        if result.attempts == 0:  # never sent (the row deadline came first): no model call, not journaled
            return result
        self.stats["network_calls"] += 1
        if not result.ok:
            self.stats["failed"] += 1
        self._record(key, body if text is None else text, sample_index, result, source="network")
        if result.ok:
            self._known_ok.add(key_mark(key))
        return result

    async def _call(
        self,
        body: dict[str, Any],
        key: str,
        retries: int,
        timeout: float,
        clock: RowClock | None = None,
        text: str | None = None,
        counted: bool = False,
    ) -> ChatResult:
        """One call sent by the provider, tried again as ``retry.send`` says."""
        return await retry.send(self, body, key, retries, timeout, clock, text, counted)

    def _health(self, r: ChatResult) -> None:
        """Follow the endpoint's health from a call sent: any answer (a success, a 4xx, a 500) says it
        is up; a call that failed after all its retries without one (no connection, a timeout,
        502/503/504) counts towards ``DOWN_AFTER_CALLS`` in a row, which find it down."""
        if r.attempts == 0:
            return
        if r.ok or (r.http_status is not None and r.http_status not in DOWN_STATUS):
            self._down_streak = 0
            if self._down_since is not None:
                self._outages[-1] = (self._down_since, time.monotonic())
                self._down_since = None
                self._confirmed = False
                logger.warning(f"{self.metric} {self.stage}: {self._where()} answers again; its calls are sent again")
            return
        if not r.transient or (r.http_status is not None and r.http_status not in DOWN_STATUS):
            return  # not a sign of an outage (a row deadline, a refused form): neither up nor down
        self._down_streak += 1
        self._down_last = r.error or ""
        if self._down_since is None and self._down_streak >= DOWN_AFTER_CALLS:
            self._down_since = time.monotonic()
            self._confirmed = False
            self._outages.append((self._down_since, None))
            logger.warning(
                f"{self.metric} {self.stage}: {self._where()} is down: {self._down_streak} calls in a row "
                f"failed after their retries (the last: {self._down_last}); until it answers, one call at "
                "a time is sent to see whether it is back; the others wait for the first such call, then, "
                "if it failed too, fail at once, recorded as failed on their rows"
            )

    def _down_error(self) -> str:
        return (
            f"not sent: the {self.role} endpoint {self.endpoint_id} is down ({DOWN_AFTER_CALLS} or more calls in "
            f"a row failed after their retries, the last: {self._down_last}); one call at a time is sent to see "
            "whether it is back, the others fail at once (a resumed run sends them)"
        )

    async def _share_connections(self) -> None:
        """Take this client's part of the endpoint's max_connections at its first call sent
        (waiting for a slot when the machine's other clients hold them all; calls that come
        meanwhile wait for this one), then look again every REBALANCE_S in the background."""
        if self._slots_lock is None:
            self._slots_lock = asyncio.Lock()
        async with self._slots_lock:
            if self._slots_held:
                return
            slots = self.slots = self.slots or SharedSlots(self.endpoint_id, self.conn.max_connections, self._want)
            try:
                await self.sem.set_cap(await slots.acquire())
            except BaseException:  # cancelled while waiting: the next call starts again
                slots.close()
                self.slots = None
                raise
            self._slots_held = True
            self._closing = asyncio.Event()
            self._rebalancer = asyncio.create_task(self._rebalance(slots))

    async def _rebalance(self, slots: SharedSlots) -> None:
        """Give back or take slots as the other clients need (slots.py); a slot still covering a
        call in flight is kept until the call ends."""
        while not slots.closed:
            try:  # a timed wait, not asyncio.sleep: the backoff and rate-limit sleeps stay the calls' own
                await asyncio.wait_for(self._closing.wait(), REBALANCE_S)
                return
            except TimeoutError:
                pass
            await self.sem.set_cap(slots.look(in_flight=self.sem.in_flight))

    def _record(self, key: str, body: dict | str, sample_index: int, r: ChatResult, source: str) -> None:
        """``body``: the request, or its JSON as sent (``wire_json``)."""
        if self.journal is None:
            return
        self.journal.record(
            {
                "run_id": self.run_id,
                "metric": self.metric,
                "stage": self.stage,
                "role": self.role,
                "call_key": key,
                "sample_index": sample_index,
                "endpoint": self.endpoint_id,
                "model": self.conn.model,
                "request": body,
                "response_text": r.text,
                "status": r.status,
                "error": r.error,
                "http_status": r.http_status,
                "latency_ms": r.latency_ms,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "attempts": r.attempts,
                "response_model": r.model,
                "fingerprint": r.fingerprint,
                "source": source,
                "created_at": time.time(),
            }
        )

    async def _negotiate(self) -> Negotiation:
        return await negotiate(self.conn, self.role)


async def negotiate(
    conn: Connection, role: str, timeout: float = 30.0, forms: tuple[str, ...] = structured.FORMS
) -> Negotiation:
    """Find the first structured-output form (``structured.FORMS``) the endpoint takes and answers
    in: one small request per form, asking for ``{"ok": true}`` with a schema, until the answer is
    that object. A form is passed over when the endpoint refuses it (any HTTP error; a refusal is
    never retried), fails after one retry, or answers without the object (it ignored the form, or
    the model cannot keep to it). ``prompt`` needs nothing of the endpoint: when no form gets the
    object, prompting is what is left (``answered`` false). Probes are not journaled and use no
    run budget, like the endpoint check."""
    client = ModelClient(
        conn,
        role=role,
        run_id="preflight",
        metric="",
        stage="preflight",
        journal=None,
        backoff_s=0.2,
        share_connections=False,
        batchable=False,
    )
    where = f"{role} endpoint {conn.base_url} (model {conn.model})"
    tried: list[tuple[str, str]] = []
    requests = 0
    r: ChatResult | None = None
    try:
        async with client:
            for form in forms:
                r = await client.chat(
                    [{"role": "user", "content": STRUCTURED_PROBE}],
                    temperature=0.0,
                    retries=1,
                    timeout=timeout,
                    max_tokens=None if conn.max_tokens else 64,
                    response_format=structured.payload(form, "probe", structured.PROBE_SCHEMA),
                )
                requests += r.attempts
                if r.ok and structured.probe_answer_ok(r.text):
                    return Negotiation(form, tried, requests)
                if r.http_status in (401, 403):
                    break
                why = (
                    f"refused ({r.error})"
                    if r.structured_refused
                    else f"failed ({r.error})"
                    if not r.ok
                    else f"answered without the JSON object asked for ({(r.text or '').strip()[:80]!r})"
                )
                tried.append((form, why))
    except EndpointError as e:
        raise EndpointError(f"{where}: {e}") from None
    if r is not None and r.http_status in (401, 403):
        raise EndpointError(f"{where}: unauthorised (HTTP {r.http_status}); check api_key_env / header_env")
    return Negotiation("prompt", tried, requests, answered=False)
