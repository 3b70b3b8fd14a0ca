"""Quadratic clients ``f_i(x) = ½||x − b_i||²``: the exactly computable test problem."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pl_privfed.checks import check_positive_int

__all__ = ["HalfSquaredError", "QuadraticModel"]


class QuadraticModel(nn.Module):
    """The parameter vector ``x`` itself, broadcast over the batch.

    Paired with :class:`HalfSquaredError` and targets ``b`` (see
    :class:`~pl_privfed.datamodules.QuadraticDataModule`), a client's loss is ``½||x − b_i||²``.

    Args:
        dim: ``d``.
        init: initial point ``x⁰``: one number (all coordinates) or a list of ``d`` numbers.
    """

    def __init__(self, dim: int, init: float | list[float] = 0.0) -> None:
        super().__init__()
        check_positive_int("dim", dim)
        x0 = (
            torch.full((dim,), float(init))
            if isinstance(init, int | float)
            else torch.tensor([float(v) for v in init])
        )
        if x0.shape != (dim,):
            raise ValueError(f"init must be a number or a list of {dim} numbers, got {init!r}")
        self.x = nn.Parameter(x0)

    def forward(self, inputs: Tensor) -> Tensor:
        return self.x.expand(inputs.shape[0], -1)


class HalfSquaredError(nn.Module):
    """``mean_b ½||output_b − target_b||²`` (sum over coordinates, mean over the batch)."""

    def forward(self, output: Tensor, target: Tensor) -> Tensor:
        return 0.5 * (output - target).pow(2).sum(-1).mean()
