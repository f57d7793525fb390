"""The Batch API's side of a connection (docs/batch-api.md): ``BatchProvider``, an OpenAI-compatible
endpoint with its ``/v1/files`` and ``/v1/batches``, its ``BatchApiError``, and ``_outcome``, one
line of a batch's output or error file read. ``batch.BatchRunner`` drives them for a client.
"""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any, ClassVar

import httpx

from ..connections import Connection
from ..errors import EndpointError
from .openai_compatible import OpenAICompatibleProvider, resolve_headers, scrub_secrets
from .provider import Capabilities

TRANSIENT = {408, 409, 425, 429}


class BatchApiError(EndpointError):
    def __init__(self, message: str, status: int | None):
        super().__init__(message)
        self.status = status  # None: no answer (a connection error)

    @property
    def transient(self) -> bool:
        return self.status is None or self.status in TRANSIENT or self.status >= 500


class BatchProvider(OpenAICompatibleProvider):
    """An OpenAI-compatible endpoint with its Batch API: live requests as its parent sends them (the
    endpoint check, a batch's request sent again live), and the Batch API's files and batches
    (:meth:`api`), which a client's :class:`BatchRunner` drives."""

    capabilities: ClassVar[Capabilities] = replace(OpenAICompatibleProvider.capabilities, batch=True)

    def __init__(self, conn: Connection):
        super().__init__(conn)
        self._http: httpx.AsyncClient | None = None

    def _client(self) -> httpx.AsyncClient:
        if self._http is None:
            headers = {k: v for k, v in resolve_headers(self.conn).items() if k.lower() != "content-type"}
            self._http = httpx.AsyncClient(
                base_url=(self.conn.base_url or "").rstrip("/") + "/", headers=headers, timeout=120.0
            )
        return self._http

    async def api(self, where: str, what: str, method: str, path: str, **kw: Any) -> httpx.Response:
        """One request of the Batch API (``path`` under the base URL); raises :class:`BatchApiError`
        for no answer or an HTTP error, the endpoint's words without the connection's secrets."""
        try:
            r = await self._client().request(method, path, **kw)
        except httpx.HTTPError as e:
            raise BatchApiError(
                f"{where}: the Batch API cannot be reached to {what}: {type(e).__name__}: "
                f"{scrub_secrets(str(e), self.conn)}",
                None,
            ) from None
        if r.status_code >= 400:
            raise BatchApiError(
                f"{where}: the Batch API refused to {what}: HTTP {r.status_code}: "
                f"{scrub_secrets(r.text, self.conn)[:300]}",
                r.status_code,
            )
        return r

    async def close_api(self) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None


def _outcome(line: str) -> tuple[str, str, Any, int | None] | None:
    """(custom id, "ok" | "failed", the completion or why, the endpoint's status) of one line of a
    batch's output or error file; None for a line of another shape."""
    if not line.strip():
        return None
    try:
        rec = json.loads(line)
    except json.JSONDecodeError:
        return None
    if not isinstance(rec, dict) or not isinstance(rec.get("custom_id"), str):
        return None
    resp, err = rec.get("response"), rec.get("error")
    resp = resp if isinstance(resp, dict) else {}
    status = resp.get("status_code") if isinstance(resp.get("status_code"), int) else None
    if status == 200 and not err and isinstance(resp.get("body"), dict):
        return rec["custom_id"], "ok", resp["body"], 200
    if isinstance(err, dict):
        return rec["custom_id"], "failed", f"{err.get('code')}: {err.get('message')}", status
    if err:
        return rec["custom_id"], "failed", str(err)[:300], status
    return rec["custom_id"], "failed", f"HTTP {status}: {json.dumps(resp.get('body'))[:300]}", status
