"""What a model call came to (:class:`ChatResult`), whether answered, cached or failed."""

from __future__ import annotations

from dataclasses import dataclass


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
