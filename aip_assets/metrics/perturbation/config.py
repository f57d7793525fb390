"""The perturbation metrics' config models: the external scorer's spec schema, and the hosted
metric's additions."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from ..base import ScoringFields

PType = Literal["typos", "casing", "punctuation", "word_order", "filler", "synonyms", "paraphrase"]


class PerturbationRobustnessExternalConfig(ScoringFields):
    """Mirrors the spec's PerturbationRobustnessExternalConfig schema."""

    model_config = ConfigDict(extra="forbid")
    groundtruth_context: str | None = None
    metric_name: str = "perturbation_robustness_external"
    reference_answer: str | None = None
    sub_call_concurrency_limit: int = Field(5, ge=1, le=64)
    timeout_seconds: float = Field(60.0, gt=0)


class PerturbationRobustnessConfig(PerturbationRobustnessExternalConfig):
    """The hosted variant: the external scorer's fields plus how variants are made and answered."""

    metric_name: str = "perturbation_robustness"
    perturbation_types: list[PType] = Field(
        default_factory=list,
        description="default: all rule-based types, plus paraphrase when a synthesis model is configured",
    )
    variants_per_type: int = Field(1, ge=1, le=5)
    sut_temperature: float = Field(0.7, ge=0.0, le=2.0)
    n_sut_retries: int = Field(0, ge=0, le=5)
