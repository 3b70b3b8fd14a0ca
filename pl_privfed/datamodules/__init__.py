"""Federated datamodules and partitioners."""

from pl_privfed.datamodules.base import (
    ClientStreams,
    DatasetDataModule,
    FederatedDataModule,
    RoundBatch,
    TensorRoundBatch,
    round_description,
    validation_split,
)
from pl_privfed.datamodules.digits import DigitsDataModule
from pl_privfed.datamodules.partition import (
    ClassesPerClientPartitioner,
    DirichletPartitioner,
    FixedSizePartitioner,
    IIDPartitioner,
    Partitioner,
    classes_per_client_partition,
    dirichlet_partition,
    iid_partition,
)
from pl_privfed.datamodules.streams import ReferenceClientStreams
from pl_privfed.datamodules.synthetic import QuadraticDataModule, SyntheticLogisticDataModule
from pl_privfed.datamodules.tabular import A9ADataModule
from pl_privfed.datamodules.vision import (
    CIFAR10DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
    load_cifar10_arrays,
    random_crop_flip,
)

__all__ = [
    "A9ADataModule",
    "CIFAR10DataModule",
    "ClassesPerClientPartitioner",
    "ClientStreams",
    "DatasetDataModule",
    "DigitsDataModule",
    "DirichletPartitioner",
    "FashionMNISTDataModule",
    "FederatedDataModule",
    "FixedSizePartitioner",
    "IIDPartitioner",
    "MNISTDataModule",
    "Partitioner",
    "QuadraticDataModule",
    "ReferenceClientStreams",
    "RoundBatch",
    "SyntheticLogisticDataModule",
    "TensorRoundBatch",
    "classes_per_client_partition",
    "dirichlet_partition",
    "iid_partition",
    "load_cifar10_arrays",
    "random_crop_flip",
    "round_description",
    "validation_split",
]
