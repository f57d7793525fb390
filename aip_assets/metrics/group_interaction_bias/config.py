"""Group interaction bias's config model: every field, default, bound and enum of its spec's schema."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from ..base import (
    METRIC_NAME,
    N_SUT_RETRIES,
    PAIR_CONCURRENCY,
    PAIR_SUT_TEMPERATURE,
    ScoringFields,
    check_persona_pairs,
)


class GroupInteractionBiasConfig(ScoringFields):
    """Mirrors the spec's GroupInteractionBiasConfig schema: every field, default, bound and enum."""

    model_config = ConfigDict(extra="forbid")
    language: Literal["en", "de", "fr"] = Field(
        "en",
        description="Language of the personas, the persona-prefixed queries and the judges' prompts: en "
        "(default), de or fr.",
    )
    metric_name: str = Field("group_interaction_bias", description=METRIC_NAME)
    n_sut_retries: int = Field(
        0,
        ge=0,
        le=5,
        description=N_SUT_RETRIES,
    )
    num_pairs: int = Field(
        4,
        ge=1,
        le=16,
        description="Pairs of distinct personas asked for each row (1-16), drawn from the pool and fixed for the "
        "row; capped at the pairs the pool holds. Default 4.",
    )
    persona_pairs: list[dict[str, str]] | None = Field(
        None,
        description="Persona pairs to use instead of the synthesised pool: [{persona_a, persona_b}], free-text "
        "persona descriptions. None (default): the pool.",
    )
    persona_pool_size: int = Field(
        16,
        ge=1,
        le=64,
        description="Personas in the pool made once per run (1-64): written by the synthesis model, else (the "
        "builtin model, or too few written) composed from the catalogue. Default 16.",
    )
    sub_call_concurrency_limit: int = Field(
        5,
        ge=1,
        le=64,
        description=PAIR_CONCURRENCY,
    )
    sut_temperature: float = Field(
        0.7,
        ge=0.0,
        le=2.0,
        description=PAIR_SUT_TEMPERATURE,
    )
    synthesis_temperature: float = Field(
        0.4,
        ge=0.0,
        le=2.0,
        description="Sampling temperature of the model that writes the persona pool (0-2); default 0.4. Unused "
        "when the personas come from the catalogue or persona_pairs.",
    )
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="Timeout of each synthesis, SUT and judge call, in seconds (above 0); default 60.",
    )
    use_case_description: str = Field(
        "",
        description="What the service does, given to the persona-writing model so the personas fit its users. "
        "Empty (default): not given.",
    )
    use_case_intended_users: str = Field(
        "",
        description="Who uses the service, given to the persona-writing model. Empty (default): not given.",
    )
    use_case_name: str = Field(
        "",
        description="The service's name, given to the persona-writing model. Empty (default): not given; with "
        "every use_case field empty the service is described to it as a general-purpose assistant.",
    )
    use_case_primary_task: str = Field(
        "",
        description="The service's primary task, given to the persona-writing model. Empty (default): not given.",
    )

    @field_validator("persona_pairs")
    @classmethod
    def _pairs(cls, v):
        return check_persona_pairs(v, ("persona_a", "persona_b"), "leave it out to use the synthesised pool")
