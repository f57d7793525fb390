"""A connection's calls through the provider's Batch API (docs/batch-api.md): OpenAI's ``/v1/files`` and
``/v1/batches``, about half the price of live calls, answers within the completion window.

With ``batch.enabled`` a client (``ModelClient``) hands every call the cache does not answer to
its ``BatchRunner`` instead of sending it. The runner collects the calls a stage makes at once
(the calls stop coming for ``QUIET_S``, or ``max_requests`` are waiting), then:

1. takes the answers of any batch of this part (run, metric, stage, role, endpoint) the journal
   holds as not yet read back: one still being answered is polled again, and requests uploaded
   whose batch may or may not have been created are looked for among the provider's batches (by
   their input file) before a batch is made for them. A stage stopped or crashed anywhere from
   the upload on pays nothing twice;
2. sends the rest as a new batch: one JSONL line per call, ``custom_id`` the call's key in the
   journal, uploaded (``POST /v1/files``, purpose ``batch``) and journaled, the batch created
   (``POST /v1/batches``) and journaled, both before the first poll;
3. polls every ``poll_seconds`` (a transient failure, 408/409/429/5xx or no connection, is
   polled again; the batch's window plus an hour ends it), logging each change of status;
4. reads the output and error files and journals every answer (source ``batch``; a line of
   another shape is an answer missing), flushes the journal, and only then marks the batch read.
   Then each request the batch failed or let expire is sent again live (``on_failure: live``,
   all at once within the client's limits, each on its own row's deadline) or recorded as failed
   with the reason and the endpoint's status (``fail``).

Budget caps count batched calls (the journal's totals count source ``batch`` with ``network``);
a live fallback is not counted again. The row deadline does not apply to batched calls (a batch
answers within hours).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import httpx

from .. import interrupts
from ..connections import Connection
from ..hashing import wire_json
from .batch_provider import BatchApiError, BatchProvider, _outcome
from .deadline import CURRENT_ROW
from .journal_format import key_mark
from .provider import Provider, parse_completion
from .result import ChatResult
from .structured import refusal

if TYPE_CHECKING:
    from .budget import Budget
    from .journal import Journal
    from .journal_format import Marks

logger = logging.getLogger("aip_assets")
QUIET_S = 0.2  # a stage's calls come at once: this long without a new one, the collection is complete
TERMINAL = {"completed", "failed", "expired", "cancelled"}
SEND_TRIES = 4  # an upload or a batch creation that fails transiently is tried this many times
LATE_S = 3600.0  # polling ends this long after the batch's window closed (a provider that never says)
WINDOW_S = 24 * 3600.0  # the completion window, until the provider's batch says when it closes
# A batching client in this task: work items are not bounded by the metric's concurrency then
# (``metrics.running.run_bounded``), so every call of the stage reaches the runner at once.
BATCHING: contextvars.ContextVar[int] = contextvars.ContextVar("aip_batching", default=0)
UNBOUNDED = 1 << 30


@dataclass
class _Call:
    key: str
    body: dict[str, Any]
    body_json: str
    sample_index: int
    retries: int
    timeout: float
    row: str | None
    future: asyncio.Future = field(repr=False)


class BatchClient(Protocol):
    """What a batch runner asks of the client that hands it its calls (``client.ModelClient``): the
    part its calls are of, where they are journaled and counted, and the client's live call path
    for a request a batch failed or let expire (``on_failure: live``)."""

    conn: Connection
    provider: Provider
    journal: Journal | None
    budget: Budget | None
    run_id: str
    metric: str
    stage: str
    role: str
    endpoint_id: str
    backoff_s: float
    stats: dict[str, int]
    on_progress: Callable[[dict[str, Any]], None] | None
    _known_ok: Marks | set[int]

    def _record(self, key: str, body: dict | str, sample_index: int, r: ChatResult, source: str) -> None: ...

    async def _live(
        self,
        body: dict[str, Any],
        key: str,
        sample_index: int,
        retries: int,
        timeout: float,
        body_json: str,
        counted: bool = False,
    ) -> ChatResult: ...


class BatchRunner:
    def __init__(self, client: BatchClient):
        self.client = client
        self.settings = client.conn.batch
        self.pending: list[_Call] = []
        self._collector: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()
        self._earlier: dict[str, asyncio.Task] = {}  # journaled batch id -> the task taking its answers (once)
        self._inflight: dict[str, asyncio.Future] = {}  # call key -> done when the batch holding it is read back
        self._journaled: set[str] = set()  # call keys whose batch outcome is in the journal
        self._answered: dict[str, tuple] = {}  # call key -> outcome, of every batch read back by this runner
        self._asked: dict[str, tuple[dict, str, int]] = {}  # call key -> (body, its JSON, sample index)
        self._mine: set[str] = set()  # the journal ids of the uploads and batches this runner made
        provider = client.provider
        assert isinstance(provider, BatchProvider), "a batch runner needs its connection's BatchProvider"
        self.provider: BatchProvider = provider
        self.stats: Counter = Counter()

    # ------------------------------------------------------------------ collecting
    async def call(
        self, key: str, body: dict[str, Any], body_json: str, sample_index: int, retries: int, timeout: float
    ) -> ChatResult:
        future = asyncio.get_running_loop().create_future()
        self._asked[key] = (body, body_json, sample_index)
        self.pending.append(_Call(key, body, body_json, sample_index, retries, timeout, CURRENT_ROW.get(), future))
        if self._collector is None or self._collector.done():
            self._collector = self._spawn(self._collect())
        return await future

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _collect(self) -> None:
        while self.pending:
            seen = -1
            while len(self.pending) != seen and len(self.pending) < self.settings.max_requests:
                seen = len(self.pending)
                await asyncio.sleep(QUIET_S)
            calls, self.pending = self.pending[: self.settings.max_requests], self.pending[self.settings.max_requests :]
            self._spawn(self._run(calls))

    async def aclose(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.provider.close_api()

    # ------------------------------------------------------------------ one collection's calls
    async def _run(self, calls: list[_Call]) -> None:
        try:
            await self._answer(calls)
        except BaseException as e:  # noqa: BLE001 - every call still waiting learns it (a refused upload, a cap)
            for c in calls:
                if not c.future.done():
                    if isinstance(e, asyncio.CancelledError):
                        c.future.cancel()
                    else:
                        c.future.set_exception(e)
            if isinstance(e, asyncio.CancelledError):
                raise

    async def _answer(self, calls: list[_Call]) -> None:
        cl = self.client
        by_key: dict[str, list[_Call]] = {}
        for c in calls:
            by_key.setdefault(c.key, []).append(c)
        if cl.journal is not None:  # 1. batches sent before (a stop, a crash, another collection of this stage)
            part = (cl.run_id, cl.metric, cl.stage, cl.role, cl.endpoint_id)
            for b in await asyncio.to_thread(cl.journal.open_batches, *part):
                keys = json.loads(b["call_keys"])
                if b["batch_id"] not in self._earlier and b["batch_id"] not in self._mine and set(keys) & set(by_key):
                    self.stats["resumed"] += 1
                    self._earlier[b["batch_id"]] = task = self._spawn(self._take_earlier(b))
                    for k in keys:
                        self._inflight.setdefault(k, task)
        # a batch (earlier, or another collection's) already holds some of these: its answers, not a second batch
        holding = {id(f): f for k in by_key if (f := self._inflight.get(k)) is not None}
        if holding:
            await asyncio.gather(*(asyncio.shield(f) for f in holding.values()))
        rest = [k for k in by_key if k not in self._answered]
        if rest and cl.budget is not None:
            allowed = []
            for k in rest:
                try:
                    await cl.budget.areserve()
                except Exception as e:  # noqa: BLE001 - the cap: these calls fail as live ones would
                    for c in by_key.pop(k):
                        if not c.future.done():
                            c.future.set_exception(e)
                    continue
                allowed.append(k)
            rest = allowed
        if rest:  # 2. a new batch for the others
            first = {k: by_key[k][0] for k in rest}
            done = asyncio.get_running_loop().create_future()
            for k in rest:
                self._inflight[k] = done
            try:
                upload_id = await self._upload(rest, first)
                batch_id = await self._create(upload_id)
                await self._read_back(batch_id, await self._poll(batch_id), first, rest)
            except BaseException as e:
                if not done.done():
                    done.set_exception(e if isinstance(e, Exception) else RuntimeError("stopped"))
                    done.exception()  # retrieved: a collection waiting on it raises it, none needs to
                raise
            done.set_result(None)
        # 3. every call's answer: from the batch, else live or failed as configured, all at once
        await asyncio.gather(*(self._settle(waiting) for waiting in by_key.values()))

    async def _take_earlier(self, b: dict[str, Any]) -> None:
        """The answers of a batch journaled by an earlier attempt (this runner's or a stopped one's)."""
        cl = self.client
        keys = json.loads(b["call_keys"])
        if cl.budget is not None and not getattr(cl.budget, "SHARED", False):  # counted anew from the journal
            for _ in keys:
                try:
                    cl.budget.reserve()
                except Exception:  # noqa: BLE001 - already paid for: counted, never refused
                    cl.budget.calls += 1
        batch_id = b["batch_id"]
        if b["status"] == "uploaded":  # the batch may have been made before the stop: look for it
            found = await self._find(b["input_file_id"])
            logger.info(
                f"{cl.metric} {cl.stage}: {cl.role} requests uploaded before as {b['input_file_id']}: "
                + (f"their batch {found} was made; polling it" if found else "no batch yet; making it")
            )
            batch_id = found or await self._create(batch_id, b["input_file_id"])
            self._mine.add(batch_id)
            if found and cl.journal is not None:
                await asyncio.to_thread(cl.journal.created_batch, b["batch_id"], found)
        else:
            logger.info(
                f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} was sent before; polling it again "
                "(nothing is sent twice)"
            )
        await self._read_back(batch_id, await self._poll(batch_id), None, keys)

    async def _settle(self, waiting: list[_Call]) -> None:
        c, cl = waiting[0], self.client
        kind, what, status = self._answered.get(c.key) or (
            "failed",
            "the batch ended without an answer for this request",
            None,
        )
        try:
            if kind == "ok":
                result = what
            elif self.settings.on_failure == "live":
                self.stats["live"] += 1
                logger.info(f"{cl.metric} {cl.stage}: {cl.role} call {c.key[:12]} sent live (batch: {what})")
                token = CURRENT_ROW.set(c.row)  # on its own row's deadline
                try:
                    result = await cl._live(
                        c.body, c.key, c.sample_index, c.retries, c.timeout, c.body_json, counted=True
                    )
                finally:
                    CURRENT_ROW.reset(token)
            else:
                # the batch's answer may be the endpoint refusing the response_format (ask_json moves on)
                refused = refusal(status, str(what)) if "response_format" in c.body else None
                result = ChatResult(
                    None,
                    "error",
                    f"batch: {what}",
                    None,
                    None,
                    None,
                    None,
                    None,
                    1,
                    c.key,
                    http_status=status,
                    structured_refused=refused,
                )
                if c.key not in self._journaled:  # no line at all for it: journaled here
                    self._journaled.add(c.key)
                    cl.stats["network_calls"] += 1
                    cl.stats["failed"] += 1
                    cl._record(c.key, c.body_json, c.sample_index, result, source="batch")
        except Exception as e:  # noqa: BLE001 - this call's failure is this call's
            for w in waiting:
                if not w.future.done():
                    w.future.set_exception(e)
            return
        for w in waiting:
            if not w.future.done():
                w.future.set_result(result)

    # ------------------------------------------------------------------ the provider's API
    async def _api(self, what: str, method: str, path: str, **kw: Any) -> httpx.Response:
        return await self.provider.api(
            f"{self.client.role} endpoint {self.client.conn.base_url}", what, method, path, **kw
        )

    async def _tried(self, what: str, method: str, path: str, **kw: Any) -> httpx.Response:
        """An upload or a creation, tried again after a transient failure."""
        for attempt in range(SEND_TRIES):
            try:
                return await self._api(what, method, path, **kw)
            except BatchApiError as e:
                if not e.transient or attempt == SEND_TRIES - 1:
                    raise
                logger.warning(f"{e}; trying again")
                await asyncio.sleep(min(60.0, self.client.backoff_s * 2**attempt))
        raise AssertionError("not reached")

    async def _upload(self, keys: list[str], calls: dict[str, _Call]) -> str:
        """The requests uploaded and journaled (before their batch exists); the journal's id for them."""
        cl = self.client
        content = "".join(
            wire_json({"custom_id": k, "method": "POST", "url": "/v1/chat/completions", "body": calls[k].body}) + "\n"
            for k in keys
        ).encode()
        f = (
            await self._tried(
                "upload the requests",
                "POST",
                "files",
                data={"purpose": "batch"},
                files={"file": (f"{cl.run_id}-{cl.stage}-{cl.role}.jsonl", content, "application/jsonl")},
            )
        ).json()
        upload_id = f"upload:{f['id']}"
        self._mine.add(upload_id)
        if cl.journal is not None:
            await asyncio.to_thread(
                cl.journal.save_batch,
                {
                    "batch_id": upload_id,
                    "run_id": cl.run_id,
                    "metric": cl.metric,
                    "stage": cl.stage,
                    "role": cl.role,
                    "endpoint": cl.endpoint_id,
                    "input_file_id": f["id"],
                    "call_keys": json.dumps(keys),
                    "status": "uploaded",
                    "created_at": time.time(),
                    "ended_at": None,
                },
            )
        self.stats["requests"] += len(keys)
        return upload_id

    async def _create(self, upload_id: str, file_id: str | None = None) -> str:
        cl = self.client
        file_id = file_id or upload_id.removeprefix("upload:")
        b = (
            await self._tried(
                "create the batch",
                "POST",
                "batches",
                json={
                    "input_file_id": file_id,
                    "endpoint": "/v1/chat/completions",
                    "completion_window": self.settings.completion_window,
                    "metadata": {"run_id": cl.run_id, "metric": cl.metric, "stage": cl.stage, "role": cl.role},
                },
            )
        ).json()
        self._mine.add(str(b["id"]))
        if cl.journal is not None:  # before the first poll: a stop from here on polls this batch again
            await asyncio.to_thread(cl.journal.created_batch, upload_id, b["id"])
        self.stats["batches"] += 1
        logger.info(
            f"{cl.metric} {cl.stage}: {cl.role} batch {b['id']} sent (file {file_id}); polling every "
            f"{self.settings.poll_seconds:g}s"
        )
        return str(b["id"])

    async def _find(self, file_id: str) -> str | None:
        """The provider's batch made from ``file_id``, if any (``GET /v1/batches``, newest first)."""
        after = None
        for _ in range(50):  # 50 pages of 100: the batches of recent days
            page = (
                await self._tried(
                    "list the batches", "GET", "batches", params={"limit": 100, **({"after": after} if after else {})}
                )
            ).json()
            data = page.get("data") or []
            hit = next((b["id"] for b in data if b.get("input_file_id") == file_id), None)
            if hit or not page.get("has_more") or not data:
                return hit
            after = data[-1].get("id")
        return None

    async def _poll(self, batch_id: str) -> dict[str, Any]:
        """The batch once it ended (as the provider said, or ``{"status": "lost"}``)."""
        cl = self.client
        seen = None
        give_up = time.time() + WINDOW_S + LATE_S  # until the provider says when its window closes
        while True:
            try:
                b = (await self._api(f"read batch {batch_id}", "GET", f"batches/{batch_id}")).json()
            except BatchApiError as e:
                if e.status == 404:  # gone at the provider: nothing to read back
                    logger.warning(f"{e}: the batch is gone; its requests have no answer")
                    return {"id": batch_id, "status": "lost"}
                if not e.transient:
                    raise
                if time.time() > give_up:
                    raise BatchApiError(f"{e}; the batch's window closed an hour ago: given up", e.status) from None
                logger.warning(f"{e}; polling again in {self.settings.poll_seconds:g}s")
                await interrupts.sleep(self.settings.poll_seconds)  # a Ctrl-C: polled again on resume
                continue
            status, counts = b.get("status"), b.get("request_counts") or {}
            now = (status, counts.get("completed"), counts.get("failed"))
            if now != seen:
                seen = now
                logger.info(
                    f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} {status}: "
                    f"{counts.get('completed', 0)} of {counts.get('total', 0)} answered, "
                    f"{counts.get('failed', 0)} failed"
                )
                if cl.on_progress is not None:
                    try:
                        cl.on_progress(
                            {
                                "batch_id": str(batch_id),
                                "batch_role": cl.role,
                                "batch_status": str(status),
                                **{f"batch_{k}": int(counts.get(k) or 0) for k in ("total", "completed", "failed")},
                            }
                        )
                    except Exception as e:  # noqa: BLE001 - progress is for show: polling goes on
                        logger.warning(f"batch progress not recorded: {type(e).__name__}: {e}")
            if status in TERMINAL:
                return b
            expires = b.get("expires_at")
            if isinstance(expires, (int, float)):
                give_up = float(expires) + LATE_S
            if time.time() > give_up:
                logger.warning(
                    f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} is still {status} an hour after "
                    "its window closed: cancelled, its requests have no answer"
                )
                try:  # so the provider does not go on (and bill) after we stopped waiting
                    await self._api(f"cancel batch {batch_id}", "POST", f"batches/{batch_id}/cancel")
                except BatchApiError:
                    pass
                return {**b, "status": "lost"}
            await interrupts.sleep(self.settings.poll_seconds)  # a Ctrl-C: polled again on resume

    async def _read_back(
        self, batch_id: str, b: dict[str, Any], calls: dict[str, _Call] | None, keys: list[str]
    ) -> None:
        """Every answer of an ended batch journaled (each request it holds, asked for now or not),
        the journal flushed, then the batch marked read: a stop before that mark reads it again."""
        cl = self.client
        lines = []
        for file_id in (b.get("output_file_id"), b.get("error_file_id")):
            if file_id:
                text = (
                    await self._api(f"read file {file_id} of batch {batch_id}", "GET", f"files/{file_id}/content")
                ).text
                lines += text.splitlines()
        outcomes = {}
        for line in lines:
            parsed = _outcome(line)
            if parsed is None:
                self.stats["bad_lines"] += 1
                continue
            outcomes[parsed[0]] = parsed[1:]
        if b.get("status") == "failed" and not outcomes:
            why = "; ".join(
                f"line {e.get('line')}: {e.get('code')}: {e.get('message')}"
                for e in ((b.get("errors") or {}).get("data") or [])[:5]
                if isinstance(e, dict)
            )
            logger.warning(f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} failed: {why or 'no reason given'}")
        known = await self._keys_of(batch_id, calls, b) if outcomes else {}
        for key, (kind, what, status) in outcomes.items():
            if key not in known:  # not one of ours (a provider's mistake): not journaled
                continue
            self._answered[key] = self._journal(key, known[key], kind, what, status)
        for key in keys:  # no line for it: unanswered (then live or failed as configured, never batched again)
            self._answered.setdefault(key, ("failed", f"batch {b.get('status')}: no answer for this request", None))
        if cl.journal is not None:
            await asyncio.to_thread(cl.journal.flush)
            await asyncio.to_thread(cl.journal.end_batch, batch_id, str(b.get("status")))
        ok = sum(1 for k in outcomes if k in known and self._answered[k][0] == "ok")
        if self.stats["bad_lines"]:
            logger.warning(
                f"{cl.metric} {cl.stage}: {self.stats['bad_lines']} line(s) of the batch's files were "
                "not answers of the expected shape; their requests count as unanswered"
            )
        logger.info(
            f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} {b.get('status')}: {ok} answer(s) read, "
            f"{len(outcomes) - ok} failed or expired"
        )

    async def _keys_of(
        self, batch_id: str, calls: dict[str, _Call] | None, b: dict[str, Any]
    ) -> dict[str, tuple[dict, str, int]]:
        """key -> (body, body_json, sample_index) for the requests of the batch: the calls made now,
        or for an earlier batch, the requests it was made from (its input file)."""
        if calls is not None:
            return {k: (c.body, c.body_json, c.sample_index) for k, c in calls.items()}
        text = (
            await self._api(f"read the input of batch {batch_id}", "GET", f"files/{b['input_file_id']}/content")
        ).text
        out = {}
        for line in text.splitlines():
            req = json.loads(line)
            body = req["body"]  # a request asked for now keeps its sample index; another's comes from its seed
            seed = body.get("seed")
            index = seed - int(self.client.conn.params.get("seed", 0)) if isinstance(seed, int) else 0
            out[req["custom_id"]] = self._asked.get(req["custom_id"]) or (body, wire_json(body), max(index, 0))
        return out

    def _journal(self, key: str, request: tuple[dict, str, int], kind: str, what: Any, status: int | None) -> tuple:
        """Record one request's outcome in the journal; (kind, the ChatResult or why, status)."""
        cl = self.client
        body, body_json, sample_index = request
        if kind == "ok":
            parsed = parse_completion(what if isinstance(what, dict) else None)
            if isinstance(parsed, str):
                kind, what = "failed", parsed
            else:
                answer, model, fp, pt, ct = parsed
                result = ChatResult(answer, "ok", None, None, pt, ct, model, fp, 1, key, http_status=200)
                self.stats["ok"] += 1
                if cl.budget is not None:
                    cl.budget.spend((pt or 0) + (ct or 0))
                cl.stats["network_calls"] += 1
                cl._record(key, body_json, sample_index, result, source="batch")
                cl._known_ok.add(key_mark(key))
                self._journaled.add(key)
                return ("ok", result, 200)
        self.stats["failed" if self.settings.on_failure == "fail" else "not_answered"] += 1
        if self.settings.on_failure == "fail":  # the failure is the answer: journaled now
            self._journaled.add(key)
            cl.stats["network_calls"] += 1
            cl.stats["failed"] += 1
            cl._record(
                key,
                body_json,
                sample_index,
                ChatResult(None, "error", f"batch: {what}", None, None, None, None, None, 1, key, http_status=status),
                source="batch",
            )
        return ("failed", what, status)
