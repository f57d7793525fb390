"""What a judge is asked and how its answer is read: JSON answers validated by a pydantic model
(:class:`JsonAnswer`, :class:`Verdict`), the request in the client's structured-output form
(:func:`response_format`), the ask-and-re-ask loop (:func:`ask_json`), and a panel of judges
(:class:`JudgePanel`, :func:`ask_panel`, :func:`panel_decision`), whose votes become
``judge_panel`` rows (:func:`split_panel`)."""

from __future__ import annotations

import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..models.client import ChatResult, ModelClient
from .running import gather_all

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


# words a prompt's answer format is written in: a string field holding one of them (alone, or in
# angle brackets anywhere) copies the format instead of answering it
TEMPLATE_WORDS = frozenset(
    {
        "one or two sentences",
        "one to two sentences",
        "1-2 sentences",
        "a sentence or two",
        "decision or null",
        "decision",
        "label",
        "reasoning",
        "your reasoning",
        "your reasoning here",
        "reason",
        "why",
        "explanation",
        "your explanation",
        "string",
        "text",
        "number",
        "score",
        "value",
        "number from 0 to 1",
        "number from 0 to 1, or null",
        "description",
        "paraphrase",
        "rewritten question",
        "persona description",
    }
)
TEMPLATE_PHRASES = ("sentence", "decision", "reasoning", "explain", "or null", "number from", "your ")
_ANGLE = re.compile(r"<([^<>\n]{1,80})>")
_ONLY_DOTS = re.compile(r"[\s.\u2026_\-\u2013\u2014?*]+")
_ALL_BRACKETED = re.compile(r"<[^<>]*>|\[[^\[\]]*\]|\{[^{}]*\}")


def _plain(s: str) -> str:
    return " ".join(s.lower().split()).strip(" \"'`.,;:!")


# a run of this many consecutive words shared with the prompt's example (or field description) or
# with a re-ask, words compared in lower case with their punctuation stripped ("step-by-step" is one
# word, "23:10" one), is copied, not written (docs/judges.md has the measurement). Honest verdicts
# share at most 5 words in a row with any example: the builtin judges' reasoning over the corpora,
# the 43 synthetic and the 69 real judge outputs. The English examples cut to 57 characters, as the
# old re-ask showed them, are 8 to 11 words (16 of the 19 examples' cuts, every language, reach 8).
# A verdict written in the example's sentence frame with its own facts can share 8 or 9 words: it
# is re-asked ("in your own words", as the prompt says), and a judge that can judge rewrites it.
NEAR_COPY_WORDS = 8
_PUNCT = re.compile(r"[^\w\s]")
# what every copy's reason says, and only a copy's (is_copy)
COPY_REASON = re.compile(r"\brepeats the (?:prompt's (?:example|placeholder|template words)|re-ask's text)\b")


def is_copy(reason: str | None) -> bool:
    """Whether a failed judgement's reason (``judgements.error``, a vote's error, ``JsonOutcome.error``)
    names a copy: a string of the answer that repeats the prompt's example, placeholder or template
    words, or the text of a re-ask, or a decision that is the prompt's example's (decision flip's
    RENEW / CANCEL on another question). True when any of the reason's problems is a copy, so a
    judge whose failures are mostly copies copies the prompt instead of judging; False for every
    other failure (JSON that does not parse or match the schema, fields that disagree, a call that
    failed) and for None. Every copy's reason says "repeats the prompt's example" (or placeholder,
    template words) or "repeats the re-ask's text" (``COPY_REASON``), and no other reason does."""
    return reason is not None and COPY_REASON.search(reason) is not None


class Problem(str):
    """A reason an answer is no answer, as people read it (``judgements.error``: the passage copied,
    the value that is no label), with ``told``: the same for the judge's re-ask, without any text
    the judge could copy into its next answer (an example's passage, its own long value)."""

    told: str

    def __new__(cls, said: str, told: str | None = None) -> Problem:
        p = super().__new__(cls, said)
        p.told = said if told is None else told
        return p


@functools.lru_cache(maxsize=1024)
def _words(text: str) -> tuple[tuple[str, ...], tuple[tuple[int, int], ...]]:
    """The words of ``text`` as the copy rule compares them (lower case, punctuation stripped), and
    where each stands in ``text``."""
    words, spans = [], []
    for m in re.finditer(r"\S+", text):
        w = _PUNCT.sub("", m.group().lower())
        if w:
            words.append(w)
            spans.append(m.span())
    return tuple(words), tuple(spans)


def shared_run(value: str, source: str) -> tuple[int, str]:
    """The longest run of consecutive words ``value`` shares with ``source`` (words compared as
    :data:`NEAR_COPY_WORDS` says): its length in words and the passage of ``source`` it is."""
    import difflib

    a, _ = _words(value)
    b, spans = _words(source)
    if not a or not b:
        return 0, ""
    m = difflib.SequenceMatcher(None, a, b, autojunk=False).find_longest_match(0, len(a), 0, len(b))
    return (m.size, source[spans[m.b][0] : spans[m.b + m.size - 1][1]]) if m.size else (0, "")


def _short(s: str, n: int = 80) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def copied_text(value: str, examples: Iterable[str] = (), shown: Iterable[str] = ()) -> str | None:
    """What ``value`` copies from a prompt's answer format instead of answering, as a phrase (the
    prompt's placeholder ``'<why>'``, its example text), or None for text of its own: a value that
    is an angle-bracket placeholder, dots alone (``...``), template words (``one or two
    sentences``, ``decision or null``, alone or in brackets), one of ``examples`` (the prompt's
    example and field descriptions, compared case- and spacing-insensitively), or that shares a run
    of :data:`NEAR_COPY_WORDS` words with one of them or with one of ``shown`` (the re-asks the
    judge was sent)."""
    found = _copied(value, tuple(examples), tuple(shown))
    return None if found is None else str(found)


@functools.lru_cache(maxsize=4096)
def _copied(value: str, examples: tuple[str, ...], shown: tuple[str, ...]) -> Problem | None:
    """:func:`copied_text`'s phrase as a :class:`Problem` (its ``told``: the phrase without the text copied)."""
    s = " ".join(value.split())
    if not s:
        return None
    short = _short(s)
    if _ONLY_DOTS.fullmatch(s):
        return Problem(f"the prompt's placeholder {short!r}", "the prompt's placeholder")
    if s.startswith("<") and s.endswith(">") and _ALL_BRACKETED.fullmatch(s):
        return Problem(f"the prompt's placeholder {short!r}", "the prompt's placeholder")
    for m in _ANGLE.finditer(s):
        inner = _plain(m.group(1))
        if inner in TEMPLATE_WORDS or any(ph in inner for ph in TEMPLATE_PHRASES):
            return Problem(f"the prompt's placeholder {m.group(0)!r}", "the prompt's placeholder")
    plain = _plain(s)
    if plain in TEMPLATE_WORDS or (_ALL_BRACKETED.fullmatch(s) and _plain(s[1:-1]) in TEMPLATE_WORDS):
        return Problem(f"the prompt's template words {short!r}", "the prompt's template words")
    for e in examples:
        if plain == _plain(e):
            return Problem(f"the prompt's example {short!r}", "the prompt's example word for word")
    for sources, what in ((examples, "the prompt's example nearly word for word"), (shown, "the re-ask's text")):
        for e in sources:  # the example cut short, with a word changed or a sentence added
            n, passage = shared_run(s, e)
            if n >= NEAR_COPY_WORDS:
                return Problem(f"{what} ({n} words of it: {_short(passage)!r})", f"{what} ({n} words of it)")
    return None


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(field path, text) of every string in an answer, nested models, lists and dict values too."""
    if isinstance(value, str):
        yield path, value
    elif isinstance(value, BaseModel):
        for name in type(value).model_fields:
            yield from _strings(getattr(value, name), f"{path}.{name}" if path else name)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from _strings(v, f"{path}[{i}]")
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(v, f"{path}.{k}")


RE_ASKS = "re_asks"  # the context key of the re-asks a judge was sent (ask_json): copying one is no answer


class JsonAnswer(BaseModel):
    """A model's JSON answer (a judge's verdict, a synthesis). It must answer, not copy the
    prompt's answer format: a string that repeats a placeholder, template words or the prompt's
    example (``EXAMPLES``) makes it no answer, and so does any other ``problems`` a subclass finds
    (fields that disagree, a decision that is no label). Problems are a validation error of type
    ``not_a_verdict`` naming each, so the judge is re-asked with the reason and, past its budget,
    the judgement fails with it. ``model_validate(obj, context={...})`` gives the checks what a
    verdict is judged against (decision flip: the row's ``labels``)."""

    model_config = ConfigDict(extra="ignore")
    NOUN: ClassVar[str] = "answer"
    EXAMPLES: ClassVar[tuple[str, ...]] = ()  # the prompt's example texts and field descriptions

    def copies(self, context: dict[str, Any] | None = None) -> dict[str, Problem]:
        """{field path: what it copies} for every string field that copies the prompt's format, its
        example, or a re-ask the judge was sent (``context[RE_ASKS]``, given by :func:`ask_json`)."""
        shown = tuple((context or {}).get(RE_ASKS, ()))
        out = {}
        for path, text in _strings(self, ""):
            what = _copied(text, self.EXAMPLES, shown)
            if what is not None:
                out[path] = what
        return out

    def copied(self, context: dict[str, Any] | None = None) -> dict[str, str]:
        """{field path: what it copies, as people read it} (:meth:`copies`)."""
        return {path: str(what) for path, what in self.copies(context).items()}

    def problems(self, context: dict[str, Any]) -> list[str]:
        """Why this is no answer (empty: it is one). Subclasses add their own checks; a
        :class:`Problem` among them tells the judge its reason without the text it quotes."""
        return [
            Problem(f"the {self.NOUN} repeats {what} in {path}", f"the {self.NOUN} repeats {what.told} in {path}")
            for path, what in self.copies(context).items()
        ]

    def complete(self) -> None:
        """Raise ValueError when a field the answer needs is missing (a schema error, not a copy)."""

    @model_validator(mode="after")
    def _an_answer(self, info: ValidationInfo):
        self.complete()
        problems = self.problems(info.context if isinstance(info.context, dict) else {})
        if problems:
            told = "; ".join(getattr(p, "told", p) for p in problems)
            raise PydanticCustomError("not_a_verdict", "{why}", {"why": "; ".join(problems), "told": told})
        return self


class Verdict(JsonAnswer):
    """A judge's JSON answer. Every verdict may instead declare the item ``unjudgeable`` (with its
    reasoning): then its score fields may be missing, and the item is excluded and counted.

    One source for the schema a judge is given and the validator that reads its answer. The schema
    (``models.structured.strict_schema``) requires every field, ``reasoning`` and ``unjudgeable``
    included, with no null: a grammar-constrained judge cannot leave a field out, so it states
    whether the item is unjudgeable and still writes the score fields, which are then ignored
    (a score written beside ``"unjudgeable": true`` is never used). The validator takes every
    answer the schema allows and asks of the others what a verdict needs: the ``SCORE_FIELDS``,
    not null, and the ``STATED_FIELDS``, present (null allowed: decision flip's "no decision"),
    unless the answer says ``"unjudgeable": true``. ``reasoning`` (default "") and ``unjudgeable``
    (default false) may be left out, as plainly prompted judges do; unknown fields are ignored."""

    NOUN: ClassVar[str] = "verdict"
    reasoning: str = ""
    unjudgeable: bool = False
    SCORE_FIELDS: ClassVar[tuple[str, ...]] = ()
    STATED_FIELDS: ClassVar[tuple[str, ...]] = ()

    @field_validator("reasoning", mode="before")
    @classmethod
    def _reasoning(cls, v):
        return "" if v is None else v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)

    def complete(self) -> None:
        if not self.unjudgeable:
            missing = [f for f in self.SCORE_FIELDS if getattr(self, f) is None] + [
                f for f in self.STATED_FIELDS if f not in self.model_fields_set
            ]
            if missing:
                raise ValueError(f'missing {", ".join(missing)} (or "unjudgeable": true)')


def parse_json_answer(
    text: str | None, model: type[BaseModel], context: dict[str, Any] | None = None
) -> tuple[BaseModel | None, str | None]:
    """A judge/synthesis answer validated against ``model`` (with ``context``, what the verdict is
    judged against, e.g. the row's decision labels): (value, None) or (None, reason). A reason
    that quotes what the answer copied is a :class:`Problem`, whose ``told`` is for the re-ask.

    Reads JSON as judges write it (``readers.json_objects``: code fences, a preamble, trailing
    prose, ``<think>`` blocks, trailing commas, Python-style dicts); the last object that
    validates wins (a judge may write a draft first). An object that copies the prompt's format
    or whose fields disagree (:class:`JsonAnswer`) is "not a verdict", with each reason."""
    from ..readers.judge_json import scan_json
    from ..readers.text import is_whitespace

    if not text or is_whitespace(text):
        return None, "empty answer"
    objects, unfinished = scan_json(text)
    if unfinished:
        return None, "the answer ends in an unfinished JSON object"
    if not objects:
        return None, "no JSON object in the answer"
    err: ValidationError | None = None
    for obj in reversed(objects):
        try:
            return model.model_validate(obj, context=context), None
        except ValidationError as e:
            err = err or e
    assert err is not None
    errors = err.errors()
    if all(x["type"] == "not_a_verdict" for x in errors):
        head = f"not a {getattr(model, 'NOUN', 'answer')}: "
        told = "; ".join((x.get("ctx") or {}).get("told", x["msg"]) for x in errors)
        return None, Problem(head + "; ".join(x["msg"] for x in errors), head + told)
    return None, "JSON does not match the expected schema: " + "; ".join(
        f"{'.'.join(map(str, x['loc'])) or '(object)'}: {x['msg']}" for x in errors
    )


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
