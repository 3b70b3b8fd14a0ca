"""Paper 001's logistic regression with a non-convex regularizer (plain ``nn.Module``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pl_privfed.checks import check_positive_int

__all__ = ["NonconvexLogisticRegression"]


class NonconvexLogisticRegression(nn.Module):
    """Binary logistic regression with the regularizer ``λ Σ_j x_j² / (1 + x_j²)``.

    Paper 001 §5.1 (line 301), following Wang et al. (2019):
    ``ℓ(x; {f, l}) = log(1 + exp(−b xᵀf)) + λ Σ_{i=1}^d x_i²/(1 + x_i²)``, λ = 0.2, with the
    parameter ``x ∈ R^d`` (no bias). The paper prints ``log(1 + l exp(−xᵀf))`` with
    ``l ∈ {0, 1}``, which would drop every ``l = 0`` example from the loss; we read it as the
    standard logistic loss of the cited work with sign labels ``b = 2l − 1``.

    So that the package's default cross-entropy and accuracy apply unchanged, ``forward``
    returns the two logits ``[−z/2, z/2]`` with ``z = xᵀf``: softmax cross-entropy on them with
    class ``l`` is exactly ``log(1 + exp(−(2l − 1) z))``. The regularizer is
    :meth:`regularizer`, which the gradient oracle and the evaluation add to the loss.

    Args:
        in_features: ``d`` (123 for a9a).
        lam: λ.
    """

    def __init__(self, in_features: int = 123, lam: float = 0.2) -> None:
        super().__init__()
        check_positive_int("in_features", in_features)
        if not lam >= 0:
            raise ValueError(f"lam must be non-negative, got {lam!r}")
        self.lam = float(lam)
        self.weight = nn.Parameter(torch.zeros(in_features))

    def forward(self, x: Tensor) -> Tensor:
        z = x.flatten(1) @ self.weight
        return torch.stack([-z / 2, z / 2], dim=-1)

    def regularizer(self, params: dict[str, Tensor]) -> Tensor:
        """``λ Σ_j x_j²/(1 + x_j²)`` of the given named parameters (works under ``vmap``)."""
        w = params["weight"]
        sq = w * w
        return self.lam * (sq / (1 + sq)).sum()
