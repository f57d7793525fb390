"""The figures an answer states (:func:`read_figures`: dates, percentages, amounts, durations,
whatever their formatting and language, each with its unit and the words it is attached to) and how
two answers' figures relate (:func:`compare_figures`: same, subset, conflict, not comparable)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .text import _THINK

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
