"""Privacy loss distributions (dp-accounting's PLD machinery) for the releases a run composes.

A tight ε for a composition of Gaussian releases is the hockey-stick divergence of the composed
privacy loss distribution (PLD) of a *dominating pair* of each release. This module only builds
those PLDs from dp-accounting's factories and composes them with dp-accounting
(``dp_accounting.pld.privacy_loss_distribution``, Doroshenko et al. 2022's pessimistic
connect-the-dots discretization); every ε is ``PrivacyLossDistribution.get_epsilon_for_delta``
of the composition. The dominating pairs, in units of the release's sensitivity (noise std =
noise multiplier ``σ``):

* **no sampling** (any relation): ``(N(1, σ²), N(0, σ²))``, dp-accounting's Gaussian PLD;
* **Poisson sampling at rate q, add/remove**: dp-accounting's subsampled Gaussian PLD, the pair
  ``(q·N(1, σ²) + (1−q)·N(0, σ²), N(0, σ²))`` for removal and its counterpart for addition;
  the two directions are composed separately and ε is the larger (the direction is fixed by the
  pair of datasets, whatever the rounds adapt);
* **sampling without replacement of b of m, replace-one** (Zhu, Dong & Wang 2022, "Optimal
  accounting of differential privacy via characteristic function", AISTATS: the dominating
  pair of a mechanism subsampled without replacement under replace-one; the same profile as
  Dong, Roth & Su 2022's subsampling bound ``C_γ(f)`` in Gaussian DP): with ``(P, Q) = (N(1, σ²), N(0, σ²))`` dominating one Gaussian release under
  replace-one and ``γ = b/m``, the subsampled release is dominated by
  ``(γP + (1−γ)Q, Q)`` for hockey-stick orders ``α ≥ 1`` and by ``(P, (1−γ)P + γQ)`` for
  ``α < 1``. The second pair is the first one reversed (reflect ``x ↦ 1 − x``), so together they
  are the *symmetric* privacy profile whose ``δ(ε)`` for ``ε ≥ 0`` is that of
  ``R = (γP + (1−γ)Q, Q)``. Its PLD is R's privacy loss ``ω`` on positive losses, mirrored with
  the likelihood-ratio weight (``ω*(−l) = e^{−l} ω(l)`` for ``l > 0``; a pair is symmetric
  exactly when its PLD has this property) and the rest of the mass at loss 0 — a valid PLD
  (the mass at 0 is ``1 − P(L > 0) − Q(L > 0) ≥ 0`` for this pair). Composing R's PLD alone
  (dp-accounting's remove direction) would be smaller but is not a certificate: under
  replace-one an adaptive run can make one round behave like R and another like its reverse for
  the same pair of datasets, and a composition needs a pair dominating at every ``α``.

A history of releases without sampling only is one Gaussian mechanism (``K_i`` releases at
noise multiplier ``σ_i`` compose to ``μ² = Σ K_i/σ_i²``): its ε is the exact one of the
analytic Gaussian mechanism (Balle & Wang 2018, Thm. 8), ``δ(ε)`` from dp-accounting's
``GaussianPrivacyLoss.get_delta_for_epsilon`` solved for ε (no discretization, so no
interval; the discretized PLD of the same pair is a hair above it, and building it at a fine
interval for every new round count took a second per ε).

R's PLD is dp-accounting's pessimistic connect-the-dots PMF
(``from_gaussian_mechanism(standard_deviation=σ, sampling_prob=γ)``, remove direction), so the
symmetric PLD built from it dominates the pair above at every ε, and the composed ε is an upper
bound. The discretization interval is ``1e-4`` up to ε of about 10 and grows with ε beyond
(ε's scale from a first pass at a coarse interval, itself an upper bound): the PLD's support
grows with ε over the interval, and a history at tiny noise would otherwise need gigabytes (as
Opacus's PRV did, :mod:`pl_privfed.privacy.accounting`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable

import numpy as np
from dp_accounting import gaussian_mechanism
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

from pl_privfed.compat.dp_accounting import remove_pmf
from pl_privfed.privacy.mechanism import ReleaseKey

__all__ = [
    "PLD_INTERVAL",
    "composed_pld",
    "discretization_for",
    "gaussian_epsilon",
    "pld_epsilon",
    "release_pld",
    "wor_pld",
]

#: dp-accounting's default discretization interval of the privacy loss
PLD_INTERVAL = 1e-4
#: above this ε the interval grows in proportion to ε
PLD_EXACT_UP_TO = 10.0
#: the interval of the first pass that gives ε's scale
COARSE_INTERVAL = 1e-2

#: PLDs kept (one release's, and its self-compositions): a run asks for the same history once
#: per adversary, and a calibration for the same σ more than once; each can be megabytes
PLD_CACHE_SIZE = 16
#: ε of whole histories kept (a float each: many), least recently used first out
EPSILON_CACHE_SIZE = 4096


def discretization_for(epsilon_scale: float) -> float:
    """The discretization interval for a history whose ε is at most ``epsilon_scale``."""
    if not math.isfinite(epsilon_scale):
        return 1.0
    return PLD_INTERVAL * max(1.0, epsilon_scale / PLD_EXACT_UP_TO)


def wor_pld(
    noise_multiplier: float, sampling_prob: float, interval: float = PLD_INTERVAL
) -> pld_lib.PrivacyLossDistribution:
    """The PLD of the dominating pair of one Gaussian release on a sample drawn without
    replacement (rate ``γ = sampling_prob``), under replace-one: the symmetric profile of
    Zhu, Dong & Wang 2022 (module docstring), built from dp-accounting's pessimistic PMF of
    ``R = (γ N(1, σ²) + (1−γ) N(0, σ²), N(0, σ²))``.

    Raises ``ArithmeticError`` if the discretized R cannot be symmetrized (negative mass at 0:
    never seen for a Gaussian, checked rather than assumed).
    """
    remove = pld_lib.from_gaussian_mechanism(
        standard_deviation=noise_multiplier,
        sensitivity=1.0,
        sampling_prob=sampling_prob,
        value_discretization_interval=interval,
    )
    # dp-accounting keeps R's PMF as the remove direction; its dense form is the loss grid
    # lower_loss + i (in units of the interval) with masses probs, plus the mass at +∞
    losses, probs, infinity = remove_pmf(remove)  # private: no public accessor in 0.6
    positive = losses > 0
    up, mass = losses[positive], probs[positive]
    mirrored = mass * np.exp(-up * interval)
    zero = 1.0 - float(mass.sum()) - float(mirrored.sum()) - infinity
    if zero < -1e-9:
        raise ArithmeticError(
            f"the discretized pair for noise multiplier {noise_multiplier!r} and rate "
            f"{sampling_prob!r} has no symmetric profile (mass at 0: {zero!r})"
        )
    top = int(up.max()) if len(up) else 0
    symmetric = np.zeros(2 * top + 1)  # losses -top .. top
    symmetric[top + up] = mass
    symmetric[top - up] = mirrored
    symmetric[top] = max(zero, 0.0)
    return pld_lib.PrivacyLossDistribution(
        pld_pmf.DensePLDPmf(interval, -top, symmetric, infinity, pessimistic_estimate=True)
    )


@functools.lru_cache(maxsize=PLD_CACHE_SIZE)
def release_pld(key: ReleaseKey, interval: float = PLD_INTERVAL) -> pld_lib.PrivacyLossDistribution:
    """One release's PLD (cached): a Gaussian of noise multiplier ``σ`` without sampling, Poisson
    subsampled at rate ``q`` (add/remove), or sampled without replacement at rate ``q``
    (replace-one, :func:`wor_pld`)."""
    sigma, rate, sampling, _ = key
    if sampling == "without_replacement" and rate < 1:
        return wor_pld(sigma, rate, interval)
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma,
        sensitivity=1.0,
        sampling_prob=rate if sampling == "poisson" else 1.0,
        value_discretization_interval=interval,
    )


@functools.lru_cache(maxsize=PLD_CACHE_SIZE)
def composed_pld(
    key: ReleaseKey, steps: int, interval: float = PLD_INTERVAL
) -> pld_lib.PrivacyLossDistribution:
    """``steps`` compositions of one release's PLD (cached: a run asks for the same history
    once per adversary, and a calibration for the same σ more than once). Always composed from
    the one-step PLD (dp-accounting's ``self_compose``), so a run's ε at round K is the ε its
    calibration solved for, to the last digit."""
    sigma, _, sampling, _ = key
    if sampling == "none":  # K Gaussians are one with σ/√K (as dp-accounting's accountant)
        return release_pld(ReleaseKey(sigma / math.sqrt(int(steps)), 1.0, "none", None), interval)
    return release_pld(key, interval).self_compose(int(steps))


def pld_epsilon(
    history: Iterable[tuple[ReleaseKey, int]], delta: float, coarse_only: bool = False
) -> float:
    """dp-accounting's ε at ``delta`` for the composition of ``(release, count)`` pairs.

    A first pass at a coarse interval (``1e-2``, itself a valid upper bound, returned as it is
    with ``coarse_only``) gives ε's scale; the answer is computed at the interval
    :func:`discretization_for` gives for it."""
    history = tuple((ReleaseKey(*key), int(steps)) for key, steps in history if steps > 0)
    if not history:
        return 0.0
    if all(key.sampling == "none" or key.sample_rate >= 1 for key, _ in history):
        mu_squared = sum(steps / key.noise_multiplier**2 for key, steps in history)
        return gaussian_epsilon(1.0 / math.sqrt(mu_squared), delta)
    return _history_epsilon(history, float(delta), bool(coarse_only))


@functools.lru_cache(maxsize=EPSILON_CACHE_SIZE)
def _history_epsilon(
    history: tuple[tuple[ReleaseKey, int], ...], delta: float, coarse_only: bool
) -> float:
    """:func:`pld_epsilon` of a history with sampled releases, kept: the same history is asked
    again by another adversary with the same releases, the next report, a grid's
    configurations that share their noise (a function of the history alone)."""
    coarse = _composed_epsilon(history, delta, COARSE_INTERVAL)
    interval = discretization_for(coarse)
    if coarse_only or interval >= COARSE_INTERVAL:
        return coarse
    return _composed_epsilon(history, delta, interval)


def gaussian_epsilon(noise_multiplier: float, delta: float) -> float:
    """The exact ε at ``delta`` of one Gaussian mechanism of sensitivity 1 and noise std
    ``noise_multiplier`` (the analytic Gaussian mechanism, Balle & Wang 2018, Thm. 8), the one
    exact-Gaussian ε of the package: the certified ε of a history without sampling
    (:func:`pld_epsilon`) and, with ``noise_multiplier = 1/μ``, ε of μ-GDP (Dong, Roth & Su),
    the audit's estimate (:func:`~pl_privfed.privacy.audit.gaussian_estimate`).

    dp-accounting's ``get_epsilon_gaussian`` (a root of its δ(ε) to 1e-12), rounded up so that
    the ε returned always has ``δ(ε) ≤ delta`` by dp-accounting's ``GaussianPrivacyLoss``; 0
    where dp-accounting's δ(0) is already at most ``delta`` (no root is searched), ``inf`` at
    ``noise_multiplier = 0``."""
    epsilon = float(gaussian_mechanism.get_epsilon_gaussian(float(noise_multiplier), delta))
    if not math.isfinite(epsilon):
        return math.inf
    if epsilon == 0.0:
        return 0.0
    loss = GaussianPrivacyLoss(float(noise_multiplier), sensitivity=1.0)
    while float(loss.get_delta_for_epsilon(epsilon)) > delta:  # to the last digit, safe side
        epsilon = math.nextafter(epsilon, math.inf) + 1e-12 * epsilon
    return epsilon


def _composed_epsilon(history: Iterable[tuple[ReleaseKey, int]], delta: float, interval: float):
    total = None
    for key, steps in history:
        part = composed_pld(key, steps, interval)
        total = part if total is None else total.compose(part)
    return float(total.get_epsilon_for_delta(delta))
