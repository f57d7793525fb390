"""OpenAI's Batch API, served by the builtin model, so the batch path is tested offline.

The endpoints and shapes of OpenAI's Files and Batches API, for ``/v1/chat/completions`` only:

- ``POST /v1/files`` (multipart: ``purpose=batch``, ``file``): stores a file, returns its object;
  ``GET /v1/files/{id}``; ``GET /v1/files/{id}/content``.
- ``POST /v1/batches`` (``input_file_id``, ``endpoint``, ``completion_window`` "24h",
  ``metadata``): validates the input file (one JSON object a line with a unique ``custom_id``,
  ``method`` POST, ``url`` the endpoint, a ``body``; at most ``MAX_REQUESTS`` lines). A bad file
  gives a batch ``failed`` with ``errors.data`` naming each bad line, as OpenAI does.
- ``GET /v1/batches/{id}``: the batch as it stands; ``GET /v1/batches`` (``limit``, ``after``):
  the batches, newest first. ``POST /v1/batches/{id}/cancel``.

The answers are computed when the batch is created (the builtin's answers are a pure function of
the request), and what a poll sees is a function of the time since: ``validating`` for the first
tenth of ``seconds``, ``in_progress`` (``request_counts.completed`` growing) until nine tenths,
``finalizing``, then ``completed``, or ``expired`` when some requests were picked to miss the
window. Then the output file holds one line per answered request (``response.status_code`` 200,
``body`` the chat completion) and the error file one per failed request (``status_code`` 500 with
an error body: the server's ``fail_rate``/``fail_substring`` pick them, by the body) or expired one
(``error.code`` ``batch_expired``). ``expire_rate`` picks requests to expire by their body, so a
resubmitted request expires again; ``expire_first`` expires every request of the first
``expire_first`` batches only (a retried batch then completes). ``clock`` is injectable so tests
step time instead of sleeping.

``stats``: files uploaded, batches created, requests in batches, polls; what the tests count
("a resumed poll creates no second batch").
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from ..hashing import stable_json

ENDPOINT = "/v1/chat/completions"
WINDOWS = ("24h",)
MAX_REQUESTS = 50_000  # OpenAI's limit per batch
Answer = Callable[[dict[str, Any]], "tuple[int, dict[str, Any]]"]


def _id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex[:24]}"


class BatchService:
    def __init__(
        self,
        answer: Answer,
        seconds: float = 2.0,
        expire_rate: float = 0.0,
        expire_first: int = 0,
        clock: Callable[[], float] = time.time,
        pick: Callable[..., float] | None = None,
    ):
        from ..hashing import u01

        self.answer = answer  # a request body -> (HTTP status, JSON body), as the live endpoint answers it
        self.seconds = seconds
        self.expire_rate = expire_rate
        self.expire_first = expire_first
        self.clock = clock
        self.pick = pick or u01
        self.files: dict[str, dict[str, Any]] = {}  # id -> {"object": {...}, "content": bytes}
        self.batches: dict[str, dict[str, Any]] = {}  # id -> {"object": {...}, "results": [...]}
        self.stats: Counter = Counter()

    # -- files
    def add_file(self, content: bytes, filename: str, purpose: str) -> dict[str, Any]:
        file_id = _id("file-")
        obj: dict[str, Any] = {
            "id": file_id,
            "object": "file",
            "bytes": len(content),
            "created_at": int(self.clock()),
            "filename": filename,
            "purpose": purpose,
        }
        self.files[file_id] = {"object": obj, "content": content}
        return obj

    # -- batches
    def create(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """(HTTP status, the batch object or an error body)."""
        file_id = str(body.get("input_file_id"))
        if body.get("endpoint") != ENDPOINT:
            return 400, _error(f"endpoint must be {ENDPOINT}", "invalid_request_error", "endpoint")
        if body.get("completion_window") not in WINDOWS:
            return 400, _error(
                f"completion_window must be one of {', '.join(WINDOWS)}", "invalid_request_error", "completion_window"
            )
        if file_id not in self.files:
            return 404, _error(f"No such File object: {file_id}", "invalid_request_error", "input_file_id")
        if self.files[file_id]["object"]["purpose"] != "batch":
            return 400, _error("the input file's purpose must be batch", "invalid_request_error", "input_file_id")
        now = self.clock()
        obj: dict[str, Any] = {
            "id": _id("batch_"),
            "object": "batch",
            "endpoint": ENDPOINT,
            "errors": None,
            "input_file_id": file_id,
            "completion_window": body["completion_window"],
            "status": "validating",
            "output_file_id": None,
            "error_file_id": None,
            "created_at": int(now),
            "in_progress_at": None,
            "expires_at": int(now) + 86400,
            "finalizing_at": None,
            "completed_at": None,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 0, "completed": 0, "failed": 0},
            "metadata": body.get("metadata") or {},
        }
        requests, errors = _parse(self.files[file_id]["content"])
        entry: dict[str, Any] = {"object": obj, "t0": now, "results": [], "cancelled_at": None}
        self.batches[obj["id"]] = entry
        if errors:
            obj.update(status="failed", failed_at=int(now), errors={"object": "list", "data": errors})
            self.stats["failed_validation"] += 1
            return 200, dict(obj)
        self.stats["batches"] += 1
        expire_all = self.stats["batches"] <= self.expire_first
        for req in requests:
            self.stats["batch_requests"] += 1
            if expire_all or (self.expire_rate and self.pick("expire", stable_json(req["body"])) < self.expire_rate):
                entry["results"].append((req["custom_id"], "expired", None))
                continue
            status, answer = self.answer(req["body"])
            entry["results"].append((req["custom_id"], "ok" if status == 200 else "failed", (status, answer)))
        obj["request_counts"]["total"] = len(requests)
        return 200, self.view(obj["id"])

    def cancel(self, batch_id: str) -> dict[str, Any] | None:
        entry = self.batches.get(batch_id)
        if entry is None:
            return None
        if (
            self.view(batch_id)["status"] in ("validating", "in_progress", "finalizing")
            and entry["cancelled_at"] is None
        ):
            entry["cancelled_at"] = self.clock()
        return self.view(batch_id)

    def view(self, batch_id: str) -> dict[str, Any]:
        """The batch as a poll sees it now (its files made when it ends)."""
        entry = self.batches[batch_id]
        obj = entry["object"]
        if obj["status"] in ("failed", "completed", "expired", "cancelled"):
            return dict(obj)
        done_at = entry["t0"] + self.seconds
        now = entry["cancelled_at"] if entry["cancelled_at"] is not None else self.clock()
        elapsed = (now - entry["t0"]) / self.seconds if self.seconds > 0 else 1.0
        results = entry["results"]
        ran = [r for r in results if r[1] != "expired"]
        if elapsed >= 0.1:
            obj["in_progress_at"] = obj["in_progress_at"] or int(entry["t0"] + 0.1 * self.seconds)
        share = min(1.0, max(0.0, (elapsed - 0.1) / 0.8))
        so_far = ran[: int(len(ran) * share)]
        obj["request_counts"] = {
            "total": len(results),
            "completed": sum(r[1] == "ok" for r in so_far),
            "failed": sum(r[1] == "failed" for r in so_far),
        }
        if entry["cancelled_at"] is not None:
            obj.update(status="cancelled", cancelling_at=int(now), cancelled_at=int(now))
            self._files(batch_id, so_far, [])
        elif elapsed < 0.1:
            obj["status"] = "validating"
        elif elapsed < 0.9:
            obj["status"] = "in_progress"
        elif elapsed < 1.0:
            obj.update(status="finalizing", finalizing_at=obj["finalizing_at"] or int(entry["t0"] + 0.9 * self.seconds))
        else:
            expired = [r for r in results if r[1] == "expired"]
            obj["request_counts"]["failed"] += len(expired)
            if expired:
                obj.update(status="expired", expired_at=int(done_at))
            else:
                obj.update(status="completed", completed_at=int(done_at))
            self._files(batch_id, ran, expired)
        return dict(obj)

    def _files(self, batch_id: str, ran: list, expired: list) -> None:
        obj = self.batches[batch_id]["object"]
        out: list[dict[str, Any]] = []
        err: list[dict[str, Any]] = []
        for custom_id, kind, answer in ran:
            status, body = answer
            line = {
                "id": _id("batch_req_"),
                "custom_id": custom_id,
                "response": {"status_code": status, "request_id": _id("req_"), "body": body},
                "error": None,
            }
            (out if kind == "ok" else err).append(line)
        for custom_id, _, _ in expired:
            err.append(
                {
                    "id": _id("batch_req_"),
                    "custom_id": custom_id,
                    "response": None,
                    "error": {
                        "code": "batch_expired",
                        "message": "This request could not be executed before the completion window expired.",
                    },
                }
            )
        if out:
            obj["output_file_id"] = self.add_file(_jsonl(out), f"{batch_id}_output.jsonl", "batch_output")["id"]
        if err:
            obj["error_file_id"] = self.add_file(_jsonl(err), f"{batch_id}_error.jsonl", "batch_output")["id"]

    # -- HTTP
    def routes(self, app, guard: Callable[[Any], Any]) -> None:
        """Add the endpoints to an aiohttp app; ``guard(request)`` returns a response to send instead
        (an unauthorised request), or None."""
        from aiohttp import web

        async def upload(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            form = await request.post()
            purpose, file = form.get("purpose"), form.get("file")
            if purpose != "batch" or not isinstance(file, web.FileField):
                return web.json_response(
                    _error("a multipart form with purpose=batch and a file is needed", "invalid_request_error", "file"),
                    status=400,
                )
            self.stats["files"] += 1
            return web.json_response(self.add_file(file.file.read(), file.filename or "upload.jsonl", "batch"))

        async def file_object(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            f = self.files.get(request.match_info["file_id"])
            if f is None:
                return web.json_response(_error("No such File object", "invalid_request_error", "id"), status=404)
            return web.json_response(f["object"])

        async def file_content(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            f = self.files.get(request.match_info["file_id"])
            if f is None:
                return web.json_response(_error("No such File object", "invalid_request_error", "id"), status=404)
            return web.Response(body=f["content"], content_type="application/octet-stream")

        async def create(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            try:
                body = await request.json()
            except json.JSONDecodeError:
                return web.json_response(_error("body is not JSON", "invalid_request_error", None), status=400)
            status, out = self.create(body if isinstance(body, dict) else {})
            return web.json_response(out, status=status)

        async def get(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            batch_id = request.match_info["batch_id"]
            if batch_id not in self.batches:
                return web.json_response(_error("No such Batch object", "invalid_request_error", "id"), status=404)
            self.stats["polls"] += 1
            return web.json_response(self.view(batch_id))

        async def listing(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            ids = list(reversed(self.batches))  # newest first, as OpenAI lists them
            after = request.query.get("after")
            if after in self.batches:
                ids = ids[ids.index(after) + 1 :]
            limit = max(1, min(100, int(request.query.get("limit", "20") or 20)))
            page = [self.view(i) for i in ids[:limit]]
            return web.json_response(
                {
                    "object": "list",
                    "data": page,
                    "has_more": len(ids) > limit,
                    "first_id": page[0]["id"] if page else None,
                    "last_id": page[-1]["id"] if page else None,
                }
            )

        async def cancel(request: web.Request) -> web.Response:
            if (refused := guard(request)) is not None:
                return refused
            out = self.cancel(request.match_info["batch_id"])
            if out is None:
                return web.json_response(_error("No such Batch object", "invalid_request_error", "id"), status=404)
            return web.json_response(out)

        for prefix in ("/v1", ""):
            app.router.add_post(f"{prefix}/files", upload)
            app.router.add_get(f"{prefix}/files/{{file_id}}", file_object)
            app.router.add_get(f"{prefix}/files/{{file_id}}/content", file_content)
            app.router.add_post(f"{prefix}/batches", create)
            app.router.add_get(f"{prefix}/batches", listing)
            app.router.add_get(f"{prefix}/batches/{{batch_id}}", get)
            app.router.add_post(f"{prefix}/batches/{{batch_id}}/cancel", cancel)


def _error(message: str, kind: str, param: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": None}}


def _jsonl(lines: list[dict[str, Any]]) -> bytes:
    return "".join(json.dumps(line) + "\n" for line in lines).encode()


def _parse(content: bytes) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The input file's requests, and its errors as OpenAI lists them (code, message, line)."""
    requests: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    seen: set[str] = set()

    def bad(line: int, code: str, message: str) -> None:
        errors.append({"code": code, "message": message, "param": None, "line": line})

    for n, raw in enumerate(content.decode("utf-8", errors="replace").splitlines(), 1):
        if not raw.strip():
            continue
        try:
            req = json.loads(raw)
        except json.JSONDecodeError:
            bad(n, "invalid_json_line", "This line is not parseable as valid JSON.")
            continue
        if not isinstance(req, dict) or not isinstance(req.get("custom_id"), str) or not req["custom_id"]:
            bad(n, "missing_required_parameter", "custom_id is required.")
        elif req["custom_id"] in seen:
            bad(n, "duplicate_custom_id", f"The custom_id {req['custom_id']} is duplicated.")
        elif req.get("method") != "POST":
            bad(n, "invalid_method", "method must be POST.")
        elif req.get("url") != ENDPOINT:
            bad(n, "invalid_url", f"url must be {ENDPOINT}, the batch's endpoint.")
        elif not isinstance(req.get("body"), dict):
            bad(n, "missing_required_parameter", "body is required.")
        else:
            seen.add(req["custom_id"])
            requests.append(req)
    if not requests and not errors:
        bad(0, "empty_file", "The input file has no requests.")
    if len(requests) > MAX_REQUESTS:
        bad(0, "too_many_requests", f"A batch holds at most {MAX_REQUESTS} requests; this file has {len(requests)}.")
    return requests, errors
