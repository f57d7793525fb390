"""What a judge is asked: the request in the client's structured-output form
(:func:`response_format`), the ask-and-re-ask loop (:func:`ask_json`), and a panel of judges
(:class:`JudgePanel`, :func:`ask_panel`, :func:`panel_decision`), whose votes become
``judge_panel`` rows (:func:`split_panel`). How its answer is read (:class:`~.verdicts.JsonAnswer`,
:class:`~.verdicts.Verdict`, :func:`~.verdicts.parse_json_answer`) is ``verdicts``."""

from __future__ import annotations

import functools
import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from ..models.client import ChatResult, ModelClient
from .running import gather_all
from .verdicts import RE_ASKS, parse_json_answer

# SQL: a judgement's reasoning with "response 1/2" ("the first / second response") turned into the
# personas' order "a/b": the judge saw the pair in a seeded random order (``judgements.order_swapped``),
# a pair's columns are in persona order. For any metric that swaps its pairs' order; the report's too.
PERSONA_ORDER_REASONING = r"""replace(replace(
    regexp_replace(regexp_replace(regexp_replace(regexp_replace(j.reasoning,
        '\b(responses?|requests?|decision|answer)[ _]?1\b', '\1 §1§', 'gi'),
        '\b(responses?|requests?|decision|answer)[ _]?2\b', '\1 §2§', 'gi'),
        '\b(the) first (response|request|answer)\b', '\1 \2 §1§', 'gi'),
        '\b(the) second (response|request|answer)\b', '\1 \2 §2§', 'gi'),
    '§1§', CASE WHEN j.order_swapped THEN 'b' ELSE 'a' END), '§2§', CASE WHEN j.order_swapped THEN 'a' ELSE 'b' END)"""


def response_format(
    model: type[BaseModel], form: str = "json_schema", enums: dict[str, list[str] | tuple[str, ...]] | None = None
) -> dict[str, Any] | None:
    """The ``response_format`` asking for a JSON object of ``model``'s strict schema
    (``models.structured.strict_schema``) in structured-output ``form`` (None for ``prompt``);
    ``enums``: fields whose values are given per item (decision flip: the row's labels). A fresh
    copy each call: the text is made once per (model, form, enums), as pydantic takes 1.5 ms to
    build a schema, more than the rest of a judge call answered from the cache."""
    if form == "prompt":
        return None
    frozen = tuple(sorted((k, tuple(v)) for k, v in enums.items())) if enums else ()
    return json.loads(_response_format_json(model, form, frozen))


@functools.lru_cache(maxsize=4096)
def _response_format_json(model: type[BaseModel], form: str, enums: tuple[tuple[str, tuple[str, ...]], ...]) -> str:
    from ..models.structured import payload, strict_schema

    schema, strict = strict_schema(model, dict(enums))
    return json.dumps(payload(form, model.__name__, schema, strict))


@dataclass
class JsonOutcome:
    value: BaseModel | None
    error: str | None
    raw: str | None
    attempts: int  # requests made for this judgement (an answer from the run's cache counts one)
    last: ChatResult | None
    reasks: int = 0  # re-asks of an answer that could not be used
    network_retries: int = 0  # failed requests retried (timeouts, connection errors, 5xx, 429 without Retry-After)
    rate_limit_waits: int = 0  # 429/503 with Retry-After waited out: requests made that used no budget


async def ask_json(
    client: ModelClient,
    messages: list[dict[str, str]],
    model: type[BaseModel],
    *,
    retries: int,
    timeout: float,
    temperature: float,
    template_version: str,
    context: dict[str, Any] | None = None,
    enums: dict[str, list[str] | tuple[str, ...]] | None = None,
) -> JsonOutcome:
    """Ask for a JSON answer. One budget per judgement: ``retries`` caps every extra request,
    failed calls and re-asks of an unusable answer together (2 means at most three requests).
    Each re-ask is a distinct call (its attempt number is part of the call's identity). A 429
    with Retry-After is a wait and uses no budget. An answer that cannot be used after the
    budget is reported as failed with the raw text, never silently scored. ``context``: what the
    verdict is judged against (``parse_json_answer``); an answer that is no verdict (a copied
    placeholder, fields that disagree) is re-asked with the reason like one that does not parse.
    The re-ask names a copy without quoting the passage copied (``Problem.told``; the outcome's
    ``error`` keeps it for people), and an answer that repeats a re-ask's text is a copy too.

    The request asks in the client's structured-output form (``client.structured_form``) for
    ``model``'s schema (``enums``: per-item enums, e.g. the row's labels). When the endpoint refuses
    that form (an HTTP error naming it) and the connection says ``auto``, the run moves to the next
    form and the request is sent again in it: the refused request is counted in ``attempts`` but
    not charged to the budget."""
    remaining = retries
    attempts = reasks = net = waits = 0
    value, err, raw, last = None, None, None, None
    re_asks: list[str] = []  # what the judge was sent after an unusable answer: a copy of one is no answer
    form = await client.structured_form()
    fmt = response_format(model, form, enums)
    attempt = 0
    while True:
        r = await client.chat(
            messages,
            temperature=temperature,
            sample_index=0,
            retries=remaining,
            timeout=timeout,
            template_version=template_version,
            attempt=attempt,
            response_format=fmt,
        )
        while r.structured_refused is not None and fmt is not None and client.falls_back():
            attempts += r.attempts  # a negotiation: counted, not charged
            waits += r.rate_limit_waits
            form = await client.fall_back(form, r.structured_refused)
            fmt = response_format(model, form, enums)
            r = await client.chat(
                messages,
                temperature=temperature,
                sample_index=0,
                retries=remaining,
                timeout=timeout,
                template_version=template_version,
                attempt=attempt,
                response_format=fmt,
            )
        attempts += 1 if r.cached else r.attempts
        net += r.retries_used
        waits += r.rate_limit_waits
        remaining -= r.retries_used
        last = r
        if not r.ok:
            why = r.error
            if r.structured_refused is not None:
                why = (
                    f"{why} (the endpoint refuses structured-output form {form}; structured_output: "
                    f"{client.conn.structured_output} never moves to another: auto finds one it takes)"
                )
            return JsonOutcome(None, f"call failed: {why}", raw, attempts, last, reasks, net, waits)
        raw = r.text
        seen = {**(context or {}), RE_ASKS: tuple(re_asks)} if re_asks else context
        value, err = parse_json_answer(raw, model, seen)
        if value is not None or remaining <= 0:
            break
        remaining -= 1
        reasks += 1
        attempt += 1
        # the reason without the passage it quotes: a judge shown its copy copies it again
        why = getattr(err, "told", err)
        re_asks.append(
            f"Your answer could not be used ({why}). Answer again with the JSON object only (attempt {attempt + 1})."
        )
        messages = messages[:2] + [
            {"role": "assistant", "content": raw or ""},
            {"role": "user", "content": re_asks[-1]},
        ]
    return JsonOutcome(value, None if err is None else str(err), raw, attempts, last, reasks, net, waits)


# ------------------------------------------------------------------ a judge panel
def panel_role(i: int) -> str:
    """The ``llm_calls`` role of the panel's judge ``i`` (0-based): the primary is ``judge``."""
    return "judge" if i == 0 else f"judge-{i + 1}"


class JudgePanel:
    """A panel's clients used as one judge client: ``async with`` opens every judge's;
    :func:`ask_panel` asks them all. Anything else is the primary's (the first judge), so code
    that asks one judge (``ask_json``) asks the primary."""

    def __init__(self, clients: list[ModelClient], rule: str):
        self.clients, self.rule = clients, rule
        self._stack: Any = None

    async def __aenter__(self) -> JudgePanel:
        import contextlib

        self._stack = contextlib.AsyncExitStack()
        try:
            for c in self.clients:
                await self._stack.enter_async_context(c)
        except BaseException:
            await self._stack.aclose()
            raise
        return self

    async def __aexit__(self, *exc) -> None:
        await self._stack.__aexit__(*exc)

    @property
    def stats(self) -> dict[str, int]:
        """The panel's counts (calls in flight, cached, failed...), summed over its judges."""
        out: dict[str, int] = {}
        for c in self.clients:
            for k, v in c.stats.items():
                out[k] = out.get(k, 0) + v
        return out

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        return getattr(self.clients[0], name)


@dataclass
class PanelVote:
    """One judge's answer to one judgement of a panel."""

    judge: int  # its place in ``judges``, from 1
    role: str
    endpoint: str
    model: str
    outcome: JsonOutcome
    category: str | None  # the metric's reading of its verdict; None: no verdict (judge_failed)


@dataclass
class PanelOutcome(JsonOutcome):
    """A panel's outcome, shaped like :class:`JsonOutcome`: the verdict used (the chosen judge's)
    or none with the reason, and every judge's vote. ``status``: None (a verdict),
    ``judges_disagree`` or ``judge_failed``."""

    votes: list[PanelVote] = field(default_factory=list)
    status: str | None = None
    chosen: int | None = None  # index into votes of the verdict used
    rule: str = "majority"


def panel_decision(categories: list[str | None], rule: str) -> tuple[int | None, str | None, str | None]:
    """(index of the verdict used, status, reason) from each judge's category (None: the judge gave
    no verdict, and does not vote).

    - majority: the verdict of the first judge (in panel order) whose category a strict majority
      of the valid verdicts shares; no strict majority (1-1, 1-1-1, 2-2): ``judges_disagree``.
    - unanimous: every judge must give a verdict (one that gave none: ``judge_failed``), all of
      one category (else ``judges_disagree``); the first judge's verdict is used.
    - either: fewer than two valid verdicts is ``judge_failed``: a panel's verdict rests on two."""
    n = len(categories)
    valid = [(i, c) for i, c in enumerate(categories) if c is not None]
    silent = [i + 1 for i, c in enumerate(categories) if c is None]
    if rule == "unanimous" and silent:
        return (
            None,
            "judge_failed",
            (
                f"unanimous panel: judge {', '.join(map(str, silent))} of {n} gave no verdict, "
                "and a unanimous verdict needs every judge's"
            ),
        )
    if len(valid) < 2:
        return (
            None,
            "judge_failed",
            (
                f"{len(valid)} of {n} judges gave a verdict (judge "
                f"{', '.join(map(str, silent))} none); a panel's verdict needs two"
            ),
        )
    counts = Counter(c for _, c in valid)
    top, k = counts.most_common(1)[0]
    if (rule == "unanimous" and len(counts) == 1) or (rule != "unanimous" and 2 * k > len(valid)):
        return next(i for i, c in valid if c == top), None, None
    said = "; ".join(f"judge {i + 1} {c}" for i, c in valid)
    need = "all alike" if rule == "unanimous" else f"a strict majority of {len(valid)}"
    return None, "judges_disagree", f"judges disagree ({rule}: {need} needed): {said}"


async def ask_panel(
    client: ModelClient | JudgePanel,
    messages: list[dict[str, str]],
    model: type[BaseModel],
    *,
    category: Callable[[BaseModel], str],
    retries: int,
    timeout: float,
    temperature: float,
    template_version: str,
    context: dict[str, Any] | None = None,
    enums: dict[str, list[str] | tuple[str, ...]] | None = None,
) -> JsonOutcome:
    """:func:`ask_json`, of every judge of a panel when ``client`` is one (else of the one judge).

    Each judge is asked concurrently, with its own budget of ``retries`` and its own calls
    (journaled and cached under its own endpoint and model). ``category`` reads a verdict as the
    category judges are compared by (the metric's ``verdict_category``); :func:`panel_decision`
    applies the rule. The outcome is the verdict used (its raw text, model and call key) or none
    with the reason (its ``status`` says ``judges_disagree`` or ``judge_failed``); ``attempts``,
    ``reasks`` and the retries count every judge's requests. ``judged_fields`` carries the votes
    into the judgement row, and ``Metric.run_judge`` turns them into ``judge_panel`` rows."""
    kw: dict[str, Any] = dict(
        retries=retries,
        timeout=timeout,
        temperature=temperature,
        template_version=template_version,
        context=context,
        enums=enums,
    )
    if not isinstance(client, JudgePanel):
        return await ask_json(client, messages, model, **kw)
    outs = await gather_all(*(ask_json(c, messages, model, **kw) for c in client.clients))
    votes = [
        PanelVote(i + 1, c.role, c.endpoint_id, c.conn.model, o, None if o.value is None else category(o.value))
        for i, (c, o) in enumerate(zip(client.clients, outs))
    ]
    chosen, status, why = panel_decision([v.category for v in votes], client.rule)
    if why is not None:  # what each judge that gave no verdict said instead
        why += "".join(f"; judge {v.judge}: {v.outcome.error}" for v in votes if v.category is None)
    used = outs[chosen if chosen is not None else 0]
    return PanelOutcome(
        value=used.value if chosen is not None else None,
        error=why,
        raw=used.raw,
        attempts=sum(o.attempts for o in outs),
        last=used.last,
        reasks=sum(o.reasks for o in outs),
        network_retries=sum(o.network_retries for o in outs),
        rate_limit_waits=sum(o.rate_limit_waits for o in outs),
        votes=votes,
        status=status,
        chosen=chosen,
        rule=client.rule,
    )


def panel_rows(judgement: dict[str, Any], p: PanelOutcome) -> list[dict[str, Any]]:
    """A judgement's ``judge_panel`` rows: every judge's verdict, category and call."""
    rows = []
    for i, v in enumerate(p.votes):
        o = v.outcome
        rows.append(
            {
                "judgement_id": judgement.get("judgement_id"),
                "pair_id": judgement.get("pair_id"),
                "input_id": judgement.get("input_id"),
                "judge_kind": judgement.get("judge_kind"),
                "judge": v.judge,
                "role": v.role,
                "endpoint": v.endpoint,
                "model": v.model,
                "response_model": o.last.model if o.last else None,
                "status": "ok" if o.value is not None else "judge_failed",
                "error": None if o.value is not None else f"judge {v.judge}: {o.error}",
                "category": v.category,
                "chosen": p.chosen == i,
                "parsed": o.value.model_dump_json() if o.value is not None else None,
                "raw_output": o.raw,
                "attempts": o.attempts,
                "call_key": o.last.call_key if o.last else None,
            }
        )
    return rows


def split_panel(judgements: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the judgement rows, their judges' ``judge_panel`` rows). A judgement asked of a panel
    carries its votes (``_panel``, from :func:`judged_fields`); one the panel gave no verdict for
    is ``judges_disagree`` or ``judge_failed`` with the panel's reason, whatever the metric wrote for
    a verdict-less outcome."""
    out, panel = [], []
    for r in judgements:
        p = r.pop("_panel", None)
        if p is not None:
            panel += panel_rows(r, p)
            if p.status is not None:
                r = {**r, "status": p.status, "error": (p.error or "")[:1000]}
        out.append(r)
    return out, panel


def judged_fields(o: JsonOutcome) -> dict[str, Any]:
    """The columns every judgement row takes from its judge outcome (and a panel's votes, which
    ``Metric.run_judge`` takes out into ``judge_panel``)."""
    out: dict[str, Any] = {
        "attempts": o.attempts,
        "reasks": o.reasks,
        "network_retries": o.network_retries,
        "rate_limit_waits": o.rate_limit_waits,
        "raw_output": o.raw,
        "model": o.last.model if o.last else None,
        "call_key": o.last.call_key if o.last else None,
    }
    if isinstance(o, PanelOutcome):
        out["_panel"] = o
    return out
