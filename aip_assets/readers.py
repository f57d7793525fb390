"""Readers of model output written as people write it: decisions, stances, figures.

The builtin judge uses them to read answers from any SUT (not only the builtin one), and the
metrics use them to map an LLM judge's reading onto the configured labels. Each reader returns
``None`` when the text does not say what it looks for: the caller then excludes the item and
counts it, it never guesses.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

# ------------------------------------------------------------------ decisions
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)
# a decision statement: a marker, then the decision on the same line
_MARKER = re.compile(
    r"(?<![\w])(?:final\s+decision|my\s+final\s+decision|my\s+decision|decision\s+finale|décision\s+finale|"
    r"endgültige\s+entscheidung|meine\s+entscheidung|entscheidung|décision|decision|verdict|urteil)"
    r"(?:[\s*_`]*[:：]|\s+[-–—]\s|[\s*_`]+(?=[*_`]))|"
    r"(?<![\w])(?:my\s+(?:final\s+)?decision\s+is|meine\s+entscheidung\s+(?:ist|lautet)|ma\s+décision\s+est)\b",
    re.I)
_STRIP_LEAD = " \t*_`\"'“”„«»‘’[]()<>#:–—-"
_END_OF_PHRASE = re.compile(r"[.,;!?(\n—–]|\s-\s")


def _norm(s: str) -> str:
    return " ".join(s.upper().split())


def _at_line_start(text: str, pos: int) -> bool:
    return not text[text.rfind("\n", 0, pos) + 1:pos].strip(_STRIP_LEAD + " ")


def label_at_start(text: str | None, labels: list[str]) -> str | None:
    """The label ``text`` starts with (case-insensitive, markdown, quotes and brackets ignored,
    anything after the label allowed), the longest when labels share a prefix; else None."""
    if text is None:
        return None
    s = _norm(str(text).strip(_STRIP_LEAD + " "))
    s = s.replace("*", "").replace("_", " ").replace("`", "").strip(_STRIP_LEAD + " ")
    s = " ".join(s.split())
    for lab in sorted(labels, key=lambda x: -len(x)):
        n = _norm(lab)
        if s.startswith(n) and (len(s) == len(n) or not s[len(n)].isalnum()):
            return lab
    return None


def map_label(value: object, labels: list[str]) -> str | None:
    """A judge's reading of a decision (any case, quoted, with an explanation after it) mapped
    onto a configured label, else None (no decision, or a word that is not a label)."""
    if value is None or not isinstance(value, str):
        return None
    return label_at_start(value, labels)


@dataclass(frozen=True)
class DecisionReading:
    label: str | None         # the configured label the answer states, or None
    stated: str | None        # the word the answer puts where a label should be, when it is no label
    marker: bool              # whether the answer makes a decision statement at all


def read_decision(text: str | None, labels: list[str]) -> DecisionReading:
    """The decision an answer states, as people write it.

    A statement is a marker (``Decision:``, ``**Decision:**``, ``Final decision:``, ``Decision -``,
    ``My decision is``, ``Verdict:``, ``Entscheidung:``, ``Décision :``…) followed on its line by
    the decision, inline at the end of a sentence or on its own line; or a label alone on one of
    the last lines. The last statement counts (a model may revise itself). Text after the label
    (punctuation, an explanation) does not matter; reasoning that merely mentions a label or the
    word "decision" is not a statement. ``<think>`` blocks are ignored."""
    if not text or not text.strip():
        return DecisionReading(None, None, False)
    body = _THINK.sub(" ", text)
    statements: list[tuple[int, str | None, str | None]] = []
    for m in _MARKER.finditer(body):
        line_end = body.find("\n", m.end())
        after = body[m.end(): len(body) if line_end < 0 else line_end]
        lab = label_at_start(after, labels)
        phrase = _END_OF_PHRASE.split(after.strip(_STRIP_LEAD + " ").replace("*", "").replace("`", ""), 1)[0]
        words = phrase.split()
        if lab is not None:
            statements.append((m.start(), lab, None))
        elif words and (len(words) <= 3 or _at_line_start(body, m.start())):
            # a non-label answer ("deny", "N/A", "Escalate to a senior underwriter") is a statement when
            # short, or when the marker opens its line; inline prose after "decision:" is not
            statements.append((m.start(), None, words[0].lower().strip(_STRIP_LEAD + ".,;!?")))
    # a bare label alone on one of the last three lines ("**APPROVE**")
    lines = [(m.start(), m.group(0)) for m in re.finditer(r"[^\n]+", body) if m.group(0).strip(_STRIP_LEAD + " .!")]
    for pos, ln in lines[-3:]:
        core = ln.strip(_STRIP_LEAD + " .!").replace("*", "").strip()
        lab = label_at_start(core, labels)
        if lab is not None and _norm(core).rstrip(".!") == _norm(lab):
            statements.append((pos, lab, None))
    if not statements:
        return DecisionReading(None, None, False)
    _, lab, stated = max(statements, key=lambda x: x[0])
    return DecisionReading(lab, stated, True)


def stated_words(texts: list[str], labels: list[str], k: int = 3) -> list[tuple[str, int]]:
    """The most common words answers put where a label should be (e.g. after "Decision:")."""
    c: Counter = Counter()
    for t in texts:
        r = read_decision(t, labels)
        if r.label is None and r.stated:
            c[r.stated] += 1
    return c.most_common(k)


# ------------------------------------------------------------------ stances (yes / no)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_EXPLICIT = re.compile(r"(?:my|the\s+short)\s+answer\s+is:?\s*\**(yes|no)\b|"
                       r"(?:meine|die\s+kurze)\s+antwort\s+(?:lautet|ist):?\s*\**(ja|nein)\b|"
                       r"lautet\s+meine\s+antwort:?\s*\**(ja|nein)\b|ma\s+réponse\s+est:?\s*\**(oui|non)\b", re.I)
_YES_WORDS = {"yes", "ja", "oui"}
_START = re.compile(r"^[\W_]*(yes|yeah|yep|absolutely|definitely|no|nope|ja|jawohl|nein|oui|non)\b(?!\s+(?:problem|worries|"
                    r"matter|one|doubt|idea|way\s+to\s+tell))", re.I)
_NEGATIVE = re.compile(
    r"\b(?:i|we)\s*(?:would\s+not|wouldn[’']t|do\s+not|don[’']t|can[’']?t|cannot|can\s+not)\s+(?:\w+\s+)?recommend|"
    r"\b(?:advise|recommend|decide)\s+against\b|\bhold\s+off\b|\bnot\s+(?:a\s+good\s+idea|worth\s+it|recommended)\b|"
    r"\byou\s+(?:should\s+not|shouldn[’']t|should\s+never)\b|\bdisagree\b|\b(?:do\s+not|don[’']t)\s+agree\b|"
    r"\bempfehle\s+(?:ich\s+)?(?:es\s+|ihnen\s+|dir\s+|euch\s+|das\s+|dies\s+)?(?:nicht|keine?n?)\b|"
    r"\b(?:rate|rät|raten)\s+(?:ich\s+)?(?:ihnen\s+|dir\s+|euch\s+)?(?:eher\s+|klar\s+|dringend\s+)?davon\s+ab\b|"
    r"\babraten\b|\b(?:solltest|sollten|sollte)\b[^.!?]*\bnicht\b|\bstimme\b[^.!?]*\bnicht\s+zu\b|"
    r"\bne\s+(?:vous\s+|te\s+|l[’']|le\s+|la\s+|les\s+)?(?:recommande|conseille)\s+pas\b|\bdéconseill|"
    r"\bne\s+(?:devriez|devrais|devrait)\s+pas\b|\bpas\s+d[’']accord\b|\bconseille\s+de\s+ne\s+pas\b", re.I)
_POSITIVE = re.compile(
    r"\b(?:i|we)(?:[’']d|\s+would)?\s+(?:strongly\s+|definitely\s+|really\s+|highly\s+)?recommend|"
    r"\brecommend\s+(?:that\s+you\s+|you\s+)?(?:go|do|take|proceed|renew|accept|sign|apply)|"
    r"\byou\s+should\b|\bi\s+(?:fully\s+|completely\s+)?agree\b|\b(?:a\s+good\s+idea|worth\s+it)\b|"
    r"\bempfehle\b|\bempfehlen\b|\b(?:solltest|sollten)\b|\bstimme\b[^.!?]*\bzu\b|"
    r"\b(?:recommande|conseille)\b|\b(?:devriez|devrais)\b|\bd[’']accord\b", re.I)


def read_stance(text: str | None) -> str | None:
    """"yes" or "no": the stance an answer takes (yes/no, recommend / advise against, should /
    should not, agree / disagree; en, de, fr), from its first sentence that takes one; None
    when it takes none (information only, a refusal, "it depends")."""
    if not text or not text.strip():
        return None
    body = _THINK.sub(" ", text)
    m = _EXPLICIT.search(body)
    if m:
        word = next(g for g in m.groups() if g).lower()
        return "yes" if word in _YES_WORDS else "no"
    for sentence in _SENTENCE.split(body):
        s = sentence.strip().lstrip("#>*-• ").strip()
        if not s:
            continue
        m = _START.match(s)
        if m:
            return "no" if m.group(1).lower() in ("no", "nope", "nein", "non") else "yes"
        if _NEGATIVE.search(s):
            return "no"
        if _POSITIVE.search(s):
            return "yes"
    return None


# ------------------------------------------------------------------ figures
_NUMBER_WORDS = {
    # en
    "zero": 0, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16, "seventeen": 17,
    "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60,
    "seventy": 70, "eighty": 80, "ninety": 90,
    # de
    "null": 0, "eins": 1, "zwei": 2, "drei": 3, "vier": 4, "fünf": 5, "sechs": 6, "sieben": 7, "acht": 8,
    "neun": 9, "zehn": 10, "elf": 11, "zwölf": 12, "dreizehn": 13, "vierzehn": 14, "fünfzehn": 15,
    "sechzehn": 16, "siebzehn": 17, "achtzehn": 18, "neunzehn": 19, "zwanzig": 20, "dreißig": 30, "vierzig": 40,
    "fünfzig": 50, "sechzig": 60, "siebzig": 70, "achtzig": 80, "neunzig": 90,
    # fr
    "zéro": 0, "deux": 2, "trois": 3, "quatre": 4, "cinq": 5, "sept": 7, "huit": 8, "neuf": 9,
    "dix": 10, "onze": 11, "douze": 12, "treize": 13, "quatorze": 14, "quinze": 15, "seize": 16, "dix-sept": 17,
    "dix-huit": 18, "dix-neuf": 19, "vingt": 20, "trente": 30, "quarante": 40, "cinquante": 50, "soixante": 60,
}
# "one" / "ein" / "un" are also articles and pronouns: a number only before a unit
_ONE = r"(?:one|ein|eine|einen|un|une)(?=\s+(?:years?|months?|weeks?|days?|hours?|percent|per\s+cent|jahre?s?|monate?n?s?|"
_ONE += r"wochen?|tage?n?|prozent|ans?|mois|semaines?|jours?|pour\s+cent)\b)"
_MONTHS = {
    "january": 1, "february": 2, "march": 3, "april": 4, "may": 5, "june": 6, "july": 7, "august": 8,
    "september": 9, "october": 10, "november": 11, "december": 12,
    "jan": 1, "feb": 2, "mar": 3, "apr": 4, "jun": 6, "jul": 7, "aug": 8, "sep": 9, "sept": 9, "oct": 10,
    "nov": 11, "dec": 12,
    "januar": 1, "jänner": 1, "februar": 2, "märz": 3, "mai": 5, "juni": 6, "juli": 7, "oktober": 10,
    "dezember": 12,
    "janvier": 1, "février": 2, "mars": 3, "avril": 4, "juin": 6, "juillet": 7, "août": 8, "septembre": 9,
    "octobre": 10, "novembre": 11, "décembre": 12,
}
_MONTH = r"(" + "|".join(sorted(map(re.escape, _MONTHS), key=len, reverse=True)) + r")\.?"
_DATES = [
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), lambda m: (m[1], m[2], m[3])),
    (re.compile(r"\b(\d{1,2})(?:st|nd|rd|th|er|\.)?\s+" + _MONTH + r",?\s+(\d{4})\b", re.I),
     lambda m: (m[3], _MONTHS[m[2].lower()], m[1])),
    (re.compile(r"\b" + _MONTH + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b", re.I),
     lambda m: (m[3], _MONTHS[m[1].lower()], m[2])),
    (re.compile(r"\b" + _MONTH + r"\s+(\d{4})\b", re.I), lambda m: (m[2], _MONTHS[m[1].lower()], None)),
]
_NUM = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:(?:,|\.|\u00a0|\u202f| )\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?)(?![\w])"
    r"|(?<![\w-])(" + "|".join(sorted(map(re.escape, _NUMBER_WORDS), key=len, reverse=True)) + r"|" + _ONE + r")(?![\w-])",
    re.I)
_PCT = re.compile(r"\s*(?:%|percent\b|per\s*cent\b|prozent\b|pour\s*cent\b)", re.I)
_LIST_MARKER = re.compile(r"^\s*\d{1,2}[.)]\s", re.M)


def _to_number(tok: str) -> float | None:
    low = tok.lower()
    if low in _NUMBER_WORDS:
        return float(_NUMBER_WORDS[low])
    if low in ("one", "ein", "eine", "einen", "un", "une"):
        return 1.0
    t = tok.replace("\u00a0", " ").replace("\u202f", " ")
    groups = re.split(r"[ ,.]", t)
    seps = re.findall(r"[ ,.]", t)
    if len(groups) > 1 and groups[0] != "0" and all(len(g) == 3 for g in groups[1:]) and len(set(seps)) == 1:
        return float("".join(groups))  # thousands separators: 1,200 / 1.200 / 1 200
    if len(groups) > 2:  # 1.200,50 / 1,200.50 / 1 200,50
        return float("".join(groups[:-1]) + "." + groups[-1])
    return float(t.replace(",", "."))


def read_figures(text: str | None) -> set[tuple[str, object]]:
    """The figures an answer states, as values: dates, percentages and numbers (amounts, counts,
    years), whatever their formatting ("6%", "6 percent", "six percent"; "3 March 2024",
    "March 3, 2024", "2024-03-03"; "1,200", "1.200", "1 200"). Numbered-list markers are ignored."""
    if not text:
        return set()
    body = _LIST_MARKER.sub(" ", _THINK.sub(" ", text))
    out: set[tuple[str, object]] = set()
    for pat, parts in _DATES:
        def repl(m: re.Match) -> str:
            y, mo, d = parts(m)
            out.add(("date", f"{int(y):04d}-{int(mo):02d}" + (f"-{int(d):02d}" if d is not None else "")))
            return " "
        body = pat.sub(repl, body)
    for m in _NUM.finditer(body):
        tok = m.group(1) or m.group(2)
        try:
            val = _to_number(tok)
        except ValueError:
            continue
        if val is None:
            continue
        kind = "pct" if _PCT.match(body, m.end()) else "num"
        out.add((kind, round(val, 6)))
    return out


def compare_figures(a: set, b: set) -> str | None:
    """"same", "subset" (one omits figures the other states, nothing conflicts), "conflict", or
    None when either states no figure (nothing to compare)."""
    if not a or not b:
        return None
    if a == b:
        return "same"
    if a < b or b < a:
        return "subset"
    return "conflict"


# ------------------------------------------------------------------ JSON in a judge's answer
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?")
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
_DECODER = None


def _balanced_end(text: str, start: int) -> int | None:
    """Index just past the object opened at ``start``, honouring '…' and "…" strings."""
    depth, quote, esc = 0, None, False
    for i in range(start, len(text)):
        ch = text[i]
        if quote:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
            if depth == 0:
                return i + 1
    return None


def _repair(fragment: str) -> object | None:
    """A near-JSON object: trailing commas, or a Python dict (single quotes, True/False/None)."""
    import ast
    import json

    fixed = _TRAILING_COMMA.sub(r"\1", fragment)
    try:
        return json.loads(fixed)
    except ValueError:
        pass
    try:
        return ast.literal_eval(fixed)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None


def json_objects(text: str | None) -> list[dict]:
    """Every top-level JSON object in an answer, in order: inside code fences or not, after a
    preamble, before trailing prose, outside ``<think>`` blocks; trailing commas and Python-style
    dicts are repaired. Objects inside a top-level array are not top-level (an array is no
    verdict)."""
    import json

    global _DECODER
    if not text:
        return []
    _DECODER = _DECODER or json.JSONDecoder()
    body = _FENCE.sub("\n", _THINK.sub(" ", text)).replace("```", "\n")
    out: list[dict] = []
    i = 0
    while i < len(body):
        ch = body[i]
        if ch not in "{[":
            i += 1
            continue
        try:
            value, end = _DECODER.raw_decode(body, i)
        except ValueError:
            value, end = None, None
        if end is None:
            stop = _balanced_end(body, i)
            value = _repair(body[i:stop]) if stop else None
            end = stop if value is not None else None
        if end is None:
            i += 1
            continue
        if isinstance(value, dict):
            out.append(value)
        i = end
    return out
