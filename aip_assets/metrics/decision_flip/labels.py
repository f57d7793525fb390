"""Decision flip's label rule (docs/metrics/decision-flip.md, "Labels"): do the configured decision
labels fit the words the SUT uses?"""

from __future__ import annotations

from typing import Any

from ...readers.decisions import stated_word_counts
from ..base import StageContext
from .config import DecisionFlipConfig
from .prompts import labels_for

LABEL_MISMATCH_SHARE = 0.2  # more than this share of the answers stating a decision use other words: a mismatch


def label_mismatch(
    ctx: StageContext, cfg: DecisionFlipConfig, read: int, unread: int, texts: list[str]
) -> dict[str, Any] | None:
    """The rule (docs/metrics/decision-flip.md, "Labels"): of the answers that state a decision (the ``read - unread`` whose
    decision the judge read as a label, and those that put another word where a label should
    be, e.g. "Decision: accept"), more than a fifth using other words is a label mismatch: the
    labels do not fit the SUT; it fails the gate, naming the words. Fewer other words (a stray
    "should" after "Decision:") are a ``stray_decision_words`` warning; many answers stating no
    decision at all (refusals, hedges: more than a fifth of those read) a
    ``many_without_decision`` warning (how often per axis value is the ``refusal`` scope, a
    difference between values the differential-refusal test): the labels fit, never a failure.

    ``texts`` holds the first 5,000 of the ``unread`` answers (the caller's cap); past it the
    count of other-word answers is estimated from them (scaled by ``unread / len(texts)``)
    and the message says so."""
    if not read or not unread:
        return None
    labels = cfg.decision_labels or list(
        dict.fromkeys(lab for r in ctx.rows(ctx.input_ids()[:50]) for lab in labels_for(cfg, r))
    )
    counts = stated_word_counts(texts, labels)
    seen = len(texts)
    estimated = 0 < seen < unread
    other = round(sum(counts.values()) * unread / seen) if estimated else sum(counts.values())
    stating = read - unread + other
    other_share = other / stating if stating else 0.0
    without = unread / read
    fails = other_share > LABEL_MISMATCH_SHARE
    if not fails and not other and without <= LABEL_MISMATCH_SHARE:
        return None
    words = counts.most_common(5)
    named = ", ".join(f"{chr(39)}{w}{chr(39)} ({n})" for w, n in words)
    est = f" (estimated from the first {seen} of the {unread} answers without a label)" if estimated else ""
    others = (
        f"{other} of {stating} answers that state a decision ({other_share:.0%}) put other words where a "
        f"label ({', '.join(labels)}) should be{est}: {named}"
    )
    if fails:
        code = "label_mismatch"
        msg = (
            f"label mismatch: {others}; more than a fifth. Set decision_labels to the words the SUT uses, "
            f"or fix its instruction"
        )
    elif without > LABEL_MISMATCH_SHARE:
        code = "many_without_decision"
        msg = (
            f"{unread} of {read} answers ({without:.0%}) state no decision: "
            + (
                f"no word stands where a label ({', '.join(labels)}) should be, so they"
                if not other
                else "most put no word where a label should be: they"
            )
            + " refuse, hedge or decline. Their pairs are excluded (neither decides) or count as incidental "
            "differences (one decides); the rate per axis value is metric_scores scope 'refusal'"
            + (f". Besides, {others}: at most a fifth, no label mismatch" if other else "")
        )
    else:
        code = "stray_decision_words"
        msg = (
            f"{others}: at most a fifth, no label mismatch (those answers count as stating no decision); "
            f"read them in sut_responses if those words are decisions"
        )
    return {
        "share": without,
        "answers": read,
        "without_label": unread,
        "labels": labels,
        "stating_decision": stating,
        "other_words": other,
        "other_share": other_share,
        "texts_read": seen,
        "estimated": estimated,
        "stated_words": [{"word": w, "count": n} for w, n in words],
        "fails_gate": fails,
        "code": code,
        "message": msg,
    }
