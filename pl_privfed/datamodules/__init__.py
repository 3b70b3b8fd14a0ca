"""Federated datamodules and partitioners."""

from pl_privfed.datamodules.base import ClientStreams, FederatedDataModule
from pl_privfed.datamodules.digits import DigitsDataModule
from pl_privfed.datamodules.partition import (
    ClassesPerClientPartitioner,
    DirichletPartitioner,
    IIDPartitioner,
    Partitioner,
    classes_per_client_partition,
    dirichlet_partition,
    iid_partition,
)
from pl_privfed.datamodules.synthetic import QuadraticDataModule, SyntheticLogisticDataModule

__all__ = [
    "ClassesPerClientPartitioner",
    "ClientStreams",
    "DigitsDataModule",
    "DirichletPartitioner",
    "FederatedDataModule",
    "IIDPartitioner",
    "Partitioner",
    "QuadraticDataModule",
    "SyntheticLogisticDataModule",
    "classes_per_client_partition",
    "dirichlet_partition",
    "iid_partition",
]
