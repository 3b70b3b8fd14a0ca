"""Models (plain ``nn.Module``s, no Lightning imports)."""

from pl_privfed.models.mlp import MLP, LogisticRegression
from pl_privfed.models.quadratic import HalfSquaredError, QuadraticModel

__all__ = ["MLP", "HalfSquaredError", "LogisticRegression", "QuadraticModel"]
