"""Metric plug-ins. Adding a metric: its module, its line in REGISTRY, its parameter manifest in
``specs/manifests.json`` and answers for its judge prompts in the builtin judge (README, "One
scoring engine")."""

from __future__ import annotations

from .base import Metric
from .consistency import FactualConsistency, SafetyConsistency, SemanticConsistency
from .decision_flip import DecisionFlip
from .group_interaction_bias import GroupInteractionBias
from .perturbation import PerturbationRobustness, PerturbationRobustnessExternal

REGISTRY: dict[str, Metric] = {m.name: m for m in (
    DecisionFlip(), GroupInteractionBias(), SemanticConsistency(), FactualConsistency(), SafetyConsistency(),
    PerturbationRobustnessExternal(), PerturbationRobustness())}


def get_metric(name: str) -> Metric:
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; registered: {sorted(REGISTRY)}") from None
