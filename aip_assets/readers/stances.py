"""The stance an answer takes on a yes/no question (:func:`read_stance`: yes/no, recommend / advise
against, should / should not, agree / disagree; en, de, fr), None when it takes none."""

from __future__ import annotations

import re

from .text import _THINK, is_blank

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
