"""The metric registry. A metric is one package, ``metrics/<name>/`` (or any importable module):
its config model, prompts, stages, the builtin judge's answers to its prompts, its views and
previews, and a README. Adding one is that package and one registration: a line in
:data:`BUILTIN_METRICS` for the project's own, or :func:`register` for a metric kept elsewhere
(``aip_assets_tests/toy_metric/`` is the worked example; docs, "Adding a metric").

The registry is lazy: it holds each metric as ``"module:Class"`` until the metric is looked up,
so naming a metric (a spec's validation, a partition key) loads that metric's module only, and
importing this package loads none. Listing or iterating the names loads nothing; asking for
the values loads every metric.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from typing import TYPE_CHECKING, Any

from ..runspec import use_metric_registry

if TYPE_CHECKING:
    from ..runspec import RunSpec
    from .base import Metric

# name -> "module:Class", in the order metrics are listed (the demo, the report, `aip-eval metrics`)
BUILTIN_METRICS: dict[str, str] = {
    "llm.decision_flip": "aip_assets.metrics.decision_flip:DecisionFlip",
    "llm.group_interaction_bias": "aip_assets.metrics.group_interaction_bias:GroupInteractionBias",
    "llm.semantic_consistency": "aip_assets.metrics.consistency:SemanticConsistency",
    "llm.factual_consistency": "aip_assets.metrics.consistency:FactualConsistency",
    "llm.safety_consistency": "aip_assets.metrics.consistency:SafetyConsistency",
    "llm.perturbation_robustness_external": "aip_assets.metrics.perturbation:PerturbationRobustnessExternal",
    "llm.perturbation_robustness": "aip_assets.metrics.perturbation:PerturbationRobustness",
}


def _load(path: str) -> Metric:
    module, _, cls = path.partition(":")
    return getattr(importlib.import_module(module), cls)()


class Registry(MutableMapping[str, "Metric"]):
    """Metric name -> plug-in instance, each loaded (imported and instantiated) when first looked up.

    Args:
        entries: Name -> a :class:`~aip_assets.metrics.base.Metric` instance, or the
            ``"module:Class"`` path of one to load when it is first asked for.
    """

    def __init__(self, entries: dict[str, Any]):
        self._entries: dict[str, Any] = dict(entries)

    def __getitem__(self, name: str) -> Metric:
        entry = self._entries[name]
        if isinstance(entry, str):
            metric = _load(entry)
            if metric.name != name:
                raise ValueError(f"{entry} is registered as {name!r} but names itself {metric.name!r}")
            self._entries[name] = entry = metric
        return entry

    def __setitem__(self, name: str, metric: Any) -> None:
        self._entries[name] = metric

    def __delitem__(self, name: str) -> None:
        del self._entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def loaded(self) -> list[str]:
        """The names whose metric has been loaded so far."""
        return [n for n, e in self._entries.items() if not isinstance(e, str)]


REGISTRY = Registry(BUILTIN_METRICS)
use_metric_registry(REGISTRY)  # run specs are validated against it (the spec layer imports no metric)


def register(metric: Metric | str, name: str | None = None) -> None:
    """Add a metric to the registry (or replace the one of its name).

    Args:
        metric: A plug-in instance, or the ``"module:Class"`` path of its class, loaded when the
            metric is first looked up.
        name: The metric's name; required with a path (the registry names it before loading
            it), taken from the instance otherwise.
    """
    if isinstance(metric, str):
        if not name:
            raise ValueError("register a metric by path with its name: register('pkg.mod:Class', name='llm.x')")
        REGISTRY[name] = metric
        return
    if name is not None and name != metric.name:
        raise ValueError(f"{type(metric).__name__} names itself {metric.name!r}, not {name!r}")
    REGISTRY[metric.name] = metric


def get_metric(name: str) -> Metric:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; registered: {sorted(REGISTRY)}") from None


def all_views() -> dict[str, str]:
    """Every registered metric's own SQL views (``Metric.views()``), name -> SELECT, in registry
    order; a view several metrics share (the consistency family's) is listed once. Loads every
    metric."""
    out: dict[str, str] = {}
    for metric in REGISTRY.values():
        for view, sql in metric.views().items():
            if out.setdefault(view, sql) != sql:
                raise ValueError(f"view {view!r} is declared twice, differently ({metric.name})")
    return out


def count_labels() -> dict[str, tuple[str, str, str]]:
    """What each metric's counts are called in the report: (units judged, events, units failed:
    ``metric_scores.n_failed``, a SUT call or a judge; the exclusions are counted apart)."""
    return {name: m.count_labels for name, m in REGISTRY.items() if m.count_labels is not None}


def rate_labels() -> dict[str, str]:
    """What each metric's rate is called in the report, for the metrics that name it."""
    return {name: m.rate_label for name, m in REGISTRY.items() if m.rate_label is not None}


def chart_scopes() -> dict[str, dict[str, Any]]:
    """How the report charts each metric's breakdown scopes (``Metric.chart_scopes``), every
    metric's in its own order."""
    out: dict[str, dict[str, Any]] = {}
    for metric in REGISTRY.values():
        out.update(metric.chart_scopes)
    return out


def uncharted_scopes() -> set[str]:
    """The metrics' scopes the report shows as facts beside the headline, not as charts."""
    return {scope for metric in REGISTRY.values() for scope in metric.uncharted_scopes}


def scope_labels() -> dict[str, str]:
    """What the report calls the metrics' fact scopes (``Metric.scope_labels``)."""
    return {scope: label for metric in REGISTRY.values() for scope, label in metric.scope_labels.items()}


def lower_is_better() -> set[tuple[str, str]]:
    """(metric, scope) pairs whose numbers are rates where lower is better (``aip-eval compare``)."""
    return {(name, scope) for name, m in REGISTRY.items() for scope in m.lower_is_better}


def exclusion_reasons() -> dict[str, str]:
    """Every reason a unit can be excluded for, reason -> what it means: the shared ones
    (``gate.REASONS``) and each registered metric's own (``Metric.exclusion_reasons``)."""
    from ..gate import REASONS

    out = dict(REASONS)
    for metric in REGISTRY.values():
        out.update(metric.exclusion_reasons)
    return out


def check_policy(spec: RunSpec, role: str, metrics: list[str] | None = None) -> dict[str, Any]:
    """How the endpoint check of ``role`` retries (``endpoint_check.check_endpoint``'s retries, timeout,
    backoff_s): as the calls it comes before do. The retry budget is theirs (the SUT's
    ``n_sut_retries``; a judge's ``n_judge_retries`` where the metric has one, else the spec's
    ``judge_retries``), the timeout their ``timeout_seconds``, the largest over ``metrics`` (default:
    every metric of the run that makes such calls), never fewer than ``CHECK_MIN_RETRIES`` retries;
    the backoff is the spec's ``retry_backoff_seconds``."""
    from ..models.endpoint_check import CHECK_MIN_RETRIES

    names = [
        m for m in (metrics if metrics is not None else spec.metrics) if role != "sut" or get_metric(m).calls_sut
    ] or list(spec.metrics)
    cfgs = [spec.metric_config(m) for m in names]
    if role == "sut":
        retries = [getattr(c, "n_sut_retries", 0) for c in cfgs]
    elif role.startswith("judge") or role == "audit":
        retries = [getattr(c, "n_judge_retries", spec.judge_retries) for c in cfgs]
    else:  # synthesis
        retries = [spec.judge_retries]
    timeouts = [t for c in cfgs if (t := getattr(c, "timeout_seconds", None))]
    return {
        "retries": max(CHECK_MIN_RETRIES, *retries),
        "timeout": max(timeouts, default=60.0),
        "backoff_s": spec.retry_backoff_seconds,
    }
