"""The toy metric's config model (checked against ``manifest.json``) and its judge's verdict model."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from aip_assets.metrics.base import ScoringFields
from aip_assets.metrics.verdicts import Verdict


class ToyPolitenessConfig(ScoringFields):
    """Parameters of ``llm.toy_politeness``."""

    metric_name: str = Field("toy_politeness", description="the name the score is reported under")
    concurrency_limit: int = Field(4, ge=1, le=64, description="calls in flight at once, per role")
    timeout_seconds: float = Field(30.0, gt=0, description="seconds one call may take")
    n_judge_retries: int = Field(2, ge=0, le=5, description="extra judge requests for an unusable answer")


class PolitenessVerdict(Verdict):
    """The judge's verdict on one answer: the metric's own fields, stored in ``judgements.parsed``."""

    SCORE_FIELDS: ClassVar[tuple[str, ...]] = ("polite", "word_count")
    polite: bool | None = Field(None, description="true when the answer thanks the user")
    word_count: int | None = Field(None, ge=0, description="the number of words in the answer")
