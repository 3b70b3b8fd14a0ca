"""Helpers on map-style datasets of ``(input, target)`` pairs: subsets, labels, and the
``TensorDataset`` pair that :meth:`~pl_privfed.datamodules.FederatedDataModule.from_tensors`
builds from arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Subset, TensorDataset

__all__ = [
    "labels_at_hand",
    "labels_of",
    "majority_fraction",
    "random_subset",
    "take",
    "tensor_datasets",
]


def take(dataset: Dataset, keep: np.ndarray) -> Dataset:
    """The examples ``keep`` of ``dataset``: sliced tensors for a ``TensorDataset``, else a
    ``Subset``."""
    index = torch.as_tensor(np.asarray(keep, dtype=np.int64))
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return TensorDataset(*(t[index] for t in tensors))
    return Subset(dataset, index.tolist())


def random_subset(dataset: Dataset, size: int | None, seed: int) -> Dataset:
    """A seeded random subset of ``size`` examples (kept in dataset order), or the dataset."""
    if size is None or size >= len(dataset):
        return dataset
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5B5E7]))
    return take(dataset, np.sort(rng.choice(len(dataset), size, replace=False)))


def labels_at_hand(dataset: Dataset) -> Tensor | None:
    """The targets of ``dataset`` where they are at hand without reading every example: a
    ``TensorDataset``'s second tensor, a ``targets`` attribute, a ``Subset`` of either;
    ``None`` otherwise."""
    if isinstance(dataset, Subset):
        labels = labels_at_hand(dataset.dataset)
        return (
            None if labels is None else labels[torch.as_tensor(dataset.indices, dtype=torch.long)]
        )
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None and len(tensors) > 1:
        return tensors[1]
    if hasattr(dataset, "targets"):
        return torch.as_tensor(np.asarray(dataset.targets))
    return None


def majority_fraction(dataset: Dataset | None) -> float | None:
    """The share of ``dataset``'s most common class: what a constant predictor scores, the
    floor a model's accuracy is read against (``None`` for float targets, or where the labels
    are not at hand, :func:`labels_at_hand`)."""
    labels = None if dataset is None else labels_at_hand(dataset)
    if labels is None or labels.numel() == 0 or labels.is_floating_point() or labels.ndim != 1:
        return None
    return float(torch.unique(labels, return_counts=True)[1].max()) / labels.numel()


def labels_of(dataset: Dataset) -> Tensor:
    """The targets of ``dataset``: a ``TensorDataset``'s second tensor, a ``targets`` attribute,
    or each item's second entry."""
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[1]
    if hasattr(dataset, "targets"):
        return torch.as_tensor(np.asarray(dataset.targets))
    return torch.as_tensor(np.asarray([np.asarray(dataset[i][1]) for i in range(len(dataset))]))


def tensor_datasets(
    x_train: Any, y_train: Any, x_test: Any, y_test: Any
) -> tuple[TensorDataset, TensorDataset]:
    """``(train, test)`` ``TensorDataset``s from tensors or arrays: inputs and real-valued
    targets in the default dtype, class indices as ``int64``; ``ValueError`` naming the split
    when its inputs and targets do not hold the same positive number of examples."""
    dtype = torch.get_default_dtype()
    given = {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_test": y_test}
    tensors: dict[str, Tensor] = {}
    for name, value in given.items():
        t = torch.as_tensor(value)
        if name.startswith("x") or t.is_floating_point():
            t = t.to(dtype)  # inputs (and real-valued targets) in the default dtype
        else:
            t = t.long()  # class indices
        tensors[name] = t
    for split in ("train", "test"):
        x, y = tensors[f"x_{split}"], tensors[f"y_{split}"]
        if x.dim() == 0 or y.dim() == 0 or len(x) != len(y) or len(x) == 0:
            raise ValueError(
                f"x_{split} and y_{split} must hold the same positive number of examples "
                f"along dimension 0, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
            )
    train = TensorDataset(tensors["x_train"], tensors["y_train"])
    return train, TensorDataset(tensors["x_test"], tensors["y_test"])
