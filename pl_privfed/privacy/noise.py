"""Gaussian-noise configuration and the papers' noise calibration."""

from __future__ import annotations

import math
from dataclasses import dataclass

from pl_privfed.privacy.accounting import AccountantName

__all__ = ["DPNoise", "paper_noise_std"]


def paper_noise_std(
    *, sensitivity: float, epsilon: float, delta: float, rounds: int, constant: float = 1.0
) -> float:
    """The papers' calibration ``σ = c · Φ · sqrt(K log(1/δ)) / ε``.

    This is the noise level the α-NormEC papers use (paper 002 eq. 3 with ``B = n``, where the
    paper's constant ``c`` under the square root equals ``constant²`` here; and §5.2, "variance of
    added noise β sqrt(K log(1/δ))/ε"). It is a *calibration rule*, not a privacy guarantee: the ε
    a run actually certifies is computed by :class:`~pl_privfed.privacy.PrivacyAccountant`.

    >>> round(paper_noise_std(sensitivity=1.0, epsilon=8.0, delta=1e-5, rounds=300), 4)
    7.3462
    """
    return constant * sensitivity * math.sqrt(rounds * math.log(1.0 / delta)) / epsilon


@dataclass
class DPNoise:
    """Gaussian DP noise settings shared by the private algorithms.

    Give either ``epsilon`` (paper calibration, :func:`paper_noise_std`) or ``noise_multiplier``
    (noise std = ``noise_multiplier`` × sensitivity).

    Attributes:
        epsilon: target ε of the paper calibration.
        delta: δ used by the calibration and to report the accountant's ε.
        noise_multiplier: direct mode: noise std divided by the sensitivity.
        constant: the constant ``c`` of the paper calibration (default 1).
        rounds: ``K`` of the paper calibration; ``None`` → the run's number of rounds.
        seed: seed of the noise generator (an explicit ``torch.Generator``).
        accountant: ``"rdp"`` or ``"prv"`` (Opacus) for the reported ε.
    """

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    constant: float = 1.0
    rounds: int | None = None
    seed: int = 0
    accountant: AccountantName = "rdp"

    def __post_init__(self) -> None:
        if (self.epsilon is None) == (self.noise_multiplier is None):
            raise ValueError(
                "give exactly one of epsilon or noise_multiplier, got "
                f"epsilon={self.epsilon!r}, noise_multiplier={self.noise_multiplier!r}"
            )
        if self.epsilon is not None and not (self.epsilon > 0 and math.isfinite(self.epsilon)):
            raise ValueError(f"epsilon must be positive, got {self.epsilon!r}")
        if self.noise_multiplier is not None and not self.noise_multiplier > 0:
            raise ValueError(f"noise_multiplier must be positive, got {self.noise_multiplier!r}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")
        if not self.constant > 0:
            raise ValueError(f"constant must be positive, got {self.constant!r}")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {self.rounds!r}")
        if self.accountant not in ("rdp", "prv"):
            raise ValueError(f"accountant must be 'rdp' or 'prv', got {self.accountant!r}")

    def std(self, sensitivity: float, rounds: int) -> float:
        """Noise std for a release of the given sensitivity in a run of ``rounds`` rounds."""
        if self.noise_multiplier is not None:
            return self.noise_multiplier * sensitivity
        return paper_noise_std(
            sensitivity=sensitivity,
            epsilon=self.epsilon,
            delta=self.delta,
            rounds=self.rounds or rounds,
            constant=self.constant,
        )
