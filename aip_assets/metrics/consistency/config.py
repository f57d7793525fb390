"""The consistency family's config models (the spec page's configuration table; one model per metric)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from ..base import ScoringFields


class ConsistencyConfig(ScoringFields):
    """The family's configuration table (the spec page has no schema block: the bounds are the project's, docs/metrics/consistency.md)."""

    model_config = ConfigDict(extra="forbid")
    metric_name: str = "consistency"
    responses_per_query: int = Field(3, ge=2, le=8)
    sut_temperature: float = Field(0.7, ge=0.0, le=2.0)
    concurrency_limit: int = Field(5, ge=1, le=64)
    timeout_seconds: float = Field(60.0, gt=0)
    n_sut_retries: int = Field(2, ge=0, le=5)
    n_judge_retries: int = Field(2, ge=0, le=5)


class SemanticConsistencyConfig(ConsistencyConfig):
    metric_name: str = "semantic_consistency"


class FactualConsistencyConfig(ConsistencyConfig):
    metric_name: str = "factual_consistency"


class SafetyConsistencyConfig(ConsistencyConfig):
    metric_name: str = "safety_consistency"
    dpi_ratio: float = Field(0.25, ge=0.0, le=1.0)
