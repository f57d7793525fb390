"""Transports: any OpenAI-compatible ``/chat/completions`` endpoint over httpx, or the builtin model.

httpx is the API; an aiohttp transport carries it (``AiohttpBodyTransport``), because on this
kind of machine httpx's default transport spends its CPU in connection-pool bookkeeping at high
concurrency (see DESIGN.md and ``benchmarks/bench_sampling.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import httpx
import yarl

from ..errors import EndpointError
from ..hashing import stable_json
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

    async def post_chat(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        await asyncio.sleep(0)  # let other calls interleave, as over a network
        out = builtin.handle_chat(body, self.conn.profile)
        return TransportResponse(200, out, "")

    async def aclose(self) -> None:
        return None


def scrub_secrets(text: str, conn: Connection) -> str:
    """``text`` (an endpoint's error page, which may echo the request's headers) without the
    connection's secrets: the API key and every header_env value."""
    values = [os.environ.get(conn.api_key_env or "")] + [os.environ.get(env) for env in conn.header_env.values()]
    for v in sorted((v for v in values if v and len(v) >= 4), key=len, reverse=True):
        text = text.replace(v, "***")
    return text


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


# aiohttp's failures as httpx's (the httpx transport contract), the aiohttp error kept as the
# cause: describe_failure reads the chain. The first match in this order wins (most specific first).
_HTTPX_ERRORS: list[tuple[type, type]] = [
    (aiohttp.ConnectionTimeoutError, httpx.ConnectTimeout),
    (aiohttp.SocketTimeoutError, httpx.ReadTimeout),
    (aiohttp.ServerTimeoutError, httpx.TimeoutException),
    (aiohttp.ClientConnectorError, httpx.ConnectError),
    (aiohttp.ServerDisconnectedError, httpx.RemoteProtocolError),
    (aiohttp.ClientPayloadError, httpx.ReadError),
    (aiohttp.ClientConnectionError, httpx.NetworkError),
    (aiohttp.ClientError, httpx.TransportError),
]


class AiohttpBodyTransport(httpx.AsyncBaseTransport):
    """An httpx transport on one aiohttp session (its pool holds at most ``max_connections``),
    for requests whose answer is read whole: the answer comes back as an ``httpx.Response``
    holding its bytes, with no stream wrapper and no async iteration per chunk.

    Measured against ``httpx-aiohttp``'s transport (which wraps the answer's stream) and aiohttp
    called directly, client CPU per call at 1,024 calls in flight on 2 cores (2026-11-30,
    ``bench_sampling.py`` workload): httpx-aiohttp 0.42-0.52 ms, this 0.39-0.44 ms, aiohttp
    directly 0.32-0.45 ms (bare aiohttp loop 0.26-0.29). httpx stays the API (DESIGN.md), so the
    httpx request and response objects remain the client's largest cost at that load."""

    def __init__(self, max_connections: int, keepalive_s: float = 5.0):
        self.max_connections, self.keepalive_s = max_connections, keepalive_s
        self.session: aiohttp.ClientSession | None = None
        self._timeouts: dict[tuple, aiohttp.ClientTimeout] = {}
        self._urls: dict[httpx.URL, yarl.URL] = {}

    def _open(self, https: bool) -> aiohttp.ClientSession:
        # TLS as httpx makes it (certifi's roots, no SSLKEYLOGFILE from the environment)
        connector = aiohttp.TCPConnector(limit=self.max_connections, limit_per_host=0,
                                         keepalive_timeout=self.keepalive_s,
                                         ssl=httpx.create_ssl_context(trust_env=False) if https else True)
        self.session = aiohttp.ClientSession(connector=connector, trust_env=False, cookie_jar=aiohttp.DummyCookieJar())
        return self.session

    def _timeout(self, t: dict[str, float | None]) -> aiohttp.ClientTimeout:
        """httpx's connect / read / pool timeouts as aiohttp's (its ``connect`` covers the wait for
        a connection of the pool), made once per value (row deadlines give many: a few kept)."""
        key = (t.get("connect"), t.get("read"), t.get("pool"))
        timeout = self._timeouts.get(key)
        if timeout is None:
            timeout = self._timeouts[key] = aiohttp.ClientTimeout(total=None, sock_connect=key[0], sock_read=key[1],
                                                                  connect=key[2])
            if len(self._timeouts) > 64:
                self._timeouts.pop(next(iter(self._timeouts)))
        return timeout

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self.session or self._open(request.url.scheme == "https")
        url = self._urls.get(request.url)
        if url is None:  # parsed once per URL, not per call
            url = self._urls[request.url] = yarl.URL(str(request.url), encoded=True)
        try:
            async with session.request(request.method, url, headers=request.headers, data=request.content or None,
                                       timeout=self._timeout(request.extensions.get("timeout", {})),
                                       allow_redirects=False, compress=None) as r:
                content = await r.read()
                status, headers = r.status, r.raw_headers
        except aiohttp.ClientError as e:
            for source, target in _HTTPX_ERRORS:
                if isinstance(e, source):
                    raise target(str(e) or type(e).__name__, request=request) from e
            raise
        # the content is already decoded (aiohttp's auto_decompress): drop the header that says
        # otherwise, or httpx would decode it again
        headers = tuple((k, v) for k, v in headers if k.lower() != b"content-encoding")
        return httpx.Response(status, headers=headers, content=content, request=request,
                              extensions={"http_version": b"HTTP/1.1"})

    async def aclose(self) -> None:
        session, self.session = self.session, None
        if session is not None:
            await session.close()


class HttpTransport:
    """POST /chat/completions: an httpx request, carried by ``AiohttpBodyTransport``.

    The request goes straight to the transport: an ``httpx.AsyncClient`` would add URL merging,
    cookie extraction and redirect handling on every call, which an API endpoint does not need
    and which cost about 0.2 ms of CPU per call (benchmarks/bench_sampling.py)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self.transport = AiohttpBodyTransport(conn.max_connections)
        self.url = httpx.URL(conn.endpoint_id() + "/chat/completions")
        self.headers = httpx.Headers(resolve_headers(conn))  # normalised once, copied per request

    async def post_chat(self, body: dict[str, Any], timeout: float, text: str | None = None) -> TransportResponse:
        """``text``: the body as JSON when the caller has it already (``stable_json``)."""
        # connect and read timeouts inside the transport, so a failure says which it was; the outer
        # bound (a little later) only catches an answer trickled in so slowly that no read times out
        limits = {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        request = httpx.Request("POST", self.url, headers=self.headers,
                                content=(text if text is not None else stable_json(body)).encode("utf-8"),
                                extensions={"timeout": limits})
        bound = timeout * 1.05 + 0.05
        if hasattr(asyncio, "timeout"):  # 3.11+: no task per call, as wait_for makes (visible at 1,024 in flight)
            async with asyncio.timeout(bound):
                resp = await self.transport.handle_async_request(request)
        else:
            resp = await asyncio.wait_for(self.transport.handle_async_request(request), bound)
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
