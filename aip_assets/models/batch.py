"""A connection's calls through the provider's Batch API (issue 15): OpenAI's ``/v1/files`` and
``/v1/batches``, about half the price of live calls, answers within the completion window.

With ``batch.enabled`` a client (``ModelClient``) hands every call the cache does not answer to
its ``BatchRunner`` instead of sending it. The runner collects the calls a stage makes at once
(the calls stop coming for ``QUIET_S``, or ``max_requests`` are waiting), then:

1. polls again any batch of this part (run, metric, stage, role, endpoint) the journal holds as
   still pending that has some of these calls: a stage stopped or crashed while polling resumes
   the same batch and pays nothing twice;
2. sends the rest as a new batch: one JSONL line per call, ``custom_id`` the call's key in the
   journal, uploaded (``POST /v1/files``, purpose ``batch``), the batch created
   (``POST /v1/batches``) and journaled (``batches`` table) before the first poll;
3. polls every ``poll_seconds``, logging each change of status and counts;
4. reads the output and error files and records each answer in the journal as a live call
   would be recorded, with source ``batch``. A request the batch failed or let expire is sent
   again as a live call (``on_failure: live``) or recorded as failed with the reason (``fail``).

Budget caps count batched calls as calls. The row deadline does not apply to batched calls (a
batch answers within hours); a live fallback has it as any live call.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from ..errors import EndpointError

if TYPE_CHECKING:
    from .client import ChatResult, ModelClient

logger = logging.getLogger("aip_assets")
QUIET_S = 0.2  # a stage's calls come at once: this long without a new one, the batch is complete
TERMINAL = {"completed", "failed", "expired", "cancelled"}
POLL_ERRORS = 10  # a poll that fails this many times in a row (connection, 5xx) fails the stage
# A batching client in this task: work items are not bounded by the metric's concurrency then
# (``metrics.base.run_bounded``), so every call of the stage reaches the batch at once.
BATCHING: contextvars.ContextVar[int] = contextvars.ContextVar("aip_batching", default=0)


@dataclass
class _Call:
    key: str
    body: dict[str, Any]
    body_json: str
    sample_index: int
    retries: int
    timeout: float
    future: asyncio.Future


class BatchRunner:
    def __init__(self, client: "ModelClient"):
        self.client = client
        self.settings = client.conn.batch
        self.pending: list[_Call] = []
        self._collector: asyncio.Task | None = None
        self._running: set[asyncio.Task] = set()
        self._resumed: dict[str, asyncio.Task] = {}  # batch id -> the task polling it (one per batch)
        self._http: httpx.AsyncClient | None = None
        self.stats: Counter = Counter()

    # ------------------------------------------------------------------ collecting
    async def call(self, key: str, body: dict[str, Any], body_json: str, sample_index: int, retries: int,
                   timeout: float) -> "ChatResult":
        future = asyncio.get_running_loop().create_future()
        self.pending.append(_Call(key, body, body_json, sample_index, retries, timeout, future))
        if self._collector is None or self._collector.done():
            self._collector = asyncio.create_task(self._collect())
        return await future

    async def _collect(self) -> None:
        while self.pending:
            seen = -1
            while len(self.pending) != seen and len(self.pending) < self.settings.max_requests:
                seen = len(self.pending)
                await asyncio.sleep(QUIET_S)
            calls, self.pending = self.pending[:self.settings.max_requests], self.pending[self.settings.max_requests:]
            task = asyncio.create_task(self._run(calls))
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def aclose(self) -> None:
        for task in [*self._running, *([self._collector] if self._collector else [])]:
            task.cancel()
        if self._http is not None:
            await self._http.aclose()

    # ------------------------------------------------------------------ one batch's worth of calls
    async def _run(self, calls: list[_Call]) -> None:
        try:
            await self._answer(calls)
        except BaseException as e:  # noqa: BLE001 - every waiting call learns it (a failed upload, a cap)
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
        outcomes: dict[str, tuple[str, Any]] = {}
        journal = cl.journal
        if journal is not None:  # 1. a batch of this part still pending (a stop, a crash): poll it again
            part = (cl.run_id, cl.metric, cl.stage, cl.role, cl.endpoint_id)
            opened = await asyncio.to_thread(journal.open_batches, *part)
            for b in opened:
                if not set(json.loads(b["call_keys"])) & set(by_key):
                    continue
                task = self._resumed.get(b["batch_id"])
                if task is None:
                    self.stats["resumed"] += 1
                    logger.info(f"{cl.metric} {cl.stage}: {cl.role} batch {b['batch_id']} was sent before; polling it "
                                "again (nothing is sent twice)")
                    task = self._resumed[b["batch_id"]] = asyncio.create_task(self._finish(b["batch_id"]))
                outcomes.update(await asyncio.shield(task))
        rest = [k for k in by_key if k not in outcomes]
        if rest:  # 2. a new batch for the others
            if cl.budget is not None:
                allowed = []
                for k in rest:
                    try:
                        await cl.budget.areserve()
                    except Exception as e:  # noqa: BLE001 - the cap: these calls fail as live ones would
                        for c in by_key.pop(k):
                            c.future.set_exception(e)
                        continue
                    allowed.append(k)
                rest = allowed
            if rest:
                batch_id = await self._send(rest, {k: by_key[k][0] for k in rest})
                outcomes.update(await self._finish(batch_id))
        for key, waiting in by_key.items():  # 3. each call's answer, recorded as a live one would be
            result = await self._result(waiting[0], outcomes.get(key))
            for c in waiting:
                if not c.future.done():
                    c.future.set_result(result)

    async def _result(self, c: _Call, outcome: tuple[str, Any] | None) -> "ChatResult":
        from .client import ChatResult, _parse_completion

        cl = self.client
        kind, what = outcome or ("failed", "the batch ended without an answer for this request")
        if kind == "ok":
            parsed = _parse_completion(what if isinstance(what, dict) else None)
            if isinstance(parsed, str):
                kind, what = "failed", parsed
            else:
                answer, model, fp, pt, ct = parsed
                result = ChatResult(answer, "ok", None, None, pt, ct, model, fp, 1, c.key, http_status=200)
                self.stats["ok"] += 1
                if cl.budget is not None:
                    cl.budget.spend((pt or 0) + (ct or 0))
                self._record(c, result)
                return result
        reason = f"batch: {what}"
        if self.settings.on_failure == "live":
            self.stats["live"] += 1
            logger.info(f"{cl.metric} {cl.stage}: {cl.role} call {c.key[:12]} sent live ({reason})")
            return await cl._live(c.body, c.key, c.sample_index, c.retries, c.timeout, c.body_json)
        self.stats["failed"] += 1
        result = ChatResult(None, "error", reason, None, None, None, None, None, 1, c.key)
        self._record(c, result)
        return result

    def _record(self, c: _Call, result: "ChatResult") -> None:
        from .journal import key_mark

        cl = self.client
        cl.stats["network_calls"] += 1
        if not result.ok:
            cl.stats["failed"] += 1
        cl._record(c.key, c.body_json, c.sample_index, result, source="batch")
        if result.ok:
            cl._known_ok.add(key_mark(c.key))

    # ------------------------------------------------------------------ the provider's API
    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            from .openai_compatible import resolve_headers

            headers = {k: v for k, v in resolve_headers(self.client.conn).items() if k.lower() != "content-type"}
            self._http = httpx.AsyncClient(base_url=(self.client.conn.base_url or "").rstrip("/") + "/",
                                           headers=headers, timeout=120.0)
        return self._http

    async def _api(self, what: str, method: str, path: str, **kw: Any) -> httpx.Response:
        cl = self.client
        try:
            r = await self._client().request(method, path, **kw)
        except httpx.HTTPError as e:
            raise EndpointError(f"{cl.role} endpoint {cl.conn.base_url}: the Batch API cannot be reached to {what}: "
                                f"{type(e).__name__}: {e}") from None
        if r.status_code >= 400:
            raise EndpointError(f"{cl.role} endpoint {cl.conn.base_url}: the Batch API refused to {what}: "
                                f"HTTP {r.status_code}: {r.text[:300]}")
        return r

    async def _send(self, keys: list[str], calls: dict[str, _Call]) -> str:
        cl = self.client
        content = "".join(json.dumps({"custom_id": k, "method": "POST", "url": "/v1/chat/completions",
                                      "body": calls[k].body}) + "\n" for k in keys).encode()
        f = (await self._api("upload the requests", "POST", "files", data={"purpose": "batch"},
                             files={"file": (f"{cl.run_id}-{cl.stage}-{cl.role}.jsonl", content,
                                             "application/jsonl")})).json()
        b = (await self._api("create the batch", "POST", "batches", json={
            "input_file_id": f["id"], "endpoint": "/v1/chat/completions",
            "completion_window": self.settings.completion_window,
            "metadata": {"run_id": cl.run_id, "metric": cl.metric, "stage": cl.stage, "role": cl.role}})).json()
        if cl.journal is not None:  # before the first poll: a stop from here on resumes this batch
            rec = {"batch_id": b["id"], "run_id": cl.run_id, "metric": cl.metric, "stage": cl.stage, "role": cl.role,
                   "endpoint": cl.endpoint_id, "input_file_id": f["id"], "call_keys": json.dumps(keys),
                   "status": "pending", "created_at": time.time(), "ended_at": None}
            await asyncio.to_thread(cl.journal.save_batch, rec)
        self.stats["batches"] += 1
        self.stats["requests"] += len(keys)
        logger.info(f"{cl.metric} {cl.stage}: {cl.role} batch {b['id']} sent: {len(keys)} request(s) "
                    f"(file {f['id']}); polling every {self.settings.poll_seconds:g}s")
        return str(b["id"])

    async def _finish(self, batch_id: str) -> dict[str, tuple[str, Any]]:
        """Poll until the batch ends; each request's outcome by custom id: ("ok", the chat
        completion) or ("failed", why)."""
        cl = self.client
        seen, errors = None, 0
        while True:
            try:
                b = (await self._api(f"read batch {batch_id}", "GET", f"batches/{batch_id}")).json()
                errors = 0
            except EndpointError as e:
                errors += 1
                if errors >= POLL_ERRORS or "HTTP 4" in str(e):
                    raise
                logger.warning(f"{e}; polling again in {self.settings.poll_seconds:g}s")
                await asyncio.sleep(self.settings.poll_seconds)
                continue
            status, counts = b.get("status"), b.get("request_counts") or {}
            now = (status, counts.get("completed"), counts.get("failed"))
            if now != seen:
                seen = now
                logger.info(f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} {status}: "
                            f"{counts.get('completed', 0)} of {counts.get('total', 0)} answered, "
                            f"{counts.get('failed', 0)} failed")
            if status in TERMINAL:
                break
            await asyncio.sleep(self.settings.poll_seconds)
        outcomes: dict[str, tuple[str, Any]] = {}
        for file_id in (b.get("output_file_id"), b.get("error_file_id")):
            if not file_id:
                continue
            text = (await self._api(f"read file {file_id} of batch {batch_id}", "GET", f"files/{file_id}/content")).text
            for line in text.splitlines():
                if not line.strip():
                    continue
                rec = json.loads(line)
                resp, err = rec.get("response") or {}, rec.get("error")
                if resp.get("status_code") == 200 and not err:
                    outcomes[rec["custom_id"]] = ("ok", resp.get("body"))
                elif err:
                    outcomes[rec["custom_id"]] = ("failed", f"{err.get('code')}: {err.get('message')}")
                else:
                    outcomes[rec["custom_id"]] = (
                        "failed", f"HTTP {resp.get('status_code')}: {json.dumps(resp.get('body'))[:300]}")
        if status == "failed" and not outcomes:
            why = "; ".join(f"line {e.get('line')}: {e.get('code')}: {e.get('message')}"
                            for e in ((b.get("errors") or {}).get("data") or [])[:5])
            logger.warning(f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} failed: {why or 'no reason given'}")
            outcomes = {}  # every request: "the batch ended without an answer" (then live or failed)
        if cl.journal is not None:
            await asyncio.to_thread(cl.journal.end_batch, batch_id, str(status))
        cl_answers = sum(1 for kind, _ in outcomes.values() if kind == "ok")
        logger.info(f"{cl.metric} {cl.stage}: {cl.role} batch {batch_id} {status}: {cl_answers} answer(s) read, "
                    f"{len(outcomes) - cl_answers} failed or expired")
        return outcomes
