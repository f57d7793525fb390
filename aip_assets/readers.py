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


# characters that show nothing yet are no whitespace to ``str.isspace``: zero-width space, non-joiner
# and joiner, word joiner, zero-width no-break space (the byte order mark)
_ZERO_WIDTH = "\u200b\u200c\u200d\u2060\ufeff"
_DROP_ZERO_WIDTH = str.maketrans("", "", _ZERO_WIDTH)


def is_whitespace(text: str | None) -> bool:
    """Nothing visible, in every script: empty, or only whitespace by Unicode (``str.isspace``:
    NBSP, the ideographic space U+3000, line and paragraph separators…) and the zero-width
    characters U+200B–U+200D, U+2060 and U+FEFF."""
    return not (text or "").translate(_DROP_ZERO_WIDTH).strip()


def is_blank(text: str | None) -> bool:
    """An empty answer: nothing visible (``is_whitespace``), or nothing visible outside a
    ``<think>`` block (a reasoning model cut off before its answer)."""
    return is_whitespace(_THINK.sub(" ", text or ""))


# a decision statement: a marker, then the decision on the same line
_MARKER = re.compile(
    r"(?<![\w])(?:final\s+decision|my\s+final\s+decision|my\s+decision|decision\s+finale|décision\s+finale|"
    r"endgültige\s+entscheidung|meine\s+entscheidung|entscheidung|décision|decision|verdict|urteil)"
    r"(?:[\s*_`]*[:：]|\s+[-–—]\s|[\s*_`]+(?=[*_`]))|"
    r"(?<![\w])(?:my\s+(?:final\s+)?decision\s+is|meine\s+entscheidung\s+(?:ist|lautet)|ma\s+décision\s+est)\b",
    re.I)
_STRIP_LEAD = " \t*_`\"'“”„«»‘’[]()<>#:–—-"
_LIST_ITEM = re.compile(r"^\s*(?:[-•+]|\*\s|\d{1,2}[.)])\s")
_END_OF_PHRASE = re.compile(r"[.,;!?(\n—–]|\s-\s")


def _norm(s: str) -> str:
    return " ".join(s.upper().split())


def _at_line_start(text: str, pos: int) -> bool:
    return not text[text.rfind("\n", 0, pos) + 1:pos].strip(_STRIP_LEAD + " ")


# what may follow a stated label: nothing, punctuation, a dash or a bracket, then an explanation
# ("NO, because…", "YES — the applicant…", "Approve (with conditions)"); not a question mark, a
# slash or more words ("No decision", "Yes/No", "YES or NO cannot be determined", "Approve?")
_AFTER_LABEL = re.compile(r"$|\s*(?:[.,;:!)\]]|[-–—]|\(|\n)", re.S)


def label_at_start(text: str | None, labels: list[str]) -> str | None:
    """The label ``text`` states at its start (case-insensitive; markdown, quotes and brackets
    ignored; punctuation or an explanation after a separator allowed), the longest when labels
    share a prefix; else None."""
    if text is None:
        return None
    s = str(text).strip(_STRIP_LEAD + " ")
    s = s.replace("*", "").replace("`", "").replace("_", " ").strip(_STRIP_LEAD + " ")
    s = " ".join(s.split(" "))
    up = s.upper()
    for lab in sorted(labels, key=lambda x: -len(x)):
        n = _norm(lab)
        if up.startswith(n) and not s[len(n):len(n) + 1].isalnum():
            k = len(n)
            while k < len(s) and s[k] in "\"'”’»":  # a closing quote
                k += 1
            if _AFTER_LABEL.match(s, k) and not s[k:].lstrip().startswith(("?", "/")):
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
    if not text or is_blank(text):
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
            word = words[0].lower().strip(_STRIP_LEAD + ".,;!?")
            statements.append((m.start(), None, None if word.upper() in {_norm(x) for x in labels} else word))
    # a bare label alone on one of the last three lines ("**APPROVE**"), not an item of a list
    lines = [(m.start(), m.group(0)) for m in re.finditer(r"[^\n]+", body) if m.group(0).strip(_STRIP_LEAD + " .!")]
    for pos, ln in lines[-3:]:
        if _LIST_ITEM.match(ln):
            continue
        core = ln.strip(_STRIP_LEAD + " .!").replace("*", "").strip()
        lab = label_at_start(core, labels)
        if lab is not None and _norm(core).rstrip(".!") == _norm(lab):
            statements.append((pos, lab, None))
    if not statements:
        return DecisionReading(None, None, False)
    _, lab, stated = max(statements, key=lambda x: x[0])
    return DecisionReading(lab, stated, True)


def stated_word_counts(texts: list[str], labels: list[str]) -> Counter:
    """How many of ``texts`` put each word where a label should be (e.g. after "Decision:") that
    is none of ``labels``: the answers that state a decision in other words. An answer stating a
    label, or no decision at all, is not counted."""
    c: Counter = Counter()
    for t in texts:
        r = read_decision(t, labels)
        if r.label is None and r.stated:
            c[r.stated] += 1
    return c


def stated_words(texts: list[str], labels: list[str], k: int = 3) -> list[tuple[str, int]]:
    """The most common words answers put where a label should be (e.g. after "Decision:")."""
    return stated_word_counts(texts, labels).most_common(k)


# ------------------------------------------------------------------ stances (yes / no)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_EXPLICIT = re.compile(r"(?:my|the\s+short)\s+answer\s+is:?\s*\**(yes|no)\b|"
                       r"(?:meine|die\s+kurze)\s+antwort\s+(?:lautet|ist):?\s*\**(ja|nein)\b|"
                       r"lautet\s+meine\s+antwort:?\s*\**(ja|nein)\b|ma\s+réponse\s+est:?\s*\**(oui|non)\b", re.I)
_YES_WORDS = {"yes", "ja", "oui"}
_START = re.compile(r"^[\W_]*(?:(?P<no2>(?:absolutely|definitely|certainly)\s+not)\b|(?P<w>yes|yeah|yep|absolutely|definitely|"
                    r"no|nope|ja|jawohl|nein|oui|non)\b(?!\s+(?:problem|worries|need|rush|matter|one|doubt|idea|"
                    r"way\s+to\s+tell|and\s+no|seulement|plus)))", re.I)
# the whole answer hedges: no stance to read
_HEDGE = re.compile(r"\b(?:it|that)\s+(?:really\s+)?depends\b|\byes\s+and\s+no\b|\b(?:es\s+)?kommt\s+(?:ganz\s+)?dr?a(?:uf|rauf)\s+an\b|"
                    r"\b(?:ça|cela)\s+dépend\b", re.I)
# a sentence that declines to recommend anything is no stance ("I can't recommend specific products")
_NO_ADVICE = re.compile(r"\b(?:can[’']?t|cannot|can\s+not|unable\s+to)\s+(?:\w+\s+)?(?:recommend|advise)\s+"
                        r"(?:a\s+|any\s+|specific|particular|anything|one\s+option)", re.I)
# first-person cues, strongest after an explicit answer or a leading yes/no
_NEGATIVE = re.compile(
    r"\b(?:i|we)\s*(?:would\s+not|wouldn[’']t|do\s+not|don[’']t|can[’']?t|cannot|can\s+not)\s+(?:\w+\s+)?recommend|"
    r"\b(?:i|we)\s+(?:do\s+not|don[’']t)\s+think\s+(?:you\s+should|it[’']?s\s+(?:a\s+good\s+idea|worth)|it\s+is\s+(?:a\s+good\s+idea|worth))|"
    r"\b(?:recommend|advise|suggest)\w*\s+(?:that\s+you\s+)?(?:not|against|never)\b|\bdecide\s+against\b|"
    r"\b(?:i|we)(?:[’']d|\s+would)?\s+hold\s+off\b|\bnot\s+(?:a\s+good\s+idea|worth\s+it|recommended)\b|"
    r"\bdisagree\b|\b(?:do\s+not|don[’']t)\s+agree\b|"
    r"\bempfehle\b[^.!?]*\bnicht\s+zu\b|"
    r"\bempfehle\s+(?:ich\s+)?(?:es\s+|ihnen\s+|dir\s+|euch\s+|das\s+|dies\s+)?(?:nicht|keine?n?)\b|"
    r"\b(?:rate|rät|raten)\s+(?:ich\s+)?(?:ihnen\s+|dir\s+|euch\s+)?(?:eher\s+|klar\s+|dringend\s+)?davon\s+ab\b|"
    r"\babraten\b|\bstimme\b[^.!?]*\bnicht\s+zu\b|"
    r"\bne\s+(?:vous\s+|te\s+|l[’']|le\s+|la\s+|les\s+)?(?:recommande|conseille)\s+pas\b|\bdéconseill|"
    r"\b(?:recommande|conseille)\w*\s+de\s+ne\s+pas\b|\bpas\s+d[’']accord\b", re.I)
_POSITIVE = re.compile(
    r"\b(?:i|we)(?:[’']d|\s+would)?\s+(?:strongly\s+|definitely\s+|really\s+|highly\s+)?recommend|"
    r"\brecommend\s+(?:that\s+you\s+|you\s+)?(?:go|do|take|proceed|renew|accept|sign|apply)|"
    r"\bi\s+(?:fully\s+|completely\s+)?agree\b|\b(?:is|it[’']s)\s+(?:a\s+good\s+idea|worth\s+it)\b|"
    r"\bempfehle\b|\bempfehlen\b|\bstimme\b[^.!?]*\bzu\b|"
    r"\b(?:recommande|conseille)\b|\bd[’']accord\b", re.I)
# second-person advice: the weakest cue ("you should", "Sie sollten", "vous devriez")
_YOU_NEGATIVE = re.compile(r"\byou\s+(?:should\s+not|shouldn[’']t|should\s+never)\b|"
                           r"\b(?:solltest|sollten|sollte)\b[^.!?]*\bnicht\b|\bne\s+(?:devriez|devrais|devrait)\s+pas\b", re.I)
_YOU_POSITIVE = re.compile(r"\byou\s+should\b(?!\s+(?:know|be\s+aware|note|keep\s+in\s+mind))|"
                           r"\b(?:solltest|sollten)\b|\b(?:devriez|devrais)\b", re.I)


def read_stance(text: str | None) -> str | None:
    """"yes" or "no": the stance an answer takes (yes/no, recommend / advise against, should /
    should not, agree / disagree; en, de, fr); None when it takes none (information only, a
    refusal, "it depends", "yes and no"). Cues by strength: an explicit "my answer is …"; a
    leading yes/no in the first two sentences; the first sentence with a first-person cue (I'd
    recommend, I'd advise against, I agree); the first with a second-person one (you should)."""
    if not text or is_blank(text):
        return None
    body = _THINK.sub(" ", text)
    m = _EXPLICIT.search(body)
    if m:
        word = next(g for g in m.groups() if g).lower()
        return "yes" if word in _YES_WORDS else "no"
    sentences = [x.strip().lstrip("#>*-• ").strip() for x in _SENTENCE.split(body)]
    sentences = [x for x in sentences if x and not _NO_ADVICE.search(x)]
    if any(_HEDGE.search(x) for x in sentences[:2]):
        return None
    for x in sentences[:2]:
        m = _START.match(x)
        if m:
            return "no" if m.group("no2") or m.group("w").lower() in ("no", "nope", "nein", "non") else "yes"
    for neg, pos in ((_NEGATIVE, _POSITIVE), (_YOU_NEGATIVE, _YOU_POSITIVE)):
        for x in sentences:
            if neg.search(x):
                return "no"
            if pos.search(x):
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
_UNITS_EN = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
for _tens in ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"):
    for _i, _u in enumerate(_UNITS_EN, 1):  # twenty-five, thirty one
        _NUMBER_WORDS[f"{_tens}-{_u}"] = _NUMBER_WORDS[_tens] + _i
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
    r"(?<![\w.,])(\d{1,3}(?:(?:,|\.|\u00a0|\u202f| )\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?)(?=[kK]\b|[^\w]|$)"
    r"|(?<![\w-])(" + "|".join(sorted(map(re.escape, _NUMBER_WORDS), key=len, reverse=True)) + r"|" + _ONE + r")(?![\w-])",
    re.I)
_PCT_UNIT = r"\s*(?:%|percent\b|per\s*cent\b|prozent\b|pour\s*cent\b)"
_PCT = re.compile(_PCT_UNIT, re.I)
_RANGE_PCT = re.compile(r"\s*(?:[-–]|to|bis|à)\s*\d+(?:[.,]\d+)?" + _PCT_UNIT, re.I)  # 5-7%: both are percentages
_SCALE = re.compile(r"(?:k\b|\s*(?:thousand|tausend|mille)\b|\s*(?:million|millions|millionen|mio)\b\.?)", re.I)
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
        kind = "pct" if _PCT.match(body, m.end()) or _RANGE_PCT.match(body, m.end()) else "num"
        scale = _SCALE.match(body, m.end()) if kind == "num" else None
        if scale:  # 1.2k, 3 million
            val *= 1e3 if scale.group(0).strip(" .").lower() in ("k", "thousand", "tausend", "mille") else 1e6
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
    """Every top-level JSON object in an answer, in order (see :func:`scan_json`)."""
    return scan_json(text)[0]


_KEY_START = re.compile(r"\{\s*[\"']")


def scan_json(text: str | None) -> tuple[list[dict], bool]:
    """(every top-level JSON object in an answer, in order; whether an object the answer began
    after the last one is unfinished). Objects count inside code fences or not, after a preamble,
    before trailing prose, outside ``<think>`` blocks; trailing commas and Python-style dicts are
    repaired. Objects inside a top-level array are not top-level (an array is no verdict). A
    cut-off final object means the verdict is missing, whatever drafts came before it."""
    import json

    global _DECODER
    if not text:
        return [], False
    _DECODER = _DECODER or json.JSONDecoder()
    body = _FENCE.sub("\n", _THINK.sub(" ", text)).replace("```", "\n")
    out: list[dict] = []
    unfinished = False
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
            if end is None and stop is None and ch == "{" and _KEY_START.match(body, i):
                unfinished = True  # an object begun and never closed: the answer was cut off
        if end is None:
            i += 1
            continue
        if isinstance(value, dict) and not unfinished:  # after an unfinished object, objects are inside it
            out.append(value)
        i = end
    return out, unfinished
