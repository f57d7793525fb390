"""The consistency family's config models (the spec page's configuration table; one model per metric)."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from ..base import METRIC_NAME, ScoringFields


class ConsistencyConfig(ScoringFields):
    """The family's configuration table (the spec page has no schema block: the bounds are the project's, docs/metrics/consistency.md)."""

    model_config = ConfigDict(extra="forbid")
    metric_name: str = Field("consistency", description=METRIC_NAME)
    responses_per_query: int = Field(
        3,
        ge=2,
        le=8,
        description="Responses compared per row (2-8), counting the row's sut_response as the base: the base is "
        "judged against responses_per_query - 1 fresh answers to the reworded query, at a proportional SUT cost. "
        "Default 3.",
    )
    sut_temperature: float = Field(
        0.7,
        ge=0.0,
        le=2.0,
        description="Sampling temperature of the fresh answers (0-2); default 0.7, above 0 so repeated samples can "
        "differ. The judge is always called at temperature 0.",
    )
    concurrency_limit: int = Field(
        5,
        ge=1,
        le=64,
        description="SUT calls, and judge calls, in flight at once for this metric (1-64); default 5.",
    )
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="Timeout of each SUT and judge call, in seconds (above 0); default 60.",
    )
    n_sut_retries: int = Field(
        2,
        ge=0,
        le=5,
        description="Retries of a SUT call that fails with a transient error (0-5) before it errors the whole "
        "row; default 2, since one row fans out several SUT calls.",
    )
    n_judge_retries: int = Field(
        2,
        ge=0,
        le=5,
        description="Retries of one judge comparison (0-5; failed calls and re-asks of an unusable answer "
        "together) before it is excluded as judge_failed, shrinking the row's denominator; default 2.",
    )


class SemanticConsistencyConfig(ConsistencyConfig):
    """llm.semantic_consistency: the family's fields; the judge compares the answers' stance."""

    metric_name: str = Field("semantic_consistency", description=METRIC_NAME)


class FactualConsistencyConfig(ConsistencyConfig):
    """llm.factual_consistency: the family's fields; the judge compares figures, dates and named entities."""

    metric_name: str = Field("factual_consistency", description=METRIC_NAME)


class SafetyConsistencyConfig(ConsistencyConfig):
    """llm.safety_consistency: the family's fields, plus how often the adversarial variant is a jailbreak."""

    metric_name: str = Field("safety_consistency", description=METRIC_NAME)
    dpi_ratio: float = Field(
        0.25,
        ge=0.0,
        le=1.0,
        description="Probability (0-1) that a row's adversarial variant is wrapped in a jailbreak template "
        "rather than a plain adversarial framing; 0.0 never wraps, 1.0 always; default 0.25.",
    )
