"""One scoring engine for every metric, for its aggregation and for `aip-eval compare`.

A metric turns its judgements into **units** (a judged persona pair, a judged comparison, a
judged variant pair), each with its values (``flip``; ``bias``; ``score``; ``robustness`` and
``correctness_drop``), the row it scores (``score_row``: the input row, or a perturbation
group), the cluster its interval resamples (``cluster``) and the breakdown groups it belongs to
(``groups``: ``{scope: [key, …]}``; a key listed twice counts twice). The units are stored in
``score_units``; everything a score says is computed from them here, by the metric's
:class:`Formula`:

- a row's raw score is ``formula.stat`` of the sums of its units' values (and their count);
- the run's (or a breakdown group's) raw score is, for a ``pooled`` formula, ``stat`` of the
  sums over all its units; for a ``rows`` formula, the mean of its rows' raw scores;
- its 95% interval is Wilson's for a ``wilson`` formula (a rate of events), else a percentile
  bootstrap resampling whole clusters, of exactly the statistic the score reports;
- the score is the raw score normalised (``stats.normalise``), the interval likewise.

`compare` reads the same units of two runs and bootstraps the same statistic, so no formula
exists twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np
import pandas as pd

from .records import MetricScore, ScoreUnit
from .stats import bootstrap, normalise, normalise_interval, wilson

VALUE_COLUMNS = ("flip", "bias", "score", "robustness", "correctness_drop")


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, undefined (NaN) where nothing was counted."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


@dataclass(frozen=True)
class Formula:
    """How a metric's units become a score. ``stat`` maps summed values (the ``values`` in order,
    then the count) to a raw score, vectorised over leading axes."""

    name: str
    values: tuple[str, ...]
    stat: Callable[[np.ndarray], np.ndarray]
    level: Literal["pooled", "rows"]
    interval: Literal["wilson", "bootstrap"]
    # wilson: the event count among the units (e.g. flips), from the same sums
    events: Callable[[np.ndarray], np.ndarray] | None = None
    clusters: str = "input_ids"  # what the bootstrap resamples, in words

    def __post_init__(self):
        if self.interval == "wilson" and self.events is None:
            raise ValueError(f"formula {self.name!r}: a Wilson interval needs the event count (events=)")

    def raw(self, sums: np.ndarray) -> float | None:
        v = float(self.stat(np.asarray(sums, dtype=float)))
        return None if np.isnan(v) else v


# the project's formulas, one each
ONE_MINUS_FLIP_RATE = Formula(
    "1 - attributable flips / judged pairs, pooled over every judged pair",
    ("flip",),
    lambda s: 1 - _ratio(s[..., 0], s[..., 1]),
    "pooled",
    "wilson",
    events=lambda s: s[..., 0],
)
EQUITABILITY = Formula(
    "1 - the mean pair bias, pooled over judged pairs (a pair's bias: the mean of 1 - similarity, tone divergence "
    "and effort gap over the judges that answered)",
    ("bias",),
    lambda s: 1 - _ratio(s[..., 0], s[..., 1]),
    "pooled",
    "bootstrap",
)
MEAN_OF_ROW_MEANS = Formula(
    "the mean over rows of each row's mean judged comparison score",
    ("score",),
    lambda s: _ratio(s[..., 0], s[..., 1]),
    "rows",
    "bootstrap",
)
PERTURBATION_GROUP = Formula(
    "the mean over perturbation groups of 0.5 x mean robustness + 0.5 x min(1, max(0, 1 - mean correctness drop))",
    ("robustness", "correctness_drop"),
    lambda s: 0.5 * _ratio(s[..., 0], s[..., 2]) + 0.5 * np.clip(1 - _ratio(s[..., 1], s[..., 2]), 0.0, 1.0),
    "rows",
    "bootstrap",
    clusters="perturbation groups",
)


_NATIVE = frozenset({str, int, float, bool, type(None)})


def frame_records(df: pd.DataFrame) -> list[dict[str, Any]]:
    """``df.to_dict("records")``, the same dicts, without boxing value by value where that keeps
    every value as it is: a frame of object columns holding plain Python values only (a warehouse
    read: ``read_partition``), read a column at a time. Any other frame: to_dict's own."""
    cols = df.columns.tolist()
    if (
        not cols
        or len(set(cols)) != len(cols)
        or not all(isinstance(dt, np.dtype) and dt.kind == "O" for dt in df.dtypes)
    ):
        return df.to_dict("records")
    lists = [df.iloc[:, i].tolist() for i in range(len(cols))]
    if any(not set(map(type, values)) <= _NATIVE for values in lists):
        return df.to_dict("records")
    return [dict(zip(cols, row, strict=True)) for row in zip(*lists, strict=True)]


def units_frame(records: Iterable[dict[str, Any]]) -> pd.DataFrame:
    """Units as a frame: unit_id, input_id, score_row, cluster, the value columns, groups (a dict)."""
    df = pd.DataFrame.from_records(list(records))
    for c in ("unit_id", "input_id", "score_row", "cluster", "groups", *VALUE_COLUMNS):
        if c not in df:
            df[c] = None
    return df


def sums(units: pd.DataFrame, formula: Formula, by: str) -> pd.DataFrame:
    """Per ``by`` (score_row or cluster): the summed values and the count, in formula order."""
    v = units[list(formula.values)].astype(float).assign(_n=1.0)
    return v.groupby(units[by], sort=False).sum()


def row_raws(units: pd.DataFrame, formula: Formula) -> pd.Series:
    """Each scored row's raw score."""
    s = sums(units, formula, "score_row")
    return pd.Series(formula.stat(s.to_numpy()), index=s.index)


def explode(units: pd.DataFrame, scope: str) -> pd.DataFrame:
    """The units of each group of ``scope``, with a ``key`` column (a unit in two groups twice)."""
    keys = units["groups"].map(lambda g: list((g or {}).get(scope, [])))
    out = units.assign(key=keys).explode("key")
    return out[out["key"].notna()]


@dataclass
class Stat:
    """A score and what it rests on."""

    raw: float | None
    lo: float | None = None  # raw-scale 95% interval
    hi: float | None = None
    n: int = 0  # units (pooled) or rows (rows) it rests on
    events: int | None = None
    rate: float | None = None
    rate_lo: float | None = None
    rate_hi: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def cluster_table(units: pd.DataFrame, formula: Formula) -> pd.DataFrame:
    """The sufficient vector of each cluster (index: cluster): summed values and count (pooled),
    or the cluster's rows' raw scores summed and counted (rows), so that ``statistic`` of a
    resampled sum is exactly the score's statistic."""
    if formula.level == "pooled":
        return sums(units, formula, "cluster")
    raws = row_raws(units, formula)
    cl = units.drop_duplicates("score_row").set_index("score_row")["cluster"].reindex(raws.index)
    return pd.DataFrame({"raw": raws.to_numpy(), "n": 1.0}, index=raws.index).groupby(cl.to_numpy(), sort=False).sum()


def cluster_vectors(units: pd.DataFrame, formula: Formula) -> np.ndarray:
    return cluster_table(units, formula).to_numpy()


def statistic(formula: Formula) -> Callable[[np.ndarray], np.ndarray]:
    """The statistic of summed cluster vectors (see :func:`cluster_vectors`)."""
    if formula.level == "pooled":
        return formula.stat
    return lambda s: _ratio(s[..., 0], s[..., 1])


def stat_of(vectors: np.ndarray, formula: Formula, seed: int, interval: bool = True) -> Stat:
    """The score of summed cluster vectors (see :func:`cluster_vectors`), with its interval."""
    vectors = np.asarray(vectors, dtype=float).reshape(-1, len(formula.values) + 1 if formula.level == "pooled" else 2)
    if not len(vectors):
        return Stat(None)
    total = vectors.sum(axis=0)
    raw_v = float(statistic(formula)(total))
    raw = None if np.isnan(raw_v) else raw_v
    st = Stat(raw, n=int(round(total[-1])))
    if formula.interval == "wilson":
        assert formula.events is not None  # __post_init__
        k = int(round(float(formula.events(total))))
        st.events, st.rate = k, (k / st.n if st.n else None)
        st.rate_lo, st.rate_hi = wilson(k, st.n)
        if interval and raw is not None:  # score = 1 - rate: its interval from the rate's
            st.lo = None if st.rate_hi is None else 1 - st.rate_hi
            st.hi = None if st.rate_lo is None else 1 - st.rate_lo
    elif interval and raw is not None:
        st.lo, st.hi = bootstrap(vectors, statistic(formula), seed=seed)
    return st


class Accumulator:
    """Scores of a run and its breakdowns, from units fed a batch at a time (a batch holds whole
    clusters). It keeps one vector per cluster for the run and for the scopes with an interval,
    and a total per group for the others, so memory grows with the clusters, not the units."""

    def __init__(self, formula: Formula, scopes: Iterable[str] = (), interval_scopes: Iterable[str] = ()):
        self.formula = formula
        self.scopes = list(scopes)
        self.interval_scopes = set(interval_scopes)
        self.overall: list[np.ndarray] = []
        self.groups: dict[str, dict[str, list[np.ndarray]]] = {sc: {} for sc in self.scopes}

    def add(self, units: pd.DataFrame) -> None:
        if not len(units):
            return
        self.overall.append(cluster_vectors(units, self.formula))
        for scope in self.scopes:
            ex = explode(units, scope)
            for key, g in ex.groupby("key"):  # any order: breakdown() sorts the keys
                v = cluster_vectors(g, self.formula)
                if scope not in self.interval_scopes:
                    v = v.sum(axis=0, keepdims=True)  # a total is all a group without an interval needs
                self.groups[scope].setdefault(str(key), []).append(v)

    def run(self, seed: int) -> Stat:
        if not self.overall:
            return Stat(None)
        return stat_of(np.concatenate(self.overall), self.formula, seed)

    def breakdown(self, scope: str, seed: int) -> dict[str, Stat]:
        return {
            key: stat_of(np.concatenate(vs), self.formula, seed, interval=scope in self.interval_scopes)
            for key, vs in sorted(self.groups[scope].items())
        }


def record(
    st: Stat,
    scope: str,
    key: str,
    cfg: Any,
    *,
    n: int | None = None,
    n_events: int | None = None,
    n_failed: int | None = None,
    threshold: float | None = None,
    judged: int | None = None,
    excluded: dict[str, int] | None = None,
    gate_failures: list[str] | None = None,
    details: str | None = None,
) -> MetricScore:
    """A metric_scores record: raw and normalised score and interval, counts, the metric's name
    (the keyword arguments, when given, set or override those fields)."""
    slo, shi = normalise_interval(st.lo, st.hi, cfg.min, cfg.max, cfg.inverted)
    rec: MetricScore = {
        "metric_name": cfg.metric_name,
        "scope": scope,
        "group_key": key,
        "raw_score": st.raw,
        "score": normalise(st.raw, cfg.min, cfg.max, cfg.inverted),
        "ci_low": slo,
        "ci_high": shi,
        "n": st.n,
        "weight": cfg.weight,
    }
    if st.rate is not None:  # a Wilson formula with units (its interval exists exactly then)
        rec["rate"], rec["rate_ci_low"], rec["rate_ci_high"] = st.rate, st.rate_lo, st.rate_hi
        rec["n_events"] = st.events
    given = {
        "n": n,
        "n_events": n_events,
        "n_failed": n_failed,
        "threshold": threshold,
        "judged": judged,
        "excluded": excluded,
        "gate_failures": gate_failures,
        "details": details,
    }
    rec.update(cast(MetricScore, {k: v for k, v in given.items() if v is not None}))
    return rec


def stored_units(frame: pd.DataFrame) -> pd.DataFrame:
    """Units read back from ``score_units`` (groups as JSON text) into the engine's shape."""
    out = frame.copy()
    out["groups"] = out["groups"].map(lambda g: json.loads(g) if isinstance(g, str) else {})  # NULL: none
    return out


def to_records(units: pd.DataFrame) -> list[ScoreUnit]:
    """Units as ``score_units`` rows (groups as JSON text)."""
    out = units.copy()
    out["groups"] = out["groups"].map(lambda g: json.dumps(g or {}, sort_keys=True, ensure_ascii=False))
    recs = out[["unit_id", "input_id", "score_row", "cluster", "groups", *VALUE_COLUMNS]].to_dict("records")
    return cast(list[ScoreUnit], recs)
