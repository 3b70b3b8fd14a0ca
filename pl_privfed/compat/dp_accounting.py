"""dp-accounting's private names that the package uses: the dense PMF of a PLD's remove
direction, which dp-accounting 0.6 has no public accessor for.

Tested with dp-accounting ``TESTED`` (``tests/test_compat.py``).
"""

from __future__ import annotations

import numpy as np
from dp_accounting.pld import privacy_loss_distribution as pld_lib

__all__ = ["TESTED", "remove_pmf"]

#: the dp-accounting versions this module was checked against (``pyproject.toml`` pins them)
TESTED = ">=0.6,<0.7"


def remove_pmf(
    pld: pld_lib.PrivacyLossDistribution,
) -> tuple[np.ndarray, np.ndarray, float]:
    """The PLD's remove-direction PMF in dense form: ``(losses, probs, infinity_mass)``, where
    ``losses`` are integers (the loss in units of the PLD's discretization interval) and
    ``probs`` their masses, beside the mass at ``+∞``."""
    pmf = pld._pmf_remove.to_dense_pmf()
    losses = int(pmf._lower_loss) + np.arange(len(pmf._probs))
    probs = np.asarray(pmf._probs, dtype=np.float64)
    return losses, probs, float(pmf._infinity_mass)
