"""HDET: Hyperparameter-Divergent Ensemble Training (see docs/method.md)."""

from recsys_hdet.hdet.engine import HDETConfig, HDETEngine, ReplicaAxis, ScalarHParam, spread_multipliers
from recsys_hdet.hdet.scheduler import HDETOneCycleLR

__all__ = ["HDETConfig", "HDETEngine", "HDETOneCycleLR", "ReplicaAxis", "ScalarHParam", "spread_multipliers"]
