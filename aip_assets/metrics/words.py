"""The words a metric's results are told in: why a row has no score and how the rows without one
are said (:func:`row_reason`, :func:`unscored_status`, :func:`not_scored_phrase`,
:func:`failed_and_excluded`), and what a run found (:class:`Finding`, read from the run's rows
through :class:`Evidence`, with :func:`examples_of`, :func:`clip_quote` and :func:`pct`;
``aip_assets.findings`` ranks every metric's)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import pandas as pd

from ..gate import FAILURE_REASONS


def row_reason(statuses: list[str] | tuple[str, ...]) -> str:
    """Why a row (or a group) has no score, from the statuses of its units: a failure first (a SUT
    call, a judge that never answered in form), else its most frequent exclusion (``unjudgeable``,
    ``empty_answer``, ``no_decision``...; ties by name); ``not_judged`` when it has no unit at all."""
    bad = [s for s in statuses if s != "ok"]
    if not bad:
        return "not_judged"
    for failure in ("sut_failed", "judge_failed"):
        if failure in bad:
            return failure
    counts = Counter(bad)
    return min(counts, key=lambda s: (-counts[s], s))


def unscored_status(reason: str) -> Literal["error", "excluded"]:
    """A ``row_scores`` status (and label) for a row without a score, from its ``row_reason``:
    ``error`` when something failed (``FAILURE_REASONS``: a SUT call, a judge, a row never judged),
    ``excluded`` when what it holds cannot be judged (a refusal, an unreadable answer, an edge case
    of the dataset): an exclusion is never called an error."""
    return "error" if reason in FAILURE_REASONS else "excluded"


def not_scored_phrase(what: str, by_reason: Mapping[str, int] | None) -> str:
    """``rows failed 2 (judge_failed 2), rows excluded 1 (unjudgeable 1)``: the rows (or groups)
    without a score, by reason. A failure reason (``sut_failed``, ``judge_failed``, ``not_judged``:
    the row is stored as ``error``) is said failed; the others are exclusions (a refusal, an
    unreadable answer), never called failures or errors. ``rows excluded 0`` when there are none."""
    kinds = failed_and_excluded(by_reason)
    if not kinds:
        return f"{what} excluded 0"
    return ", ".join(f"{what} {word} {sum(n for _, n in items)} ({reasons_phrase(items)})" for word, items in kinds)


def failed_and_excluded(by_reason: Mapping[str, int] | None) -> list[tuple[str, list[tuple[str, int]]]]:
    """Counts by reason split into ("failed", [(reason, n)...]) (``FAILURE_REASONS``) and
    ("excluded", [...]) (the others), each kind only when it has any, each the most frequent first."""
    counts = sorted(((k, int(v)) for k, v in (by_reason or {}).items() if v), key=lambda kv: (-kv[1], kv[0]))
    kinds = [
        ("failed", [kv for kv in counts if kv[0] in FAILURE_REASONS]),
        ("excluded", [kv for kv in counts if kv[0] not in FAILURE_REASONS]),
    ]
    return [(word, items) for word, items in kinds if items]


def reasons_phrase(items: list[tuple[str, int]]) -> str:
    return ", ".join(f"{k} {v}" for k, v in items)


@dataclass(frozen=True)
class Finding:
    """One thing a run found, in plain words: a sentence with its numbers and interval, the
    example rows that show it, and whether it is a failed gate (ranked first) and how big it is
    (``effect``: ranked by it next, on the scale of a rate or a score gap).

    Attributes:
        metric: The metric (partition) that found it.
        sentence: The finding in words, its figures and interval in it.
        gate_failed: It is (part of) why the metric's gate failed.
        effect: Its size, for ranking: a rate, or a score's gap to the overall score.
        numbers: The figures the sentence states, by name (rates and scores in [0, 1]).
        examples: Input ids of up to three rows that show it.
        quotes: A short quote from each example row (parallel to ``examples``).
        scope: The metric_scores scope it rests on (``axis``, ``attribute``...), when one.
        group: The group of that scope (``gender``, ``religion=Muslim``...), when one.
    """

    metric: str
    sentence: str
    gate_failed: bool
    effect: float
    numbers: dict[str, Any] = field(default_factory=dict)
    examples: tuple[str, ...] = ()
    quotes: tuple[str, ...] = ()
    scope: str | None = None
    group: str | None = None

    @property
    def severity(self) -> str:
        """``fail`` (a failed gate) or ``notice`` (an effect the gate did not fail on)."""
        return "fail" if self.gate_failed else "notice"

    def to_dict(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "severity": self.severity,
            "sentence": self.sentence,
            "effect": self.effect,
            "numbers": dict(self.numbers),
            "examples": [{"input_id": i, "quote": q} for i, q in zip(self.examples, self.quotes)],
            "scope": self.scope,
            "group": self.group,
        }


class Evidence(Protocol):
    """What a metric's findings read beyond its metric_scores: the run's rows, by SQL over the
    warehouse (short read-only connections); ``?`` parameters, the run and metric passed in."""

    run_id: str
    metric: str

    def query(self, sql: str, params: list[Any] | None = None) -> pd.DataFrame: ...


def clip_quote(text: Any, n: int = 80) -> str:
    """A short one-line quote of a text (an answer, a reasoning, a prompt)."""
    t = " ".join(str(text or "").split())
    return t if len(t) <= n else t[: n - 1].rstrip() + "…"


def examples_of(df: pd.DataFrame, quote: Callable[[dict], str], k: int = 3) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(input ids, quotes) of the first ``k`` distinct rows of ``df`` (its ``input_id`` column)."""
    ids: list[str] = []
    quotes: list[str] = []
    for r in df.to_dict("records") if len(df) else []:
        if r["input_id"] in ids:
            continue
        ids.append(str(r["input_id"]))
        quotes.append(quote(r))
        if len(ids) == k:
            break
    return tuple(ids), tuple(quotes)


def pct(x: float | None, nd: int = 1) -> str:
    """A share as a percentage (``0.125`` -> ``12.5%``)."""
    return "n/a" if x is None or x != x else f"{100 * x:.{nd}f}%"


def num(x: Any, spec: str = ".3f") -> str:
    """A number in a claim's or gate's words (``format(x, spec)``), ``n/a`` when there is none."""
    return "n/a" if x is None else format(x, spec)
