"""Federated optimization algorithms (server topology)."""

from pl_privfed.algorithms.base import FederatedAlgorithm, GradFn, Mechanism, RoundResult
from pl_privfed.algorithms.dpsgd import DistributedDPSGD
from pl_privfed.algorithms.ef21 import EF21, AlphaNormEC, Clip21, ErrorFeedback, MemoryInit

__all__ = [
    "EF21",
    "AlphaNormEC",
    "Clip21",
    "DistributedDPSGD",
    "ErrorFeedback",
    "FederatedAlgorithm",
    "GradFn",
    "Mechanism",
    "MemoryInit",
    "RoundResult",
]
