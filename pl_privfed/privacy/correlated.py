"""Correlated noise across rounds: the matrix factorization mechanism as a noise placement.

A trusted aggregator adds to round ``t``'s sum of clipped client updates ``(C^{-1} Z)_t`` instead
of an independent draw, the rows of ``Z`` iid ``N(0, σ² I)`` drawn from the keyed stream
``(noise seed, STREAM_CORRELATED_NOISE, row)`` (:mod:`pl_privfed.rng`). The models a run
releases are then ``x_{t+1} = x_0 − (η/B) Σ_{s≤t} (G_s + (C^{-1}Z)_s)``: the noisy prefix sums
``A (G + C^{-1} Z) = A C^{-1} (C G + Z)``, post-processing of one Gaussian mechanism on ``C G``
(DP-FTRL, Kairouz et al. 2021; the MF mechanism, Denisov et al. 2022, Choquette-Choo et al.
2023; :mod:`pl_privfed.privacy.factorization`). The strategy ``C`` is the placement's:
:class:`BandedMFNoise` (a banded ``C``, Toeplitz or general, optimized for the run's horizon) or
:class:`TreeNoise` (DP-FTRL's binary tree with restarts).

Accounting (against whoever sees the released models; the aggregator is trusted, as for
central noise). The participation schema must need no secret sampling: cyclic cohorts
(:class:`~pl_privfed.sampling.CyclicSampler`: ``b`` fixed groups, group ``t mod b`` trains at
round ``t``; public, so nothing is amplified) or every client every round. The release up to
round ``t`` is one Gaussian mechanism on the first ``t + 1`` rows of ``C G`` with noise std
``σ`` and sensitivity ``Φ_rel · s_t`` (``Φ_rel`` the message bound under the relation: ``Φ``
add/remove, ``2Φ`` replace-one; ``s_t`` the factorization's exact prefix sensitivity over the
schema's patterns, :func:`~pl_privfed.privacy.factorization.cyclic_prefix_sensitivities`), so
round ``t`` is charged as a Gaussian release of noise multiplier ``σ / (Φ_rel √(s_t² −
s_{t−1}²))``: Gaussian releases compose by adding their ``1/multiplier²``, so after round ``t``
the accountant holds exactly the Gaussian mechanism of multiplier ``σ / (Φ_rel s_t)``, and after
the run the whole training's (dp-accounting's analytic Gaussian ε; the tests compare it with
``GaussianDpEvent`` and, for the tree restarted every epoch, with
``SingleEpochTreeAggregationDpEvent``).

Distributed shares are refused (``min_contributors`` with a correlated placement: one
``ValueError``). Under secure aggregation the server sees each round's sum and nothing else, so
its view is private only if those sums are post-processing of ``C G + Z``. Shares of ``Z_t``
added to round ``t``'s updates give the server ``G_t + Z_t``, and the recursion ``C^{-1}`` does
not turn that into ``G_t + (C^{-1} Z)_t`` (it would also transform ``G``). Shares of
``(C^{-1} Z)_t`` need noise correlated across rounds, that is across the disjoint cohorts of
cyclic participation: a secret the clients share and the server lacks (one colluding client
then reveals every round's noise). The third way, each round's secure sum being ``(C G)_t +
Z_t``, needs every client to send ``C[t, j]``-scaled copies of its round-``j`` update in the
``bands − 1`` rounds after ``j`` (sums over several cohorts): not what a round is here.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from torch import Tensor, nn

from pl_privfed.privacy.factorization import (
    Banded,
    BandedToeplitz,
    Factorization,
    TreeAggregation,
    cyclic_prefix_sensitivities,
)
from pl_privfed.privacy.mechanism import Mechanism
from pl_privfed.privacy.placement import CentralNoise, NoisePlacement, register_placement
from pl_privfed.rng import STREAM_CORRELATED_NOISE, KeyedGenerator

if TYPE_CHECKING:
    from pl_privfed.privacy.noise import DPNoise
    from pl_privfed.privacy.release import Release

__all__ = [
    "BandedMFNoise",
    "CorrelatedNoise",
    "CorrelatedNoiseProcess",
    "TreeNoise",
    "prefix_sensitivities",
]

#: a round's squared-sensitivity increment is rounded *up* to this absolute precision, so the
#: rounds of a periodic schema share one release key (the overcharge is at most this per round)
INCREMENT_PRECISION = 1e-12


@functools.lru_cache(maxsize=256)
def prefix_sensitivities(
    strategy: Factorization, horizon: int, groups: int, rounds: int
) -> tuple[tuple[float, ...], bool]:
    """``(s², exact)``: the squared prefix sensitivities ``s_t²`` (``t < rounds``) of
    ``strategy`` at ``horizon`` for cyclic cohorts of ``groups`` groups (1: every client every
    round), per unit message bound; cached."""
    c_matrix = strategy.matrix(rounds, horizon)
    s2, exact = cyclic_prefix_sensitivities(c_matrix, groups)
    return tuple(float(v) for v in s2), exact


class CorrelatedNoise(CentralNoise):
    """Central noise correlated across rounds by a factorization ``C`` (module docstring);
    a subclass names the strategy (:meth:`strategy`)."""

    name: ClassVar[str] = ""

    @classmethod
    def from_settings(cls, min_contributors: int | None = None) -> NoisePlacement:
        if min_contributors is not None:  # distributed shares (module docstring)
            raise ValueError(
                f"min_contributors={min_contributors!r}: placement={cls.name!r} is central "
                "(a trusted aggregator draws Z); distributed shares of correlated noise are "
                "not supported (see docs/correlated_noise.md)"
            )
        return cls()

    def strategy(self) -> Factorization:
        """The factorization ``C``."""
        raise NotImplementedError

    # ------------------------------------------------------------------ the engine's
    def noise_process(self, dim: int, horizon: int, device: torch.device | str) -> nn.Module:
        """The stateful draw of the rounds' noise (:class:`CorrelatedNoiseProcess`)."""
        return CorrelatedNoiseProcess(self.strategy(), horizon, dim, device)

    # ------------------------------------------------------------------ the accounting's
    @property
    def round_dependent(self) -> bool:
        return True

    def check(self, release: Release) -> None:
        if release.cohort not in ("all", "cyclic"):
            raise ValueError(
                f"noise.placement={self.name!r} needs a participation schema without secret "
                f"sampling (sampler: CyclicSampler, or every client every round), got a "
                f"{release.cohort!r} cohort: amplification by sampling is not analysed for "
                "correlated noise here"
            )

    def mechanisms(
        self,
        release: Release,
        noise: DPNoise,
        noise_std: float,
        sensitivity: float,
        round_index: int,
        label: str,
    ) -> list[Mechanism]:
        """Round ``round_index``'s Gaussian release: multiplier ``σ / (sensitivity ·
        √(s_t² − s_{t−1}²))`` (module docstring); none where the prefix sensitivity does not
        grow."""
        horizon = noise.rounds
        if horizon is None:  # an algorithm's setup sets it to the run's rounds
            raise ValueError(
                f"noise.placement={self.name!r} needs noise.rounds (the horizon n its "
                "factorization C is built for), got None"
            )
        groups = release.separation if release.cohort == "cyclic" else 1
        rounds = horizon * math.ceil((round_index + 1) / horizon)
        s2, _ = prefix_sensitivities(self.strategy(), int(horizon), int(groups), rounds)
        before = s2[round_index - 1] if round_index > 0 else 0.0
        increment = s2[round_index] - before
        if increment <= INCREMENT_PRECISION:
            return []
        increment = math.ceil(increment / INCREMENT_PRECISION) * INCREMENT_PRECISION
        multiplier = noise_std / (sensitivity * math.sqrt(increment))
        return [Mechanism(multiplier, 1.0, label, sampling="none")]

    def models_note(self) -> str:
        return (
            f"; correlated noise ({self.strategy().describe()}): the run is one Gaussian "
            "mechanism on C·G, charged round by round with the exact prefix sensitivity of C "
            "over the participation schema"
        )

    def phrase(self) -> str:
        return (
            "correlated central noise (a trusted aggregator adds (C^-1 Z)_t to round t's sum; "
            f"{self.strategy().describe()})"
        )

    def record(self) -> dict[str, object]:
        return {**super().record(), "strategy": self.strategy().describe()}


@register_placement
@dataclass(frozen=True)
class BandedMFNoise(CorrelatedNoise):
    """Banded matrix factorization noise (Choquette-Choo et al. 2023): a ``bands``-banded
    lower-triangular ``C`` with unit columns, optimized for the prefix sums of the run's
    horizon ``noise.rounds``: Toeplitz (McKenna et al. 2024's banded Toeplitz, the default) or,
    with ``toeplitz: false``, the paper's general banded ``C`` (every entry of the band free;
    :class:`~pl_privfed.privacy.factorization.Banded`). With cyclic cohorts of ``b ≥ bands``
    groups a client's columns never overlap, and the sensitivity over the run is ``√k`` for
    ``k`` participations (the paper's Theorem 2). ``bands: 1`` is independent central noise.

    Args:
        bands: ``b̂``, the nonzero diagonals of ``C``.
        toeplitz: whether ``C`` is Toeplitz (one coefficient per diagonal) or general banded.
    """

    name: ClassVar[str] = "banded_mf"
    bands: int = 1
    toeplitz: bool = True

    def __post_init__(self) -> None:
        BandedToeplitz(self.bands)  # ValueError naming bands
        if not isinstance(self.toeplitz, bool):
            raise ValueError(f"toeplitz must be true or false, got {self.toeplitz!r}")

    def strategy(self) -> Factorization:
        return BandedToeplitz(self.bands) if self.toeplitz else Banded(self.bands)


@register_placement
@dataclass(frozen=True)
class TreeNoise(CorrelatedNoise):
    """DP-FTRL's tree aggregation noise (Kairouz et al. 2021, plain tree estimator), restarted
    every ``restart`` rounds (``None``: never).

    Args:
        restart: the rounds of one tree (e.g. the number of cyclic groups: one tree per epoch,
            every client once per tree), or ``None``.
    """

    name: ClassVar[str] = "tree_aggregation"
    restart: int | None = None

    def __post_init__(self) -> None:
        TreeAggregation(self.restart)  # ValueError naming restart

    def strategy(self) -> Factorization:
        return TreeAggregation(self.restart)


class CorrelatedNoiseProcess(nn.Module):
    """The noise ``(C^{-1} Z)_t`` of successive rounds, with its state as buffers (so the
    algorithm's ``state_dict`` and a Lightning checkpoint carry it): ``recent``, the last
    noise rows the strategy's recursion needs (float64), and ``next_round``. A round asked out
    of order (a process that never saw the earlier rounds) is caught up from round 0: every
    row of ``Z`` is keyed, so the result is the same.

    Args:
        strategy: the factorization ``C``.
        horizon: ``n``, the rounds ``C`` is built for.
        dim: ``d``.
        device: where the noise is drawn.
    """

    def __init__(
        self, strategy: Factorization, horizon: int, dim: int, device: torch.device | str = "cpu"
    ) -> None:
        super().__init__()
        self.strategy, self.horizon = strategy, int(horizon)
        memory = strategy.memory(self.horizon)
        self.register_buffer("recent", torch.zeros(memory, dim, dtype=torch.float64, device=device))
        self.register_buffer("next_round", torch.tensor(0, dtype=torch.int64))

    def draw(
        self,
        round_index: int,
        std: float,
        seed: int,
        keyed: KeyedGenerator,
        like: Tensor,
        checks: Any = None,
    ) -> Tensor:
        """Round ``round_index``'s noise ``(C^{-1} Z)_t`` (rows of ``Z`` ~ ``N(0, std² I)``),
        shaped and typed like ``like``. ``checks``: the run's privacy invariants (check mode),
        told of the round's fresh row ``z_t`` (the rows drawn again are not fresh)."""
        if int(self.next_round) != round_index:
            self.recent.zero_()
            for t in range(round_index):
                self._advance(t, std, seed, keyed)
        return self._advance(round_index, std, seed, keyed, checks).to(like.dtype)

    def _advance(
        self, t: int, std: float, seed: int, keyed: KeyedGenerator, checks: Any = None
    ) -> Tensor:
        def z(row: int) -> Tensor:
            out = torch.empty(self.recent.shape[1], dtype=torch.float64, device=self.recent.device)
            out.normal_(0.0, std, generator=keyed(seed, STREAM_CORRELATED_NOISE, row))
            if checks is not None and row == t:  # the round's fresh row z_t
                checks.drew(t, "correlated", keyed, std, release="the aggregator's sum")
            return out

        w = self.strategy.round_noise(t, z, self.recent, self.horizon)
        if self.recent.shape[0]:
            self.recent.copy_(torch.cat([w.unsqueeze(0), self.recent[:-1]]))
        self.next_round.fill_(t + 1)
        return w
