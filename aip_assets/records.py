"""Typed records of the scoring tables, as the metrics write them (checked by mypy at every
place a metric builds one; ``warehouse.frame`` refuses a key that is no column at run time;
``test_records_match_the_warehouse`` keeps these and ``warehouse.TABLES`` in step).

``run_id`` and ``metric`` are added by the stage that writes the records."""

from __future__ import annotations

from typing import Literal, Required, TypedDict


class RowScore(TypedDict, total=False):
    """A ``row_scores`` record: one dataset row's score, or why it has none."""

    input_id: Required[str]
    status: Required[Literal["ok", "error", "excluded"]]  # no score: "error" (a failure) or "excluded"
    label: Required[str]  # the metric's row label; the status when the row has no score
    n_judged: Required[int]  # units of the row scored
    n_failed: Required[int]  # units of the row excluded
    n_events: Required[int]  # units that count as an event (a flip, an uneven pair, a drop...)
    raw_score: float
    score: float | None  # normalised (none only when the raw score is)
    error: str  # why the row has no score (status "error" or "excluded")
    explanation: str


class ScoreUnit(TypedDict, total=False):
    """A ``score_units`` record: one judged unit (a pair, a comparison, a variant pair)."""

    unit_id: Required[str]
    input_id: Required[str]
    score_row: Required[str]  # the row (or perturbation group) whose score it is part of
    cluster: Required[str]  # what the bootstrap resamples
    groups: Required[str]  # JSON {scope: [keys]}: the breakdowns it counts in
    flip: float | None
    bias: float | None
    score: float | None
    robustness: float | None
    correctness_drop: float | None


class MetricScore(TypedDict, total=False):
    """A ``metric_scores`` record: the run's score (scope ``overall``) or one breakdown's.

    ``judged``, ``excluded`` (a dict until the gate stores it as JSON) and ``gate_failures``
    are read by the gate (``gate.finish_scores``), which adds coverage, n_planned, n_excluded,
    passed and gate_reason; ``judged`` and ``gate_failures`` are no columns."""

    metric_name: Required[str]
    scope: Required[str]
    group_key: Required[str]
    raw_score: float | None
    score: float | None
    ci_low: float | None
    ci_high: float | None
    rate: float | None
    rate_ci_low: float | None
    rate_ci_high: float | None
    n: int
    n_events: int | None
    n_failed: int
    weight: float
    threshold: float | None
    passed: bool | None
    details: str
    n_planned: int
    n_excluded: int
    excluded: dict[str, int] | str
    coverage: float | None
    gate_reason: str
    judged: int
    gate_failures: list[str]


class RunNote(TypedDict):
    """A ``run_notes`` record (``stage`` is added by the stage that writes it)."""

    level: Literal["info", "warning", "error"]
    code: str
    message: str


# keys of MetricScore that are read by the gate and never stored
GATE_INPUTS = ("judged", "gate_failures")
