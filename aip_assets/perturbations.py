"""Meaning-preserving perturbations of a question, one small class each (after HELM's augmentations).

Each perturbation is deterministic under a seed: ``apply(text, rng)`` returns the perturbed text,
or None when it cannot change this text (no word of the synonym table, a single clause to
reorder...). The ``paraphrase`` perturbation asks a model (the run's synthesis connection) and is
used only when one is configured.
"""

from __future__ import annotations

import random
import re
from typing import ClassVar

from .readers.text import is_whitespace

_WORD = re.compile(r"[A-Za-z]+")


def _replaced(text: str, swaps: list[tuple[re.Match[str], str]]) -> str:
    """``text`` with each match's span replaced (the spans do not overlap), in one pass: replacing
    them one at a time copied the whole text each time, quadratic in its length (a 5 MB prompt's
    typos took minutes)."""
    out, at = [], 0
    for m, new in sorted(swaps, key=lambda s: s[0].start()):
        out += [text[at : m.start()], new]
        at = m.end()
    return "".join([*out, text[at:]])


class Perturbation:
    name: ClassVar[str]
    description: ClassVar[str]

    def apply(self, text: str, rng: random.Random) -> str | None:
        raise NotImplementedError

    def __call__(self, text: str, rng: random.Random) -> str | None:
        out = self.apply(text, rng)
        return out if out and not is_whitespace(out) and out != text else None


class Typos(Perturbation):
    name = "typos"
    description = "swaps two adjacent letters or doubles a letter in about one word in eight"

    def apply(self, text, rng):
        words = [m for m in _WORD.finditer(text) if len(m.group()) >= 4]
        if not words:
            return None
        chosen = sorted(rng.sample(words, max(1, len(words) // 8)), key=lambda m: m.start(), reverse=True)
        swaps = []
        for m in chosen:  # the draws in this order (the last word first): the same typos as ever
            w = m.group()
            i = rng.randrange(1, len(w) - 2)
            if rng.random() < 0.5 and w[i] != w[i + 1]:
                typo = w[:i] + w[i + 1] + w[i] + w[i + 2 :]
            else:
                typo = w[:i] + w[i] + w[i:]
            swaps.append((m, typo))
        return _replaced(text, swaps)


class Casing(Perturbation):
    name = "casing"
    description = "changes letter case: all lower, all upper, or the first letters of words"

    def apply(self, text, rng):
        return rng.choice([str.lower, str.upper, str.title])(text)


class Punctuation(Perturbation):
    name = "punctuation"
    description = "drops punctuation, or doubles question and exclamation marks and adds stray commas"

    def apply(self, text, rng):
        if rng.random() < 0.5:
            return re.sub(r"[.,;:!?]", "", text)
        out = re.sub(r"([?!])", r"\1\1", text)
        words = out.split(" ")
        if len(words) > 3:
            i = rng.randrange(1, len(words) - 1)
            words[i] = words[i].rstrip(",") + ","
        return " ".join(words)


class WordOrder(Perturbation):
    name = "word_order"
    description = "moves sentences (the question first or last), or swaps the clauses around a comma"

    def apply(self, text, rng):
        sentences = re.split(r"(?<=[.!?])\s+", text.strip())
        if len(sentences) >= 2:
            k = rng.randrange(1, len(sentences))
            return " ".join(sentences[k:] + sentences[:k])
        head, sep, tail = text.partition(", ")
        if sep and tail:
            tail = tail.rstrip(".?!")
            end = text[-1] if text[-1] in ".?!" else ""
            return f"{tail[0].upper()}{tail[1:]}, {head[0].lower()}{head[1:]}{end}"
        return None


FILLERS = ("um,", "basically,", "you know,", "so,", "honestly,", "put differently,", "I mean,", "well,")


class Filler(Perturbation):
    name = "filler"
    description = "adds filler words (um, basically, you know, so...) at the start and between sentences"

    def apply(self, text, rng):
        sentences = re.split(r"(?<=[.!?])\s+", text.strip())
        out = []
        for s in sentences:
            if rng.random() < 0.6 or not out:
                f = rng.choice(FILLERS)
                s = f"{f[0].upper()}{f[1:]} {s[0].lower()}{s[1:]}" if s[:2] != "I " else f"{f[0].upper()}{f[1:]} {s}"
            out.append(s)
        return " ".join(out)


SYNONYMS = {
    "buy": "purchase",
    "big": "large",
    "help": "assist",
    "job": "position",
    "money": "funds",
    "doctor": "physician",
    "start": "begin",
    "need": "require",
    "get": "obtain",
    "quick": "fast",
    "enough": "sufficient",
    "pay": "cover",
    "car": "vehicle",
    "home": "residence",
    "ask": "request",
    "show": "demonstrate",
    "try": "attempt",
    "late": "overdue",
    "rent": "lease",
    "kids": "children",
    "boss": "manager",
    "work": "employment",
    "small": "modest",
    "cheap": "inexpensive",
    "fix": "repair",
    "answer": "reply",
    "problem": "issue",
    "maybe": "perhaps",
    "sick": "ill",
    "choose": "select",
    "keep": "retain",
    "end": "finish",
    "mistake": "error",
    "often": "frequently",
}
CANONICAL = {**{v: k for k, v in SYNONYMS.items()}, **{k: k for k in SYNONYMS}}


class Synonyms(Perturbation):
    name = "synonyms"
    description = "replaces words with synonyms from a fixed table (buy -> purchase, job -> position...)"

    def apply(self, text, rng):
        hits = [m for m in _WORD.finditer(text) if m.group().lower() in SYNONYMS]
        if not hits:
            return None
        swaps = []
        for m in sorted(rng.sample(hits, max(1, (len(hits) + 1) // 2)), key=lambda m: m.start(), reverse=True):
            w = m.group()
            syn = SYNONYMS[w.lower()]
            swaps.append((m, syn.capitalize() if w[0].isupper() else syn))
        return _replaced(text, swaps)


RULE_BASED: dict[str, Perturbation] = {
    p.name: p for p in (Typos(), Casing(), Punctuation(), WordOrder(), Filler(), Synonyms())
}
ALL_TYPES = (*RULE_BASED, "paraphrase")


def canonical_tokens(text: str, typo_robust: bool = True, skip: tuple[str, ...] = ()) -> str:
    """A form of the text that the perturbations above leave unchanged (the builtin model reads
    questions through it; ``skip`` names perturbations whose effect it does not undo)."""
    t = re.sub(r"(?<=\d)[,.](?=\d)", "", text if "casing" in skip else text.lower())
    if "filler" not in skip:
        for f in FILLERS:
            t = re.sub(rf"(^|\W){re.escape(f.rstrip(','))},", r"\1", t, flags=re.I)
    words = re.findall(r"[A-Za-z]+|\d+", t) if "punctuation" not in skip else re.findall(r"\S+", t)
    table = CANONICAL
    if typo_robust and "typos" not in skip:  # a word's set of letters survives a swap or a doubled letter
        sig = lambda w: "".join(sorted(set(w)))  # noqa: E731
        words = [sig(w) for w in words]
        table = {sig(k): sig(v) for k, v in CANONICAL.items()}
    if "synonyms" not in skip:
        words = [table.get(w, w) for w in words]
    if "word_order" not in skip:
        words = sorted(words)
    return " ".join(words)
