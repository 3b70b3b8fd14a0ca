"""Local solvers: the client-side update ``T_i(x)``, run for the clients of a chunk at once.

A solver starts every client of the chunk at the server model ``x`` and takes ``steps`` local
steps ``y_i ← y_i − lr · g_i`` with the chunk's parameters stacked as ``[c, d]`` — one call of the
chunk's gradient oracle per local step, in its per-client-parameter mode. The solvers differ in
the data a step uses:

* :class:`LocalGD` — every step uses the round's whole batch (full-batch local gradient descent
  when the client's batch is its whole shard): paper 004 Theorem 1 (line 137),
  ``x_i^{k,j+1} = x_i^{k,j} − (γ/T) ∇f_i(x_i^{k,j})``, and paper 003 Algorithms 1–2 with
  full-batch gradients (App. G, line 1641).
* :class:`LocalSGD` — step ``j`` uses the ``j``-th of the round's local minibatches (the
  datamodule's ``local_batches`` option delivers ``[n, T, B, ...]``): local minibatch SGD as
  practitioners run it, paper 003's stochastic ``∇F_i(y_i)``.
* :class:`IncrementalGradient` — cyclic incremental gradient over the client's ``N`` samples in a
  fixed order: paper 004 App. G eq. (2) (line 850),
  ``x_i^{k,j+1} = x_i^{k,j} − (γ/N) ∇f_{i,j}(x_i^{k,j})``, ``j = 0..N−1``. It is :class:`LocalSGD`
  with one example per step, which the datamodule provides with ``batch_size: 1``,
  ``local_batches: N`` and ``shuffle: false`` (every round then walks each shard once in its
  stored, fixed order); the solver checks that setting.

Besides the local models the solver returns ``Σ_j g_i^j``, the sum of the (transformed) local
gradients, so that ``x − T_i(x) = lr Σ_j g_i^j`` can be used as written in paper 004 (its local
operators are defined through that sum) without the cancellation of ``x − y_i``. A ``transform``
applied to every local gradient before the step implements per-sample clipping and the local
noise of paper 003 Algorithm 1 / Corollary I.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from pl_privfed.checks import check_choice, check_positive_int

__all__ = ["IncrementalGradient", "LocalGD", "LocalRun", "LocalSGD", "LocalSolver"]


@dataclass
class LocalRun:
    """The outcome of the local steps of the participating clients.

    Attributes:
        params: the local models ``y_i`` after the last step, ``[c, d]``.
        grad_sum: ``Σ_j g_i^j`` over the steps (after ``transform``), ``[c, d]``.
        steps: the number of local steps taken.
    """

    params: Tensor
    grad_sum: Tensor
    steps: int


class LocalSolver:
    """Base class: ``steps`` local steps from ``x`` for the clients ``clients`` (all if None)."""

    #: whether step ``j`` uses the ``j``-th local minibatch (``grad_fn(..., step=j)``)
    per_step_batches: bool = False

    def __init__(self, steps: int = 1) -> None:
        self.steps = check_positive_int("steps", steps)

    def check_data(
        self,
        *,
        batch_size: int,
        local_batches: int,
        shuffle: bool,
        client_sizes: list[int],
    ) -> None:
        """Raise ``ValueError`` when the datamodule's rounds do not fit this solver."""
        if self.per_step_batches and local_batches != self.steps:
            raise ValueError(
                f"{self!r} takes {self.steps} local minibatches per round but the datamodule "
                f"delivers local_batches={local_batches}: set data local_batches: {self.steps}"
            )

    def run(
        self,
        x: Tensor,
        grad: Callable[[Tensor, int | None], Tensor],
        lr: float,
        *,
        transform: Callable[[Tensor, int], Tensor] | None = None,
        keep: str = "both",
    ) -> LocalRun:
        """Local steps ``y ← y − lr · transform(g(y), j)`` from ``y = x`` for every client.

        Args:
            x: the server model ``[d]``.
            grad: the chunk's gradients ``grad(params, step) -> [c, d]`` (e.g.
                :meth:`~pl_privfed.engine.ClientChunk.grad`), ``step`` the local minibatch
                (``None`` for solvers that use all the round's data at every step).
            lr: the local step size of one step.
            transform: applied to every step's gradients ``[c, d]`` (with the step index).
            keep: what the caller reads: ``"params"`` (the local models), ``"sum"`` (the
                gradient sum; the last step's model is then not formed) or ``"both"``.
        """
        check_choice("keep", keep, ("params", "sum", "both"))
        y: Tensor = x  # shared at the first step: one oracle call in its shared mode
        grad_sum: Tensor | None = None
        for j in range(self.steps):
            g = grad(y, j if self.per_step_batches else None)
            if transform is not None:
                g = transform(g, j)
            if keep != "params":
                grad_sum = (
                    g.clone()
                    if grad_sum is None and j + 1 < self.steps
                    else (g if grad_sum is None else grad_sum.add_(g))
                )
            if keep != "sum" or j + 1 < self.steps:  # [d] − lr·[c, d] at the first step
                y = torch.add(y, g, alpha=-lr) if j == 0 else y.sub_(g, alpha=lr)
        return LocalRun(params=y, grad_sum=grad_sum, steps=self.steps)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(steps={self.steps})"


class LocalGD(LocalSolver):
    """``steps`` local gradient-descent steps on the round's whole batch (paper 004 Thm. 1).

    Args:
        steps: ``T >= 1`` (paper 003's ``τ``).
    """


class LocalSGD(LocalSolver):
    """``steps`` local minibatch SGD steps, step ``j`` on the round's ``j``-th local minibatch.

    Needs the datamodule's ``local_batches`` equal to ``steps`` (the datamodule's
    ``local_epochs`` sets it to whole passes over the shards).

    Args:
        steps: ``T >= 1``.
    """

    per_step_batches = True


class IncrementalGradient(LocalSGD):
    """Cyclic incremental gradient over each client's ``N`` samples (paper 004 App. G, eq. 2).

    ``N`` local steps, step ``j`` on sample ``j`` of the client's shard in a fixed order, with the
    per-step size ``γ/N`` chosen by the algorithm. The datamodule must deliver that order:
    ``batch_size: 1``, ``local_batches: N``, ``shuffle: false`` and every client holding ``N``
    samples (checked before training).

    Args:
        num_samples: ``N``, the samples per client.
    """

    def __init__(self, num_samples: int) -> None:
        super().__init__(check_positive_int("num_samples", num_samples))
        self.num_samples = num_samples

    def check_data(self, *, batch_size, local_batches, shuffle, client_sizes) -> None:
        super().check_data(
            batch_size=batch_size,
            local_batches=local_batches,
            shuffle=shuffle,
            client_sizes=client_sizes,
        )
        if batch_size != 1:
            raise ValueError(f"{self!r} needs data batch_size: 1, got batch_size={batch_size}")
        if shuffle:
            raise ValueError(f"{self!r} needs a fixed sample order: set data shuffle: false")
        sizes = np.asarray(client_sizes)
        if sizes.size and (sizes != self.num_samples).any():
            raise ValueError(
                f"{self!r} needs every client to hold num_samples={self.num_samples} samples, "
                f"got client sizes {sorted(set(sizes.tolist()))}"
            )

    def __repr__(self) -> str:
        return f"IncrementalGradient(num_samples={self.num_samples})"
