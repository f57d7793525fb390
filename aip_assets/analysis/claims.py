"""Claims: everything a run states as beyond chance, decided once, in one family per metric and run.

A metric hands the layer its claims, each a hypothesis with its test (``Dual``: a p-value for any
shifted effect, so its interval inverts the same test). The family adjusts every p-value
(Holm by default: the family-wise error rate, the chance of any false claim in the run's metric;
Benjamini–Hochberg as an option: the false discovery rate, the expected share of false claims
among those made), then decides: a claim is made when its adjusted p-value is at most alpha and,
for a value's claim, when the claim about its axis as a whole (its ``parent``, the omnibus test)
is made too. The interval of every claim is at the matching level ``1 - alpha * p / p_adjusted``:
it excludes the null exactly when the claim is made. Everything the gate, the summary, the
findings, the report and ``--json`` say is beyond chance reads these decisions.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

from .permutation import Dual, Sides

Adjust = Literal["holm", "bh"]
ADJUST_WORDS = {
    "holm": "Holm: the chance of any false claim among this metric's claims in the run is at most alpha",
    "bh": "Benjamini-Hochberg: the expected share of false claims among those made is about alpha (at most, for independent tests)",
}


@dataclass
class Claim:
    """One hypothesis a metric may claim. ``kind``: what it is about (``excess``, ``favoured``,
    ``refusal``, ``group``); ``axis`` and ``value`` what it names (``value`` None: the axis as a
    whole, an omnibus test); ``sides``: the direction a claim asserts; ``test``: its dual test,
    or None with ``p_value`` given (an omnibus test has no interval) or ``why`` (it cannot be
    tested: too few units, or a value the pool cannot tell apart from another)."""

    id: str
    kind: str
    axis: str | None
    value: str | None
    sides: Sides
    method: str
    estimate: float | None = None
    test: Dual | None = None
    p_value: float | None = None
    parent: str | None = None
    why: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # rates, counts: what the words quote
    limits: tuple[float, float] = (-1.0, 1.0)  # the effect's scale (a difference of rates or of means in [0, 1])
    # decided by the family
    p_adjusted: float | None = None
    level: float | None = None  # the interval's one-minus-confidence, matched to the decision
    ci: tuple[float | None, float | None] = (None, None)
    ci_confidence: float | None = None
    claimed: bool = False
    status: str = "not tested"  # claimed | not shown | not tested | inseparable | gated

    def __post_init__(self):
        if self.p_value is None and self.test is not None:
            self.p_value = self.test.p(0.0, self.sides)
        if self.estimate is None and self.test is not None:
            self.estimate = self.test.d

    @property
    def direction(self) -> str | None:
        """``greater`` or ``less``: which way the estimate points (a two-sided claim's side)."""
        if self.estimate is None:
            return None
        if self.sides != "two-sided":
            return self.sides
        return "greater" if self.estimate > 0 else "less"

    def record(self, metric_name: str, weight: float) -> dict[str, Any]:
        """This claim as a ``metric_scores`` row (scope ``claim``, group ``id``): the estimate in
        ``raw_score``, its matched interval in ``ci_low``/``ci_high``, everything else in ``details``."""
        details = {
            "kind": self.kind,
            "axis": self.axis,
            "value": self.value,
            "sides": self.sides,
            "method": self.method,
            "p_value": self.p_value,
            "p_adjusted": self.p_adjusted,
            "status": self.status,
            "claimed": self.claimed,
            "direction": self.direction,
            "parent": self.parent,
            "why": self.why,
            "ci_confidence": self.ci_confidence,
            **self.facts,
        }
        return {
            "metric_name": metric_name,
            "scope": "claim",
            "group_key": self.id,
            "raw_score": _finite(self.estimate),
            "ci_low": _finite(self.ci[0]),
            "ci_high": _finite(self.ci[1]),
            "n": int(self.facts.get("n", 0) or 0),
            "weight": weight,
            "details": json.dumps(details, ensure_ascii=False, default=_jsonable),
        }


def _within(x: float | None, limits: tuple[float, float]) -> float | None:
    """An interval's end on the effect's own scale (a search that ran past it stops there; an end
    with no bound, none), rounded where the search's bisection leaves noise (1e-9)."""
    if x is None:
        return None
    return round(min(max(x, limits[0]), limits[1]), 6)


def _finite(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def _jsonable(x: Any) -> Any:
    try:
        return float(x)
    except (TypeError, ValueError):
        return str(x)


def adjusted(pvalues: list[float], method: Adjust) -> list[float]:
    """Adjusted p-values: Holm's step-down (monotone, capped at 1) or Benjamini–Hochberg's step-up."""
    m = len(pvalues)
    if not m:
        return []
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [1.0] * m
    if method == "holm":
        running = 0.0
        for rank, i in enumerate(order):
            running = max(running, min(1.0, (m - rank) * pvalues[i]))
            out[i] = running
        return out
    running = 1.0
    for rank in range(m - 1, -1, -1):
        i = order[rank]
        running = min(running, min(1.0, pvalues[i] * m / (rank + 1)))
        out[i] = running
    return out


@dataclass
class Policy:
    """How a metric's claims are decided: the adjustment and the error rate it holds."""

    adjust: Adjust = "holm"
    alpha: float = 0.05

    @property
    def words(self) -> str:
        return ADJUST_WORDS[self.adjust].replace("alpha", f"{self.alpha:g}")


def decide(claims: list[Claim], policy: Policy) -> list[Claim]:
    """Adjust and decide every claim of one family (a metric's claims in one run).

    Every claim with a p-value is in the family. A claim is made when its adjusted p-value is
    at most alpha; a value's claim also needs its parent (the axis as a whole) made, and its
    adjusted p-value is then the larger of the two (a value is never beyond chance when its
    axis is not). Each interval is at level ``1 - alpha * p / p_adjusted``, so it excludes the
    null exactly when the claim is made."""
    tested = [c for c in claims if c.p_value is not None and c.why is None]
    adj = adjusted([float(c.p_value) for c in tested], policy.adjust)  # type: ignore[arg-type]
    for c, a in zip(tested, adj):
        c.p_adjusted = a
    by_id = {c.id: c for c in claims}
    own = {c.id: c.p_adjusted for c in tested}  # before a value's axis is taken into account
    for c in tested:
        parent = by_id.get(c.parent) if c.parent else None
        if parent is not None and parent.p_adjusted is not None:
            c.p_adjusted = max(float(c.p_adjusted), float(parent.p_adjusted))  # type: ignore[arg-type]
        elif parent is not None:
            c.p_adjusted = 1.0  # its axis could not be tested as a whole
    for c in claims:
        if c.why is not None:
            c.status = "inseparable" if c.facts.get("inseparable") else "not tested"
            continue
        if c.p_adjusted is None:
            continue
        c.claimed = c.p_adjusted <= policy.alpha
        parent = by_id.get(c.parent) if c.parent else None
        if c.claimed:
            c.status = "claimed"
        elif parent is not None and (own.get(c.id) or 1.0) <= policy.alpha:
            c.status = "gated"  # beyond chance on its own, not with its axis as a whole
        else:
            c.status = "not shown"
        p = float(c.p_value)  # type: ignore[arg-type]
        c.level = policy.alpha * p / c.p_adjusted if c.p_adjusted > 0 else policy.alpha
        c.level = min(policy.alpha, c.level)
        if c.test is not None:
            c.ci = tuple(_within(x, c.limits) for x in c.test.interval(c.level, c.sides))  # type: ignore[assignment]
            c.ci_confidence = 1 - (c.level if c.sides == "two-sided" else 2 * c.level)
    return claims


def words_p(c: Claim | dict, adjust: str = "holm") -> str:
    """'Holm p 0.0031' (the adjusted p-value, named by its adjustment)."""
    d = c if isinstance(c, dict) else {"p_adjusted": c.p_adjusted}
    p = d.get("p_adjusted")
    name = "Holm" if adjust == "holm" else "BH"
    return f"{name} p n/a" if p is None else f"{name} p {p:.2g}"


def confidence_words(conf: float | None) -> str:
    """'98.6%' (an interval's confidence: one decimal, two above 99.5%, no trailing zeros)."""
    if conf is None:
        return "n/a"
    pct = 100 * conf
    text = f"{pct:.2f}" if pct > 99.5 else f"{pct:.1f}"
    return text.rstrip("0").rstrip(".") + "%"
