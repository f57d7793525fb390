"""A scripted OpenAI-compatible server on loopback: the test decides every answer.

Not the builtin model: the answers are whatever text a test writes (natural prose, inline
decisions, empty strings, markdown-wrapped JSON) or HTTP failures, so the project's readers are
tested on what real models send. ``handler(body, n)`` gets the request body and the 1-based
number of the request, and returns the assistant's text, or a :class:`Reply` for a status code,
headers or a raw body, or no answer at all (``Reply(drop=True)``: the connection closed, as by a
server that went down). The endpoint check ("Reply with OK.") is answered with "OK" unless the
handler is asked to see it (``answer_preflight=False``); the structured-output probe (the check's
search for the ``response_format`` an endpoint takes, ``client.negotiate``) is answered with
``{"ok": true}`` in whatever form it comes, as by a server that takes every form, unless the
handler is asked to see it (``answer_probe=False``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aip_assets.models.builtin import ENDPOINT_CHECK as PREFLIGHT
from aip_assets.models.builtin import STRUCTURED_PROBE, start_app_in_thread


@dataclass
class Reply:
    status: int = 200
    text: str | None = None  # the assistant's content (status 200)
    body: dict[str, Any] | None = None  # a raw JSON body instead
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0  # answer this much later (the server stays responsive)
    hold: threading.Event | None = None  # answer once the test sets this (a call kept in flight)
    gzip: bool = False  # the answer compressed (Content-Encoding: gzip)
    drop: bool = False  # no answer: the connection is closed (an outage, a crash)


def last_user(body: dict[str, Any]) -> str:
    return next((m["content"] for m in reversed(body.get("messages") or []) if m["role"] == "user"), "")


def is_preflight(body: dict[str, Any]) -> bool:
    return last_user(body) == PREFLIGHT


def is_probe(body: dict[str, Any]) -> bool:
    return last_user(body) == STRUCTURED_PROBE


class ScriptedServer:
    def __init__(
        self,
        handler: Callable[[dict[str, Any], int], str | Reply],
        answer_preflight: bool = True,
        answer_probe: bool = True,
    ):
        self.handler = handler
        self.answer_preflight = answer_preflight
        self.answer_probe = answer_probe
        self.requests: list[dict[str, Any]] = []  # every body received, preflight and probes included, in order
        self.raw: list[bytes] = []  # the same bodies as the bytes that came on the wire, same order
        self.arrivals: list[float] = []  # time.time() of each, same order
        self.open_now = self.peak_open = 0  # requests received and not yet answered; the most at once
        self._lock = threading.Lock()
        self.url: str | None = None
        self._stop = None

    def app(self):
        from aiohttp import web

        async def chat(request: web.Request) -> web.Response:
            self.open_now += 1  # requests being answered (one event loop: no lock needed)
            self.peak_open = max(self.peak_open, self.open_now)
            try:
                return await answer(request)
            finally:
                self.open_now -= 1

        async def answer(request: web.Request) -> web.Response:
            raw = await request.read()
            body = json.loads(raw)
            with self._lock:
                self.requests.append(body)
                self.raw.append(raw)
                self.arrivals.append(time.time())
                n = len(self.requests)
            if self.answer_preflight and is_preflight(body):
                out: str | Reply = "OK"
            elif self.answer_probe and is_probe(body):
                out = '{"ok": true}'
            else:
                out = self.handler(body, n)
            r = out if isinstance(out, Reply) else Reply(text=out)
            if r.drop:  # the client sees its connection closed without an answer
                request.transport.abort()
                return web.Response(status=204)
            if r.delay_s:
                await asyncio.sleep(r.delay_s)
            while r.hold is not None and not r.hold.is_set():
                await asyncio.sleep(0.01)
            if r.status != 200:
                resp = web.json_response(
                    r.body or {"error": {"message": f"scripted {r.status}"}}, status=r.status, headers=r.headers
                )
            else:
                payload = r.body or {
                    "id": f"scripted-{n}",
                    "object": "chat.completion",
                    "model": body.get("model"),
                    "choices": [
                        {"index": 0, "message": {"role": "assistant", "content": r.text}, "finish_reason": "stop"}
                    ],
                    "usage": {"prompt_tokens": 10, "completion_tokens": len((r.text or "").split())},
                }
                resp = web.json_response(payload, headers=r.headers)
            if r.gzip:
                resp.enable_compression(web.ContentCoding.gzip)
            return resp

        app = web.Application()
        app.router.add_post("/v1/chat/completions", chat)
        return app

    def start(self) -> str:
        self.url, self._stop = start_app_in_thread(self.app())
        return self.url

    def stop(self) -> None:
        if self._stop:
            self._stop()
            self._stop = None

    def bodies(self, preflight: bool = False) -> list[dict[str, Any]]:
        """The bodies received, without the endpoint check's (its "Reply with OK." and its
        structured-output probes) unless ``preflight``."""
        with self._lock:
            return [b for b in self.requests if preflight or not (is_preflight(b) or is_probe(b))]

    def conn(self, **extra) -> dict[str, Any]:
        """A spec connection to this server."""
        return {"provider": "openai", "base_url": self.url, "model": "scripted", **extra}
