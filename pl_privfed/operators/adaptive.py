"""Adaptive clipping: the clipping norm follows a private estimate of a quantile of the update norms.

Andrew, Thakkar, McMahan & Ramaswamy, "Differentially Private Learning with Adaptive Clipping"
(NeurIPS 2021, arXiv:1905.03871): its private quantile estimate with the geometric update, inside
DP-FedAvg, and the noise split of its privacy analysis, written as the authors' reference
implementation writes it (tensorflow_privacy's ``QuantileEstimatorQuery`` and
``QuantileAdaptiveClipSumQuery``, TensorFlow Federated's
``DifferentiallyPrivateFactory.gaussian_adaptive`` and ``adaptive_clip_noise_params``). In round ``t``, with clipping norm ``C_t``:

* every participating client ``i`` clips its update, ``clip_{C_t}(Δ_i)``, and sends the bit
  ``b_i = 1[‖Δ_i‖ ≤ C_t]`` beside it;
* the server releases the noised update sum and the noised, centred count
  ``b̃ = (Σ_{i∈S} (b_i − 1/2) + ξ)/m + 1/2`` with ``ξ ~ N(0, σ_b²)`` and ``m`` the expected
  cohort (centred so that one client moves the count by at most 1/2; clamped to ``[0, 1]``,
  post-processing);
* ``C_{t+1} = C_t · exp(−η_C (b̃ − γ))`` (geometric update towards the target quantile ``γ``
  of unclipped updates).

Noise split (the paper's; TFF's ``adaptive_clip_noise_params``): the update's noise std is
``z_Δ · C_t`` with ``z_Δ = (z^{-2} − (2σ_b)^{-2})^{-1/2}``, so the update (sensitivity ``C_t``) and
the count (sensitivity 1/2) together are exactly one Gaussian mechanism with noise multiplier
``z``, whatever ``C_t`` is: the vector ``(clip(Δ_i)/C_t, (b_i − 1/2)·z_Δ/σ_b)`` has norm at most
``(1 + z_Δ²/(2σ_b)²)^{1/2}`` and carries noise ``z_Δ`` per coordinate. Under replace-one both
sensitivities double, and so does the joint vector's. ``z`` is what the accountant composes and what
the calibration solves for; it must be below ``2σ_b``.

This module holds the operator and the server's arithmetic; an algorithm
(:class:`~pl_privfed.algorithms.DPFedAvg`, :class:`~pl_privfed.algorithms.FedAvgPerUpdateClipping`,
:class:`~pl_privfed.algorithms.DistributedDPSGD`) keeps ``C_t`` as its state and draws the count's
noise (:mod:`pl_privfed.algorithms.base`).
"""

from __future__ import annotations

import math

from torch import Tensor

from pl_privfed.operators import functional as F
from pl_privfed.operators.base import Operator

__all__ = ["UNCLIPPED", "AdaptiveClip", "adaptive_noise_multiplier"]

#: the statistic the engine records for an :class:`AdaptiveClip`: each sender's bit ``b_i``
UNCLIPPED = "adaptive_clip:unclipped"

#: the count's noise std as a share of the expected cohort when none is given: ``m/20``
#: (the paper's recommendation as tensorflow_privacy's docstring quotes it, TFF's ``0.05 · m``)
DEFAULT_COUNT_STDDEV_SHARE = 0.05


def _check(name: str, value: float, low: float, high: float = math.inf) -> float:
    """``value`` as a float, or ``ValueError`` naming ``name`` unless ``low < value < high``."""
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not low < value < high:
        where = f"in ({low:g}, {high:g})" if math.isfinite(high) else f"> {low:g}"
        raise ValueError(f"{name} must be a finite number {where}, got {value!r}")
    return float(value)


def adaptive_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """``z_Δ = (z^{-2} − (2σ_b)^{-2})^{-1/2}`` (Andrew et al.'s noise split), the update's noise
    multiplier that, with the count's noise ``σ_b``, is as private as one Gaussian of
    multiplier ``z``; ``ValueError`` naming ``count_stddev`` unless ``z < 2σ_b``.

    >>> round(adaptive_noise_multiplier(1.0, 5.0), 6)  # z = 1, m = 100: σ_b = 5
    1.005038
    """
    if not noise_multiplier < 2 * count_stddev:
        raise ValueError(
            f"count_stddev={count_stddev!r} (σ_b) is too small for the run's noise multiplier "
            f"z={noise_multiplier:.6g}: the noise split z_Δ = (z^-2 − (2σ_b)^-2)^-1/2 needs "
            "z < 2σ_b; raise count_stddev (default m/20) or the noise"
        )
    return (noise_multiplier**-2 - (2 * count_stddev) ** -2) ** -0.5


class AdaptiveClip(Operator):
    """Hard clipping ``min(1, C_t/‖g‖) g`` at a norm ``C_t`` that adapts between rounds towards
    the ``target_quantile`` of the clients' update norms (module docstring).

    The operator's :attr:`bound` is the current norm ``C_t``; its :attr:`reference_bound`, at
    which the run's noise is calibrated and accounted, is ``C_0``: the update's noise std
    follows ``C_t`` (:meth:`noise_factor`), so the noise multiplier is the same every round.

    Args:
        initial_norm: ``C_0 > 0`` (TFF's default 0.1).
        target_quantile: ``γ ∈ (0, 1)``, the share of updates left unclipped (0.5: the median,
            the paper's recommendation).
        learning_rate: ``η_C > 0`` of the geometric update (0.2, the paper's).
        count_stddev: ``σ_b > 0``, the noise std of the unclipped count (in the role of the
            run's noise std: the sum's for central and distributed noise, a client's for local);
            ``None``: ``m/20`` with ``m`` the expected cohort (the paper's).
    """

    norm_based = True

    def __init__(
        self,
        initial_norm: float = 0.1,
        target_quantile: float = 0.5,
        learning_rate: float = 0.2,
        count_stddev: float | None = None,
    ) -> None:
        self.initial_norm = _check("initial_norm", initial_norm, 0.0)
        self.target_quantile = _check("target_quantile", target_quantile, 0.0, 1.0)
        self.learning_rate = _check("learning_rate", learning_rate, 0.0)
        if count_stddev is not None:
            count_stddev = _check("count_stddev", count_stddev, 0.0)
        self.count_stddev = count_stddev
        self.norm = self.initial_norm
        self._cohort = 1.0  # m, set by configure

    # ------------------------------------------------------------------ the bound
    @property
    def bound(self) -> float:  # type: ignore[override]
        """``C_t``: no message of this round is longer."""
        return self.norm

    @property
    def reference_bound(self) -> float:
        """``C_0``: the bound the noise is calibrated and accounted at."""
        return self.initial_norm

    def scale(self, norms: Tensor) -> Tensor:
        return F.clip_scale(norms, self.norm)

    def unclipped(self, norms: Tensor) -> Tensor:
        """``b_i = 1[‖Δ_i‖ ≤ C_t]`` for every norm of ``norms``."""
        return (norms <= self.norm).to(norms.dtype)

    # ------------------------------------------------------------------ the noise split
    def configure(self, expected_cohort: float, noise_multiplier: float | None) -> None:
        """Before training: ``m`` (the expected cohort, the count's denominator), ``C = C_0``,
        and, for a private run, a check that its noise multiplier ``z`` (the run's noise std
        over :attr:`reference_bound`) can be split (``z < 2σ_b``)."""
        self._cohort = _check("expected cohort", expected_cohort, 0.0)
        self.norm = self.initial_norm
        if noise_multiplier is not None:
            adaptive_noise_multiplier(noise_multiplier, self.count_std)

    @property
    def count_std(self) -> float:
        """``σ_b``: :attr:`count_stddev`, or ``m/20``."""
        if self.count_stddev is not None:
            return self.count_stddev
        return DEFAULT_COUNT_STDDEV_SHARE * self._cohort

    def noise_factor(self, noise_std: float | None) -> float:
        """The update's noise std over the run's ``noise_std`` (``None``: no noise):
        ``(z_Δ/z) · C_t/C_0`` with ``z = noise_std / C_0``."""
        split = 1.0
        if noise_std:
            z = noise_std / self.initial_norm
            split = adaptive_noise_multiplier(z, self.count_std) / z
        return split * self.norm / self.initial_norm

    # ------------------------------------------------------------------ the server
    def released_fraction(self, unclipped: float, senders: int, noise: float) -> float:
        """``b̃ = clamp((Σ_{i∈S} (b_i − 1/2) + ξ)/m + 1/2, 0, 1)`` from ``Σ b_i``, ``|S|`` and
        the count's noise draw ``ξ``."""
        centred = unclipped - 0.5 * senders + noise
        return min(1.0, max(0.0, centred / self._cohort + 0.5))

    def next_norm(self, fraction: float) -> float:
        """``C_t · exp(−η_C (b̃ − γ))``."""
        return self.norm * math.exp(-self.learning_rate * (fraction - self.target_quantile))

    def __repr__(self) -> str:
        return (
            f"AdaptiveClip(initial_norm={self.initial_norm!r}, target_quantile="
            f"{self.target_quantile!r}, learning_rate={self.learning_rate!r}, "
            f"count_stddev={self.count_stddev!r})"
        )
