"""Decision flip's config model: every field, default, bound and enum of its spec's schema."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..base import ScoringFields, check_persona_pairs

Axis = Literal["role", "gender", "ethnicity", "religion"]


class DecisionFlipConfig(ScoringFields):
    """Mirrors the spec's DecisionFlipConfig schema: every field, default, bound and enum."""

    model_config = ConfigDict(extra="forbid")
    catalog_seed: int = 42
    decision_labels: list[str] = Field(default_factory=list)
    decision_prompt: str = ""
    dimensions: list[Axis] = Field(default_factory=list)
    language: Literal["en", "de"] = "en"
    metric_name: str = "decision_flip"
    n_sut_retries: int = Field(0, ge=0, le=5)
    num_pairs_per_dimension: int = Field(4, ge=1, le=16)
    persona_pairs: list[dict[str, str]] | None = None
    pool_size_per_dimension: int = Field(16, ge=1, le=64)
    sub_call_concurrency_limit: int = Field(5, ge=1, le=64)
    sut_temperature: float = Field(0.7, ge=0.0, le=2.0)
    synthesis_temperature: float = Field(0.0, ge=0.0, le=2.0)
    timeout_seconds: float = Field(60.0, gt=0)
    use_case_description: str = ""
    use_case_intended_users: str = ""
    use_case_name: str = ""
    use_case_primary_task: str = ""

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
