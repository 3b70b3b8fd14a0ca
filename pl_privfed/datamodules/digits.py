"""The embedded default dataset: scikit-learn's handwritten digits (no download)."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from pl_privfed.datamodules.base import FederatedDataModule

__all__ = ["DigitsDataModule"]


class DigitsDataModule(FederatedDataModule):
    """scikit-learn's optical-recognition handwritten digits (UCI): 1,797 real 8×8 images.

    Shipped with scikit-learn, so nothing is downloaded. Pixels (0–16) are scaled to [0, 1] and
    flattened to 64 features; labels 0–9. The train/test split is fixed (stratified,
    ``test_size=0.2``, ``random_state=0``: 1,437 train / 360 test) and independent of ``seed``,
    so every run is evaluated on the same held-out images.

    Args: see :class:`FederatedDataModule`.
    """

    num_classes = 10

    def load_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        from sklearn.datasets import load_digits  # on use: 0.4 s of CPU to import
        from sklearn.model_selection import train_test_split

        data = load_digits()
        x = (data.data / 16.0).astype(np.float32)
        y = data.target.astype(np.int64)
        x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
        return (
            TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
            TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)),
        )
