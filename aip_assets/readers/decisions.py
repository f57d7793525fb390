"""The decision an answer states (:func:`read_decision`: "Decision: YES", "The answer is: NO", a
label alone on a last line), a judge's reading of one mapped onto the configured labels
(:func:`map_label`, :func:`label_at_start`), and the words answers put where a label should be
(:func:`stated_words`)."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

from .text import _THINK, is_blank

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
