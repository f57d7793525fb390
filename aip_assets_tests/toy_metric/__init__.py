"""A toy metric kept in one folder: proof that a metric is one package and one registration
(``aip_assets.metrics.register(ToyPoliteness())``), with no edit anywhere else."""

from .metric import ToyPoliteness

__all__ = ["ToyPoliteness"]
