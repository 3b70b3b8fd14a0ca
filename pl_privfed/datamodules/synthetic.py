"""Synthetic federated problems with known structure: quadratic and non-IID logistic clients."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import TensorDataset

from pl_privfed.checks import check_positive_int
from pl_privfed.datamodules.base import FederatedDataModule

__all__ = ["QuadraticDataModule", "SyntheticLogisticDataModule"]


class QuadraticDataModule(FederatedDataModule):
    """Clients ``f_i(x) = ½||x − b_i||²`` (use with ``QuadraticModel`` and ``HalfSquaredError``).

    Client ``i``'s only example has target ``b_i`` (its input is a dummy zero), so every round's
    gradient is exactly ``x − b_i``. The test set is all the centers, so the logged
    ``test/loss`` is ``f(x) = (1/n) Σ_i f_i(x)``. Nothing is held out for validation
    (``val_fraction=0``: one example per client): ``val/loss`` is the same ``f(x)``, the
    objective of this optimization problem.

    Args:
        centers: one row ``b_i`` per client (paper 002 Example 1: ``[[3.0], [-3.0]]``); if
            ``None``, ``num_clients`` centers of dimension ``dim`` are drawn ``N(0, scale²)``.
        num_clients: number of clients (default: ``len(centers)``, or 10).
        dim: dimension of the random centers.
        scale: standard deviation of the random centers.
        seed: seed of the random centers.
    """

    datasets_use_seed = True  # the data are drawn from the seed

    def __init__(
        self,
        centers: list[list[float]] | None = None,
        num_clients: int | None = None,
        dim: int = 10,
        scale: float = 1.0,
        seed: int = 0,
    ) -> None:
        if centers is not None:
            if num_clients is not None and num_clients != len(centers):
                raise ValueError(
                    f"num_clients={num_clients} does not match the {len(centers)} centers"
                )
            num_clients = len(centers)
            if len({len(c) for c in centers}) != 1:
                raise ValueError(f"centers must all have the same dimension, got {centers!r}")
        super().__init__(num_clients or 10, batch_size=1, seed=seed, val_fraction=0.0)
        self.centers = centers
        self.dim = check_positive_int("dim", dim)
        self.scale = float(scale)

    def load_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        if self.centers is not None:
            b = torch.tensor(self.centers, dtype=torch.float32)
        else:
            rng = np.random.default_rng(self.seed)
            b = torch.from_numpy(
                rng.normal(0.0, self.scale, (self.num_clients, self.dim)).astype(np.float32)
            )
        ds = TensorDataset(torch.zeros(len(b), 1), b)
        return ds, ds

    def client_indices(self) -> list[np.ndarray]:
        return [np.array([i]) for i in range(self.num_clients)]


class SyntheticLogisticDataModule(FederatedDataModule):
    """Non-IID multinomial logistic data in the style of Synthetic(α, β) (Li et al., FedProx 2020).

    Client ``i``: ``u_i ~ N(0, α)``, ``W_i, b_i ~ N(u_i, 1)``; ``B_i ~ N(0, β)``,
    ``v_i ~ N(B_i, 1)``; features ``x ~ N(v_i, Σ)`` with ``Σ_jj = j^{-1.2}``; label
    ``argmax(W_i x + b_i)``. α controls how different the clients' models are, β how different
    their features are. Each client's shard is its own samples; the test set pools a held-out
    ``test_fraction`` of every client's samples.

    Args:
        num_clients: number of clients.
        batch_size: examples per client per round.
        alpha: model heterogeneity α.
        beta: feature heterogeneity β.
        dim: number of features.
        num_classes: number of classes.
        samples_per_client: examples generated per client (before the test split).
        test_fraction: share of each client's examples held out for the test set.
        seed: data and sampling seed.
        val_fraction: share of every client's remaining examples held out for validation
            (:class:`FederatedDataModule`).
    """

    datasets_use_seed = True  # the data are drawn from the seed

    def __init__(
        self,
        num_clients: int = 10,
        batch_size: int = 16,
        alpha: float = 0.5,
        beta: float = 0.5,
        dim: int = 20,
        num_classes: int = 5,
        samples_per_client: int = 100,
        test_fraction: float = 0.2,
        seed: int = 0,
        val_fraction: float = 0.1,
    ) -> None:
        super().__init__(num_clients, batch_size, seed=seed, val_fraction=val_fraction)
        if alpha < 0 or beta < 0:
            raise ValueError(f"alpha and beta must be >= 0, got alpha={alpha}, beta={beta}")
        if not 0 < test_fraction < 1:
            raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction!r}")
        self.alpha, self.beta = float(alpha), float(beta)
        self.dim = check_positive_int("dim", dim)
        self.num_classes = check_positive_int("num_classes", num_classes)
        self.samples_per_client = check_positive_int("samples_per_client", samples_per_client)
        self.test_fraction = float(test_fraction)
        self._train_shards: list[np.ndarray] = []

    def load_datasets(self) -> tuple[TensorDataset, TensorDataset]:
        rng = np.random.default_rng(self.seed)
        d, c, m = self.dim, self.num_classes, self.samples_per_client
        cov = np.arange(1, d + 1, dtype=np.float64) ** -1.2
        n_test = max(1, round(m * self.test_fraction))
        xs_tr, ys_tr, xs_te, ys_te, shards, offset = [], [], [], [], [], 0
        for _ in range(self.num_clients):
            u = rng.normal(0.0, np.sqrt(self.alpha))
            w = rng.normal(u, 1.0, (c, d))
            b = rng.normal(u, 1.0, c)
            v = rng.normal(rng.normal(0.0, np.sqrt(self.beta)), 1.0, d)
            x = rng.normal(v, np.sqrt(cov), (m, d))
            y = np.argmax(x @ w.T + b, axis=1)
            xs_tr.append(x[n_test:])
            ys_tr.append(y[n_test:])
            xs_te.append(x[:n_test])
            ys_te.append(y[:n_test])
            shards.append(np.arange(offset, offset + m - n_test))
            offset += m - n_test
        self._train_shards = shards

        def tensors(xs, ys):
            return TensorDataset(
                torch.from_numpy(np.concatenate(xs).astype(np.float32)),
                torch.from_numpy(np.concatenate(ys).astype(np.int64)),
            )

        return tensors(xs_tr, ys_tr), tensors(xs_te, ys_te)

    def client_indices(self) -> list[np.ndarray]:
        return self._train_shards
