"""Federated optimization algorithms: server-based (α-NormEC family, DP-SGD, FedAvg variants) and
decentralized (PORTER, BEER). Each is its paper's client and server lines plus one declaration of
what it releases (:class:`~pl_privfed.privacy.Release`); a server-based one takes a server
optimizer (server momentum, FedAdam, FedYogi, FedAdagrad: :mod:`.server_opt`) for its step."""

from pl_privfed.algorithms.base import FederatedAlgorithm
from pl_privfed.algorithms.decentralized import BEER, PORTER, DecentralizedAlgorithm
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
from pl_privfed.algorithms.server_opt import (
    FedAdagrad,
    FedAdam,
    FedYogi,
    ServerMomentum,
    ServerOptimizer,
    ServerSGD,
)
from pl_privfed.algorithms.soteria import SoteriaFL

__all__ = [
    "BEER",
    "EF21",
    "PORTER",
    "AlphaNormEC",
    "Clip21",
    "DPFedAvg",
    "DecentralizedAlgorithm",
    "DistributedDPSGD",
    "ErrorFeedback",
    "FedAdagrad",
    "FedAdam",
    "FedAlphaNormEC",
    "FedAvgPerSampleClipping",
    "FedAvgPerUpdateClipping",
    "FedYogi",
    "FederatedAlgorithm",
    "IncrementalGradient",
    "LocalGD",
    "LocalRun",
    "LocalSGD",
    "LocalSolver",
    "LocalUpdateAlgorithm",
    "MemoryInit",
    "ServerMomentum",
    "ServerOptimizer",
    "ServerSGD",
    "SoteriaFL",
]
