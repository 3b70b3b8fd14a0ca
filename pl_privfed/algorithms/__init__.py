"""Federated optimization algorithms (server topology)."""

from pl_privfed.algorithms.base import FederatedAlgorithm, GradFn, Mechanism, RoundResult
from pl_privfed.algorithms.dpsgd import DistributedDPSGD
from pl_privfed.algorithms.ef21 import EF21, AlphaNormEC, Clip21, ErrorFeedback, MemoryInit
from pl_privfed.algorithms.fed_normec import FedAlphaNormEC
from pl_privfed.algorithms.fedavg import (
    DPFedAvg,
    FedAvgPerSampleClipping,
    FedAvgPerUpdateClipping,
    LocalUpdateAlgorithm,
)
from pl_privfed.algorithms.local import (
    IncrementalGradient,
    LocalGD,
    LocalRun,
    LocalSGD,
    LocalSolver,
)

__all__ = [
    "EF21",
    "AlphaNormEC",
    "Clip21",
    "DPFedAvg",
    "DistributedDPSGD",
    "ErrorFeedback",
    "FedAlphaNormEC",
    "FedAvgPerSampleClipping",
    "FedAvgPerUpdateClipping",
    "FederatedAlgorithm",
    "GradFn",
    "IncrementalGradient",
    "LocalGD",
    "LocalRun",
    "LocalSGD",
    "LocalSolver",
    "LocalUpdateAlgorithm",
    "Mechanism",
    "MemoryInit",
    "RoundResult",
]
