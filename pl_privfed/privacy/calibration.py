"""Noise calibration: the papers' formula, and solving for a target ε with the accountant."""

from __future__ import annotations

import math

from opacus.accountants.utils import get_noise_multiplier

from pl_privfed.privacy.accounting import AccountantName

__all__ = ["calibrate_noise_multiplier", "paper_noise_std"]


def paper_noise_std(
    *,
    sensitivity: float,
    epsilon: float,
    delta: float,
    rounds: int,
    constant: float = 1.0,
    sample_rate: float = 1.0,
) -> float:
    """The papers' calibration ``σ = c · p · Φ · sqrt(K log(1/δ)) / ε``.

    This is the noise level the α-NormEC papers use: paper 002 eq. (3) with ``B = n`` (its
    constant ``c`` under the square root equals ``constant²`` here) and §5.2 ("noise
    β sqrt(K log(1/δ))/ε"); with client participation probability ``p`` it is paper 004's
    ``σ = c p sqrt((K+1) log(1/δ))/ε`` (Corollary 2, with K+1 rounds counted as ``rounds``). It
    is a *calibration rule*, not a guarantee: the ε a run certifies comes from
    :class:`~pl_privfed.privacy.PrivacyAccountant`.

    >>> round(paper_noise_std(sensitivity=1.0, epsilon=8.0, delta=1e-5, rounds=300), 4)
    7.3462
    """
    return constant * sample_rate * sensitivity * math.sqrt(rounds * math.log(1 / delta)) / epsilon


def calibrate_noise_multiplier(
    *,
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    accountant: AccountantName = "rdp",
    epsilon_tolerance: float = 0.01,
) -> float:
    """The noise multiplier that spends ``target_epsilon`` at ``delta`` after ``steps`` releases.

    Solved by Opacus (``opacus.accountants.utils.get_noise_multiplier``, a bisection over the
    chosen accountant) for a (Poisson-)subsampled Gaussian mechanism with the given sampling rate;
    the certified ε is within ``epsilon_tolerance`` below the target.
    """
    if not target_epsilon > 0:
        raise ValueError(f"target_epsilon must be positive, got {target_epsilon!r}")
    if steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    return float(
        get_noise_multiplier(
            target_epsilon=target_epsilon,
            target_delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            accountant=accountant,
            epsilon_tolerance=epsilon_tolerance,
        )
    )
