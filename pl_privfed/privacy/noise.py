"""Gaussian-noise settings shared by the private algorithms."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pl_privfed.privacy.accounting import AccountantName
from pl_privfed.privacy.calibration import calibrate_noise_multiplier, paper_noise_std

__all__ = ["Calibration", "DPNoise", "Draws", "Neighbouring", "paper_noise_std"]

Calibration = Literal["paper", "target"]
Neighbouring = Literal["add_remove", "replace_one"]
Draws = Literal["aggregate", "per_client"]


@dataclass
class DPNoise:
    """Gaussian DP noise settings.

    Give either ``epsilon`` (calibrated) or ``noise_multiplier`` (noise std = noise_multiplier ×
    sensitivity).

    Attributes:
        epsilon: target ε.
        delta: δ of the calibration and of the reported ε.
        noise_multiplier: direct mode: noise std divided by the sensitivity.
        calibration: with ``epsilon``: ``"paper"`` — the papers' formula
            ``σ = c · p · Φ · sqrt(K log(1/δ))/ε`` (:func:`paper_noise_std`; the accountant's ε is
            reported beside the target and may differ); ``"target"`` — the noise multiplier that
            makes the accountant certify ``epsilon`` after the run's K rounds at its sampling rate.
        constant: the constant ``c`` of the paper calibration (default 1).
        rounds: ``K`` of the calibration; ``None`` → the run's number of rounds.
        neighbouring: ``"add_remove"`` (sensitivity = the bound Φ of the noised message) or
            ``"replace_one"`` (sensitivity 2Φ: a clipped or normalized vector can be replaced by
            its opposite).
        seed: seed of the noise streams: client ``i``'s noise in round ``k`` is drawn from the
            stream keyed by ``(seed, k, i)`` (:mod:`pl_privfed.engine.rng`).
        accountant: ``"rdp"`` or ``"prv"`` (Opacus) for calibration and the reported ε.
        draws: how the simulation draws the clients' noise when an algorithm uses it only
            through the sum the server receives (the error-feedback family, DP-SGD, DP-FedAvg,
            Fed-α-NormEC, per-update clipping): ``"aggregate"`` draws that sum
            ``Σ_i z_i ~ N(0, m σ² I)`` once per round (``d`` normals instead of ``m·d``; every
            iterate has the same distribution), ``"per_client"`` draws each client's ``z_i``
            from its own stream and adds it to its message. Algorithms whose clients use their
            own noise (per-sample clipping's local steps, PORTER-DP, SoteriaFL) always draw
            per client. The privacy guarantee is the same either way: it is a property of the
            mechanism, not of how the simulation samples it.
    """

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    calibration: Calibration = "paper"
    constant: float = 1.0
    rounds: int | None = None
    neighbouring: Neighbouring = "add_remove"
    seed: int = 0
    accountant: AccountantName = "rdp"
    draws: Draws = "aggregate"

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
        if self.calibration not in ("paper", "target"):
            raise ValueError(f"calibration must be 'paper' or 'target', got {self.calibration!r}")
        if not self.constant > 0:
            raise ValueError(f"constant must be positive, got {self.constant!r}")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {self.rounds!r}")
        if self.neighbouring not in ("add_remove", "replace_one"):
            raise ValueError(
                f"neighbouring must be 'add_remove' or 'replace_one', got {self.neighbouring!r}"
            )
        if self.accountant not in ("rdp", "prv"):
            raise ValueError(f"accountant must be 'rdp' or 'prv', got {self.accountant!r}")
        if self.draws not in ("aggregate", "per_client"):
            raise ValueError(f"draws must be 'aggregate' or 'per_client', got {self.draws!r}")

    @property
    def sensitivity_factor(self) -> float:
        """Sensitivity / bound of the noised message under the neighbouring relation."""
        return 2.0 if self.neighbouring == "replace_one" else 1.0

    def std(
        self, *, bound: float, sensitivity: float, rounds: int, sample_rate: float = 1.0
    ) -> float:
        """Noise std for a message of norm at most ``bound`` whose sensitivity is ``sensitivity``.

        Args:
            bound: ``Φ``, the bound on the noised message (what the paper formula scales with).
            sensitivity: what one privacy unit can change, under the neighbouring relation
                (the accountant's noise multiplier is ``std / sensitivity``).
            rounds: the run's number of rounds (used when ``self.rounds`` is None).
            sample_rate: probability that a privacy unit takes part in a round.
        """
        if self.noise_multiplier is not None:
            return self.noise_multiplier * sensitivity
        rounds = self.rounds or rounds
        if self.calibration == "paper":
            return paper_noise_std(
                sensitivity=bound,
                epsilon=self.epsilon,
                delta=self.delta,
                rounds=rounds,
                constant=self.constant,
                sample_rate=sample_rate,
            )
        multiplier = calibrate_noise_multiplier(
            target_epsilon=self.epsilon,
            delta=self.delta,
            sample_rate=sample_rate,
            steps=rounds,
            accountant=self.accountant,
        )
        return multiplier * sensitivity
