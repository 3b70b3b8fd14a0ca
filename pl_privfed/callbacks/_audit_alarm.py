"""The alarm's tests of :class:`~pl_privfed.callbacks.PrivacyAudit`: each gives its value at a
confidence and a number of tests sharing it (Bonferroni)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from pl_privfed.privacy.audit import gaussian_estimate, one_run_audit

__all__ = ["bound", "fit_low"]


def fit_low(
    inserted: np.ndarray, held_out: np.ndarray, delta: float
) -> Callable[[float, int], float]:
    """The low end of a Gaussian fit's ε interval at ``1 − (1 − confidence)/tests``."""

    def low(confidence: float, tests: int) -> float:
        level = 1.0 - (1.0 - confidence) / tests
        return gaussian_estimate(inserted, held_out, delta, level).epsilon_low

    return low


def bound(scores: np.ndarray, inserted: np.ndarray, delta: float) -> Callable[[float, int], float]:
    """A one-run lower bound with ``tests`` audits sharing the confidence (Bonferroni)."""

    def value(confidence: float, tests: int) -> float:
        return one_run_audit(scores, inserted, delta, confidence, tests=tests).epsilon

    return value
