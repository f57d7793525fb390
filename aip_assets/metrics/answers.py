"""The SUT's answers as the metrics' stages share them: sampled and stored (:func:`sample_probes`,
:func:`response_record`, :func:`given_response`, :func:`answer_status`), twinned for the no-effect
baseline (:func:`baseline_share`, :func:`null_twins`, :func:`is_null`), read back for a pair
(:func:`pair_batch`, :func:`answer_keys`) and checked before a judge sees them
(:func:`answer_problem`, :func:`answers_problem`, :func:`sut_failure`)."""

from __future__ import annotations

import contextlib
import json
import random
from typing import Any

from ..models.client import ChatResult
from .base import StageContext
from .running import run_bounded


def answer_status(ok: bool, text: str | None, error: str | None, empty_error: str) -> tuple[str, str | None]:
    """(status, error) of a SUT answer: ``ok``, ``error`` (the call failed) or ``empty`` (nothing
    visible: empty, whitespace by Unicode and zero-width characters only, or only a ``<think>``
    block, ``readers.text.is_blank``: a failure for completeness, never scored)."""
    from ..readers.text import is_blank

    if not ok:
        return "error", error
    if is_blank(text):
        return "empty", empty_error
    return "ok", None


def response_record(p: dict, r: ChatResult, sample_index: int) -> dict[str, Any]:
    """A ``sut_responses`` row for probe ``p`` from a chat result."""
    status, error = answer_status(r.ok, r.text, r.error, "empty answer: the SUT returned no text")
    return {
        "probe_id": p["probe_id"],
        "input_id": p["input_id"],
        "sample_index": sample_index,
        "response": r.text,
        "status": status,
        "error": error,
        "latency_ms": r.latency_ms,
        "prompt_tokens": r.prompt_tokens,
        "completion_tokens": r.completion_tokens,
        "model": r.model,
        "fingerprint": r.fingerprint,
        "call_key": r.call_key,
        "cached": r.cached,
    }


def given_response(p: dict, text: str | None) -> dict[str, Any]:
    """A ``sut_responses`` row for an answer that came with the dataset (not sampled)."""
    status, error = answer_status(True, text, None, "empty answer in the dataset")
    return {
        "probe_id": p["probe_id"],
        "input_id": p["input_id"],
        "sample_index": 0,
        "response": text,
        "status": status,
        "error": error,
        "model": "dataset",
        "cached": False,
    }


def baseline_share(ctx: StageContext, sut_temperature: float) -> float:
    """The share of persona pairs that get a null twin (the no-effect baseline): the run spec's
    ``baseline_share``, else 0.25 when the SUT samples (``sut_temperature`` > 0), else 0."""
    entry = ctx.spec.metrics.get(ctx.metric) if ctx.spec is not None else None
    if entry is not None and entry.baseline_share is not None:
        return float(entry.baseline_share)
    return DEFAULT_BASELINE_SHARE if sut_temperature > 0 else 0.0


DEFAULT_BASELINE_SHARE = 0.25


def null_twins(pairs: list[dict], share: float, seed_key: str) -> list[dict]:
    """Null pairs for a row's persona pairs: each pair, with probability ``share`` (seeded by its
    id), gets a twin that compares one of its personas (seeded) with itself: its first answer
    (sample 0) against a fresh sample of the same request (``sample_b`` 1, 2, ... for a probe
    twinned more than once). The judge is shown it exactly as the pair it twins (``twin_of``):
    the same persona descriptions, so it cannot tell a null pair from a real one."""
    out: list[dict] = []
    if share <= 0:
        return out
    used: dict[str, int] = {}
    for p in pairs:
        rng = random.Random(f"{seed_key}:null:{p['pair_id']}")
        if rng.random() >= share:
            continue
        side = "a" if rng.random() < 0.5 else "b"
        probe, value = p[f"probe_{side}"], p[f"value_{side}"]
        used[probe] = used.get(probe, 0) + 1
        out.append(
            {
                **p,
                "pair_id": f"{p['pair_id']}|null",
                "kind": "null",
                "twin_of": p["pair_id"],
                "value_a": value,
                "value_b": value,
                "probe_a": probe,
                "probe_b": probe,
                "sample_b": used[probe],
            }
        )
    return out


def is_null(pair: dict) -> bool:
    return pair.get("kind") == "null"


async def sample_probes(
    ctx: StageContext,
    *,
    concurrency: int,
    temperature: float,
    retries: int,
    timeout: float,
    template_version: str,
    twins: bool = False,
    ahead: Any = None,
):
    """Send every probe of the partition to the SUT (one sample each), a batch of rows at a time;
    with ``twins``, also the fresh samples that the null pairs in ``probe_pairs`` compare. ``ahead``:
    a ``JudgeAhead`` (``ahead.judge_ahead``), which judges the pairs as their answers come in."""
    async with contextlib.AsyncExitStack() as stack:
        if ahead is not None:
            await stack.enter_async_context(ahead)
        async for tables in _sample(ctx, concurrency, temperature, retries, timeout, template_version, twins, ahead):
            yield tables


async def _sample(ctx, concurrency, temperature, retries, timeout, template_version, twins, ahead):
    total = ctx.count("probes") + (
        int((ctx.read("probe_pairs", None, ["kind"])["kind"] == "null").sum()) if twins else 0
    )
    progress = ctx.progress("SUT sampling", total)
    async with ctx.client("sut", "sampling", concurrency) as client:
        progress.in_flight = lambda: client.stats["in_flight"]

        async def one(item):
            p, k = item
            r = await client.chat(
                json.loads(p["messages"]),
                temperature=temperature,
                sample_index=k,
                retries=retries,
                timeout=timeout,
                template_version=template_version,
            )
            rec = response_record(p, r, k)
            if ahead is not None:
                ahead.answered(rec)
            return rec

        for ids in ctx.batches():
            probes = (
                ctx.read("probes", ids, ["probe_id", "input_id", "messages"]).sort_values("probe_id").to_dict("records")
            )
            items = [(p, 0) for p in probes]
            if ahead is not None:
                ahead.batch(ids)
            if twins:
                pp = ctx.read("probe_pairs", ids, ["kind", "probe_b", "sample_b"])
                extra = sorted(
                    {(r["probe_b"], int(r["sample_b"])) for r in pp[pp["kind"] == "null"].to_dict("records")}
                )
                by_id = {p["probe_id"]: p for p in probes}
                items += [(by_id[pid], k) for pid, k in extra if pid in by_id]
            yield {"sut_responses": await run_bounded(items, one, concurrency, progress, lambda r: r["status"])}


def answer_keys(pair: dict) -> tuple[tuple[str, int], tuple[str, int]]:
    """The (probe, sample index) of a pair's two answers: both first samples for a persona pair;
    a null pair's second answer is the fresh sample ``sample_b`` of the same probe."""
    sb = pair.get("sample_b")
    return (pair["probe_a"], 0), (pair["probe_b"], int(sb) if is_null(pair) and sb == sb and sb is not None else 0)


def pair_batch(
    ctx: StageContext, ids: list[str], answers: bool = True
) -> tuple[list[dict], dict[str, dict], dict[tuple[str, int], dict]]:
    """(pairs, probes by id, SUT answers by (probe id, sample index)) for a batch of rows; without
    ``answers``, no answers (none yet: judging ahead, ``ahead.py``)."""
    pairs = ctx.read("probe_pairs", ids).sort_values("pair_id").to_dict("records")
    probes = {
        p["probe_id"]: p
        for p in ctx.read("probes", ids, ["probe_id", "attribute_value", "persona_id", "persona"]).to_dict("records")
    }
    if not answers:
        return pairs, probes, {}
    resp = {
        (r["probe_id"], int(r["sample_index"])): r
        for r in ctx.read("sut_responses", ids, ["probe_id", "sample_index", "status", "error", "response"]).to_dict(
            "records"
        )
    }
    return pairs, probes, resp


def answer_problem(r: dict | None, who: str) -> tuple[str, str] | None:
    """Why a stored SUT answer cannot be judged, as (judgement status, reason), or None."""
    if r is None:
        return "sut_failed", f"{who}: missing"
    if r["status"] == "empty":
        return "empty_answer", f"{who}: empty (no judge asked)"
    if r["status"] != "ok":
        return "sut_failed", f"{who}: {r['error']}"
    return None


def answers_problem(answers: list[tuple[dict | None, str]]) -> tuple[str, str] | None:
    """Why a unit built from several answers cannot be judged: a failed answer before an empty one."""
    problems = [p for p in (answer_problem(r, who) for r, who in answers) if p]
    if not problems:
        return None
    status = "sut_failed" if any(st == "sut_failed" for st, _ in problems) else "empty_answer"
    return status, "; ".join(why for _, why in problems)


def sut_failure(pair: dict, probes: dict[str, dict], resp: dict[tuple[str, int], dict]) -> tuple[str, str] | None:
    """Why a persona pair cannot be judged (``sut_failed`` or ``empty_answer``, with the reason)."""

    def who(m: str, k: int) -> str:
        return f"SUT answer for {probes[m]['attribute_value'] or probes[m]['persona_id']!r}" + (
            f" (sample {k})" if k else ""
        )

    return answers_problem([(resp.get((m, k)), who(m, k)) for m, k in answer_keys(pair)])
