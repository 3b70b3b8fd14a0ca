"""LIBSVM a9a (Adult) through scikit-learn's svmlight reader."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from pl_privfed.datamodules.base import FederatedDataModule
from pl_privfed.datamodules.files import (
    DataFileError,
    Split,
    check_split,
    data_root,
    resplit,
    where_searched,
)

__all__ = ["A9ADataModule"]

A9A_FEATURES = 123


class A9ADataModule(FederatedDataModule):
    """a9a (LIBSVM's binarized UCI Adult): 123 binary features, 32,561 train / 16,281 test rows.

    Read with :func:`sklearn.datasets.load_svmlight_file` (``n_features=123`` for both files:
    the test file's highest index is 122). Labels ±1 are mapped to class indices
    ``{0, 1}`` (``+1 → 1``), what :class:`~pl_privfed.models.NonconvexLogisticRegression` and
    cross-entropy expect (the logistic loss ``log(1 + exp(−b xᵀf))`` with ``b = 2l − 1``).

    Args:
        data_dir: directory holding ``a9a`` and ``a9a.t`` (or ``a9a/a9a``, ``a9a/a9a.t``) — default
            ``$PL_PRIVFED_DATA`` or ``./data``.
        split: ``"standard"`` (the LIBSVM files) or ``"paper"`` (pooled, 90 % / 10 %).
        split_seed: seed of the paper split.
        **kwargs: :class:`FederatedDataModule` arguments.
    """

    num_classes = 2

    def __init__(
        self,
        data_dir: str | None = None,
        split: Split = "standard",
        split_seed: int = 42,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        self.data_dir = data_dir
        self.split = check_split(split)
        self.split_seed = split_seed

    def _file(self, name: str):
        root = data_root(self.data_dir)
        for path in (root / name, root / "a9a" / name):
            if path.is_file():
                return path
        raise FileNotFoundError(
            f"a9a file {name!r} not found: looked for {str(root / name)!r} and "
            f"{str(root / 'a9a' / name)!r}; {where_searched(self.data_dir)}"
        )

    def load_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        from sklearn.datasets import load_svmlight_file  # on use: 0.4 s of CPU to import

        parts = []
        for name in ("a9a", "a9a.t"):
            path = self._file(name)
            try:
                x, y = load_svmlight_file(str(path), n_features=A9A_FEATURES)
            except (ValueError, OSError, EOFError) as exc:
                raise DataFileError(
                    f"a9a file {str(path)!r} cannot be read as svmlight text ({exc}): truncated "
                    f"or corrupted; {where_searched(self.data_dir)}. Replace it with the "
                    "original LIBSVM file"
                ) from exc
            labels = np.asarray(y)
            if not np.isin(labels, (-1, 1)).all():
                raise DataFileError(
                    f"a9a labels must be ±1, found {np.unique(labels)!r} in {str(path)!r}"
                )
            parts += [x.toarray().astype(np.float32), (labels > 0).astype(np.int64)]
        x_tr, y_tr, x_te, y_te = resplit(self.split, self.split_seed, *parts)
        return (
            TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
            TensorDataset(torch.from_numpy(x_te), torch.from_numpy(y_te)),
        )
