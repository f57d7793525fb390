"""Group interaction bias's config model: every field, default, bound and enum of its spec's schema."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator

from ..base import ScoringFields, check_persona_pairs


class GroupInteractionBiasConfig(ScoringFields):
    """Mirrors the spec's GroupInteractionBiasConfig schema: every field, default, bound and enum."""

    model_config = ConfigDict(extra="forbid")
    language: Literal["en", "de", "fr"] = "en"
    metric_name: str = "group_interaction_bias"
    n_sut_retries: int = Field(0, ge=0, le=5)
    num_pairs: int = Field(4, ge=1, le=16)
    persona_pairs: list[dict[str, str]] | None = None
    persona_pool_size: int = Field(16, ge=1, le=64)
    sub_call_concurrency_limit: int = Field(5, ge=1, le=64)
    sut_temperature: float = Field(0.7, ge=0.0, le=2.0)
    synthesis_temperature: float = Field(0.4, ge=0.0, le=2.0)
    timeout_seconds: float = Field(60.0, gt=0)
    use_case_description: str = ""
    use_case_intended_users: str = ""
    use_case_name: str = ""
    use_case_primary_task: str = ""

    @field_validator("persona_pairs")
    @classmethod
    def _pairs(cls, v):
        return check_persona_pairs(v, ("persona_a", "persona_b"), "leave it out to use the synthesised pool")
