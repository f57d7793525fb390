"""Decision flip's config model: every field, default, bound and enum of its spec's schema."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..base import (
    METRIC_NAME,
    N_SUT_RETRIES,
    PAIR_CONCURRENCY,
    PAIR_SUT_TEMPERATURE,
    ScoringFields,
    check_persona_pairs,
)

Axis = Literal["role", "gender", "ethnicity", "religion"]


class DecisionFlipConfig(ScoringFields):
    """Mirrors the spec's DecisionFlipConfig schema: every field, default, bound and enum."""

    model_config = ConfigDict(extra="forbid")
    catalog_seed: int = Field(
        42,
        description="Seed of the draw of each axis's persona pairs from the protected-attribute catalogue, and, "
        "with the run seed, of each row's pairs; the same seed draws the same pairs.",
    )
    decision_labels: list[str] = Field(
        default_factory=list,
        description="The decisions the SUT chooses from, ending its answer with 'Decision: <label>' (at least two "
        "distinct labels). Empty (default): a row's metadata.decision_labels, else YES/NO (JA/NEIN in German).",
    )
    decision_prompt: str = Field(
        "",
        description="The decision question put to both personas, word for word. Empty (default): a built-in "
        "instruction in the configured language asking for the decision and a brief reason.",
    )
    dimensions: list[Axis] = Field(
        default_factory=list,
        description="The axes personas differ on: role, gender, ethnicity, religion. Empty (default): all four.",
    )
    language: Literal["en", "de"] = Field(
        "en",
        description="Language of the catalogue's personas, the decision instruction and the default labels: en "
        "(default) or de.",
    )
    metric_name: str = Field("decision_flip", description=METRIC_NAME)
    n_sut_retries: int = Field(
        0,
        ge=0,
        le=5,
        description=N_SUT_RETRIES,
    )
    num_pairs_per_dimension: int = Field(
        4,
        ge=1,
        le=16,
        description="Persona pairs per axis asked for each row (1-16), drawn from the axis's pool and fixed for the "
        "row; capped at the pool's size. Default 4.",
    )
    persona_pairs: list[dict[str, str]] | None = Field(
        None,
        description="Persona pairs to use instead of the catalogue's pool: [{dimension, persona_a, persona_b}], "
        "each persona a catalogue value or free text, dimension optional ('custom'). None (default): the catalogue.",
    )
    pool_size_per_dimension: int = Field(
        16,
        ge=1,
        le=64,
        description="Persona pairs drawn once per run for each axis (1-64), capped at what the catalogue can "
        "express for the axis (the shortfall goes to run_notes). Default 16.",
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
        0.0,
        ge=0.0,
        le=2.0,
        description="Kept for the spec's schema and must stay 0.0 (the default): no model writes this metric's "
        "personas, which come from the catalogue or persona_pairs, so any other value is refused.",
    )
    timeout_seconds: float = Field(
        60.0,
        gt=0,
        description="Timeout of each SUT and judge call, in seconds (above 0); default 60.",
    )
    use_case_description: str = Field(
        "",
        description="What the service does, stated before the decision question ('About this service: ...'). "
        "Empty (default): not stated.",
    )
    use_case_intended_users: str = Field(
        "",
        description="Who uses the service, stated before the decision question ('It is used by ...'). Empty "
        "(default): not stated.",
    )
    use_case_name: str = Field(
        "",
        description="The service's name, stated before the decision question ('You are assisting with ...'). "
        "Empty (default): not stated.",
    )
    use_case_primary_task: str = Field(
        "",
        description="The service's primary task, stated before the decision question ('Your task: ...'). Empty "
        "(default): not stated.",
    )

    @field_validator("persona_pairs")
    @classmethod
    def _pairs(cls, v):
        return check_persona_pairs(v, ("dimension", "persona_a", "persona_b"), "leave it out to use the catalogue")

    @field_validator("synthesis_temperature")
    @classmethod
    def _no_synthesis(cls, v):
        if v != 0.0:  # never silently ignored
            raise ValueError(
                "decision flip writes no personas with a model: its pairs come from the protected-"
                "attribute catalogue (or persona_pairs), so synthesis_temperature has no effect; "
                "leave it at 0.0 (the field is kept for the spec's schema)"
            )
        return v

    @model_validator(mode="after")
    def _pairs_in_dimensions(self):
        if self.persona_pairs and self.dimensions:
            given = {(p.get("dimension") or "custom").strip() or "custom" for p in self.persona_pairs}
            if not given & set(self.dimensions):
                raise ValueError(
                    f"no persona_pairs entry is on one of the dimensions {list(self.dimensions)} (their "
                    f"dimensions: {sorted(given)}): every pair would be filtered out"
                )
        return self

    @field_validator("decision_labels")
    @classmethod
    def _labels(cls, v):
        if v and (len(v) < 2 or len({x.strip().upper() for x in v}) != len(v) or any(not x.strip() for x in v)):
            raise ValueError("decision_labels needs at least two distinct, non-empty labels")
        return v
