"""Gaussian-noise settings shared by the private algorithms."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from pl_privfed.checks import check_choice
from pl_privfed.privacy.accounting import ACCOUNTANTS, AccountantName
from pl_privfed.privacy.calibration import paper_noise_std
from pl_privfed.privacy.placement import NoisePlacement, PlacementName, resolve_placement
from pl_privfed.privacy.selection import repetition_shape

__all__ = [
    "Calibration",
    "DPNoise",
    "Draws",
    "Neighbouring",
    "Placement",
    "paper_noise_std",
    "relation_factor",
]

Calibration = Literal["paper", "target", "random_search"]
Neighbouring = Literal["add_remove", "replace_one"]
Draws = Literal["aggregate", "per_client"]
#: The names of the built-in noise placements (:mod:`pl_privfed.privacy.placement`).
Placement = PlacementName


def relation_factor(relation: Neighbouring) -> float:
    """Sensitivity / bound of a noised vector of norm at most the bound, under ``relation``:
    1 under add/remove (the vector is present or absent), 2 under replace-one (a clipped or
    normalized vector can be replaced by its opposite)."""
    check_choice("neighbouring", relation, ("add_remove", "replace_one"))
    return 2.0 if relation == "replace_one" else 1.0


@dataclass
class DPNoise:
    """Gaussian DP noise settings.

    Give either ``epsilon`` (calibrated) or ``noise_multiplier`` (noise std = noise_multiplier ×
    sensitivity, the sensitivity under the relation of the reported ε).

    Attributes:
        epsilon: target ε.
        delta: δ of the calibration and of the reported ε.
        noise_multiplier: direct mode: noise std divided by the sensitivity.
        calibration: with ``epsilon``: ``"paper"`` — the papers' formula
            ``σ = c · p · Φ · sqrt(K log(1/δ))/ε`` (:func:`paper_noise_std`; the accountant's ε is
            reported beside the target and may differ); ``"target"`` — the noise that makes the
            accountant certify ``epsilon`` for the run's K rounds under the defensible accounting
            (the relation below, amplification only where it holds; docs/privacy.md);
            ``"random_search"`` — ``epsilon`` is the *total* ε of a hyperparameter search that
            trains a random number ``K`` of such runs (``K`` drawn with mean ``search_mean``
            from ``search_distribution``, each candidate drawn at random from a grid) and
            releases only the best (Papernot & Steinke, ICLR 2022, Thm. 2 and 6): the noise is
            the one at which dp-accounting's ``RepeatAndSelectDpEvent`` over this run's
            releases certifies ``epsilon`` (an RDP bound,
            :func:`~pl_privfed.privacy.selection.random_search_noise_std`). The run's own ε is
            reported as always, and is smaller.
        constant: the constant ``c`` of the paper calibration (default 1).
        rounds: ``K`` of the calibration; ``None`` → the run's number of rounds. Fixed when a
            run starts and kept in its checkpoints.
        neighbouring: the relation of the reported ε. ``None`` (default): the privacy model's —
            ``"replace_one"`` for local DP (a client or agent noises what it sends: changing its
            data can move the message anywhere in the ball, sensitivity 2Φ) and
            ``"add_remove"`` for central DP with a trusted server (sensitivity Φ). Give
            ``"add_remove"`` or ``"replace_one"`` to override.
        seed: seed of the noise streams: client ``i``'s noise in round ``k`` is drawn from the
            stream keyed by ``(seed, k, i)`` (:mod:`pl_privfed.rng`).
        accountant: the accountant of the calibration and the reported ε: ``"auto"``
            (default) or ``"pld"`` — dp-accounting's PLD for every release: the tight
            dominating pair (Zhu, Dong & Wang 2022) where releases are sampled without
            replacement (record-level minibatches, a fixed-size cohort against whoever sees the
            models), where RDP is loose by a factor of two; the Poisson-subsampled Gaussian
            (add/remove) and the exact Gaussian ε elsewhere, 7–9 % below RDP at the same noise
            (so 5–6 % less noise for the same ε); ``"rdp"`` or ``"prv"`` (Opacus; RDP for
            sampling without replacement), which the paper configurations measured under RDP
            pin. The RDP bound is reported beside any other (``epsilon_rdp`` in
            ``summary.json``).
        draws: how the simulation draws the clients' noise when an algorithm uses it only
            through the sum the server receives (the error-feedback family, DP-SGD, DP-FedAvg,
            Fed-α-NormEC, per-update clipping): ``"aggregate"`` draws that sum
            ``Σ_i z_i ~ N(0, m σ² I)`` once per round (``d`` normals instead of ``m·d``; every
            iterate has the same distribution), ``"per_client"`` draws each client's ``z_i``
            from its own stream and adds it to its message. Algorithms whose clients use their
            own noise (per-sample clipping's local steps, PORTER-DP, SoteriaFL) always draw
            per client. The privacy guarantee is the same either way: it is a property of the
            mechanism, not of how the simulation samples it.
        placement: where the noise is added (server-based client-level algorithms; the
            record-level ones are always ``local``): a registered name or a
            :class:`~pl_privfed.privacy.NoisePlacement` (``class_path`` in YAML);
            :attr:`where` is the placement object either way:

            * ``"local"``: each client adds ``z_i ~ N(0, σ² I)`` to its message before sending;
              the server, which sees every message and its sender, is the adversary.
            * ``"central"``: clients send clean messages and a trusted aggregator adds one
              ``z ~ N(0, σ² I)`` to their *sum* (σ is the noise of the sum, sensitivity Φ); the
              adversary is whoever sees the released models. With a Poisson cohort the server
              divides by the expected cohort size (fixed denominator).
            * ``"distributed"``: every participant adds ``N(0, σ²/t)`` (``t =
              min_contributors``) and the server learns only the sum (secure aggregation), which
              holds at least ``σ²`` of noise whenever at least ``t`` clients take part; a round
              with fewer senders is aborted: nothing is released, and the server's step uses only
              what earlier rounds released (with a momentum or memory the model can still move).
              No ε charges the abort pattern, so a run with a Poisson cohort that may abort any
              of its rounds with probability above
              :data:`~pl_privfed.privacy.placement.MAX_ABORT_PROBABILITY` is refused before
              training (:class:`~pl_privfed.privacy.DistributedNoise`, whose ``allow_aborts``
              runs it anyway, uncertified against whoever sees the models).
        search_mean: with ``calibration: random_search``, the mean number of candidates of the
            search (``>= 1``; e.g. the size of the grid the candidates are drawn from).
        search_distribution: with ``calibration: random_search``, the distribution of the
            number of candidates: ``"poisson"`` (default), ``"geometric"``, ``"logarithmic"``
            or a truncated negative binomial's shape ``η >= 0``
            (:func:`~pl_privfed.privacy.selection.repetition_shape`).
        min_contributors: ``t`` of distributed noise: the fewest participants a round may have
            (the noise the accounting relies on; never the noise that was hoped for). With
            ``placement: distributed``; a ``DistributedNoise`` placement carries its own ``t``
            (this one may repeat it, not contradict it).
    """

    epsilon: float | None = None
    delta: float = 1e-5
    noise_multiplier: float | None = None
    calibration: Calibration = "paper"
    constant: float = 1.0
    rounds: int | None = None
    neighbouring: Neighbouring | None = None
    seed: int = 0
    accountant: AccountantName = "auto"
    draws: Draws = "aggregate"
    placement: str | NoisePlacement = "local"
    min_contributors: int | None = None
    search_mean: float | None = None
    search_distribution: str | float = "poisson"

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
        check_choice("calibration", self.calibration, ("paper", "target", "random_search"))
        self._check_search()
        if not self.constant > 0:
            raise ValueError(f"constant must be positive, got {self.constant!r}")
        if self.rounds is not None and self.rounds < 1:
            raise ValueError(f"rounds must be a positive integer, got {self.rounds!r}")
        if self.neighbouring is not None:
            relation_factor(self.neighbouring)  # raises on an unknown relation
        check_choice("accountant", self.accountant, ACCOUNTANTS)
        check_choice("draws", self.draws, ("aggregate", "per_client"))
        t = self.min_contributors
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ValueError(f"min_contributors must be a positive integer, got {t!r}")
        self.where  # noqa: B018 (raises on an unknown placement or a t it does not take)

    def _check_search(self) -> None:
        """``ValueError`` for random-search settings that do not fit the calibration."""
        mean = self.search_mean
        if self.calibration != "random_search":
            if mean is not None:
                raise ValueError(
                    f"search_mean={mean!r} needs calibration: random_search, got "
                    f"calibration={self.calibration!r}"
                )
            return
        if self.epsilon is None:
            raise ValueError(
                "calibration: random_search needs epsilon (the total ε of the search), got "
                f"noise_multiplier={self.noise_multiplier!r}"
            )
        if isinstance(mean, bool) or not (
            isinstance(mean, (int, float)) and math.isfinite(mean) and mean >= 1
        ):
            raise ValueError(
                "calibration: random_search needs search_mean, the mean number of candidates, "
                f">= 1, got search_mean={mean!r}"
            )
        try:
            repetition_shape(self.search_distribution)
        except ValueError as err:
            raise ValueError(f"search_distribution={self.search_distribution!r}: {err}") from None

    @property
    def where(self) -> NoisePlacement:
        """Where the noise goes: the placement object (:mod:`pl_privfed.privacy.placement`)."""
        return resolve_placement(self.placement, self.min_contributors)
