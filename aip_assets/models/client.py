"""One async chat client for every role (SUT, judge, synthesis).

- bounded concurrency (a semaphore per client, sized by the metric's concurrency limit);
- a per-call timeout; transient failures (timeouts, connection errors, 408, 429, 5xx) retried
  with exponential backoff and jitter, honouring ``Retry-After``; other 4xx are not retried;
- every call recorded in the journal as it completes (role, latency, tokens, attempts);
- successful calls cached by request + sample index within the run (and in runs the spec
  explicitly reuses), so a resumed stage does not pay twice and N samples stay N samples;
- a row deadline: the calls one dataset row makes in one stage may be in flight for
  ``row_timeout_s`` seconds in all (the execution manifest's ``timeout_seconds``): the row's clock
  runs while at least one of its calls is sent, retried or waiting out a Retry-After, not while
  it waits for a free slot behind other rows. A call it would outlast is cut at the deadline,
  and none is sent or retried after it (see :data:`CURRENT_ROW`).
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import functools
import hashlib
import logging
import random
import re
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
import httpx
from aiohttp import http_exceptions

from .. import interrupts
from ..errors import AipError, EndpointDown, EndpointError, LimitReached
from ..hashing import stable_json
from ..runspec import Connection
from . import structured
from .builtin import ENDPOINT_CHECK, STRUCTURED_PROBE
from .batch import BATCHING, UNBOUNDED, BatchRunner
from .journal import Journal, Marks, key_mark
from .openai_compatible import make_transport, scrub_secrets
from .ratelimit import SharedRate, counted_tokens, estimate_tokens, prompt_tokens_estimate
from .shared_state import SharedDb, shared_state_url
from .slots import REBALANCE_S, SharedSlots

TRANSIENT_STATUS = {408, 409, 425, 429}
logger = logging.getLogger("aip_assets")

# the dataset row a call is made for (set per work item by ``metrics.base.run_bounded``); a
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


class BudgetExhausted(LimitReached):
    """The run reached its limits.max_calls / max_tokens: the stage stops, nothing is written."""


class Budget:
    """A run's caps on network calls and tokens, counted from the journal (so across stages and
    resumed runs) and reserved before each call."""

    def __init__(self, run_id: str, journal: Journal | None, max_calls: int | None, max_tokens: int | None):
        self.max_calls, self.max_tokens = max_calls, max_tokens
        self.calls, self.tokens = journal.totals(run_id) if journal is not None and (max_calls or max_tokens) else (0, 0)

    def reserve(self) -> None:
        if self.max_calls is not None and self.calls >= self.max_calls:
            raise BudgetExhausted(f"the run reached limits.max_calls = {self.max_calls}; the calls made so far are "
                                  "kept: raise the limit (aip-eval run SPEC --run-id RUN --max-calls N) to resume")
        if self.max_tokens is not None and self.tokens >= self.max_tokens:
            raise BudgetExhausted(f"the run reached limits.max_tokens = {self.max_tokens} ({self.tokens} spent); "
                                  "raise the limit (aip-eval run SPEC --run-id RUN --max-tokens N) to resume")
        self.calls += 1

    async def areserve(self) -> None:
        self.reserve()

    def spend(self, tokens: int) -> None:
        self.tokens += tokens

    @staticmethod
    def for_run(run_id: str, journal: Journal | None, max_calls: int | None, max_tokens: int | None) -> "Budget":
        """The run's budget: in Postgres when ``AIP_SHARED_STATE_URL`` names one (every worker of
        the run draws from it), else counted in this process from the journal."""
        url = shared_state_url()
        if url:
            return PgBudget(run_id, journal, max_calls, max_tokens, url)
        return Budget(run_id, journal, max_calls, max_tokens)


class PgBudget(Budget):
    """A run's budget shared by its workers (issue 14's shared mode): one row per run id in
    Postgres, a call reserved by one atomic ``UPDATE … WHERE calls < max_calls RETURNING``, so the
    workers together never send more than ``max_calls``. The row starts from the journal's totals
    of the first worker to open it (the local journal without a lake, the lake's with one, where
    ``aip-eval migrate`` copies a run's calls), and it stays: a later resume of
    the same run id, on any worker, goes on from it. Statements
    run on the database's own thread (``SharedDb``); ``spend`` is queued without waiting."""

    SHARED = True  # its count lives in Postgres: a resumed batch's calls are in it already

    def __init__(self, run_id: str, journal: Journal | None, max_calls: int | None, max_tokens: int | None,
                 url: str):
        self.run_id, self.max_calls, self.max_tokens = run_id, max_calls, max_tokens
        self.db = SharedDb.get(url)
        self._seed = journal.totals(run_id) if journal is not None else (0, 0)
        self.calls, self.tokens = self.db.run(f"the budget of run {run_id}", self._row)

    def _row(self, conn) -> tuple[int, int]:
        """The run's row, made from this worker's journal totals if there is none yet."""
        conn.execute("INSERT INTO aip_run_budget (run_id, calls, tokens) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING",
                     [self.run_id, *self._seed])
        return conn.execute("SELECT calls, tokens FROM aip_run_budget WHERE run_id = %s", [self.run_id]).fetchone()

    def _take(self, conn) -> tuple[int, int] | None:
        return conn.execute(
            "UPDATE aip_run_budget SET calls = calls + 1 WHERE run_id = %s AND (%s::bigint IS NULL OR calls < %s) "
            "AND (%s::bigint IS NULL OR tokens < %s) RETURNING calls, tokens",
            [self.run_id, self.max_calls, self.max_calls, self.max_tokens, self.max_tokens]).fetchone()

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
            self.db.queue(self.db.run, f"the budget of run {self.run_id}", lambda conn: conn.execute(
                "UPDATE aip_run_budget SET tokens = tokens + %s WHERE run_id = %s", [tokens, self.run_id]))


MAX_BACKOFF_S = 60.0
# The endpoint is down once this many calls in a row failed after all their retries without any
# answer from it (no connection, a timeout, 502/503/504): from then on one call at a time is sent
# (with its retries) to see whether it is back, and the others fail at once without being sent,
# until an answer comes (ModelClient._live). Measured (benchmarks/bench_outage.py, 2 cores): a SUT
# refusing connections for a whole demo sampling stage, decision flip's 826 calls with 2 retries
# each, took 157 s without it and 5.8 s with it (16 calls sent); the demo's six SUT metrics 345 s
# and 39 s. A SUT that accepts and never answers costs (1 + retries) x timeout_seconds per round.
DOWN_AFTER_CALLS = 8
DOWN_STATUS = {502, 503, 504}  # answers that say the endpoint (or what is behind it) is down


@dataclass
class ChatResult:
    text: str | None
    status: str  # ok | error
    error: str | None
    latency_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    model: str | None
    fingerprint: str | None
    attempts: int
    call_key: str
    cached: bool = False
    http_status: int | None = None
    retries_used: int = 0  # failed requests retried (each uses the caller's retry budget)
    rate_limit_waits: int = 0  # 429/503 answers with Retry-After that were waited out (no budget used)
    # the endpoint refused the response_format sent (an HTTP error naming it): the server's words
    structured_refused: str | None = None
    # the last failure was one a retry may answer (no connection, a timeout, 408/409/425/429, 5xx):
    # the endpoint is down or overloaded, not misconfigured (check_endpoint tells them apart)
    transient: bool = False

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class AdaptiveLimit:
    """At most ``limit`` calls in flight: a semaphore whose size adapts to the endpoint (additive
    increase, multiplicative decrease). A rate-limit answer halves the limit, once for all the
    answers to calls sent before that cut (a burst of 429s is one signal, not thirty); after
    ``limit`` successes in a row it grows by one, never above ``ceiling`` (the configured
    concurrency) nor below 1. With ``adaptive`` off it is a plain semaphore of ``ceiling``.

    ``cap`` is a second, separate bound: the endpoint's connections this client holds (its slots,
    models/slots.py). Calls in flight stay under both; a change of ``cap`` never undoes a cut."""

    def __init__(self, ceiling: int, adaptive: bool = True):
        self.ceiling = self.limit = self.lowest = self.cap = ceiling
        self.adaptive = adaptive
        self.in_flight = 0
        self.cuts = 0  # a call remembers how many cuts there had been when it was sent
        self._streak = 0
        self._cond: asyncio.Condition | None = None
        self._waiting = 0  # calls queued for a place

    def _c(self) -> asyncio.Condition:
        if self._cond is None:  # made on first use, inside the running loop
            self._cond = asyncio.Condition()
        return self._cond

    async def __aenter__(self) -> "AdaptiveLimit":
        if not self._waiting and self.in_flight < self.bound:  # a free place and nobody queued before
            self.in_flight += 1  # this call: take it at once (one event loop: nothing runs in between)
            return self
        c = self._c()
        self._waiting += 1
        try:
            async with c:
                await c.wait_for(lambda: self.in_flight < self.bound)
                self.in_flight += 1
        finally:
            self._waiting -= 1
        return self

    @property
    def bound(self) -> int:
        return min(self.limit, self.cap)

    async def __aexit__(self, *exc) -> None:
        self.in_flight -= 1
        if self._waiting and self.in_flight < self.bound:  # nobody queued: nobody to wake
            c = self._c()
            async with c:
                if self.in_flight < self.bound:
                    c.notify(self.bound - self.in_flight)

    async def pause(self, seconds: float, clock: "RowClock | None" = None) -> None:
        """Sleep without holding a place: a call waiting out a rate limit or a backoff gives its
        place back and queues for one again (behind the limit as it is by then). The wait counts
        on the row's clock; queueing for the place afterwards does not (as before any call)."""
        await self.__aexit__()
        try:
            await interrupts.sleep(seconds)  # a Ctrl-C ends the wait: the call is not retried
        finally:
            if clock is not None:
                clock.stop()
            try:  # shielded: a cancelled wait still takes the place its caller will give back
                await asyncio.shield(self.__aenter__())
            finally:
                if clock is not None:
                    clock.start()

    async def set_cap(self, cap: int) -> None:
        """The connections this client holds now: calls above it finish, none starts until under."""
        if cap == self.cap:
            return
        self.cap = max(1, cap)
        if self.in_flight < self.bound:
            c = self._c()
            async with c:
                c.notify(self.bound - self.in_flight)

    def throttled(self, cuts_when_sent: int) -> None:
        """A call sent when there had been ``cuts_when_sent`` cuts got a rate-limit answer: it cuts
        only if no cut came since (the answers to one burst are one signal)."""
        self._streak = 0
        if self.adaptive and cuts_when_sent == self.cuts and self.bound > 1:
            self.limit = self.bound // 2  # half of what was allowed in flight when the 429 came
            self.lowest = min(self.lowest, self.limit)
            self.cuts += 1

    async def succeeded(self) -> None:
        self._streak += 1
        if self.limit < self.ceiling and self._streak >= self.limit:
            self._streak = 0
            self.limit += 1
            c = self._c()
            async with c:
                c.notify(1)


def _retry_after(headers: dict[str, str]) -> float | None:
    val = next((v for k, v in headers.items() if k.lower() == "retry-after"), None)
    if val is None:
        return None
    try:
        return max(0.0, float(val))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(val)
        return max(0.0, when.timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def build_body(conn: Connection, messages: list[dict[str, str]], temperature: float,
               max_tokens: int | None, sample_index: int) -> dict[str, Any]:
    """The request body. Fresh samples (``sample_index`` > 0) carry ``seed = (params.seed or 0) +
    sample_index``: N samples are N distinct, reproducible requests on endpoints that honour
    ``seed``, and still fresh samples on those that ignore it."""
    msgs = list(messages)
    if conn.system_prompt:
        msgs = [{"role": "system", "content": conn.system_prompt}, *msgs]
    body: dict[str, Any] = {"model": conn.model, "messages": msgs, "temperature": temperature}
    mt = max_tokens if max_tokens is not None else conn.max_tokens
    if mt is not None:
        body["max_tokens"] = mt
    body.update(conn.params)
    if sample_index > 0:
        body["seed"] = int(conn.params.get("seed", 0)) + sample_index
    return body


def call_key(endpoint_id: str, body: dict[str, Any], sample_index: int, template_version: str, attempt: int = 0,
             body_json: str | None = None) -> str:
    """The call's identity: endpoint, body, sample index, prompt-template version and, for a
    re-ask of an unusable answer, its attempt number (so a re-ask is never answered from the
    cache by an earlier re-ask that got the same prose). The hash of ``stable_json`` of those, put
    together around ``body_json`` (``stable_json(body)``, made once per call: the request sent
    and journaled is that text) exactly as ``stable_json`` would write the whole."""
    if body_json is None:
        body_json = stable_json(body)
    text = "".join((f'{{"attempt":{_scalar_json(attempt)},' if attempt else "{", '"body":', body_json,
                    ',"endpoint":', _scalar_json(endpoint_id), ',"sample_index":', _scalar_json(sample_index),
                    ',"template":', _scalar_json(template_version), "}"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1024, typed=True)
def _scalar_json(x: Any) -> str:
    """``stable_json`` of a key's scalar (an endpoint, a template version, an index), remembered:
    a client asks for the same few every call. (Keyed by value and type: 1, 1.0 and True differ.)"""
    return stable_json(x)


class ModelClient:
    """Use as ``async with ModelClient(...) as client: await client.chat(...)``."""

    # ---- structured output (models/structured.py): the form this client asks for JSON in
    _form: str | None  # once known (structured_form)
    _form_lock: asyncio.Lock | None  # made in the running loop

    def _where(self) -> str:
        return f"{self.role} endpoint {self.endpoint_id} (model {self.conn.model})"

    async def structured_form(self) -> str:
        """The structured-output form of this run's requests for JSON to this endpoint: the one the
        connection pins (``on``, ``off``, a form; the builtin model: ``prompt``), else (``auto``)
        the one recorded for the run in the journal, by the endpoint check before the run or by an
        earlier stage; with none recorded (a run launched without the check), it is found now, once
        per (run, endpoint), the same way, and recorded. A run note says which form and why."""
        if self._form is not None:
            return self._form
        if self._form_lock is None:
            self._form_lock = asyncio.Lock()
        async with self._form_lock:
            if self._form is not None:
                return self._form
            pinned = structured.configured_form(self.conn.structured_output, self.conn.provider)
            if pinned is not None:
                self._form = pinned
                if self.conn.provider != "builtin":
                    self._note("info", "structured_output", f"{self.metric} {self.stage}: {self._where()} is asked "
                               f"for JSON in form {pinned} (structured_output: {self.conn.structured_output})")
                return pinned
            rec = await self._recorded_form()
            if rec is None:
                n = await negotiate(self.conn, self.role)
                rec = {"run_id": self.run_id, "endpoint": self.endpoint_id, "model": self.conn.model,
                       "role": self.role, "form": n.form, "previous": None, "how": "lazily", "reason": n.describe()}
                if self.journal is not None:
                    await self._in_thread(self.journal.record_form, rec)
                    rec = await self._recorded_form() or rec  # another process may have recorded one first
            self._form = rec["form"]
            how = {"preflight": "chosen by the endpoint check before the run",
                   "lazily": "chosen when the run first asked this endpoint for JSON (no choice was recorded)",
                   "fallback": "moved to after a refusal"}.get(rec["how"], rec["how"])
            self._note("info", "structured_output", f"{self.metric} {self.stage}: {self._where()} is asked for JSON "
                       f"in form {self._form} ({how}: {rec['reason']})")
            return self._form

    async def _recorded_form(self) -> dict[str, Any] | None:
        if self.journal is None:
            return None
        return await self._in_thread(self.journal.form, self.run_id, self.endpoint_id, self.conn.model)

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        """A journal statement: off the event loop when the journal is a server's."""
        return await asyncio.to_thread(fn, *args) if self.journal is not None and self.journal.REMOTE else fn(*args)

    def falls_back(self) -> bool:
        """Whether a refused form moves this client to the next one (``structured_output: auto``)."""
        return self.conn.provider != "builtin" and self.conn.structured_output == "auto"

    async def fall_back(self, refused: str, words: str | None) -> str:
        """The endpoint refused form ``refused`` (``words``: what it said): the run asks it in the next
        form from now on (recorded in the journal, with a run note), or in the form another request
        already moved it to. Uses no judgement's budget."""
        current = self._form or refused
        nxt = structured.next_form(refused) or refused
        if structured.later(current, nxt) == current:  # moved on already (another judgement's refusal)
            return current
        self._form = nxt
        reason = f"the endpoint refused form {refused}: {(words or '')[:300]}"
        if self.journal is not None:
            await self._in_thread(self.journal.record_form, {
                "run_id": self.run_id, "endpoint": self.endpoint_id, "model": self.conn.model, "role": self.role,
                "form": nxt, "previous": refused, "how": "fallback", "reason": reason})
        self._note("warning", "structured_output_fallback", f"{self.metric} {self.stage}: {self._where()} refused "
                   f"response_format in form {refused} ({(words or '')[:300]}); the run asks it in form {nxt} from "
                   "now on (structured_output: auto; the refused requests used no judgement's retries)")
        return nxt

    def _note(self, level: str, code: str, msg: str) -> None:
        (logger.warning if level == "warning" else logger.info)(msg)
        if self.on_note:
            self.on_note({"level": level, "code": code, "message": msg})

    def __init__(self, conn: Connection, *, role: str, run_id: str, metric: str, stage: str,
                 journal: Journal | None, reuse_runs: list[str] | tuple[str, ...] = (), concurrency: int = 5,
                 backoff_s: float = 0.5, budget: "Budget | None" = None,
                 on_note: "Callable[[dict[str, str]], None] | None" = None, row_timeout_s: float | None = None,
                 share_connections: bool = True, batchable: bool = True,
                 on_progress: "Callable[[dict[str, Any]], None] | None" = None,
                 on_wait: "Callable[[str], None] | None" = None, retry_after_uses_retries: bool = False):
        self.conn = conn
        # told, before each wait of a call, why it waits and for how long (the endpoint check prints it)
        self.on_wait = on_wait
        # a 429/503's Retry-After is waited out as one of the call's retries, never as a free wait up
        # to max_rate_limit_wait_seconds (the endpoint check: its wait is bounded by the retry budget)
        self.retry_after_uses_retries = retry_after_uses_retries
        self.row_timeout_s = row_timeout_s  # None: no row deadline
        self._row_clock: dict[str, RowClock] = {}
        self._rows_cut: set[str] = set()
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
        self.limiter = (SharedRate.for_endpoint(conn.endpoint_id(), conn.requests_per_minute, conn.tokens_per_minute)
                        if conn.requests_per_minute or conn.tokens_per_minute else None)
        self.transport: Any = None  # made on __aenter__
        self.endpoint_id = conn.endpoint_id()
        # keys of successful calls this run may answer from the journal (kept current as calls
        # succeed), so a call with nothing to reuse costs no SQL lookup
        self._known_ok: Marks | set[int] = journal.ok_marks(self.cache_runs, stage) if journal is not None else set()
        self.stats = {"network_calls": 0, "cached": 0, "failed": 0, "in_flight": 0, "deadline_cut": 0,
                      "deadline_rows": 0, "not_sent_down": 0}
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
        self.batcher: BatchRunner | None = BatchRunner(self) if conn.batch.enabled and batchable else None
        self._batching: contextvars.Token | None = None
        self._form = None  # the structured-output form, once known (structured_form)
        self._form_lock = None

    async def __aenter__(self) -> "ModelClient":
        self.transport = make_transport(self.conn)
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
                self.on_note({"level": "info", "code": "batch", "message": (
                    f"{self.metric} {self.stage}: {self.role} calls through the Batch API: {b['batches']} batch(es) "
                    f"sent ({b['requests']} requests), {b['resumed']} resumed; {b['ok']} answered, {b['live']} sent "
                    f"live after the batch failed or expired, {b['failed']} recorded as failed")})
        try:
            await self.transport.aclose()
        finally:
            if self._rebalancer is not None:
                self._closing.set()
                self._rebalancer.cancel()
            if self.slots is not None:
                self.slots.close()
        if self.sem.cuts:
            msg = (f"{self.metric} {self.stage}: {self.role} endpoint {self.endpoint_id} answered with rate limits; "
                   f"calls in flight were lowered {self.sem.cuts} time(s) from {self.sem.ceiling} to as few as "
                   f"{self.sem.lowest} and were {self.sem.limit} at the end (adaptive_concurrency)")
            logger.warning(msg)
            if self.on_note:
                self.on_note({"level": "warning", "code": "adaptive_concurrency", "message": msg})
        if self._outages and self.on_note:
            back = sum(1 for _, end in self._outages if end is not None)
            msg = (f"{self.metric} {self.stage}: {self.role} endpoint {self.endpoint_id} was down "
                   f"{len(self._outages)} time(s) ({DOWN_AFTER_CALLS} calls in a row failed after their retries, the "
                   f"last: {self._down_last}); {self.stats['not_sent_down']} call(s) were not sent while it was down "
                   f"and are recorded as failed on their rows; "
                   + (f"it answered again {back} time(s)" if back else "it did not answer again") +
                   (", and was still down at the end of the stage" if self._down_since is not None and back else ""))
            logger.warning(msg)
            self.on_note({"level": "warning", "code": "endpoint_down", "message": msg})
        if self.stats["deadline_cut"] and self.on_note:
            msg = (f"{self.metric} {self.stage}: {self.stats['deadline_rows']} row(s) passed the {self.row_timeout_s:g}s "
                   f"row deadline (the execution manifest's timeout_seconds, or limits.row_timeout_seconds); "
                   f"{self.stats['deadline_cut']} {self.role} call(s) were cut or not sent, and each is an error on its "
                   f"row (excluded and counted, never scored)")
            logger.warning(msg)
            self.on_note({"level": "warning", "code": "row_deadline", "message": msg})

    def row_clock(self) -> RowClock | None:
        """The current row's clock (None without a row timeout or outside a row's work item)."""
        row = CURRENT_ROW.get()
        if self.row_timeout_s is None or row is None:
            return None
        if row not in self._row_clock:
            self._row_clock[row] = RowClock(self.row_timeout_s)
        return self._row_clock[row]

    def _count_cut(self) -> None:
        row = CURRENT_ROW.get() or ""
        self.stats["deadline_cut"] += 1
        if row not in self._rows_cut:
            self._rows_cut.add(row)
            self.stats["deadline_rows"] += 1

    def _deadline_error(self, what: str) -> str:
        """Why a call stopped at its row's deadline (counted for the run note)."""
        self._count_cut()
        return (f"row deadline: row {CURRENT_ROW.get()}'s calls in the {self.stage} stage reached their "
                f"{self.row_timeout_s:g}s limit of time in flight {what} (execution timeout_seconds; "
                f"limits.row_timeout_seconds sets it)")

    def _from_record(self, rec: dict[str, Any], key: str) -> ChatResult:
        return ChatResult(rec["response_text"], "ok", None, rec["latency_ms"], rec["prompt_tokens"],
                          rec["completion_tokens"], rec["response_model"], rec["fingerprint"], rec["attempts"],
                          key, cached=True, http_status=rec["http_status"])

    async def chat(self, messages: list[dict[str, str]], *, temperature: float, sample_index: int = 0,
                   retries: int = 0, timeout: float = 60.0, template_version: str = "",
                   max_tokens: int | None = None, attempt: int = 0,
                   response_format: dict[str, Any] | None = None) -> ChatResult:
        """One answer. ``retries`` caps the failed requests retried for it (transient errors);
        a 429/503 with ``Retry-After`` is waited out without using it, up to the connection's
        ``max_rate_limit_wait_seconds`` in total. ``attempt`` > 0 marks a re-ask (its own key)."""
        interrupts.check()  # after a Ctrl-C no call starts (not even one the journal would answer)
        body = build_body(self.conn, messages, temperature, max_tokens, sample_index)
        if response_format is not None:
            body["response_format"] = response_format
        body_json = stable_json(body)  # once: the key's, the request sent and the journal's
        key = call_key(self.endpoint_id, body, sample_index, template_version, attempt, body_json)
        if self.journal is not None and key_mark(key) in self._known_ok:
            if self.journal.REMOTE:  # a round trip to the database: not on the event loop
                rec = await asyncio.to_thread(self.journal.lookup, key, self.cache_runs)
            else:
                rec = self.journal.lookup(key, self.cache_runs)
            if rec is not None:
                self.stats["cached"] += 1
                if rec["run_id"] != self.run_id:  # reused from an earlier run: record it in this run
                    self._record(key, body, sample_index, self._from_record(rec, key), source=f"reused:{rec['run_id']}")
                return self._from_record(rec, key)
        if self.batcher is not None:  # the provider's Batch API (models/batch.py)
            return await self.batcher.call(key, body, body_json, sample_index, retries, timeout)
        return await self._live(body, key, sample_index, retries, timeout, body_json)

    async def _live(self, body: dict[str, Any], key: str, sample_index: int, retries: int, timeout: float,
                    body_json: str, counted: bool = False) -> ChatResult:
        """A call the cache does not answer, sent now (as ``chat`` says), journaled as it ends.
        ``counted``: the budget has it already (a batch's request sent again live)."""
        clock = self.row_clock()
        text = None if self.conn.provider == "builtin" else body_json
        if not self._slots_held and self.conn.provider != "builtin":
            await self._share_connections()
        async with self.sem:
            if clock is not None and clock.left() <= 0:  # not sent: not a model call, not journaled
                return ChatResult(None, "error", self._deadline_error("before this call was sent"), None, None, None,
                                  None, None, 0, key)
            probe = False
            if self._down_since is not None and self.conn.provider != "builtin":
                if self._probing and not self._confirmed and self._probe_done is not None:
                    await self._probe_done.wait()  # only suspected down: this call follows what that one finds
                if self._down_since is not None:
                    if self._probing:  # down, and a call is finding out whether it is back
                        self.stats["not_sent_down"] += 1
                        return ChatResult(None, "error", self._down_error(), None, None, None, None, None, 0, key,
                                          transient=True)
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
            logger.warning(f"{self.metric} {self.stage}: {self._where()} is down: {self._down_streak} calls in a row "
                           f"failed after their retries (the last: {self._down_last}); until it answers, one call at "
                           "a time is sent to see whether it is back; the others wait for the first such call, then, "
                           "if it failed too, fail at once, recorded as failed on their rows")

    def _down_error(self) -> str:
        return (f"not sent: the {self.role} endpoint {self.endpoint_id} is down ({DOWN_AFTER_CALLS} or more calls in "
                f"a row failed after their retries, the last: {self._down_last}); one call at a time is sent to see "
                "whether it is back, the others fail at once (a resumed run sends them)")

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
            except asyncio.TimeoutError:
                pass
            await self.sem.set_cap(slots.look(in_flight=self.sem.in_flight))

    def _record(self, key: str, body: dict | str, sample_index: int, r: ChatResult, source: str) -> None:
        """``body``: the request, or its JSON as ``stable_json`` made it."""
        if self.journal is None:
            return
        self.journal.record({
            "run_id": self.run_id, "metric": self.metric, "stage": self.stage, "role": self.role,
            "call_key": key, "sample_index": sample_index, "endpoint": self.endpoint_id,
            "model": self.conn.model, "request": body, "response_text": r.text, "status": r.status,
            "error": r.error, "http_status": r.http_status, "latency_ms": r.latency_ms,
            "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens, "attempts": r.attempts,
            "response_model": r.model, "fingerprint": r.fingerprint, "source": source, "created_at": time.time(),
        })

    async def _call(self, body: dict[str, Any], key: str, retries: int, timeout: float,
                    clock: RowClock | None = None, text: str | None = None, counted: bool = False) -> ChatResult:
        """``text``: the body as JSON (``stable_json``), sent as it is."""
        attempts = retries_used = waits = 0
        waited_s = 0.0
        max_wait = self.conn.max_rate_limit_wait_seconds
        http_status = None

        def left() -> float:
            return float("inf") if clock is None else clock.left()

        def failed(err: str, latency: float | None = None, refused: str | None = None,
                   transient: bool = False) -> ChatResult:
            return ChatResult(None, "error", err, latency, None, None, None, None, attempts, key,
                              http_status=http_status, retries_used=retries_used, rate_limit_waits=waits,
                              structured_refused=refused, transient=transient)

        structured_sent = "response_format" in body

        limiter = self.limiter
        tokens = estimate_tokens(body) if limiter is not None else 0  # charged to the shared schedule per attempt
        while True:
            charge: int | None = None  # what this attempt cost at the endpoint, once known (else 0)
            try:
                if limiter is not None:  # waiting for the endpoint's shared rate is not the row's time
                    if clock is not None:
                        clock.stop()
                    try:
                        await limiter.wait(tokens)
                    finally:
                        if clock is not None:
                            clock.start()
                if left() <= 0:
                    return failed(self._deadline_error("before this attempt" if attempts else "before this call was sent"))
                interrupts.check()  # after a Ctrl-C nothing is sent or retried; the calls sent finish
                if attempts == 0 and self.budget is not None and not counted:  # counted once it is really sent
                    await self.budget.areserve()
                attempts += 1
                cut = left() < timeout  # this attempt ends at the row deadline, not at its own timeout
                t0 = time.perf_counter()
                retry_after = None
                http_status = None
                cuts_when_sent = self.sem.cuts
                try:
                    resp = await self.transport.post_chat(body, min(timeout, left()), text)
                except (asyncio.TimeoutError, httpx.TransportError, aiohttp.ClientError, OSError) as e:
                    charge = prompt_tokens_estimate(body) if limiter is not None else 0  # it may have been read
                    if cut and left() <= 0:
                        return failed(self._deadline_error("while this call waited for its answer"))
                    err, transient = describe_failure(e, timeout)
                else:
                    latency = (time.perf_counter() - t0) * 1000
                    http_status = resp.status_code
                    if resp.status_code == 200:
                        self._last_answer = time.monotonic()
                        await self.sem.succeeded()
                        parsed = _parse_completion(resp.body)
                        if isinstance(parsed, str):
                            charge = prompt_tokens_estimate(body) if limiter is not None else 0
                            return failed(parsed, latency)
                        answer, model, fp, pt, ct = parsed
                        charge = counted_tokens(body, pt, ct, answer) if limiter is not None else 0
                        return ChatResult(answer, "ok", None, latency, pt, ct, model, fp, attempts, key, http_status=200,
                                          retries_used=retries_used, rate_limit_waits=waits)
                    text_ = scrub_secrets(resp.text, self.conn)  # it may echo the key
                    err = f"HTTP {resp.status_code}: {text_[:300]}"
                    if limiter is not None and resp.status_code != 429:  # a 429 was refused before any token
                        charge = prompt_tokens_estimate(body)
                    words = structured.refusal(resp.status_code, text_) if structured_sent else None
                    if words is not None:  # the form is refused, not the request: no retry answers it (a 500 too)
                        return failed(f"HTTP {resp.status_code}: {words}", latency, refused=words)
                    transient = resp.status_code in TRANSIENT_STATUS or resp.status_code >= 500
                    retry_after = _retry_after(resp.headers)
                    if resp.status_code == 429 or (resp.status_code == 503 and retry_after is not None):
                        self.sem.throttled(cuts_when_sent)
                latency = (time.perf_counter() - t0) * 1000
                if transient and http_status in (429, 503) and retry_after is not None \
                        and not self.retry_after_uses_retries:
                    # the endpoint says when to come back: a wait, not a failure. Bounded twice: this call
                    # waits at most max_rate_limit_wait_seconds in all, and nobody waits once the endpoint
                    # has answered nothing for that long (a run against an endpoint that never recovers ends)
                    sleep = max(retry_after, self.backoff_s)  # Retry-After: 0 is no licence to hammer
                    silent = time.monotonic() - self._last_answer
                    if waited_s + sleep <= max_wait and silent + sleep <= max_wait:
                        if sleep >= left():  # the wait would end after the row deadline
                            self._count_cut()
                            return failed(f"{err} (rate limited; not waited: the row deadline comes first, "
                                          f"{max(left(), 0):.0f}s left, Retry-After {retry_after:g}s)", latency)
                        waits += 1
                        waited_s += sleep
                        if self.on_wait is not None:
                            self.on_wait(f"{_what_failed(err, http_status)}; waiting {_secs(sleep)} (Retry-After; a "
                                         f"rate-limit wait uses no retry) before try {attempts + 1}")
                        await self.sem.pause(sleep, clock)
                        continue
                    err += (f" (rate limited: this call waited {waited_s:g}s on Retry-After, the endpoint answered "
                            f"nothing for {silent:.0f}s; max_rate_limit_wait_seconds {max_wait:g})")
                if not transient or retries_used >= retries:
                    return failed(err, latency, transient=transient)
                delay = retry_after if retry_after is not None else self.backoff_s * 2 ** retries_used * (0.5 + self._rng.random())
                if min(delay, MAX_BACKOFF_S) >= left():  # the retry would start after the row deadline
                    self._count_cut()
                    return failed(f"{err} (not retried: the row deadline comes first)", latency, transient=transient)
                retries_used += 1
                if self.on_wait is not None:
                    self.on_wait(f"{_what_failed(err, http_status)}; waiting {_secs(min(delay, MAX_BACKOFF_S))} "
                                 f"({'Retry-After' if retry_after is not None else 'backoff'}) before try "
                                 f"{attempts + 1} of {retries + 1}")
                await self.sem.pause(min(delay, MAX_BACKOFF_S), clock)
            finally:
                if limiter is not None:  # the schedule follows what the endpoint counted
                    limiter.settle(tokens, charge or 0)


HTTP_REASONS = {408: "request timeout", 409: "conflict", 425: "too early", 429: "rate limited",
                500: "server error", 502: "bad gateway", 503: "unavailable", 504: "gateway timeout"}


def _secs(x: float) -> str:
    """Seconds as a person reads them: 0.012s, 1.5s, 16s, 600s."""
    return f"{x:.2g}s" if x < 10 else f"{x:.0f}s"


def _what_failed(err: str, http_status: int | None) -> str:
    """A try's failure in a few words, for a line saying why a call waits: the HTTP status and its
    meaning, or what happened to the connection (``describe_failure``'s words)."""
    if http_status is None:
        return err
    reason = HTTP_REASONS.get(http_status) or ("server error" if http_status >= 500 else "")
    return f"answered HTTP {http_status}" + (f" ({reason})" if reason else "")


def describe_failure(e: BaseException, timeout: float) -> tuple[str, bool]:
    """(what happened, whether to retry) for a request that got no HTTP answer. The transport
    raises httpx's error for aiohttp's (``AiohttpBodyTransport``); the aiohttp error it wraps (its
    ``__cause__``) and the OS error under that say what really happened."""
    import ssl

    chain: list[BaseException] = []
    x: BaseException | None = e
    while x is not None and x not in chain:
        chain.append(x)
        x = x.__cause__ or x.__context__
        if isinstance(x, aiohttp.ClientConnectorError) and x.os_error is not None:
            chain.append(x)
            x = x.os_error

    def has(*types) -> BaseException | None:
        return next((c for c in chain if isinstance(c, types)), None)

    text = " ".join(str(c) for c in chain)
    if has(aiohttp.ClientConnectorDNSError) or re.search(r"name or service not known|nodename nor servname|"
                                                           r"temporary failure in name resolution|getaddrinfo", text, re.I):
        return f"DNS failure: the host name cannot be resolved ({_first_line(chain[-1])})", True
    if has(aiohttp.ClientConnectorCertificateError, aiohttp.ClientSSLError, ssl.SSLError):
        return f"TLS failure: {_first_line(has(aiohttp.ClientSSLError, ssl.SSLError) or chain[-1])}", False
    if has(ConnectionRefusedError):
        return "connection refused: nothing listens at that address and port", True
    cut = has(http_exceptions.ContentLengthError, http_exceptions.TransferEncodingError)
    if cut is None and has(aiohttp.ServerDisconnectedError, ConnectionResetError, httpx.RemoteProtocolError):
        return f"connection {'reset' if has(ConnectionResetError) else 'closed'} by the server without an answer", True
    if cut is not None:  # headers came, then the connection ended mid-body (aiohttp's code 400 is no HTTP status)
        how = "reset" if re.search(r"connection reset", text, re.I) else "closed"
        got = re.search(r"received (\d+) of (\d+) bytes", text)
        part = (f": {got[1]} of the {got[2]} bytes its Content-Length announced came" if got else
                ": the chunked body stopped before its last chunk"
                if isinstance(cut, http_exceptions.TransferEncodingError) else "")
        return f"the connection was {how} before the answer was complete{part} (aiohttp {type(cut).__name__})", True
    if has(aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout) and not has(aiohttp.ClientConnectorError):
        if has(aiohttp.ConnectionTimeoutError) or isinstance(e, httpx.ConnectTimeout) and "onnect" in text:
            return f"connect timeout: no connection within {timeout:g}s", True
    if has(aiohttp.SocketTimeoutError, httpx.ReadTimeout):
        return f"read timeout: connected, but no answer within {timeout:g}s", True
    if has(asyncio.TimeoutError, httpx.TimeoutException):
        return f"timeout: no complete answer within {timeout:g}s", True
    return f"connection error: {type(chain[-1]).__name__}: {_first_line(chain[-1])}", True


def _first_line(x: BaseException) -> str:
    if isinstance(x, http_exceptions.HttpProcessingError) and x.message:
        return x.message.strip().splitlines()[0][:200]  # its str() starts with a code that is no HTTP status
    return (str(x).strip().splitlines() or [type(x).__name__])[0][:200]


def _parse_completion(body: dict[str, Any] | None):
    """(text, model, fingerprint, prompt_tokens, completion_tokens) or an error string."""
    if not isinstance(body, dict):
        return "malformed response: no choices[0].message.content"
    try:
        choice = body["choices"][0]
        text = choice["message"]["content"]
    except (TypeError, KeyError, IndexError):
        return "malformed response: no choices[0].message.content"
    if text is None:
        text = ""
    usage = body.get("usage") or {}
    return text, body.get("model"), body.get("system_fingerprint"), usage.get("prompt_tokens"), usage.get("completion_tokens")


CHECK_MIN_RETRIES = 2  # the endpoint check retries at least this often, whatever its calls' retries


async def check_endpoint(conn: Connection, role: str, *, retries: int = CHECK_MIN_RETRIES, timeout: float = 30.0,
                         backoff_s: float = 0.5, log: Callable[[str], None] | None = None) -> str:
    """Ask the endpoint one tiny question, retried as a call is (``ModelClient._call``): a try that
    fails transiently (no connection, a timeout, 408/409/425/429, 5xx) is tried again, up to
    ``retries`` times, after an exponential backoff with jitter from ``backoff_s`` or after the
    Retry-After the endpoint asks for; each try waits ``timeout`` seconds at most. A Retry-After is
    one of the retries here (not a free wait up to max_rate_limit_wait_seconds), so an endpoint
    answering 429 for ever ends the check within its budget. Each wait is told to ``log`` (default:
    the project's logger) with why it waits, how long and before which try.

    Raises EndpointDown when the endpoint is still down after the retries (the message says what
    was tried and the last failure), EndpointError when it answers but cannot be used
    (unauthorised, not a chat completion, TLS, a missing key)."""
    if conn.provider == "builtin":
        return f"{role}: builtin model ({conn.profile.name})"
    where = f"{role} endpoint {conn.base_url} (model {conn.model})"
    say = log or logger.info
    client = ModelClient(conn, role=role, run_id="preflight", metric="", stage="preflight", journal=None,
                         backoff_s=backoff_s, concurrency=1, share_connections=False,
                         batchable=False,  # one call: no slot, no batch, no concurrency to adapt
                         on_wait=lambda why: say(f"endpoint check: {where} {why}"), retry_after_uses_retries=True)
    t0 = time.monotonic()
    try:
        async with client:
            r = await client.chat([{"role": "user", "content": ENDPOINT_CHECK}], temperature=0.0, retries=retries,
                                  timeout=timeout, max_tokens=5)
    except EndpointError as e:
        raise EndpointError(f"{where}: {e}") from None
    if r.ok:
        return f"{role}: {conn.base_url} answers as {r.model or conn.model}"
    if r.http_status in (401, 403):
        raise EndpointError(f"{where}: unauthorised (HTTP {r.http_status}); check api_key_env / header_env")
    if r.transient:
        what = "unreachable" if r.http_status is None else f"unavailable: it {_what_failed(r.error or '', r.http_status)}"
        tries = f"{r.attempts} tr{'y' if r.attempts == 1 else 'ies'}"
        raise EndpointDown(f"{where}: {what} after {tries} over {time.monotonic() - t0:.1f}s (the check's budget: "
                           f"{retries} retries, backoff from {backoff_s:g}s doubling with jitter or the Retry-After "
                           f"asked for, {timeout:g}s per try); the last try: {r.error}")
    if r.http_status is None:
        raise EndpointError(f"{where}: unreachable: {r.error}")
    raise EndpointError(f"{where}: does not answer a chat completion: {r.error}")


@dataclass
class Negotiation:
    """The structured-output form found for an endpoint (``negotiate``) and what the others did."""

    form: str
    tried: list[tuple[str, str]]  # (form, why it was not kept), in the order tried
    requests: int  # requests sent, retries included
    answered: bool = True  # False: no form got the JSON object asked for (plain prompting, the last resort)

    def describe(self) -> str:
        """What was found, then why each earlier form was passed over (each reason cut at 200 characters)."""
        before = "; ".join(f"{f}: {why if len(why) <= 200 else why[:199] + '…'}" for f, why in self.tried)
        if not self.answered:
            return (f"no form got the JSON object asked for, so plain prompting, the last resort ({self.requests} "
                    f"request(s)): {before}")
        found = f"{self.form} answered the probe ({self.requests} request(s))"
        return f"{found}; before it, {before}" if before else found


async def negotiate(conn: Connection, role: str, timeout: float = 30.0,
                    forms: tuple[str, ...] = structured.FORMS) -> Negotiation:
    """Find the first structured-output form (``structured.FORMS``) the endpoint takes and answers
    in: one small request per form, asking for ``{"ok": true}`` with a schema, until the answer is
    that object. A form is passed over when the endpoint refuses it (any HTTP error; a refusal is
    never retried), fails after one retry, or answers without the object (it ignored the form, or
    the model cannot keep to it). ``prompt`` needs nothing of the endpoint: when no form gets the
    object, prompting is what is left (``answered`` false). Probes are not journaled and use no
    run budget, like the endpoint check."""
    client = ModelClient(conn, role=role, run_id="preflight", metric="", stage="preflight", journal=None, backoff_s=0.2,
                         share_connections=False, batchable=False)
    where = f"{role} endpoint {conn.base_url} (model {conn.model})"
    tried: list[tuple[str, str]] = []
    requests = 0
    r: ChatResult | None = None
    try:
        async with client:
            for form in forms:
                r = await client.chat([{"role": "user", "content": STRUCTURED_PROBE}], temperature=0.0, retries=1,
                                      timeout=timeout, max_tokens=None if conn.max_tokens else 64,
                                      response_format=structured.payload(form, "probe", structured.PROBE_SCHEMA))
                requests += r.attempts
                if r.ok and structured.probe_answer_ok(r.text):
                    return Negotiation(form, tried, requests)
                if r.http_status in (401, 403):
                    break
                why = (f"refused ({r.error})" if r.structured_refused else f"failed ({r.error})" if not r.ok else
                       f"answered without the JSON object asked for ({(r.text or '').strip()[:80]!r})")
                tried.append((form, why))
    except EndpointError as e:
        raise EndpointError(f"{where}: {e}") from None
    if r is not None and r.http_status in (401, 403):
        raise EndpointError(f"{where}: unauthorised (HTTP {r.http_status}); check api_key_env / header_env")
    return Negotiation("prompt", tried, requests, answered=False)
