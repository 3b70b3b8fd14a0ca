"""Operator classes: thin, configurable wrappers over :mod:`pl_privfed.operators.functional`."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pl_privfed.operators import functional as F

__all__ = [
    "Clip",
    "Identity",
    "Operator",
    "RandKBiased",
    "RandKUnbiased",
    "SmoothClip",
    "SmoothedNormalization",
    "TopK",
]


def _check_positive(name: str, value: float) -> None:
    if not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


class Operator:
    """An operator ``Ψ: R^d → R^d`` applied row-wise to a ``[n, d]`` tensor.

    Attributes:
        bound: upper bound on ``||Ψ(g)||`` for every ``g`` (the sensitivity used to calibrate DP
            noise), or ``None`` when the output norm is unbounded.
        random: whether the operator draws randomness (then ``__call__`` needs a generator).
        norm_based: whether ``Ψ(g) = s(||g||) g`` for a scalar function ``s`` of the norm
            (clipping, smooth clipping, smoothed normalization): then :meth:`scale` gives
            ``s``, and the engine applies Ψ as one scaling of each row (and can clip per-example
            gradients without holding them, :meth:`~pl_privfed.engine.ClientChunk.clipped_mean`).
    """

    bound: float | None = None
    random: bool = False
    norm_based: bool = False
    is_identity: bool = False
    #: whether the output is sparse by design (sent with a sparse encoding, see
    #: :data:`~pl_privfed.communication.ENCODING`)
    sparsifying: bool = False

    @property
    def reference_bound(self) -> float | None:
        """The bound the run's noise is calibrated and accounted at: :attr:`bound`, except for
        an operator whose bound moves between rounds and whose noise moves with it
        (:class:`~pl_privfed.operators.AdaptiveClip`)."""
        return self.bound

    def __call__(self, v: Tensor, generator: torch.Generator | None = None) -> Tensor:
        raise NotImplementedError

    def scale(self, norms: Tensor) -> Tensor:
        """``s(||g||)`` for a norm-based operator, elementwise over ``norms``."""
        raise NotImplementedError(f"{type(self).__name__} is not norm-based")

    def setup(self, dim: int) -> None:
        """Validate dimension-dependent parameters once the model size ``d`` is known."""

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


class Identity(Operator):
    """``Ψ(g) = g`` (no clipping, no compression). Unbounded."""

    norm_based = True
    is_identity = True

    def __call__(self, v: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return v

    def scale(self, norms: Tensor) -> Tensor:
        return torch.ones_like(norms)


class _Scaling(Operator):
    """A norm-based operator applied as ``Ψ(g) = s(||g||) g`` with ``s`` from :meth:`scale`."""

    norm_based = True

    def __call__(self, v: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return v * self.scale(F.row_norms(v))


class _Clipping(_Scaling):
    """Shared body of the clipping twins :class:`Clip` and :class:`SmoothClip`: a threshold
    ``τ > 0`` that is also the bound; only the factor :meth:`scale` differs."""

    def __init__(self, threshold: float) -> None:
        _check_positive("threshold", threshold)
        self.threshold = float(threshold)
        self.bound = self.threshold


class Clip(_Clipping):
    """Hard clipping ``min(1, τ/||g||) g``; bound ``τ``.

    Args:
        threshold: the clipping threshold ``τ > 0``.
    """

    def scale(self, norms: Tensor) -> Tensor:
        return F.clip_scale(norms, self.threshold)


class SmoothClip(_Clipping):
    """Smooth clipping ``τ/(τ+||g||) g`` (paper 001 Def. 2); bound ``τ``.

    Args:
        threshold: the clipping threshold ``τ > 0``.
    """

    def scale(self, norms: Tensor) -> Tensor:
        return F.smooth_clip_scale(norms, self.threshold)


class SmoothedNormalization(_Scaling):
    """Smoothed normalization ``Norm_α(g) = g/(α+||g||)`` (paper 002 eq. 6); bound 1.

    Args:
        alpha: the smoothing parameter ``α >= 0`` (``α = 0`` is plain normalization, 0/0 = 0).
    """

    def __init__(self, alpha: float) -> None:
        if not isinstance(alpha, int | float) or not math.isfinite(alpha) or alpha < 0:
            raise ValueError(f"alpha must be a finite number >= 0, got {alpha!r}")
        self.alpha = float(alpha)
        self.bound = 1.0

    def scale(self, norms: Tensor) -> Tensor:
        return F.smoothed_normalize_scale(norms, self.alpha)


class _Sparsifier(Operator):
    """Shared parameter handling of the ``k``-sparsifiers: ``k`` coordinates or a ``ratio`` of d."""

    sparsifying = True

    def __init__(self, k: int | None = None, ratio: float | None = None) -> None:
        if (k is None) == (ratio is None):
            raise ValueError(f"give exactly one of k or ratio, got k={k!r}, ratio={ratio!r}")
        if k is not None and (not isinstance(k, int) or k < 1):
            raise ValueError(f"k must be an integer >= 1, got {k!r}")
        if ratio is not None and not (0 < ratio <= 1):
            raise ValueError(f"ratio must be in (0, 1], got {ratio!r}")
        self.k = k
        self.ratio = ratio
        self._k: int | None = k

    def setup(self, dim: int) -> None:
        k = self.k if self.k is not None else max(1, math.floor(self.ratio * dim))
        if not 1 <= k <= dim:
            raise ValueError(f"k must be in [1, d={dim}], got k={k}")
        self._k = k

    @property
    def num_kept(self) -> int:
        if self._k is None:
            raise RuntimeError(f"{self!r}: call setup(dim) before use")
        return self._k


class TopK(_Sparsifier):
    """Top-k sparsification (contractive compressor of EF21). Unbounded.

    Args:
        k: coordinates kept per vector, in ``[1, d]``; or
        ratio: fraction of the ``d`` coordinates kept (``k = max(1, floor(ratio·d))``).
    """

    def __call__(self, v: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return F.top_k(v, self.num_kept)


class RandKBiased(_Sparsifier):
    """Biased random-k: keep each coordinate with probability ``k/d``, no rescaling (paper 001)."""

    random = True

    def __call__(self, v: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return F.rand_k_biased(v, self.num_kept, generator)


class RandKUnbiased(_Sparsifier):
    """Unbiased random-k: keep each coordinate with probability ``k/d`` and rescale by ``d/k``."""

    random = True

    def __call__(self, v: Tensor, generator: torch.Generator | None = None) -> Tensor:
        return F.rand_k_unbiased(v, self.num_kept, generator)
