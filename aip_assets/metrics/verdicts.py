"""What a judge's answer must be and how it is read: a JSON answer validated by a pydantic model
(:class:`JsonAnswer`, :class:`Verdict`, read by :func:`parse_json_answer`) that answers instead of
copying the prompt's answer format, its example or a re-ask (:func:`copied_text`, :func:`shared_run`,
:data:`NEAR_COPY_WORDS`); a reason an answer is none (:class:`Problem`), and whether a failure's reason
names a copy (:func:`is_copy`). Asking the judge is ``judging``."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Iterator
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

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

    Reads JSON as judges write it (``readers.judge_json.json_objects``: code fences, a preamble, trailing
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
