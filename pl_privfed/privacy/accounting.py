"""Privacy accounting: a thin layer over Opacus's maintained accountants.

No privacy mathematics lives here: every ε comes from :mod:`opacus.accountants` (RDP by default,
PRV as an option). Opacus was chosen over dp-accounting because it is PyTorch-native (the same
library users reach for to privatize a plain Lightning module with per-example clipping), its
accountants expose the small ``step(noise_multiplier=, sample_rate=)`` / ``get_epsilon(delta)``
interface this package needs, and their state is a plain history list that checkpoints cleanly.

Each call to :meth:`PrivacyAccountant.step` records one adaptive composition of a subsampled
Gaussian mechanism with the given noise multiplier (noise std / sensitivity) and sampling rate.
"""

from __future__ import annotations

import math
from typing import Literal

from opacus.accountants import create_accountant

__all__ = ["AccountantName", "PrivacyAccountant"]

AccountantName = Literal["rdp", "prv"]


class PrivacyAccountant:
    """Tracks the Gaussian mechanisms a run applied and reports ε for a given δ.

    Args:
        mechanism: ``"rdp"`` (Rényi DP, Mironov 2017; Opacus ``RDPAccountant``) or ``"prv"``
            (privacy random variables, Gopi et al. 2021; Opacus ``PRVAccountant``).

    >>> acc = PrivacyAccountant()
    >>> acc.step(noise_multiplier=1.0, sample_rate=1.0, num_steps=10)
    >>> round(acc.get_epsilon(1e-5), 2) > 0
    True
    """

    def __init__(self, mechanism: AccountantName = "rdp") -> None:
        if mechanism not in ("rdp", "prv"):
            raise ValueError(f"accountant must be 'rdp' or 'prv', got {mechanism!r}")
        self.mechanism = mechanism
        self._accountant = create_accountant(mechanism)

    def step(self, *, noise_multiplier: float, sample_rate: float, num_steps: int = 1) -> None:
        """Record ``num_steps`` applications of a Gaussian mechanism."""
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be positive, got {noise_multiplier!r}")
        if not 0 < sample_rate <= 1:
            raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate!r}")
        for _ in range(num_steps):
            self._accountant.step(noise_multiplier=noise_multiplier, sample_rate=sample_rate)

    @property
    def steps(self) -> int:
        """Number of mechanism applications recorded so far."""
        return sum(int(s) for _, _, s in self._accountant.history)

    def get_epsilon(self, delta: float) -> float:
        """ε certified by the accountant for the recorded history at this δ (0 if empty)."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if not self._accountant.history:
            return 0.0
        return float(self._accountant.get_epsilon(delta=delta))

    def state_dict(self) -> dict:
        return dict(self._accountant.state_dict())

    def load_state_dict(self, state: dict) -> None:
        self._accountant.load_state_dict(dict(state))
