"""Where the DP noise goes: one small class per noise placement, and the registry of their names.

A placement (docs/privacy.md, "Where the noise goes") owns every answer that depends on who adds
the noise; the message stage (:class:`~pl_privfed.engine.MessageStage`), the accounting
(:mod:`pl_privfed.privacy.plan`) and the ledger ask it, never its name:

* the engine's questions: each sender's noise std (:meth:`NoisePlacement.sender_std`), whether
  a trusted aggregator draws the sum's noise (:attr:`NoisePlacement.aggregator_draws`), and
  whether a round releases nothing (:meth:`NoisePlacement.aborts`);
* the accounting's: the adversaries it reports an ε against (:attr:`NoisePlacement.adversaries`,
  the headline first), what the server sees and the notes on amplification against each
  adversary, whether the ε relies on the noise of the *sum* (which needs a bounded, fixed-
  denominator sum: :attr:`NoisePlacement.noises_sum`), the refusals of its own
  (:meth:`NoisePlacement.check`, and :meth:`NoisePlacement.check_rounds` for those that
  depend on the run's number of rounds), what its ε does not charge
  (:meth:`NoisePlacement.not_charged`) and its sentences in the privacy statement
  (:meth:`NoisePlacement.phrase`, :meth:`NoisePlacement.trusted`).

The three placements: :class:`LocalNoise` (every client noises its own message),
:class:`CentralNoise` (a trusted aggregator noises the sum once) and :class:`DistributedNoise`
(every sender adds a ``1/t`` share of the sum's noise under secure aggregation; a round with
fewer than ``t`` senders is aborted, and a run that may abort a round with probability above
:data:`MAX_ABORT_PROBABILITY` is refused before training). A configuration names one by its registered name
(``placement: central``) or by its class (``placement: {class_path:
pl_privfed.privacy.DistributedNoise, init_args: {min_contributors: 5000}}``).

A new placement is one class here (or in the user's code) and one registration::

    @register_placement
    @dataclass(frozen=True)
    class MyNoise(NoisePlacement):
        name: ClassVar[str] = "mine"
        ...
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import torch
from torch import Tensor

from pl_privfed.checks import check_choice

if TYPE_CHECKING:
    from pl_privfed.privacy.mechanism import Mechanism
    from pl_privfed.privacy.release import Release

__all__ = [
    "ADVERSARIES",
    "MAX_ABORT_PROBABILITY",
    "PLACEMENTS",
    "Adversary",
    "CentralNoise",
    "DistributedNoise",
    "LocalNoise",
    "NoisePlacement",
    "PlacementName",
    "abort_probability",
    "largest_min_contributors",
    "register_placement",
    "resolve_placement",
    "run_abort_probability",
]

#: Who could learn something from a run: ``"server"`` — whoever sees what the clients send
#: (local noise: every noised message and its sender; distributed noise: the noised sum and who
#: took part; for decentralized methods the agent's neighbours); ``"models"`` — whoever sees
#: only the released models (not who took part), against whom a secret cohort amplifies.
Adversary = Literal["server", "models"]
ADVERSARIES: tuple[Adversary, ...] = ("server", "models")

#: The largest probability that a run with distributed noise aborts at least one of its rounds
#: (:meth:`DistributedNoise.check_rounds`). Whether a round aborts depends on the cohort's size,
#: which one client's presence shifts; whoever sees only the models sees the model not move,
#: and the ledger composes nothing for that indicator. With an independent (Poisson) cohort,
#: secret from that adversary, a run whose probability of any abort exceeds this bound is
#: refused before training: below it, the models are those of a run that never aborts except
#: on an event of at most this probability, which is left uncharged (a total-variation argument
#: adds at most ``(1 + e^ε)`` times it to δ: at 1e-12 that is 3e-9 at ε = 8, 0.03 % of
#: δ = 1e-5, and stays below a tenth of δ = 1e-5 for every ε ≤ 13.8). ``allow_aborts`` of
#: :class:`DistributedNoise` lifts it and the run then says loudly what its ε does not charge.
MAX_ABORT_PROBABILITY = 1e-12

#: The names of the built-in placements (what ``placement:`` accepts besides a registered
#: user's name or a ``class_path``).
PlacementName = Literal["local", "central", "distributed"]


class NoisePlacement:
    """Who adds the Gaussian noise, and everything that follows from it (module docstring).

    Subclasses set :attr:`name` and override what differs from local noise; they are small
    frozen dataclasses whose fields are the placement's parameters (``t`` of distributed noise).

    Attributes:
        name: the name a configuration gives (``placement: local``).
        trusted_aggregator: whether a trusted party sees the clean messages (then no ε is
            claimed against the server, and the headline adversary is whoever sees the models).
        noises_sum: whether the noise the accounting counts is the sum's (central, distributed),
            which needs a fixed denominator and a client-level release.
        min_contributors: ``t``, the fewest senders a released round needs, or ``None``.
    """

    name: ClassVar[str] = ""
    trusted_aggregator: ClassVar[bool] = False
    noises_sum: ClassVar[bool] = False
    min_contributors: int | None = None

    @classmethod
    def from_settings(cls, min_contributors: int | None = None) -> NoisePlacement:
        """The placement named in a configuration, with the noise settings' ``t`` (only
        distributed noise takes one)."""
        if min_contributors is not None:
            raise ValueError(
                f"min_contributors={min_contributors!r} is for placement='distributed', got "
                f"placement={cls.name!r}"
            )
        return cls()

    # ------------------------------------------------------------------ the engine's questions
    def sender_std(self, noise_std: float) -> float:
        """The std of one sender's own noise when the run's noise std is ``noise_std``."""
        return noise_std

    @property
    def senders_noise(self) -> bool:
        """Whether each sender adds noise of its own to its message."""
        return not self.aggregator_draws

    @property
    def aggregator_draws(self) -> bool:
        """Whether a trusted aggregator adds one draw of the run's noise std to the sum."""
        return self.trusted_aggregator

    def aborts(self, senders: int) -> bool:
        """Whether a noised round with ``senders`` senders releases nothing."""
        return False

    def unknown_noise(
        self, noise: Tensor, senders: int, share_std: float, generator: torch.Generator
    ) -> Tensor:
        """Of ``noise``, the real senders' part of a released sum's noise (central and
        distributed), what the certificate's adversary cannot subtract: the white-box auditor
        (:class:`~pl_privfed.privacy.audit.WhiteBox`) tests what is left of a release once
        everything that adversary knows is taken out. Here all of it (the trusted
        aggregator's one draw); ``generator`` is the audit's own stream for a split that needs
        randomness (:class:`DistributedNoise`)."""
        return noise

    # ------------------------------------------------------------------ the accounting's
    @property
    def adversaries(self) -> tuple[Adversary, ...]:
        """The adversaries of a client-level run's ε, the headline first."""
        return ("models",) if self.trusted_aggregator else ADVERSARIES

    def server_view(self, observer: str) -> str:
        """What the server (``observer``) sees, in words."""
        return f"{observer}: every noised message and its sender"

    def server_sees(self) -> str:
        """What of the messages the server sees, in a few words."""
        return "every message"

    def server_note(self) -> str:
        """What the ε against the server adds to its basis ("" for nothing)."""
        return ""

    def models_note(self) -> str:
        """What the ε against whoever sees the models adds to its amplification ("")."""
        return ""

    def phrase(self) -> str:
        """Where the noise goes, after the privacy unit: ``"client-level DP, <phrase>"``."""
        return "local noise (each client noises its own message)"

    def trusted(self) -> str | None:
        """What the run trusts, or ``None``."""
        return None

    def check(self, release: Release) -> None:
        """``ValueError`` before training where this placement's own rule cannot hold."""

    def check_rounds(self, release: Release, rounds: int | None) -> None:
        """``ValueError`` before training where this placement's rule cannot hold over a run
        of ``rounds`` rounds (``None``: unknown, checked as one round)."""

    def not_charged(self, release: Release, rounds: int | None) -> str | None:
        """What a run of ``rounds`` rounds reveals that its ε does not charge, in words, or
        ``None`` (then the ε covers everything the run releases)."""
        return None

    def record(self) -> dict[str, object]:
        """The placement in a run's privacy report and checkpoint."""
        return {"placement": self.name, "min_contributors": self.min_contributors}

    @property
    def round_dependent(self) -> bool:
        """Whether this placement's releases differ from round to round (correlated noise)."""
        return False

    def mechanisms(
        self,
        release: Release,
        noise: Any,
        noise_std: float,
        sensitivity: float,
        round_index: int,
        label: str,
    ) -> list[Mechanism] | None:
        """Round ``round_index``'s Gaussian releases of a client-level run (``noise`` the run's
        :class:`~pl_privfed.privacy.DPNoise`), where this placement decides them (correlated noise, :mod:`pl_privfed.privacy.correlated`), or
        ``None``: the privacy level's (one release per round at ``σ / sensitivity``)."""
        return None

    def noise_process(self, dim: int, horizon: int, device: torch.device | str) -> Any:
        """The stateful draw of the aggregator's noise across rounds (an ``nn.Module`` whose
        buffers the algorithm's state carries), or ``None``: independent draws."""
        return None


#: The registered placements, by the name a configuration gives.
PLACEMENTS: dict[str, type[NoisePlacement]] = {}


def register_placement(cls: type[NoisePlacement]) -> type[NoisePlacement]:
    """Register ``cls`` under ``cls.name`` (a class decorator): ``placement: <name>`` then
    builds it (:func:`resolve_placement`)."""
    if not (isinstance(cls, type) and issubclass(cls, NoisePlacement)) or not cls.name:
        raise ValueError(f"a placement must subclass NoisePlacement and set name, got {cls!r}")
    PLACEMENTS[cls.name] = cls
    return cls


def resolve_placement(
    placement: str | NoisePlacement, min_contributors: int | None = None
) -> NoisePlacement:
    """The placement a configuration gives: a registered name (with the noise settings'
    ``min_contributors`` for distributed noise) or a :class:`NoisePlacement` (whose own ``t``
    the settings' ``min_contributors`` may repeat but not contradict)."""
    if isinstance(placement, NoisePlacement):
        own = placement.min_contributors
        if min_contributors is not None and own is None:
            type(placement).from_settings(min_contributors)  # its own refusal, if it takes no t
        if min_contributors is not None and min_contributors != own:
            raise ValueError(
                f"min_contributors={min_contributors!r} contradicts placement={placement!r}: "
                "give t once, in the placement's init_args"
            )
        return placement
    check_choice("placement", placement, tuple(PLACEMENTS))
    return PLACEMENTS[placement].from_settings(min_contributors)


@register_placement
@dataclass(frozen=True)
class LocalNoise(NoisePlacement):
    """Every client adds ``z_i ~ N(0, σ² I)`` to its message before sending; the server, which
    sees every message and its sender, is the adversary."""

    name: ClassVar[str] = "local"

    def models_note(self) -> str:
        return "; only the client's own noise is counted, not the other clients'"


@register_placement
@dataclass(frozen=True)
class CentralNoise(NoisePlacement):
    """Clients send clean messages and a trusted aggregator adds one ``z ~ N(0, σ² I)`` to their
    sum (σ is the noise of the sum, sensitivity Φ); the adversary is whoever sees the models."""

    name: ClassVar[str] = "central"
    trusted_aggregator: ClassVar[bool] = True
    noises_sum: ClassVar[bool] = True

    def sender_std(self, noise_std: float) -> float:
        return 0.0

    def phrase(self) -> str:
        return "central noise (a trusted aggregator noises the sum)"

    def trusted(self) -> str | None:
        return (
            "the aggregator: it sees every clean message and adds the noise; no ε is claimed "
            "against it"
        )


@register_placement
@dataclass(frozen=True)
class DistributedNoise(NoisePlacement):
    """Every sender adds ``N(0, σ²/t)`` and the server learns only the sum (secure
    aggregation), which holds at least ``σ²`` of noise whenever at least ``t`` clients take
    part; a round with fewer senders is aborted: nothing is released, and the server's step uses
    only what earlier rounds released (with a momentum or memory the model can still move).

    Whether a round aborts depends on the cohort's size, which one client's presence shifts, so
    against whoever sees the models (and not who took part) the abort pattern is itself a
    release, which the ledger does not compose. With an independent (Poisson) cohort a run is
    therefore refused before training when the probability that any of its ``K`` rounds
    aborts, ``1 − (1 − P(cohort < t))^K``, exceeds :data:`MAX_ABORT_PROBABILITY`
    (:meth:`check_rounds`); a fixed-size cohort or every client never aborts, or always does
    (refused too).

    Args:
        min_contributors: ``t``, the fewest senders a round may have (the noise the accounting
            relies on; never the noise that was hoped for).
        allow_aborts: run even where rounds may abort (to study the abort mechanics). The
            abort pattern is then NOT charged: the ε against whoever sees the models is not
            certified, and the run's privacy statement, ``summary.json`` (``not_charged``) and
            a warning say so.
    """

    name: ClassVar[str] = "distributed"
    noises_sum: ClassVar[bool] = True
    min_contributors: int | None = None
    allow_aborts: bool = False

    def __post_init__(self) -> None:
        t = self.min_contributors
        if t is None:
            raise ValueError(
                "placement='distributed' needs min_contributors (t, the fewest clients whose "
                "noise shares the sum is guaranteed to hold): each adds N(0, σ²/t)"
            )
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"min_contributors must be a positive integer, got {t!r}")
        if not isinstance(self.allow_aborts, bool):
            raise ValueError(f"allow_aborts must be true or false, got {self.allow_aborts!r}")

    @classmethod
    def from_settings(cls, min_contributors: int | None = None) -> NoisePlacement:
        return cls(min_contributors)

    def sender_std(self, noise_std: float) -> float:
        return noise_std / math.sqrt(self.min_contributors)

    def aborts(self, senders: int) -> bool:
        return senders < self.min_contributors

    def unknown_noise(
        self, noise: Tensor, senders: int, share_std: float, generator: torch.Generator
    ) -> Tensor:
        """The ``t`` honest senders' shares of the sum's noise ``noise`` (the sum of the
        ``n = senders`` real shares, each ``N(0, s²)`` with ``s = share_std``): the certificate
        counts only those (``t s² = σ²``), its adversary being the server with the other
        ``n − t`` senders colluding, who know their own shares. The simulation draws the
        shares as their sum, so the split is drawn from its conditional law: with ``S`` the sum,
        the honest part ``H = (t/n) S + W``, ``W ~ N(0, s² t (n−t)/n)`` from ``generator`` (the
        audit's stream), has ``H ~ N(0, t s²)`` independent of the colluders' ``S − H ~
        N(0, (n−t) s²)``, exactly the joint law of two disjoint groups of shares; the sum, and
        every training draw, is unchanged. With shares smaller than the configured ones (a
        broken mechanism) ``s`` is what the senders used, so ``H`` carries less than ``σ²``."""
        n, t = int(senders), int(self.min_contributors)
        if n <= t:
            return noise
        extra = torch.empty_like(noise).normal_(
            0.0, share_std * math.sqrt(t * (n - t) / n), generator=generator
        )
        return noise * (t / n) + extra

    def server_view(self, observer: str) -> str:
        return "the server: the noised sum (secure aggregation) and who took part"

    def server_sees(self) -> str:
        return "the noised sum"

    def server_note(self) -> str:
        return (
            f"; the sum's noise counted is σ, which the t={self.min_contributors} "
            "guaranteed senders' shares hold (rounds with fewer senders are aborted)"
        )

    def phrase(self) -> str:
        return (
            f"distributed noise (each sender adds a 1/{self.min_contributors} share of the "
            "sum's noise under secure aggregation)"
        )

    def trusted(self) -> str | None:
        return (
            f"secure aggregation reveals only the sum, and at least t={self.min_contributors} "
            "senders add their noise share honestly in every released round"
        )

    def check(self, release: Release) -> None:
        t, floor = self.min_contributors, release.guaranteed_participants
        if release.clients and t > release.clients:
            raise ValueError(
                f"min_contributors={t} is more than the {release.clients} clients: every "
                "round would be aborted"
            )
        if floor is not None and t > floor:
            raise ValueError(
                f"min_contributors={t} is more than the {floor} clients of every round's "
                "cohort: every round would be aborted"
            )

    def run_abort(self, release: Release, rounds: int | None) -> tuple[float, float] | None:
        """``(P(a round aborts), P(any of the rounds aborts))`` for an independent cohort of
        known clients, or ``None`` (a fixed-size cohort or every client: never, or always)."""
        if release.guaranteed_participants is not None or not release.clients:
            return None
        args = (self.min_contributors, release.clients, release.participation)
        return abort_probability(*args), run_abort_probability(*args, rounds or 1)

    def check_rounds(self, release: Release, rounds: int | None) -> None:
        probabilities = self.run_abort(release, rounds)
        if self.allow_aborts or probabilities is None:
            return
        per_round, any_round = probabilities
        if any_round <= MAX_ABORT_PROBABILITY:
            return
        k, n, q = rounds or 1, release.clients, release.participation
        best = largest_min_contributors(n, q, k)
        fix = (
            f"lower min_contributors to {best} or less"
            if best
            else "no min_contributors stays below it at this participation: raise it"
        )
        raise ValueError(
            f"min_contributors={self.min_contributors} with an expected cohort of {q * n:g} "
            f"clients (participation {q:g} of {n}) over K={k} rounds: a round aborts with "
            f"probability {per_round:.3g} and at least one round with probability "
            f"{any_round:.3g}, above {MAX_ABORT_PROBABILITY:g} (whether a round aborts depends on "
            f"the secret cohort's size and is not charged against whoever sees the models); "
            f"{fix}, or use a fixed-size cohort (FixedSizeSampler), which never aborts"
        )

    def not_charged(self, release: Release, rounds: int | None) -> str | None:
        probabilities = self.run_abort(release, rounds)
        if probabilities is None or probabilities[1] <= MAX_ABORT_PROBABILITY:
            return None
        return (
            f"the abort pattern (allow_aborts: a round aborts with probability "
            f"{probabilities[0]:.3g}, at least one of K={rounds or 1} with probability "
            f"{probabilities[1]:.3g}, and whether it does depends on the secret cohort's size): "
            "the ε against whoever sees the models does not count it and is NOT certified"
        )


def abort_probability(min_contributors: int, clients: int, participation: float) -> float:
    """``P(cohort < t)`` when each of ``clients`` clients takes part independently with
    probability ``participation``: the binomial CDF at ``t - 1`` (scipy).

    >>> round(abort_probability(200, 10_000, 0.01), 6)
    1.0
    >>> abort_probability(1, 10, 1.0)
    0.0
    """
    from scipy.stats import binom

    return float(binom.cdf(min_contributors - 1, clients, participation))


def run_abort_probability(
    min_contributors: int, clients: int, participation: float, rounds: int
) -> float:
    """``1 − (1 − P(cohort < t))^K``: the probability that at least one of ``rounds``
    independent rounds aborts (computed as ``−expm1(K·log1p(−p))``, exact for tiny ``p``).

    >>> run_abort_probability(95, 10_000, 0.01, 100) > 0.2
    True
    """
    p = abort_probability(min_contributors, clients, participation)
    return 1.0 if p >= 1.0 else -math.expm1(rounds * math.log1p(-p))


def largest_min_contributors(
    clients: int, participation: float, rounds: int, bound: float = MAX_ABORT_PROBABILITY
) -> int:
    """The largest ``t`` whose run of ``rounds`` rounds aborts with probability at most
    ``bound`` (0: none, not even ``t = 1``): the per-round bound ``1 − (1 − bound)^(1/K)``
    through scipy's binomial quantile, then checked with :func:`run_abort_probability`.

    >>> largest_min_contributors(10_000, 0.01, 100)
    34
    """
    from scipy.stats import binom

    per_round = -math.expm1(math.log1p(-bound) / rounds)
    quantile = binom.ppf(per_round, clients, participation)
    t = int(quantile) + 1 if math.isfinite(quantile) else 0
    t = min(max(t, 0), clients)
    while t > 0 and run_abort_probability(t, clients, participation, rounds) > bound:
        t -= 1
    while t < clients and run_abort_probability(t + 1, clients, participation, rounds) <= bound:
        t += 1
    return t
