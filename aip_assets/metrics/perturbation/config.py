"""The perturbation metrics' config models: the external scorer's spec schema, and the hosted
metric's additions."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field

from ..base import METRIC_NAME, N_SUT_RETRIES, ScoringFields

PType = Literal["typos", "casing", "punctuation", "word_order", "filler", "synonyms", "paraphrase"]


class PerturbationRobustnessExternalConfig(ScoringFields):
    """Mirrors the spec's PerturbationRobustnessExternalConfig schema."""

    model_config = ConfigDict(extra="forbid")
    groundtruth_context: str | None = Field(
        None,
        description="Ground-truth context the judge uses, with reference_answer, to decide whether an answer is "
        "correct; a row's metadata.groundtruth_context overrides it. None (default): no context is given.",
    )
    metric_name: str = Field("perturbation_robustness_external", description=METRIC_NAME)
    reference_answer: str | None = Field(
        None,
        description="The reference answer the judge checks each answer's correctness against; a row's "
        "metadata.reference_answer overrides it. None (default): the judge uses the ground-truth context, if any, "
        "else its general knowledge.",
    )
    sub_call_concurrency_limit: int = Field(
        5,
        ge=1,
        le=64,
        description="Judge calls (and, in the hosted variant, SUT calls) in flight at once for this metric "
        "(1-64); default 5.",
    )
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="Timeout of each model call, in seconds (above 0); default 60.",
    )


class PerturbationRobustnessConfig(PerturbationRobustnessExternalConfig):
    """The hosted variant: the external scorer's fields plus how variants are made and answered."""

    metric_name: str = Field("perturbation_robustness", description=METRIC_NAME)
    perturbation_types: list[PType] = Field(
        default_factory=list,
        description="The kinds of meaning-preserving noise the variants get: typos, casing, punctuation, "
        "word_order, filler, synonyms, paraphrase (written by the synthesis model). Empty (default): every "
        "rule-based kind, plus paraphrase when a synthesis model is configured.",
    )
    variants_per_type: int = Field(
        1,
        ge=1,
        le=5,
        description="Variants made of each row's query per perturbation type (1-5); default 1.",
    )
    sut_temperature: float = Field(
        0.7,
        ge=0.0,
        le=2.0,
        description="Sampling temperature of the SUT's answers to the baseline and its variants (0-2); default 0.7.",
    )
    n_sut_retries: int = Field(
        0,
        ge=0,
        le=5,
        description=N_SUT_RETRIES,
    )
