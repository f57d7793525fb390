"""The report's words and chart settings: how each breakdown scope is charted, and what each metric's
counts, rate and single-number scopes are called, read from the metric."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..metrics import REGISTRY, chart_scopes, scope_labels, uncharted_scopes

if TYPE_CHECKING:
    from ..metrics.base import Metric

# Each metric declares how its breakdown scopes are charted and what its counts, rate and fact scopes
# are called (``Metric.chart_scopes``, ``count_labels``, ``rate_label``, ``uncharted_scopes``,
# ``scope_labels``); these read them for a metric name found in the warehouse, which may be one no
# longer registered (then the generic words). The scopes below are the pipeline's own, every metric's.

# the headline, and the checks of the judge the pipeline adds to any metric: facts beside the headline
PIPELINE_FACT_SCOPES = {"overall", "judge_audit", "judge_position", "judge_panel"}
HUMAN_SCOPE = "human_agreement"  # the judge checked against people (human_labels.py): a table of its own
PIPELINE_SCOPE_LABELS = {
    "judge_audit": "judge agreement with the audit judge",
    "judge_position": "judge position bias (difference between orders)",
}
DEFAULT_COUNT_LABELS = ("n", "events", "failed")


def _plugin(metric: str) -> Metric | None:
    return REGISTRY[metric] if metric in REGISTRY else None


def count_labels(metric: str) -> tuple[str, str, str]:
    """What the metric's counts are called: (units judged, events, excluded)."""
    plugin = _plugin(metric)
    return (plugin.count_labels if plugin is not None else None) or DEFAULT_COUNT_LABELS


def rate_label(metric: str) -> str:
    """What the metric's rate is called."""
    plugin = _plugin(metric)
    return (plugin.rate_label if plugin is not None else None) or "rate"


def not_charted() -> set[str]:
    """Scopes shown as facts beside the headline, not as charts (the pipeline's and every metric's)."""
    return PIPELINE_FACT_SCOPES | uncharted_scopes()


def chart_order(metric: str) -> list[str]:
    """The order the metric's breakdown charts come in: its own, then any other metric's."""
    plugin = _plugin(metric)
    own = list(plugin.chart_scopes) if plugin is not None else []
    return own + [s for s in chart_scopes() if s not in own]


def chart_config(metric: str, scope: str) -> dict[str, Any] | None:
    """How to chart a breakdown scope: the metric's own way, else any metric's way, else None."""
    plugin = _plugin(metric)
    own = plugin.chart_scopes if plugin is not None else {}
    return own.get(scope) or chart_scopes().get(scope)


def _scope_label(r: dict[str, Any]) -> str:
    if r["scope"] == "judge_panel":
        return "judge panel agreement" if r["group_key"] == "panel" else f"agreement {r['group_key']}"
    return {**PIPELINE_SCOPE_LABELS, **scope_labels()}.get(r["scope"], f"{r['scope']} ({r['group_key']})")
