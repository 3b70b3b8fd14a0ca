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
  (:meth:`NoisePlacement.check`) and its sentences in the privacy statement
  (:meth:`NoisePlacement.phrase`, :meth:`NoisePlacement.trusted`).

The three placements: :class:`LocalNoise` (every client noises its own message),
:class:`CentralNoise` (a trusted aggregator noises the sum once) and :class:`DistributedNoise`
(every sender adds a ``1/t`` share of the sum's noise under secure aggregation; a round with
fewer than ``t`` senders is aborted). A configuration names one by its registered name
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
from typing import TYPE_CHECKING, ClassVar, Literal

from pl_privfed.checks import check_choice

if TYPE_CHECKING:
    from pl_privfed.privacy.release import Release

__all__ = [
    "ADVERSARIES",
    "PLACEMENTS",
    "Adversary",
    "CentralNoise",
    "DistributedNoise",
    "LocalNoise",
    "NoisePlacement",
    "PlacementName",
    "abort_probability",
    "register_placement",
    "resolve_placement",
]

#: Who could learn something from a run: ``"server"`` — whoever sees what the clients send
#: (local noise: every noised message and its sender; distributed noise: the noised sum and who
#: took part; for decentralized methods the agent's neighbours); ``"models"`` — whoever sees
#: only the released models (not who took part), against whom a secret cohort amplifies.
Adversary = Literal["server", "models"]
ADVERSARIES: tuple[Adversary, ...] = ("server", "models")

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

    def record(self) -> dict[str, object]:
        """The placement in a run's privacy report and checkpoint."""
        return {"placement": self.name, "min_contributors": self.min_contributors}


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

    Args:
        min_contributors: ``t``, the fewest senders a round may have (the noise the accounting
            relies on; never the noise that was hoped for).
    """

    name: ClassVar[str] = "distributed"
    noises_sum: ClassVar[bool] = True
    min_contributors: int | None = None

    def __post_init__(self) -> None:
        t = self.min_contributors
        if t is None:
            raise ValueError(
                "placement='distributed' needs min_contributors (t, the fewest clients whose "
                "noise shares the sum is guaranteed to hold): each adds N(0, σ²/t)"
            )
        if isinstance(t, bool) or not isinstance(t, int) or t < 1:
            raise ValueError(f"min_contributors must be a positive integer, got {t!r}")

    @classmethod
    def from_settings(cls, min_contributors: int | None = None) -> NoisePlacement:
        return cls(min_contributors)

    def sender_std(self, noise_std: float) -> float:
        return noise_std / math.sqrt(self.min_contributors)

    def aborts(self, senders: int) -> bool:
        return senders < self.min_contributors

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
        if floor is None and release.clients:
            p_abort = abort_probability(t, release.clients, release.participation)
            if p_abort >= 0.5:
                raise ValueError(
                    f"min_contributors={t} with an expected cohort of "
                    f"{release.participation * release.clients:g} clients (participation "
                    f"{release.participation:g} of {release.clients}): a round is aborted with "
                    f"probability {p_abort:.3f}, so at least half the rounds would release "
                    "nothing; lower min_contributors or raise the participation"
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
