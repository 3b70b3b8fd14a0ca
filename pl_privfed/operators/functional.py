"""Pure operator functions on client-stacked tensors.

Every function takes a tensor ``v`` of shape ``[n, d]`` (one row per client; a single vector of
shape ``[d]`` also works) and applies the operator row by row, with no Python loop over rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "clip",
    "clip_scale",
    "gaussian_noise",
    "rand_k_biased",
    "rand_k_unbiased",
    "row_norms",
    "smooth_clip",
    "smooth_clip_scale",
    "smoothed_normalize",
    "smoothed_normalize_scale",
    "top_k",
]


def row_norms(v: Tensor) -> Tensor:
    """Euclidean norm of each row, keeping the last dimension (``[n, 1]``)."""
    return torch.linalg.vector_norm(v, dim=-1, keepdim=True)


def clip(v: Tensor, threshold: float) -> Tensor:
    """Hard clipping ``min(1, τ/||g||) g`` (paper 002 eq. 5). Output norm <= τ.

    >>> clip(torch.tensor([[3.0, 4.0], [0.3, 0.4]]), 1.0)
    tensor([[0.6000, 0.8000],
            [0.3000, 0.4000]])
    """
    return v * clip_scale(row_norms(v), threshold)


def clip_scale(norms: Tensor, threshold: float) -> Tensor:
    """The factor ``min(1, τ/||g||)`` of :func:`clip` as a function of the norms.

    ``τ/max(||g||, τ)``: equal to ``min(1, τ/||g||)`` and 1 at ``g = 0`` (no division by zero).
    """
    return threshold / torch.clamp(norms, min=threshold)


def smooth_clip(v: Tensor, threshold: float) -> Tensor:
    """Smooth clipping ``τ/(τ+||g||) g`` (paper 001 Def. 2). Output norm < τ.

    >>> smooth_clip(torch.tensor([[3.0, 4.0]]), 5.0)
    tensor([[1.5000, 2.0000]])
    """
    return v * smooth_clip_scale(row_norms(v), threshold)


def smooth_clip_scale(norms: Tensor, threshold: float) -> Tensor:
    """The factor ``τ/(τ+||g||)`` of :func:`smooth_clip` as a function of the norms."""
    return threshold / (threshold + norms)


def smoothed_normalize(v: Tensor, alpha: float) -> Tensor:
    """Smoothed normalization ``Norm_α(g) = g/(α+||g||)`` (paper 002 eq. 6). Output norm < 1.

    With ``α = 0`` this is plain normalization ``g/||g||`` with the convention ``0/0 = 0``.

    >>> smoothed_normalize(torch.tensor([[3.0, 4.0]]), 0.0)
    tensor([[0.6000, 0.8000]])
    """
    return v * smoothed_normalize_scale(row_norms(v), alpha)


def smoothed_normalize_scale(norms: Tensor, alpha: float) -> Tensor:
    """The factor ``1/(α + ||g||)`` of :func:`smoothed_normalize` (0 where ``α + ||g|| = 0``)."""
    denom = alpha + norms
    if alpha > 0:
        return denom.reciprocal()
    return torch.where(denom > 0, denom.clamp(min=torch.finfo(norms.dtype).tiny).reciprocal(), 0.0)


def top_k(v: Tensor, k: int) -> Tensor:
    """Keep the ``k`` largest-magnitude coordinates of each row, zero the others (contractive).

    >>> top_k(torch.tensor([[1.0, -3.0, 2.0]]), 2)
    tensor([[ 0., -3.,  2.]])
    """
    idx = v.abs().topk(k, dim=-1, sorted=False).indices
    return torch.zeros_like(v).scatter_(-1, idx, v.gather(-1, idx))


def _keep_mask(v: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    probs = torch.rand(v.shape, generator=generator, device=v.device, dtype=v.dtype)
    return probs < (k / v.shape[-1])


def rand_k_biased(v: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Biased random sparsification: keep each coordinate with probability ``k/d``, no rescaling.

    As in paper 001 Example 1 (each coordinate kept independently with probability ``p = k/d``);
    contractive with ``E||C(g) − g||² = (1 − k/d)||g||²``.
    """
    return torch.where(_keep_mask(v, k, generator), v, 0.0)


def rand_k_unbiased(v: Tensor, k: int, generator: torch.Generator | None = None) -> Tensor:
    """Unbiased random sparsification: keep each coordinate with probability ``k/d``, scaled ``d/k``.

    ``E[C(g)] = g`` and ``E||C(g) − g||² = (d/k − 1)||g||²``.
    """
    return torch.where(_keep_mask(v, k, generator), v * (v.shape[-1] / k), 0.0)


def gaussian_noise(
    shape: torch.Size | tuple[int, ...],
    std: float,
    generator: torch.Generator,
    *,
    device: torch.device | str | None = None,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Draw ``N(0, std² I)`` noise from an explicit generator (never the global RNG)."""
    if generator is None:
        raise ValueError("gaussian_noise needs an explicit torch.Generator, got None")
    return torch.randn(shape, generator=generator, device=device, dtype=dtype).mul_(std)
