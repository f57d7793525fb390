"""Transports: any OpenAI-compatible ``/chat/completions`` endpoint over httpx, or the builtin model.

httpx is the API; the aiohttp transport (``httpx-aiohttp``) carries it, because on this kind of
machine httpx's default transport spends its CPU in connection-pool bookkeeping at high
concurrency (see DESIGN.md and ``benchmarks/bench_sampling.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

from ..errors import EndpointError
from ..runspec import Connection
from . import builtin


@dataclass
class TransportResponse:
    status_code: int
    body: dict[str, Any] | None
    text: str
    headers: dict[str, str] = field(default_factory=dict)


class BuiltinTransport:
    """The builtin model in-process: the same handler the HTTP server runs, no network."""

    def __init__(self, conn: Connection):
        self.conn = conn

    async def post_chat(self, body: dict[str, Any], timeout: float) -> TransportResponse:
        await asyncio.sleep(0)  # let other calls interleave, as over a network
        out = builtin.handle_chat(body, self.conn.profile)
        return TransportResponse(200, out, "")

    async def aclose(self) -> None:
        return None


def resolve_headers(conn: Connection) -> dict[str, str]:
    """Request headers with secrets read from the environment now (never stored)."""
    headers = {"Content-Type": "application/json", **conn.headers}
    if conn.api_key_env:
        key = os.environ.get(conn.api_key_env)
        if not key:
            raise EndpointError(f"{conn.base_url}: environment variable {conn.api_key_env} (api_key_env) is not set")
        headers["Authorization"] = f"Bearer {key}"
    for name, env in conn.header_env.items():
        val = os.environ.get(env)
        if val is None:
            raise EndpointError(f"{conn.base_url}: environment variable {env} (header_env.{name}) is not set")
        headers[name] = val
    return headers


class HttpTransport:
    """POST /chat/completions with httpx requests carried by the aiohttp transport.

    The request goes straight to the transport: an ``httpx.AsyncClient`` would add URL merging,
    cookie extraction and redirect handling on every call, which an API endpoint does not need
    and which cost about 0.2 ms of CPU per call (benchmarks/bench_sampling.py).
    """

    def __init__(self, conn: Connection):
        from httpx_aiohttp import AiohttpTransport

        self.conn = conn
        limits = httpx.Limits(max_connections=conn.max_connections, max_keepalive_connections=conn.max_connections)
        self.transport = AiohttpTransport(limits=limits, trust_env=False)
        self.url = httpx.URL(conn.endpoint_id() + "/chat/completions")
        self.headers = resolve_headers(conn)

    async def post_chat(self, body: dict[str, Any], timeout: float) -> TransportResponse:
        # connect and read timeouts inside the transport, so a failure says which it was; the outer
        # bound (a little later) only catches an answer trickled in so slowly that no read times out
        limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        request = httpx.Request("POST", self.url, headers=self.headers, content=json.dumps(body).encode(),
                                extensions={"timeout": limits})

        async def send() -> httpx.Response:
            response = await self.transport.handle_async_request(request)
            try:
                await response.aread()
            finally:
                await response.aclose()
            return response

        bound = timeout * 1.05 + 0.05
        if hasattr(asyncio, "timeout"):  # 3.11+: no task per call, as wait_for makes (visible at 1,024 in flight)
            async with asyncio.timeout(bound):
                resp = await send()
        else:
            resp = await asyncio.wait_for(send(), bound)
        try:
            parsed = json.loads(resp.content)
        except ValueError:
            parsed = None
        if resp.status_code == 200 and isinstance(parsed, dict):
            return TransportResponse(200, parsed, "")
        return TransportResponse(resp.status_code, parsed if isinstance(parsed, dict) else None, resp.text,
                                 dict(resp.headers))

    async def aclose(self) -> None:
        await self.transport.aclose()


def make_transport(conn: Connection):
    return BuiltinTransport(conn) if conn.provider == "builtin" else HttpTransport(conn)
