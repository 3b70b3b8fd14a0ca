"""The audit's estimators: the Gaussian fit of a canary statistic (an ε estimate) and the
one-run lower bound (Steinke, Nasr & Jagielski 2023), for :mod:`pl_privfed.privacy.audit`
(which re-exports them): statistics of the canaries' scores, nothing about how they entered."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import scipy.optimize
import scipy.special
import scipy.stats

from pl_privfed.privacy.pld import gaussian_epsilon

__all__ = [
    "GaussianEstimate",
    "OneRunAudit",
    "gaussian_estimate",
    "guess_counts",
    "one_run_audit",
    "one_run_lower_bound",
    "one_run_p_value",
]


# ---------------------------------------------------------------------------- Gaussian fit
@dataclass(frozen=True)
class GaussianEstimate:
    """The Gaussian fit of an audit statistic (Andrew et al. 2024).

    Attributes:
        mu: ``(mean_in − mean_out)/std_out``.
        epsilon: ε of μ-GDP at ``delta``: the Gaussian mechanism of noise multiplier
            ``1/mu`` (:func:`~pl_privfed.privacy.pld.gaussian_epsilon`; 0 when ``mu <= 0``):
            the estimate.
        delta: the δ of ``epsilon``.
        confidence: the one-sided level of ``mu_low`` and ``mu_high``.
        mu_low, mu_high: ``mu`` minus and plus ``z_confidence`` standard errors of its sampling
            error across canaries (normal approximation, delta method: ``std_in²/(std_out²
            n_in) + 1/n_out + mu²/(2(n_out − 1))``): a finite number of canaries gives a noisy
            ``mu``, and an estimate above a certificate means something only beyond that noise.
        epsilon_low, epsilon_high: ε of ``mu_low`` and ``mu_high``.
        mean_in, std_in: the inserted canaries' statistic.
        mean_out, std_out: the held-out canaries' statistic (the null).
        inserted, held_out: how many of each.
    """

    mu: float
    epsilon: float
    delta: float
    confidence: float
    mu_low: float
    mu_high: float
    epsilon_low: float
    epsilon_high: float
    mean_in: float
    std_in: float
    mean_out: float
    std_out: float
    inserted: int
    held_out: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def gaussian_estimate(
    inserted: Sequence[float] | np.ndarray,
    held_out: Sequence[float] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
) -> GaussianEstimate:
    """Andrew et al.'s ε estimate: fit a Gaussian to the held-out canaries' statistic, measure
    the inserted canaries' mean shift in its standard deviations, ``μ``, and read ``μ`` as
    μ-GDP at ``delta`` (the Gaussian mechanism of noise multiplier ``1/μ``,
    :func:`~pl_privfed.privacy.pld.gaussian_epsilon`), with ``μ``'s sampling error across
    canaries (:class:`GaussianEstimate`). An estimate, not a bound."""
    a = np.asarray(inserted, dtype=np.float64)
    b = np.asarray(held_out, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError(
            f"the Gaussian fit needs at least two inserted and two held-out canaries, got "
            f"{a.size} and {b.size}"
        )
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    mean_in, mean_out = float(a.mean()), float(b.mean())
    std_in, std_out = float(a.std(ddof=1)), float(b.std(ddof=1))
    shift = mean_in - mean_out
    if std_out > 0:
        mu = shift / std_out
        spread = math.sqrt(
            (std_in / std_out) ** 2 / a.size + 1.0 / b.size + mu**2 / (2.0 * (b.size - 1))
        )
    else:
        mu, spread = (math.inf if shift > 0 else 0.0), 0.0
    z = float(scipy.stats.norm.ppf(confidence))
    low, high = mu - z * spread, mu + z * spread

    def epsilon(separation: float) -> float:  # μ-GDP: noise multiplier 1/μ; none below 0
        return gaussian_epsilon(1.0 / separation, delta) if separation > 0 else 0.0

    return GaussianEstimate(
        mu,
        epsilon(mu),
        delta,
        confidence,
        low,
        high,
        epsilon(low),
        epsilon(high),
        mean_in,
        std_in,
        mean_out,
        std_out,
        int(a.size),
        int(b.size),
    )


# ---------------------------------------------------------------------------- one-run bound
def one_run_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The probability of ``v`` or more correct guesses among ``r`` (of ``m`` canaries, each
    inserted independently with probability 1/2) when the mechanism is (ε, δ)-DP: Steinke, Nasr
    & Jagielski (2023), the theorem with the δ term,

    ``P[Bin(r, q) >= v] + 2 m δ · max_{1≤i≤v} P[v − i <= Bin(r, q) < v] / i``,
    ``q = e^ε/(1 + e^ε)`` (the accuracy of ε-randomized response), capped at 1. The binomial is
    scipy's."""
    if not 0 <= v <= r <= m:
        raise ValueError(f"need 0 <= v <= r <= m, got v={v}, r={r}, m={m}")
    if not epsilon >= 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and delta in [0, 1], got {epsilon}, {delta}")
    q = float(scipy.special.expit(epsilon))
    p = float(scipy.stats.binom.sf(v - 1, r, q))
    if delta > 0 and v > 0:
        i = np.arange(1, v + 1)
        below = np.cumsum(scipy.stats.binom.pmf(v - i, r, q))  # P[v − i <= Bin < v]
        p += 2.0 * m * delta * float(np.max(below / i))
    return min(1.0, p)


def one_run_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = 0.95) -> float:
    """The largest ε that ``v`` correct guesses of ``r`` reject at ``confidence``: no (ε, δ)-DP
    mechanism gives that many with probability above ``1 − confidence``
    (:func:`one_run_p_value`). 0 when even ε = 0 is not rejected."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    level = 1.0 - confidence

    def excess(eps: float) -> float:
        return one_run_p_value(m, r, v, eps, delta) - level

    if excess(0.0) >= 0:
        return 0.0
    hi = 1.0
    while excess(hi) < 0:
        hi *= 2.0
        if hi > 1e4:
            return math.inf
    return float(scipy.optimize.brentq(excess, hi / 2 if hi > 1 else 0.0, hi, xtol=1e-9))


def guess_counts(count: int) -> list[int]:
    """The guesses per side the one-run audit tries (``k`` "in" and ``k`` "out"): 5, 10, 25, 40
    and 50 % of the canaries, at least one; fixed before the scores are seen (40 %: with each
    canary inserted with probability 1/2, about half are in, so the top and bottom 40 % can all
    be right)."""
    fractions = (0.05, 0.1, 0.25, 0.4, 0.5)
    return sorted({max(1, min(count // 2, round(count * f))) for f in fractions})


@dataclass(frozen=True)
class OneRunAudit:
    """A one-run lower bound (Steinke et al. 2023) and how it was reached.

    Attributes:
        epsilon: the lower bound, at ``confidence`` for all the bounds computed together.
        confidence: the joint confidence.
        delta: the δ of the bound.
        guesses: ``r`` of the best ``k`` (``k`` "in" and ``k`` "out").
        correct: ``v``, the correct ones among them.
        canaries: ``m``.
        ceiling: the bound if every guess of the largest ``k`` were right: no run of this audit
            can report more.
        tried: the ``k`` tried (Bonferroni: each at ``(1 − confidence)/(len(tried)·tests)``).
    """

    epsilon: float
    confidence: float
    delta: float
    guesses: int
    correct: int
    canaries: int
    ceiling: float
    tried: tuple[int, ...]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "tried": list(self.tried)}


def one_run_audit(
    scores: Sequence[float] | np.ndarray,
    inserted: Sequence[bool] | np.ndarray,
    delta: float,
    confidence: float = 0.95,
    *,
    guesses: Sequence[int] | None = None,
    tests: int = 1,
) -> OneRunAudit:
    """Steinke et al.'s one-run lower bound from every canary's ``score`` (higher: more likely
    inserted) and whether it was ``inserted``: for each ``k`` of ``guesses`` (default
    :func:`guess_counts`), guess "in" for the ``k`` highest scores and "out" for the ``k``
    lowest, and keep the largest bound. Every ``k`` (and each of ``tests`` audits reported
    together) is tested at ``(1 − confidence)/(len(guesses)·tests)`` (Bonferroni), so the bounds
    hold jointly at ``confidence``."""
    s = np.asarray(scores, dtype=np.float64)
    truth = np.asarray(inserted, dtype=bool)
    m = int(s.size)
    if m < 2 or truth.size != m:
        raise ValueError(
            f"need at least two canaries and one membership each, got {m}, {truth.size}"
        )
    ks = tuple(sorted({max(1, min(m // 2, int(k))) for k in (guesses or guess_counts(m))}))
    each = 1.0 - (1.0 - confidence) / (len(ks) * max(1, tests))
    order = np.argsort(s, kind="stable")
    best = (0.0, 0, 0)
    for k in ks:
        low, high = order[:k], order[m - k :]
        correct = int(truth[high].sum() + (~truth[low]).sum())
        eps = one_run_lower_bound(m, 2 * k, correct, delta, each)
        if eps > best[0] or best[1] == 0:
            best = (eps, 2 * k, correct)
    ceiling = one_run_lower_bound(m, 2 * ks[-1], 2 * ks[-1], delta, each)
    return OneRunAudit(best[0], confidence, delta, best[1], best[2], m, ceiling, ks)
