"""A call's request body and its key (the identity the journal's cache answers by)."""

from __future__ import annotations

import functools
import hashlib
from typing import Any

from ..connections import Connection
from ..hashing import stable_json


def build_body(
    conn: Connection, messages: list[dict[str, str]], temperature: float, max_tokens: int | None, sample_index: int
) -> dict[str, Any]:
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


def call_key(
    endpoint_id: str,
    body: dict[str, Any],
    sample_index: int,
    template_version: str,
    attempt: int = 0,
    body_json: str | None = None,
) -> str:
    """The call's identity: endpoint, body, sample index, prompt-template version and, for a
    re-ask of an unusable answer, its attempt number (so a re-ask is never answered from the
    cache by an earlier re-ask that got the same prose). The hash of ``stable_json`` of those, put
    together around ``body_json`` (``stable_json(body)``, when the caller has it) exactly as
    ``stable_json`` would write the whole. The key is canonical (sorted keys); the request sent
    and journaled keeps the body's own order (``hashing.wire_json``)."""
    if body_json is None:
        body_json = stable_json(body)
    text = "".join(
        (
            f'{{"attempt":{_scalar_json(attempt)},' if attempt else "{",
            '"body":',
            body_json,
            ',"endpoint":',
            _scalar_json(endpoint_id),
            ',"sample_index":',
            _scalar_json(sample_index),
            ',"template":',
            _scalar_json(template_version),
            "}",
        )
    )
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.lru_cache(maxsize=1024, typed=True)
def _scalar_json(x: Any) -> str:
    """``stable_json`` of a key's scalar (an endpoint, a template version, an index), remembered:
    a client asks for the same few every call. (Keyed by value and type: 1, 1.0 and True differ.)"""
    return stable_json(x)
