"""Privacy accounting: a thin layer over maintained accountants (Opacus and dp-accounting).

No privacy mathematics lives here: every ε comes from :mod:`opacus.accountants` (RDP, or PRV)
for Gaussian releases without subsampling or with Poisson subsampling, from Google's
``dp_accounting`` RDP accountant (``SampledWithoutReplacementDpEvent``, Wang, Balle &
Kasiviswanathan 2019, Thm. 27) for the RDP bound on releases on a fixed-size sample drawn
without replacement, which Opacus does not analyse, and from ``dp_accounting``'s privacy loss
distributions (:mod:`pl_privfed.privacy.pld`: the tight dominating pairs, Zhu, Dong & Wang 2022
for sampling without replacement) for the PLD accountant.

Which accountant (``accountant:``, :data:`AccountantName`): ``"auto"`` (the default) and
``"pld"`` are the PLD accountant for every history: releases sampled without replacement, where
the RDP bound is loose by a factor of two or more (ε = 7.995 by RDP is 3.8 by PLD for the
record-level MNIST configurations' noise), and Poisson-sampled or unsampled releases, where PLD
is 7–9 % tighter than RDP at the same noise (a calibration to the same ε needs that much less
noise). ``"rdp"`` and ``"prv"`` as before (RDP for releases sampled without replacement); the
configurations whose published numbers were measured under the RDP calibration name
``accountant: rdp``. Wherever the ε is not RDP's, the RDP bound is reported beside it
(:meth:`PrivacyAccountant.get_epsilon_rdp`, ``epsilon_rdp`` in ``summary.json``). Opacus stays
the RDP library because it is PyTorch-native (the same library users reach for to privatize a
plain Lightning module with per-example clipping), its accountants expose the small
``step(noise_multiplier=, sample_rate=)`` / ``get_epsilon(delta)`` interface this package needs,
and their state is a plain history list that checkpoints cleanly (the PLD accountant composes
the same history).

Each call to :meth:`PrivacyAccountant.step` records one adaptive composition of a Gaussian
mechanism with the given noise multiplier (noise std / sensitivity), sampled as stated.
"""

from __future__ import annotations

import functools
from typing import Literal

import dp_accounting
import numpy as np
from dp_accounting.rdp import RdpAccountant
from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

from pl_privfed.checks import check_choice
from pl_privfed.privacy.mechanism import Mechanism, ReleaseKey, Sampling
from pl_privfed.privacy.pld import pld_epsilon

#: one-step RDP curves kept per library (a release's curve, shared by every accountant of the
#: process), least recently used first out
RDP_CURVE_CACHE_SIZE = 4096

__all__ = ["ACCOUNTANTS", "AccountantName", "PrivacyAccountant"]

AccountantName = Literal["auto", "rdp", "prv", "pld"]
#: the accountants a run may name
ACCOUNTANTS = ("auto", "rdp", "prv", "pld")

#: Opacus's default absolute error of the PRV accountant's ε
PRV_EPS_ERROR = 0.01
#: above this ε the PRV accountant's ε is computed to a relative error instead
PRV_EXACT_UP_TO = 50.0
#: that relative error
PRV_RELATIVE_ERROR = 0.005


class PrivacyAccountant:
    """Tracks the Gaussian mechanisms a run applied and reports ε for a given δ.

    Args:
        mechanism: ``"auto"`` (default: ``"pld"``), ``"pld"`` (dp-accounting's privacy loss
            distributions with the tight dominating pairs, :mod:`pl_privfed.privacy.pld`),
            ``"rdp"`` (Rényi DP, Mironov 2017; Opacus ``RDPAccountant``) or ``"prv"`` (privacy
            random variables, Gopi et al. 2021; Opacus ``PRVAccountant``). With ``"rdp"`` or
            ``"prv"`` a history with releases on a sample drawn without replacement is composed
            by dp-accounting's RDP accountant under the replace-one relation (Opacus does not
            analyse them; :attr:`library` names the one used). Such releases cannot be mixed
            with Poisson-subsampled ones (no library composes the two under one neighbouring
            relation).

    >>> acc = PrivacyAccountant()
    >>> acc.step(noise_multiplier=1.0, sample_rate=1.0, num_steps=10)
    >>> round(acc.get_epsilon(1e-5), 2) > 0
    True
    """

    def __init__(self, mechanism: AccountantName = "auto") -> None:
        check_choice("accountant", mechanism, ACCOUNTANTS)
        self.mechanism = mechanism
        # Opacus keeps the history of releases without sampling or Poisson-sampled (its RDP
        # accountant's, whichever ε is computed from it)
        from opacus.accountants import create_accountant  # loaded when a run accounts

        self._accountant = create_accountant("prv" if mechanism == "prv" else "rdp")
        # releases on samples drawn without replacement: [noise_multiplier, b, m, steps]
        self._without_replacement: list[list] = []

    def step(
        self,
        *,
        noise_multiplier: float,
        sample_rate: float,
        num_steps: int = 1,
        sampling: Sampling = "poisson",
        population: int | None = None,
    ) -> None:
        """Record ``num_steps`` applications of a Gaussian mechanism.

        Args:
            noise_multiplier: noise std / sensitivity.
            sample_rate: probability that the unit is in the release (1: no sampling).
            num_steps: how many such releases.
            sampling: ``"poisson"`` (or ``"none"`` at rate 1) or ``"without_replacement"``.
            population: ``m`` for sampling without replacement (sample size ``rate · m``).
        """
        mech = Mechanism(
            float(noise_multiplier), float(sample_rate), sampling=sampling, population=population
        )
        self.check(mech)
        if not mech.amplified or mech.sampling == "poisson":
            for _ in range(num_steps):
                self._accountant.step(
                    noise_multiplier=mech.noise_multiplier, sample_rate=mech.sample_rate
                )
            return
        entry = [mech.noise_multiplier, mech.sample_size, mech.population]
        history = self._without_replacement
        if history and history[-1][:3] == entry:
            history[-1][3] += num_steps
        else:
            history.append([*entry, num_steps])

    def step_mechanism(self, mechanism: Mechanism, num_steps: int = 1) -> None:
        """Record ``num_steps`` applications of ``mechanism``."""
        self.step(
            noise_multiplier=mechanism.noise_multiplier,
            sample_rate=mechanism.sample_rate,
            num_steps=num_steps,
            sampling=mechanism.sampling,
            population=mechanism.population,
        )

    def check(self, mechanism: Mechanism) -> None:
        """Raise ``ValueError`` if this accountant cannot compose ``mechanism`` with its history."""
        if not mechanism.amplified:
            return
        if mechanism.sampling == "without_replacement":
            if any(q < 1 for _, q, _ in self._accountant.history):
                raise ValueError(
                    "cannot compose a release sampled without replacement (replace-one) with "
                    "the Poisson-subsampled releases already recorded (add/remove)"
                )
        elif self._without_replacement:
            raise ValueError(
                "cannot compose a Poisson-subsampled release (add/remove) with the releases "
                "sampled without replacement already recorded (replace-one)"
            )

    @property
    def steps(self) -> int:
        """Number of mechanism applications recorded so far."""
        opacus = sum(int(s) for _, _, s in self._accountant.history)
        return opacus + sum(int(e[3]) for e in self._without_replacement)

    @property
    def method(self) -> str:
        """The accountant that computes :meth:`get_epsilon` for the recorded history:
        ``"pld"``, ``"rdp"`` or ``"prv"`` (``"auto"`` resolved)."""
        if self.mechanism in ("pld", "auto"):
            return "pld"
        if self.mechanism == "prv" and not self._without_replacement:
            return "prv"
        return "rdp"

    @property
    def library(self) -> str:
        """The library and accountant that computes ε for the recorded history."""
        method = self.method
        if method == "pld":
            if self._without_replacement:
                return (
                    "dp-accounting PLD (sampling without replacement, replace-one: the "
                    "Zhu-Dong-Wang dominating pair)"
                )
            return "dp-accounting PLD"
        if self._without_replacement:
            return "dp-accounting RDP (sampling without replacement, replace-one)"
        return f"Opacus {method.upper()}"

    def get_epsilon(self, delta: float) -> float:
        """ε certified by the accountant for the recorded history at this δ (0 if empty)."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        method = self.method
        if method == "pld":
            return self._pld_epsilon(delta)
        if method == "rdp" or self._without_replacement:
            return self.get_epsilon_rdp(delta)
        if not self._accountant.history:
            return 0.0
        return self._prv_epsilon(delta)

    def get_epsilon_rdp(self, delta: float) -> float:
        """The RDP bound on ε for the recorded history (what ``accountant: rdp`` reports;
        ``summary.json`` shows it beside a PLD or PRV ε): Opacus RDP, or dp-accounting's RDP
        (replace-one) for a history with releases sampled without replacement."""
        if not 0 < delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if self._without_replacement:
            return self._dp_accounting_epsilon(delta)
        if not self._accountant.history:
            return 0.0
        return self._rdp_epsilon(delta)

    def get_epsilon_upper(self, delta: float) -> float:
        """A cheaper upper bound on :meth:`get_epsilon`: for the PLD accountant its ε at a
        coarse discretization (pessimistic, so never below the fine one), otherwise the ε
        itself. Calibration brackets the noise with it."""
        if self.method == "pld":
            return self._pld_epsilon(delta, coarse_only=True)
        return self.get_epsilon(delta)

    def _pld_epsilon(self, delta: float, coarse_only: bool = False) -> float:
        """dp-accounting's PLD ε for the recorded history (:mod:`pl_privfed.privacy.pld`)."""
        if not self.steps:
            return 0.0
        return pld_epsilon(self.releases().items(), delta, coarse_only=coarse_only)

    def _dp_accounting_epsilon(self, delta: float) -> float:
        """dp-accounting's RDP ε (replace-one) for a history with releases sampled without
        replacement (and, possibly, releases without sampling). Each distinct release's RDP
        curve is computed once (by composing that one event into a fresh
        ``dp_accounting.rdp.RdpAccountant``) and the curves are summed, as RDP composes."""
        total = None
        curves = [
            (_replace_one_curve(sigma), steps) for sigma, _, steps in self._accountant.history
        ]
        curves += [
            (_replace_one_curve(sigma, int(size), int(population)), steps)
            for sigma, size, population, steps in self._without_replacement
        ]
        for curve, steps in curves:
            total = int(steps) * curve if total is None else total + int(steps) * curve
        orders = RdpAccountant().orders  # the orders every curve above was computed at
        return float(compute_epsilon(orders, total, delta)[0])

    def _prv_epsilon(self, delta: float) -> float:
        """Opacus's PRV upper bound on ε: with Opacus's default absolute error (0.01) up to
        ``ε = PRV_EXACT_UP_TO``, above that to ``PRV_RELATIVE_ERROR`` of ε.

        Opacus discretizes the privacy loss on a mesh as fine as its absolute ``eps_error``
        over a domain as wide as the loss, so where ε is in the hundreds (tiny noise
        multipliers, or tens of thousands of releases) one call took minutes and many GiB:
        paper 001's MNIST run at a target ε of 0.1 (noise multiplier 0.069, sampling rate
        1/6000) needed 174 s and 7.8 GB at 400 steps and was killed for memory before its
        1,000th; 50,700 releases at noise multiplier 1 asked for a 30 GiB array. A first pass at
        ``eps_error = 1`` gives ε's scale cheaply (itself a valid upper bound). Below the
        threshold every ε, and so the noise :func:`~pl_privfed.privacy.calibrate_noise_std`
        solves for, is Opacus's own.
        """
        coarse = float(self._accountant.get_epsilon(delta=delta, eps_error=1.0))
        eps_error = PRV_EPS_ERROR
        if coarse > PRV_EXACT_UP_TO:
            eps_error = PRV_RELATIVE_ERROR * coarse
            if eps_error >= 1.0:
                return coarse
        return float(self._accountant.get_epsilon(delta=delta, eps_error=eps_error))

    def _rdp_epsilon(self, delta: float) -> float:
        """What Opacus's ``RDPAccountant.get_epsilon`` computes, with each ``(σ, q)``'s one-step
        RDP curve computed once per run instead of at every call.

        Opacus sums ``compute_rdp(q, σ, steps, orders)`` over its history, and that function is
        ``steps`` times the one-step curve (RDP composes additively); for ``q < 1`` one curve
        costs ~0.1 s, which made a per-round ε dominate short runs with client sampling.
        """
        from opacus.accountants import RDPAccountant
        from opacus.accountants.analysis import rdp as rdp_analysis

        orders = RDPAccountant.DEFAULT_ALPHAS
        rdp = np.zeros(len(orders))
        for noise_multiplier, sample_rate, steps in self._accountant.history:
            rdp = rdp + steps * _opacus_curve(float(noise_multiplier), float(sample_rate))
        eps, _ = rdp_analysis.get_privacy_spent(orders=orders, rdp=rdp, delta=delta)
        return float(eps)

    def releases(self) -> dict[ReleaseKey, int]:
        """How many times each distinct release was applied, by its key
        (:meth:`~pl_privfed.privacy.Mechanism.key`), in the order first recorded: the releases
        without sampling or Poisson-sampled, then those sampled without replacement."""
        counts: dict[ReleaseKey, int] = {}
        for sigma, rate, steps in self._accountant.history:
            sampling = "poisson" if rate < 1 else "none"
            key = Mechanism(float(sigma), float(rate), sampling=sampling).key()
            counts[key] = counts.get(key, 0) + int(steps)
        for sigma, size, population, steps in self._without_replacement:
            m = int(population)
            mech = Mechanism(
                float(sigma), int(size) / m, sampling="without_replacement", population=m
            )
            counts[mech.key()] = counts.get(mech.key(), 0) + int(steps)
        return counts

    def history(self) -> list[dict]:
        """The recorded releases as plain records, one per distinct release (``summary.json``
        keeps them so that a report can compose runs again: the cost of selecting among
        them, :mod:`pl_privfed.privacy.selection`): the fields of its
        :class:`~pl_privfed.privacy.mechanism.ReleaseKey` (``noise_multiplier``,
        ``sample_rate``, ``sampling``, ``population``: ``None`` unless sampled without
        replacement) and ``releases`` (how many times it was applied)."""
        return [{**key.as_dict(), "releases": n} for key, n in self.releases().items()]

    def state_dict(self) -> dict:
        state = dict(self._accountant.state_dict())
        state["without_replacement"] = [list(e) for e in self._without_replacement]
        return state

    def load_state_dict(self, state: dict) -> None:
        state = dict(state)
        self._without_replacement = [list(e) for e in state.pop("without_replacement", [])]
        self._accountant.load_state_dict(state)


@functools.lru_cache(maxsize=RDP_CURVE_CACHE_SIZE)
def _opacus_curve(noise_multiplier: float, sample_rate: float) -> np.ndarray:
    """Opacus's one-step RDP curve of a Gaussian release (Poisson-subsampled at
    ``sample_rate``) at ``RDPAccountant.DEFAULT_ALPHAS`` (read-only: it is shared)."""
    from opacus.accountants import RDPAccountant
    from opacus.accountants.analysis import rdp as rdp_analysis

    curve = np.asarray(
        rdp_analysis.compute_rdp(
            q=sample_rate,
            noise_multiplier=noise_multiplier,
            steps=1,
            orders=RDPAccountant.DEFAULT_ALPHAS,
        ),
        dtype=np.float64,
    )
    curve.setflags(write=False)
    return curve


@functools.lru_cache(maxsize=RDP_CURVE_CACHE_SIZE)
def _replace_one_curve(
    noise_multiplier: float, size: int | None = None, population: int | None = None
) -> np.ndarray:
    """dp-accounting's one-step RDP curve (replace-one, its default orders) of a Gaussian
    release, sampled without replacement of ``size`` of ``population`` where given
    (read-only: it is shared)."""
    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    if size is not None:
        event = dp_accounting.SampledWithoutReplacementDpEvent(population, size, event)
    one = RdpAccountant(neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE)
    one.compose(event)
    curve = np.asarray(one.rdp, dtype=np.float64)
    curve.setflags(write=False)
    return curve
