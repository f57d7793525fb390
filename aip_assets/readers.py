"""Readers of model output written as people write it: decisions, stances, figures.

The builtin judge uses them to read answers from any SUT (not only the builtin one), and the
metrics use them to map an LLM judge's reading onto the configured labels. Each reader returns
``None`` when the text does not say what it looks for: the caller then excludes the item and
counts it, it never guesses.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from dataclasses import dataclass

# ------------------------------------------------------------------ decisions
_THINK = re.compile(r"<think>.*?(?:</think>|$)", re.S | re.I)


# Characters that draw nothing. By category: format characters (Cf: zero-width space, joiners, word
# joiner, the byte order mark, the directional marks U+200E/U+200F, the soft hyphen U+00AD, invisible
# operators, tags), spaces and separators (Zs, Zl, Zp: NBSP, U+3000...) and controls (Cc: tab, newline,
# NUL...). And letters or symbols whose glyph is empty: the Hangul fillers U+115F, U+1160, U+3164 and
# U+FFA0, and the blank Braille pattern U+2800.
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp", "Cc"})
_BLANK_GLYPHS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def _visible(ch: str) -> bool:
    return ch not in _BLANK_GLYPHS and unicodedata.category(ch) not in _INVISIBLE_CATEGORIES


def is_whitespace(text: str | None) -> bool:
    """Nothing visible, in every script: empty, or only characters that draw nothing (whitespace by
    Unicode, format and control characters, the Hangul fillers and the blank Braille pattern)."""
    return not any(_visible(ch) for ch in text or "")


def is_blank(text: str | None) -> bool:
    """An empty answer: nothing visible (``is_whitespace``), or nothing visible outside a
    ``<think>`` block (a reasoning model cut off before its answer)."""
    return is_whitespace(_THINK.sub(" ", text or ""))


# a decision statement: a marker, then the decision on the same line
_MARKER = re.compile(
    r"(?<![\w])(?:final\s+decision|my\s+final\s+decision|my\s+decision|decision\s+finale|décision\s+finale|"
    r"endgültige\s+entscheidung|meine\s+entscheidung|entscheidung|décision|decision|verdict|urteil)"
    r"(?:[\s*_`]*[:：]|\s+[-–—]\s|[\s*_`]+(?=[*_`]))|"
    r"(?<![\w])(?:my\s+(?:final\s+)?decision\s+is|meine\s+entscheidung\s+(?:ist|lautet)|ma\s+décision\s+est)\b|"
    # "my decision based on the information above is no": a few words between, within the sentence
    r"(?<![\w])my\s+(?:final\s+)?decision\b(?:\s+[\w'’-]+){1,8}?\s+is\b(?=\s+[\w*\"'“])",
    re.I,
)
# a final answer in the words of a quiz ("The answer is: YES", "Answer: YES", "Final answer: DENY",
# "Choose your answer: Yes", "My choice: approve"): a statement only when a label follows
_ANSWER_MARKER = re.compile(
    r"(?<![\w])(?:(?:the\s+|my\s+)?(?:final\s+)?answer\s+(?:is|would\s+be|will\s+be)|(?:final\s+)?answer|"
    r"(?:my|your|the)\s+(?:final\s+)?choice\s+is|(?:my|your|final)\s+choice|antwort|réponse)"
    r"(?:[\s*_`]*[:：]|\s+[-–—]\s|[\s*_`]+(?=[*_`])|(?<=is)\b|(?<=be)\b)|"
    r"^[\s*_`>]*A[\s*_`]*[:：]",
    re.I | re.M,
)  # the answer of a Q/A pair: "A: Yes" opening its line
# a marker quoted from the instruction: 'a final line of the form "Decision: …"', 'in the form: Decision: …'
_QUOTED_FORM = re.compile(r"\b(?:form|format|formatted\s+as|like)\s*[:\"“'‘`*]+\s*$", re.I)
# what an instruction puts where a label goes ("Decision: <label>", "[label]", "{decision}")
_PLACEHOLDER = re.compile(r"[\s*_`\"'“”]*[<\[{]")
_STRIP_LEAD = " \t*_`\"'“”„«»‘’[]()<>#:–—-"
_LIST_ITEM = re.compile(r"^\s*(?:[-•+]|\*\s|\d{1,2}[.)])\s")
_END_OF_PHRASE = re.compile(r"[.,;!?(\n—–]|\s-\s")
# a question where a decision should be ("Decision: Should I apply for food assistance …?"): the
# answer restating what it was asked, no decision in other words. A line ending in "?", or one
# opening with a question word, or with an auxiliary and then its subject ("Should I", "Can we",
# "Is it", "Do you"; not "Do not renew", a decision)
_QUESTION = re.compile(
    r"[^\n]*\?[\s*_`\"'”’»)]*$|"
    r"(?:what|which|who|whom|whose|why|how|when|where|whether)\b|"
    r"(?:should|shall|can|could|may|might|must|will|would|do|does|did|is|are|am|was|were|have|has)\s+"
    r"(?:i|we|you|he|she|it|they|my|our|your|his|her|its|their|the|this|that|these|those|there|a|an|one|someone)\b",
    re.I,
)


def _norm(s: str) -> str:
    return " ".join(s.upper().split())


def _at_line_start(text: str, pos: int) -> bool:
    return not text[text.rfind("\n", 0, pos) + 1 : pos].strip(_STRIP_LEAD + " ")


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
        if up.startswith(n) and not s[len(n) : len(n) + 1].isalnum():
            k = len(n)
            while k < len(s) and s[k] in "\"'”’»":  # a closing quote
                k += 1
            if (
                _AFTER_LABEL.match(s, k)
                and not s[k:].lstrip().startswith(("?", "/"))
                and not _lists_labels(s[k:], labels)
            ):
                return lab
    return None


def _copies_options(text: str, labels: list[str]) -> bool:
    """Whether ``text`` starts with a label followed by another ("YES, NO", "Approve or deny")."""
    s = text.strip(_STRIP_LEAD + " ").replace("*", "").replace("`", "")
    up = s.upper()
    for lab in sorted(labels, key=lambda x: -len(x)):
        n = _norm(lab)
        if up.startswith(n) and not s[len(n) : len(n) + 1].isalnum():
            return _lists_labels(s[len(n) :], labels)
    return False


def _lists_labels(rest: str, labels: list[str]) -> bool:
    """Whether ``rest`` (what follows a label) goes on to another label: "YES, NO", "APPROVE / DENY",
    "Yes or No", the options copied from the instruction, not a decision."""
    m = re.match(r"\s*(?:[,/|;]|\bor\b|\band\b|\boder\b|\bou\b)\s*", rest, re.I)
    if not m:
        return False
    nxt = rest[m.end() :].strip(_STRIP_LEAD + " ").replace("*", "").upper()
    return any(nxt.startswith(_norm(x)) and not nxt[len(_norm(x)) : len(_norm(x)) + 1].isalnum() for x in labels)


def map_label(value: object, labels: list[str]) -> str | None:
    """A judge's reading of a decision (any case, quoted, with an explanation after it) mapped
    onto a configured label, else None (no decision, or a word that is not a label)."""
    if value is None or not isinstance(value, str):
        return None
    return label_at_start(value, labels)


@dataclass(frozen=True)
class DecisionReading:
    label: str | None  # the configured label the answer states, or None
    stated: str | None  # the word the answer puts where a label should be, when it is no label
    marker: bool  # whether the answer makes a decision statement at all


def read_decision(text: str | None, labels: list[str]) -> DecisionReading:
    """The decision an answer states, as people write it.

    A statement is a marker (``Decision:``, ``**Decision:**``, ``Final decision:``, ``Decision -``,
    ``My decision is``, ``Verdict:``, ``Entscheidung:``, ``Décision :``…) followed on its line by
    the decision, inline at the end of a sentence or on its own line; a final answer ("The answer
    is: YES", "Answer: NO", "Final answer: DENY", "A: Yes") on one of the last three lines; or a
    label alone on one of the last lines. Not the options copied ("Decision: YES, NO"), the
    instruction echoed ("Decision: <label>", 'of the form "Decision: NO"'). The last statement
    counts (a model may revise itself), unless the answer states two labels twice or more each
    (it alternates: no decision). Text after the label
    (punctuation, an explanation) does not matter; reasoning that merely mentions a label or the
    word "decision" is not a statement. ``<think>`` blocks are ignored."""
    if not text or is_blank(text):
        return DecisionReading(None, None, False)
    body = _THINK.sub(" ", text)
    statements: list[tuple[int, str | None, str | None]] = []
    for m in _MARKER.finditer(body):
        if _QUOTED_FORM.search(body, max(0, m.start() - 24), m.start()):
            continue  # the instruction quoted: 'of the form "Decision: No"'
        line_end = body.find("\n", m.end())
        after = body[m.end() : len(body) if line_end < 0 else line_end]
        lab = label_at_start(after, labels)
        if lab is None and _PLACEHOLDER.match(after):  # the instruction echoed: 'of the form "Decision: <label>"'
            continue
        if lab is None and _QUESTION.match(after.strip(_STRIP_LEAD + " ")):
            continue  # the question restated ("Decision: Should I apply …?"): no statement, no other word
        phrase = _END_OF_PHRASE.split(after.strip(_STRIP_LEAD + " ").replace("*", "").replace("`", ""), 1)[0]
        words = phrase.split()
        if lab is not None:
            statements.append((m.start(), lab, None))
        elif _copies_options(after, labels):
            continue  # the options copied ("Decision: YES, NO"): no statement
        elif words and (len(words) <= 3 or _at_line_start(body, m.start())):
            # a non-label answer ("deny", "N/A", "Escalate to a senior underwriter") is a statement when
            # short, or when the marker opens its line; inline prose after "decision:" is not
            word = words[0].lower().strip(_STRIP_LEAD + ".,;!?")
            statements.append((m.start(), None, None if word.upper() in {_norm(x) for x in labels} else word))
    # the quiz forms count near the end only: "Answer: No." amid the text is most often a question
    # the model asked itself, in a dialogue it goes on to invent
    lines = [(m.start(), m.group(0)) for m in re.finditer(r"[^\n]+", body) if m.group(0).strip(_STRIP_LEAD + " .!")]
    tail = lines[-3][0] if len(lines) >= 3 else 0
    for m in _ANSWER_MARKER.finditer(body, tail):
        line_end = body.find("\n", m.end())
        lab = label_at_start(body[m.end() : len(body) if line_end < 0 else line_end], labels)
        if lab is not None:  # "Answer: it depends" states nothing
            statements.append((m.start(), lab, None))
    # a bare label alone on one of the last three lines ("**APPROVE**"), not an item of a list nor a
    # heading ("No:", "**Yes:**": an option introducing what follows, perhaps cut off)
    for pos, ln in lines[-3:]:
        if _LIST_ITEM.match(ln) or ln.replace("*", "").replace("_", "").rstrip().endswith((":", "：")):
            continue
        core = ln.strip(_STRIP_LEAD + " .!").replace("*", "").strip()
        lab = label_at_start(core, labels)
        if lab is not None and _norm(core).rstrip(".!") == _norm(lab):
            statements.append((pos, lab, None))
    if not statements:
        return DecisionReading(None, None, False)
    said = Counter(lab for _, lab, _ in statements if lab is not None)
    if sum(n >= 2 for n in said.values()) >= 2:  # "Decision: YES … Decision: NO … Decision: YES … NO": no decision
        return DecisionReading(None, None, True)
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
_EXPLICIT = re.compile(
    r"(?:my|the\s+short)\s+answer\s+is:?\s*\**(yes|no)\b|"
    r"(?:meine|die\s+kurze)\s+antwort\s+(?:lautet|ist):?\s*\**(ja|nein)\b|"
    r"lautet\s+meine\s+antwort:?\s*\**(ja|nein)\b|ma\s+réponse\s+est:?\s*\**(oui|non)\b",
    re.I,
)
_YES_WORDS = {"yes", "ja", "oui"}
_START = re.compile(
    r"^[\W_]*(?:(?P<no2>(?:absolutely|definitely|certainly)\s+not)\b|(?P<w>yes|yeah|yep|absolutely|definitely|"
    r"no|nope|ja|jawohl|nein|oui|non)\b(?!\s+(?:problem|worries|need|rush|matter|one|doubt|idea|"
    r"way\s+to\s+tell|and\s+no|seulement|plus)))",
    re.I,
)
# the whole answer hedges: no stance to read
_HEDGE = re.compile(
    r"\b(?:it|that)\s+(?:really\s+)?depends\b|\byes\s+and\s+no\b|\b(?:es\s+)?kommt\s+(?:ganz\s+)?dr?a(?:uf|rauf)\s+an\b|"
    r"\b(?:ça|cela)\s+dépend\b",
    re.I,
)
# a sentence that declines to recommend anything is no stance ("I can't recommend specific products")
_NO_ADVICE = re.compile(
    r"\b(?:can[’']?t|cannot|can\s+not|unable\s+to)\s+(?:\w+\s+)?(?:recommend|advise)\s+"
    r"(?:a\s+|any\s+|specific|particular|anything|one\s+option)",
    re.I,
)
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
    r"\b(?:recommande|conseille)\w*\s+de\s+ne\s+pas\b|\bpas\s+d[’']accord\b",
    re.I,
)
_POSITIVE = re.compile(
    r"\b(?:i|we)(?:[’']d|\s+would)?\s+(?:strongly\s+|definitely\s+|really\s+|highly\s+)?recommend|"
    r"\brecommend\s+(?:that\s+you\s+|you\s+)?(?:go|do|take|proceed|renew|accept|sign|apply)|"
    r"\bi\s+(?:fully\s+|completely\s+)?agree\b|\b(?:is|it[’']s)\s+(?:a\s+good\s+idea|worth\s+it)\b|"
    r"\bempfehle\b|\bempfehlen\b|\bstimme\b[^.!?]*\bzu\b|"
    r"\b(?:recommande|conseille)\b|\bd[’']accord\b",
    re.I,
)
# second-person advice: the weakest cue ("you should", "Sie sollten", "vous devriez")
_YOU_NEGATIVE = re.compile(
    r"\byou\s+(?:should\s+not|shouldn[’']t|should\s+never)\b|"
    r"\b(?:solltest|sollten|sollte)\b[^.!?]*\bnicht\b|\bne\s+(?:devriez|devrais|devrait)\s+pas\b",
    re.I,
)
_YOU_POSITIVE = re.compile(
    r"\byou\s+should\b(?!\s+(?:know|be\s+aware|note|keep\s+in\s+mind))|"
    r"\b(?:solltest|sollten)\b|\b(?:devriez|devrais)\b",
    re.I,
)


def read_stance(text: str | None) -> str | None:
    """Yes or no: the stance an answer takes (yes/no, recommend / advise against, should /
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
    "zero": 0,
    "two": 2,
    "three": 3,
    "four": 4,
    "five": 5,
    "six": 6,
    "seven": 7,
    "eight": 8,
    "nine": 9,
    "ten": 10,
    "eleven": 11,
    "twelve": 12,
    "thirteen": 13,
    "fourteen": 14,
    "fifteen": 15,
    "sixteen": 16,
    "seventeen": 17,
    "eighteen": 18,
    "nineteen": 19,
    "twenty": 20,
    "thirty": 30,
    "forty": 40,
    "fifty": 50,
    "sixty": 60,
    "seventy": 70,
    "eighty": 80,
    "ninety": 90,
    # de
    "null": 0,
    "eins": 1,
    "zwei": 2,
    "drei": 3,
    "vier": 4,
    "fünf": 5,
    "sechs": 6,
    "sieben": 7,
    "acht": 8,
    "neun": 9,
    "zehn": 10,
    "elf": 11,
    "zwölf": 12,
    "dreizehn": 13,
    "vierzehn": 14,
    "fünfzehn": 15,
    "sechzehn": 16,
    "siebzehn": 17,
    "achtzehn": 18,
    "neunzehn": 19,
    "zwanzig": 20,
    "dreißig": 30,
    "vierzig": 40,
    "fünfzig": 50,
    "sechzig": 60,
    "siebzig": 70,
    "achtzig": 80,
    "neunzig": 90,
    # fr
    "zéro": 0,
    "deux": 2,
    "trois": 3,
    "quatre": 4,
    "cinq": 5,
    "sept": 7,
    "huit": 8,
    "neuf": 9,
    "dix": 10,
    "onze": 11,
    "douze": 12,
    "treize": 13,
    "quatorze": 14,
    "quinze": 15,
    "seize": 16,
    "dix-sept": 17,
    "dix-huit": 18,
    "dix-neuf": 19,
    "vingt": 20,
    "trente": 30,
    "quarante": 40,
    "cinquante": 50,
    "soixante": 60,
}
_UNITS_EN = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
for _tens in ("twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"):
    for _i, _u in enumerate(_UNITS_EN, 1):  # twenty-five, thirty one
        _NUMBER_WORDS[f"{_tens}-{_u}"] = _NUMBER_WORDS[_tens] + _i
# "one" / "ein" / "un" are also articles and pronouns: a number only before a unit
_ONE = (
    r"(?:one|ein|eine|einen|un|une)(?=\s+(?:years?|months?|weeks?|days?|hours?|percent|per\s+cent|jahre?s?|monate?n?s?|"
)
_ONE += r"wochen?|tage?n?|prozent|ans?|mois|semaines?|jours?|pour\s+cent)\b)"
_MONTHS = {
    "january": 1,
    "february": 2,
    "march": 3,
    "april": 4,
    "may": 5,
    "june": 6,
    "july": 7,
    "august": 8,
    "september": 9,
    "october": 10,
    "november": 11,
    "december": 12,
    "jan": 1,
    "feb": 2,
    "mar": 3,
    "apr": 4,
    "jun": 6,
    "jul": 7,
    "aug": 8,
    "sep": 9,
    "sept": 9,
    "oct": 10,
    "nov": 11,
    "dec": 12,
    "januar": 1,
    "jänner": 1,
    "februar": 2,
    "märz": 3,
    "mai": 5,
    "juni": 6,
    "juli": 7,
    "oktober": 10,
    "dezember": 12,
    "janvier": 1,
    "février": 2,
    "mars": 3,
    "avril": 4,
    "juin": 6,
    "juillet": 7,
    "août": 8,
    "septembre": 9,
    "octobre": 10,
    "novembre": 11,
    "décembre": 12,
}
_MONTH = r"(" + "|".join(sorted(map(re.escape, _MONTHS), key=len, reverse=True)) + r")\.?"
_DATES = [
    (re.compile(r"\b(\d{4})-(\d{1,2})-(\d{1,2})\b"), lambda m: (m[1], m[2], m[3])),
    (
        re.compile(r"\b(\d{1,2})(?:st|nd|rd|th|er|\.)?\s+" + _MONTH + r",?\s+(\d{4})\b", re.I),
        lambda m: (m[3], _MONTHS[m[2].lower()], m[1]),
    ),
    (
        re.compile(r"\b" + _MONTH + r"\s+(\d{1,2})(?:st|nd|rd|th)?,?\s+(\d{4})\b", re.I),
        lambda m: (m[3], _MONTHS[m[1].lower()], m[2]),
    ),
    (re.compile(r"\b" + _MONTH + r"\s+(\d{4})\b", re.I), lambda m: (m[2], _MONTHS[m[1].lower()], None)),
]
_NUM = re.compile(
    r"(?<![\w.,])(\d{1,3}(?:(?:,|\.|\u00a0|\u202f| )\d{3})+(?:[.,]\d+)?|\d+(?:[.,]\d+)?)(?=[kK]\b|[^\w]|$)"
    r"|(?<![\w-])("
    + "|".join(sorted(map(re.escape, _NUMBER_WORDS), key=len, reverse=True))
    + r"|"
    + _ONE
    + r")(?![\w-])",
    re.I,
)
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


# a figure's unit: a currency (before or after the number), a period of time (durations are kept
# in months, days or hours), "per <period>" after an amount (a rent of $1,450 a month)
_CURRENCY_BEFORE = {"$": "USD", "us$": "USD", "usd": "USD", "€": "EUR", "eur": "EUR", "£": "GBP", "gbp": "GBP"}
_CURRENCY_AFTER = {
    "$": "USD",
    "usd": "USD",
    "dollar": "USD",
    "dollars": "USD",
    "€": "EUR",
    "eur": "EUR",
    "euro": "EUR",
    "euros": "EUR",
    "£": "GBP",
    "gbp": "GBP",
    "pound": "GBP",
    "pounds": "GBP",
}
_CUR_BEFORE = re.compile(r"(?:us\$|\$|€|£|usd|eur|gbp)\s?$", re.I)
_CUR_AFTER = re.compile(r"\s?(us\$|\$|€|£|usd|eur|gbp|dollars?|euros?|pounds?)(?![\w])", re.I)
_PERIODS = {  # word -> (unit, factor)
    "year": ("month", 12),
    "years": ("month", 12),
    "yr": ("month", 12),
    "yrs": ("month", 12),
    "jahr": ("month", 12),
    "jahre": ("month", 12),
    "jahren": ("month", 12),
    "jahres": ("month", 12),
    "ans": ("month", 12),
    "année": ("month", 12),
    "années": ("month", 12),
    "month": ("month", 1),
    "months": ("month", 1),
    "monat": ("month", 1),
    "monate": ("month", 1),
    "monaten": ("month", 1),
    "mois": ("month", 1),
    "week": ("day", 7),
    "weeks": ("day", 7),
    "woche": ("day", 7),
    "wochen": ("day", 7),
    "semaine": ("day", 7),
    "semaines": ("day", 7),
    "day": ("day", 1),
    "days": ("day", 1),
    "tag": ("day", 1),
    "tage": ("day", 1),
    "tagen": ("day", 1),
    "jour": ("day", 1),
    "jours": ("day", 1),
    "hour": ("hour", 1),
    "hours": ("hour", 1),
    "stunde": ("hour", 1),
    "stunden": ("hour", 1),
    "heure": ("hour", 1),
    "heures": ("hour", 1),
}
_PERIOD_AFTER = re.compile(
    r"[\s-]?(" + "|".join(sorted(map(re.escape, _PERIODS), key=len, reverse=True)) + r")(?:['’]s?)?(?![\w])", re.I
)
# "a" and "an" are English articles: "an" is a French year only after "par" ("20 an hour" is no 20 years)
_PER_PERIOD = re.compile(
    r"\s*(?:(?:per|a|an|each|every|/)\s*(year|month|week|day|hour|annum)|(?:pro|im)\s*(jahr|monat|"
    r"woche|tag|stunde)|par\s*(an|mois|semaine|jour|heure))(?![\w])",
    re.I,
)
_PER_CANON = {
    "annum": "year",
    "jahr": "year",
    "an": "year",
    "monat": "month",
    "mois": "month",
    "woche": "week",
    "semaine": "week",
    "tag": "day",
    "jour": "day",
    "stunde": "hour",
    "heure": "hour",
}

# the words a figure is attached to: the nearest words before it (after linking words: "score of 661",
# "the APR is 28%", "Kaution beträgt 1.200 Euro") and the words right after it ("28% APR", "a $14,000 loan")
_WORD_TOKEN = re.compile(r"[^\W\d_][\w'’-]*|\d[\d.,]*%?|[^\w\s]", re.U)
_LINKING = set(
    """
of is are was were be been being 's at around about approximately approx roughly only just nearly almost over under between within among zwischen entre
below above than more less least most up to from by for and or with as into
equals equal equalling totals total totalling totaling comes come goes go rises rise falls fall drops drop reaches
reach increases increase decreases decrease costs cost pays pay paying paid bringing brings bring get gets getting
receive receives received charges charge charged earn earns earning make makes making need needs needed require
requires required requiring would will could should can may might must do does did has have had having
currently now then still also already exactly roughly some another
a an the your my our their his her its this that these those you i we it they he she one me us them
i'd i'm i'll i've you'd you're you'll you've we'd we're we'll it's that's there's they're they'd he's she's
so which what who whose how much many because since if when while but however therefore thus ago later earlier
on off out down back after before during until till via plus minus
not no yes there here just even each every both either
von ist sind war waren beträgt betragen liegt liegen bei auf um rund etwa ungefähr circa ca zu mit höhe in im
der die das den dem des ein eine einen einem einer ihr ihre ihren sie es wir ich du
de du des est sont était sera seront à au aux environ passe passent la le les l un une votre vos son sa ses
""".split()
)
_WEAK = set(
    """monthly annual annually yearly weekly daily total current new old minimum maximum average overall
estimated net gross base basic standard approximately full additional extra initial final first last next
per cent percent dollars dollar euros euro pounds pound money amount figure number value""".split()
)
_BOUNDARY = set('.,;!?()[]{}\n"“”')


def _stem(w: str) -> str:
    w = w.lower().strip("'’-").replace("’", "'")
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith("ss"):
        w = w[:-1]
    return w


def _attached_words(body: str, start: int, end: int) -> frozenset[str]:
    """The words a figure at ``body[start:end]`` (unit included) is attached to: up to three
    before it, after any linking words, within its clause; up to two right after it. Words that
    qualify any figure (monthly, total, minimum…) are dropped."""
    words: list[str] = []
    left = _WORD_TOKEN.findall(body[max(0, start - 120) : start].replace("*", " ").replace("_", " "))
    i = len(left) - 1
    while i >= 0 and (left[i].lower() in _LINKING or left[i] in ":=-–—/" or left[i] in _CURRENCY_BEFORE):
        i -= 1
    while i >= 0 and len(words) < 3:
        t = left[i]
        if t in _BOUNDARY or t[0].isdigit() or t.lower() in _LINKING or not t[0].isalpha():
            break
        words.append(t)
        i -= 1
    right = _WORD_TOKEN.findall(body[end : end + 60].replace("*", " "))
    for t in right[:2]:
        if t in _BOUNDARY or t[0].isdigit() or t.lower() in _LINKING or not t[0].isalpha():
            break
        words.append(t)
    return frozenset(_stem(w) for w in words if _stem(w) not in _WEAK and _stem(w) not in _LINKING)


@dataclass(frozen=True)
class Figure:
    """A figure an answer states: its kind ("date", "pct", "num"), its value, its unit (a currency,
    "month"/"day"/"hour" for durations, a currency per period, "" for a bare number) and the words
    it is attached to (stemmed; empty when it stands alone)."""

    kind: str
    value: object
    unit: str = ""
    about: frozenset = frozenset()

    def __str__(self) -> str:
        about = f" ({' '.join(sorted(self.about))})" if self.about else ""
        if self.kind == "pct":
            return f"{self.value:g}%{about}"
        if self.kind == "date":
            return f"{self.value}{about}"
        unit = f" {self.unit}" if self.unit else ""
        return f"{self.value:g}{unit}{about}"


def values(figures: set[Figure]) -> set[tuple[str, object]]:
    """(kind, value) of each figure: what an answer states, whatever the words around it."""
    return {(f.kind, f.value) for f in figures}


def read_figures(text: str | None) -> set[Figure]:
    """The figures an answer states, as values with their unit and the words they are attached to:
    dates, percentages and numbers (amounts, counts, durations, years), whatever their formatting
    ("6%", "6 percent", "six percent"; "3 March 2024", "March 3, 2024", "2024-03-03"; "1,200",
    "1.200", "1 200"; "$1,200", "1,200 dollars"; "60 months", "5 years"). Numbered-list markers are
    ignored."""
    if not text:
        return set()
    body = _LIST_MARKER.sub(lambda m: " " * len(m.group(0)), _THINK.sub(lambda m: " " * len(m.group(0)), text))
    out: set[Figure] = set()
    for pat, parts in _DATES:

        def repl(m: re.Match) -> str:
            y, mo, d = parts(m)
            value = f"{int(y):04d}-{int(mo):02d}" + (f"-{int(d):02d}" if d is not None else "")
            out.add(Figure("date", value, "", _attached_words(body, m.start(), m.end())))
            return " " * len(m.group(0))

        body = pat.sub(repl, body)
    for m in _NUM.finditer(body):
        tok = m.group(1) or m.group(2)
        try:
            val = _to_number(tok)
        except ValueError:
            continue
        if val is None:
            continue
        start, end, unit = m.start(), m.end(), ""
        if _PCT.match(body, end) or _RANGE_PCT.match(body, end):
            kind = "pct"
            pm = _PCT.match(body, end)
            end = pm.end() if pm else end
        else:
            kind = "num"
            scale = _SCALE.match(body, end)
            if scale:  # 1.2k, 3 million
                val *= 1e3 if scale.group(0).strip(" .").lower() in ("k", "thousand", "tausend", "mille") else 1e6
                end = scale.end()
            before = _CUR_BEFORE.search(body, max(0, start - 4), start)
            after = _CUR_AFTER.match(body, end)
            period = _PERIOD_AFTER.match(body, end)
            if before:
                unit = _CURRENCY_BEFORE[before.group(0).strip().lower()]
                start = before.start()
            elif after:
                unit = _CURRENCY_AFTER[after.group(1).lower()]
                end = after.end()
            elif period:
                unit, factor = _PERIODS[period.group(1).lower()]
                val *= factor
                end = period.end()
            if unit and unit not in ("month", "day", "hour"):
                per = _PER_PERIOD.match(body, end)
                if per:  # an amount per period: $1,450 a month
                    word = next(g for g in per.groups() if g).lower()
                    unit += "/" + _PER_CANON.get(word, word)
                    end = per.end()
        out.add(Figure(kind, round(val, 6), unit, _attached_words(body, start, end)))
    return out


def _same_quantity(x: Figure, y: Figure, lone: bool) -> bool:
    """Whether two figures can measure the same quantity: the same kind and unit, and either a word
    in common ("the VAT rate of 6%" and "the reduced rate of 7%"; "credit score 661" and "APR 28%"
    cannot), or both ``lone`` (each the only figure of its kind and unit that the other answer does
    not state) and either both attached to no word ("6%" against "7%") or amounts per period, one
    attached to none ("$960 per year" against "so you pay $1,080 a year"). Dates are compared as lone
    figures whatever their words."""
    if x.kind != y.kind or not _same_unit(x.unit, y.unit):
        return False
    if x.kind == "date":
        return len(str(x.value)) == len(str(y.value)) and lone  # a month against a month, a day against a day
    if x.about and y.about:
        return bool(x.about & y.about)
    # a lone figure attached to nothing stands for the answer's one figure of its kind: compared with
    # the other answer's lone one when that is unattached too, or when they are amounts per period
    return lone and (not x.about and not y.about or "/" in x.unit + y.unit)


def _same_unit(u: str, v: str) -> bool:
    """The same unit, or an amount with and without its period ("850 euros" of a monthly rent
    against "875 euros a month")."""
    return u == v or (u.split("/")[0] == v.split("/")[0] != "" and ("/" not in u or "/" not in v))


def _states(fig: Figure, others: set[Figure]) -> bool:
    """Whether ``others`` state ``fig``'s value: the same kind and value, in its unit or without one
    ("$14,000" and "14,000")."""
    return any(
        o.kind == fig.kind and o.value == fig.value and (_same_unit(o.unit, fig.unit) or not o.unit or not fig.unit)
        for o in others
    )


def compare_figures(a: set[Figure], b: set[Figure]) -> str | None:
    """How two answers' figures relate, quantity by quantity (a figure another answer also states
    agrees, whatever the words around it; the rest are compared only with figures that can
    measure the same quantity, :func:`_same_quantity`):

    - "conflict": a figure of one answer and one of the other, neither stated by the other answer,
      can measure the same quantity and differ;
    - "same": each answer states every figure of the other;
    - "subset": they agree on some figures and nothing conflicts (one or both state figures the
      other leaves out);
    - "not_comparable": both state figures, but none that the other states or could contradict
      (a credit score against an APR);
    - None: either states no figure (nothing to compare)."""
    if not a or not b:
        return None
    only_a = {x for x in a if not _states(x, b)}
    only_b = {y for y in b if not _states(y, a)}

    def alone(f: Figure, among: set[Figure]) -> bool:
        return sum(g.kind == f.kind and _same_unit(g.unit, f.unit) for g in among) == 1

    if any(_same_quantity(x, y, alone(x, only_a) and alone(y, only_b)) for x in only_a for y in only_b):
        return "conflict"
    if not only_a and not only_b:
        return "same"
    if len(only_a) < len(a) or len(only_b) < len(b):
        return "subset"
    return "not_comparable"


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
        return json.loads(fixed, strict=False)  # a raw line break or tab inside a string, as small models write
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
    cut-off final object means the verdict is missing, whatever drafts came before it. A raw
    control character (a line break, a tab) inside a string is read as JSON-with-it, not refused."""
    import json

    global _DECODER
    if not text:
        return [], False
    # strict=False: a raw line break or tab inside a string ("line one<newline>line two") is read, as
    # many small models write it; only control characters inside strings are allowed beyond JSON
    _DECODER = _DECODER or json.JSONDecoder(strict=False)
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
