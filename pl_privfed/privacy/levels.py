"""Privacy kinds as types: whom a release protects decides how it is accounted.

An algorithm's :class:`~pl_privfed.privacy.Release` protects a client (client-level DP:
``records`` is ``None``) or one record of a client (record-level DP: ``records`` says how a
client's records are drawn into its noised releases, :class:`~pl_privfed.privacy.RecordUse`).
The two kinds differ in everything the accounting asks of a release: the adversaries, the
neighbouring relation, how one unit is sampled into a round's releases (and so what may
amplify), the placements that apply, the papers' convention. Each kind is a class that owns
those answers (as pfl's privacy mechanisms and Opacus's accountants own theirs):
:class:`ClientLevel` and :class:`RecordLevel`, both :class:`PrivacyLevel`. :func:`level_of` is
the one place a declaration's kind is read; :mod:`pl_privfed.privacy.plan` asks the object.

Where the noise goes (``noise.where``, a :class:`~pl_privfed.privacy.NoisePlacement`) is asked,
never named: a client-level release takes its adversaries and sentences from the placement, a
record-level one is always noised inside each client (local noise).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

from pl_privfed.checks import check_choice
from pl_privfed.privacy.mechanism import Mechanism
from pl_privfed.privacy.noise import DPNoise, Neighbouring
from pl_privfed.privacy.placement import ADVERSARIES, Adversary, LocalNoise, NoisePlacement
from pl_privfed.privacy.release import RecordUse, Release

__all__ = ["ClientLevel", "PrivacyLevel", "RecordLevel", "level_of"]


def level_of(release: Release) -> PrivacyLevel:
    """The kind of ``release``: :class:`RecordLevel` where it declares how records enter its
    releases, else :class:`ClientLevel`."""
    if release.records is not None:
        return RecordLevel(release)
    return ClientLevel(release)


@dataclass(frozen=True)
class PrivacyLevel(ABC):
    """What a privacy unit's kind decides about a :class:`~pl_privfed.privacy.Release`
    (module docstring). Every answer is a pure function of the release and the run's noise
    settings.

    Attributes:
        name: ``"client"`` or ``"record"``.
        release: the declaration.
    """

    name: ClassVar[Literal["client", "record"]]
    release: Release

    # ------------------------------------------------------------------ who and what
    @abstractmethod
    def adversaries(self, noise: DPNoise) -> list[Adversary]:
        """The adversaries the run reports an ε against, the headline first."""

    @abstractmethod
    def trusted(self, noise: DPNoise) -> str | None:
        """What the run assumes it can trust, or ``None``."""

    @abstractmethod
    def sees(self, noise: DPNoise, adversary: Adversary) -> str:
        """Who ``adversary`` is and what it sees, in words."""

    @abstractmethod
    def not_charged(self, noise: DPNoise, rounds: int | None) -> str | None:
        """What a run of ``rounds`` rounds reveals that its ε does not charge, or ``None``."""

    @abstractmethod
    def unit(self, noise: DPNoise) -> str:
        """The privacy unit, with where the noise goes where that is the run's choice."""

    @abstractmethod
    def relation(self, noise: DPNoise, adversary: Adversary) -> Neighbouring:
        """The neighbouring relation of the ε against ``adversary``."""

    # ------------------------------------------------------------------ releases
    @abstractmethod
    def mechanisms(
        self,
        noise: DPNoise,
        noise_std: float,
        sensitivity: float,
        round_index: int,
        adversary: Adversary,
    ) -> list[Mechanism]:
        """The Gaussian releases of round ``round_index`` against ``adversary``, at noise std
        ``noise_std`` on a quantity of ``sensitivity`` (under that adversary's relation)."""

    @property
    @abstractmethod
    def round_dependent(self) -> bool:
        """Whether the releases differ from round to round."""

    @property
    @abstractmethod
    def paper_rate(self) -> float:
        """The Poisson rate the papers amplify by."""

    @property
    @abstractmethod
    def paper_releases_per_round(self) -> int:
        """The releases of one round as the papers count them."""

    @property
    @abstractmethod
    def paper_gaussians_per_release(self) -> int:
        """The Gaussian draws the papers count in one release."""

    # ------------------------------------------------------------------ refusals
    @abstractmethod
    def check_sum_noise(self, noise: DPNoise) -> None:
        """``ValueError`` unless the noise of a sum (``noise.where.noises_sum``: central,
        distributed) is accounted correctly for this release."""

    @abstractmethod
    def check_data(self, noise: DPNoise) -> None:
        """``ValueError`` unless the accounting holds for how the data enter the releases."""

    # ------------------------------------------------------------------ what ε assumes
    @abstractmethod
    def amplification(
        self, noise: DPNoise, adversary: Adversary, relation: Neighbouring
    ) -> tuple[str, str]:
        """``(amplification, composition)``: what the ε against ``adversary`` claims
        amplification from (or why none), and over which releases it composes, in words."""

    @abstractmethod
    def paper_problems(self, where: NoisePlacement) -> list[str]:
        """Where the papers' convention fails for this release (empty: nowhere)."""


@dataclass(frozen=True)
class ClientLevel(PrivacyLevel):
    """Client-level DP: one client's data, in or out (or swapped). The placement decides the
    adversaries; against the server client sampling amplifies nothing (it sees who takes
    part), against whoever sees only the models a secret cohort amplifies as what it is: a
    Poisson cohort at its rate (add/remove), a fixed-size cohort as sampling without
    replacement of ``B`` of the ``N`` clients (replace-one)."""

    name: ClassVar[Literal["client"]] = "client"

    def adversaries(self, noise: DPNoise) -> list[Adversary]:
        return list(noise.where.adversaries)

    def trusted(self, noise: DPNoise) -> str | None:
        return noise.where.trusted()

    def sees(self, noise: DPNoise, adversary: Adversary) -> str:
        if adversary == "models":
            return "whoever sees the released models, but not who took part in a round"
        return noise.where.server_view(self.release.observer)

    def not_charged(self, noise: DPNoise, rounds: int | None) -> str | None:
        return noise.where.not_charged(self.release, rounds)

    def unit(self, noise: DPNoise) -> str:
        return f"{self.release.unit}, {noise.where.phrase()}"

    def relation(self, noise: DPNoise, adversary: Adversary) -> Neighbouring:
        """``noise.neighbouring`` for the headline; otherwise replace-one against the server
        (it knows who takes part) and add/remove against the models (a client present in the
        population or not), or replace-one for a fixed-size cohort (sampling without
        replacement is analysed under replace-one)."""
        if noise.neighbouring is not None and adversary == self.adversaries(noise)[0]:
            return noise.neighbouring
        if adversary == "server":
            return "replace_one"
        return "replace_one" if self.release.cohort == "fixed" else "add_remove"

    def mechanisms(
        self,
        noise: DPNoise,
        noise_std: float,
        sensitivity: float,
        round_index: int,
        adversary: Adversary,
    ) -> list[Mechanism]:
        release, label = self.release, self.unit(noise)
        own = noise.where.mechanisms(release, noise, noise_std, sensitivity, round_index, label)
        if own is not None:  # the placement decides (correlated noise)
            return own
        multiplier = noise_std / sensitivity
        if adversary == "models" and release.participation < 1:
            if release.cohort == "poisson":
                return [Mechanism(multiplier, release.participation, label, sampling="poisson")]
            if release.cohort == "fixed":
                n, b = int(release.clients), int(release.cohort_size)
                return [Mechanism(multiplier, b / n, label, "without_replacement", population=n)]
        return [Mechanism(multiplier, 1.0, label, sampling="none")]

    @property
    def round_dependent(self) -> bool:
        return False

    @property
    def paper_rate(self) -> float:
        """The client participation (1 for cyclic cohorts: nothing is sampled)."""
        return 1.0 if self.release.cohort == "cyclic" else self.release.participation

    @property
    def paper_releases_per_round(self) -> int:
        return 1

    @property
    def paper_gaussians_per_release(self) -> int:
        return 1

    def check_sum_noise(self, noise: DPNoise) -> None:
        """A fixed denominator and the relation the cohort is analysed under; then the
        placement's own rule (:meth:`~pl_privfed.privacy.NoisePlacement.check`)."""
        release, where = self.release, noise.where
        if release.cohort == "realized":
            raise ValueError(
                f"noise.placement={where.name!r} needs a fixed denominator, but the sampler "
                "averages over the clients that took part (BernoulliSampler): one client would "
                "change every other's weight, so the sensitivity of the noised average is not "
                "bounded; use PoissonSampler (divides by the expected cohort) or FixedSizeSampler"
            )
        models = self.relation(noise, "models")
        if release.cohort == "poisson" and release.participation < 1 and models != "add_remove":
            raise ValueError(
                f"noise.neighbouring={noise.neighbouring!r}: amplification by a Poisson cohort "
                "is analysed under add/remove (Opacus); set neighbouring: add_remove or null"
            )
        if release.cohort == "fixed" and release.participation < 1 and models != "replace_one":
            raise ValueError(
                f"noise.neighbouring={noise.neighbouring!r}: a fixed-size cohort is sampled "
                "without replacement, analysed under replace-one (dp-accounting); set "
                "neighbouring: replace_one or null"
            )
        where.check(release)

    def check_data(self, noise: DPNoise) -> None:
        """Nothing: a client's data enter its message whole."""

    def amplification(
        self, noise: DPNoise, adversary: Adversary, relation: Neighbouring
    ) -> tuple[str, str]:
        release, where = self.release, noise.where
        rate = release.participation
        if adversary == "server":
            seen = where.server_sees()
            if rate < 1:
                amplification = (
                    f"none: {release.observer} sees which clients transmit (and {seen}), so "
                    f"client sampling (rate {rate:g}) does not amplify against it"
                )
            else:
                amplification = (
                    f"none: every client sends every round ({release.observer} sees {seen})"
                )
            amplification += where.server_note()
        elif release.cohort == "poisson" and rate < 1:
            amplification = (
                f"Poisson sampling of clients at rate {rate:g}, secret from whoever sees only "
                "the models; the server divides by a fixed number"
            )
        elif release.cohort == "fixed" and rate < 1:
            amplification = (
                f"sampling without replacement of {int(release.cohort_size)} of the "
                f"{release.clients} clients each round, secret from whoever sees only the "
                "models (dp-accounting, replace-one)"
            )
        elif release.cohort == "cyclic":
            amplification = (
                f"none: cyclic cohorts ({release.separation} fixed groups, group t mod "
                f"{release.separation} at round t) are public; no client sampling is secret"
            )
        elif release.cohort == "realized" and rate < 1:
            amplification = (
                "none: the server averages over the clients that took part, so the model "
                "depends on how many did"
            )
        else:
            amplification = "none: every client takes part in every round"
        if adversary == "models":
            amplification += where.models_note()
        return amplification, "every round of the run (a client may take part in any)"

    def paper_problems(self, where: NoisePlacement) -> list[str]:
        release, problems = self.release, []
        if "server" in where.adversaries:
            if release.participation < 1:
                problems.append(
                    "Poisson amplification at the client rate does not hold against the "
                    "server, which sees who transmits"
                )
            problems.append(
                "add/remove understates what one client can change in its own message "
                "(replace-one: twice the bound)"
            )
        elif release.participation < 1 and release.cohort not in ("poisson", "cyclic"):
            problems.append(f"the cohort is not a Poisson sample ({release.cohort})")
        return problems


@dataclass(frozen=True)
class RecordLevel(PrivacyLevel):
    """Record-level (local) DP: one record of a client, swapped for any other. Noised inside
    each client (only local noise applies), so both adversaries get the server's relation and
    ε (the models are a post-processing of what the server sees); a record's releases are
    composed as the data draws it (:meth:`uses`), and client sampling amplifies nothing
    (the server sees who takes part)."""

    name: ClassVar[Literal["record"]] = "record"

    @property
    def records(self) -> RecordUse:
        """How the records enter the releases."""
        return self.release.records

    def adversaries(self, noise: DPNoise) -> list[Adversary]:
        return list(ADVERSARIES)

    def trusted(self, noise: DPNoise) -> str | None:
        return None

    def sees(self, noise: DPNoise, adversary: Adversary) -> str:
        if adversary == "models":
            return (
                "whoever sees the released models (a post-processing of what "
                f"{self.release.observer} sees: no smaller ε is claimed)"
            )
        return LocalNoise().server_view(self.release.observer)

    def not_charged(self, noise: DPNoise, rounds: int | None) -> str | None:
        return None

    def unit(self, noise: DPNoise) -> str:
        return self.release.unit

    def relation(self, noise: DPNoise, adversary: Adversary) -> Neighbouring:
        """``noise.neighbouring``, else replace-one, against either adversary."""
        return noise.neighbouring if noise.neighbouring is not None else "replace_one"

    def mechanisms(
        self,
        noise: DPNoise,
        noise_std: float,
        sensitivity: float,
        round_index: int,
        adversary: Adversary,
    ) -> list[Mechanism]:
        """A record's releases as the data draws it (:meth:`uses`), each at noise multiplier
        ``σ / (sensitivity · √(Gaussians per use))``, whoever the adversary."""
        multiplier = noise_std / (sensitivity * math.sqrt(self.records.gaussians_per_use))
        return self.uses(multiplier, round_index, self.unit(noise))

    def uses(self, noise_multiplier: float, round_index: int, label: str) -> list[Mechanism]:
        """A record's releases in round ``round_index`` of a client drawing ``positions`` of
        its ``population`` records per round.

        * ``"without_replacement"``: each round an independent uniform sample without
          replacement; a record is in it with probability ``positions / population`` and then
          in one release (at ``noise_multiplier``): one release sampled without replacement
          (dp-accounting), unamplified when the sample is the whole shard.
        * ``"epochs"``: the client walks per-epoch permutations of its shard (or its stored
          order), ``positions`` stream positions per round, every record once per
          ``population`` positions; by the end of round ``k`` a record has been used at most
          ``⌈(k+1)·positions/population⌉`` times, so the round adds that count's increment of
          unamplified releases (a certificate for every record, no amplification by shuffling
          claimed).
        """
        positions, population = self.records.positions, self.records.population
        if self.records.batch_sampling == "without_replacement":
            if positions >= population:
                return [Mechanism(noise_multiplier, 1.0, label, sampling="none")]
            return [
                Mechanism(
                    noise_multiplier,
                    positions / population,
                    label,
                    sampling="without_replacement",
                    population=int(population),
                )
            ]
        uses = math.ceil((round_index + 1) * positions / population) - math.ceil(
            round_index * positions / population
        )
        return [Mechanism(noise_multiplier, 1.0, label, sampling="none")] * uses

    @property
    def round_dependent(self) -> bool:
        """Whether a record's counted uses differ from round to round (``"epochs"``)."""
        return self.records.batch_sampling == "epochs"

    @property
    def paper_rate(self) -> float:
        """Client participation times a record's rate."""
        return self.release.participation * self.records.paper_rate

    @property
    def paper_releases_per_round(self) -> int:
        return self.records.paper_releases_per_round

    @property
    def paper_gaussians_per_release(self) -> int:
        return self.records.paper_gaussians_per_release

    def check_sum_noise(self, noise: DPNoise) -> None:
        """Always refused: a record-level release is noised inside each client."""
        raise ValueError(
            f"noise.placement={noise.where.name!r}: {self.release.unit} is noised inside each "
            "client (record-level DP), where only placement: local applies"
        )

    def check_data(self, noise: DPNoise) -> None:
        """A record enters one release at most once (``release_size`` of the smallest shard's
        ``population`` records), and sampling without replacement is accounted under
        replace-one."""
        records = self.records
        relation = self.relation(noise, self.adversaries(noise)[0])
        check_choice("batch_sampling", records.batch_sampling, ("epochs", "without_replacement"))
        if records.release_size > records.population:
            raise ValueError(
                f"a release uses {records.release_size} examples but the smallest shard has "
                f"{records.population}: a record would enter one release more than once (its "
                "sensitivity would grow); lower the batch size or give every client more data"
            )
        if records.batch_sampling == "without_replacement" and relation != "replace_one":
            raise ValueError(
                "sampling without replacement is analysed under the replace-one relation "
                f"(dp-accounting), got noise.neighbouring={relation!r}: set it to replace_one "
                "or null"
            )

    def amplification(
        self, noise: DPNoise, adversary: Adversary, relation: Neighbouring
    ) -> tuple[str, str]:
        records, observer = self.records, self.release.observer
        positions, population = records.positions, records.population
        if records.batch_sampling == "without_replacement":
            composition = "every round of the run"
            if positions >= population:
                amplification = "none: every round uses the whole shard"
            else:
                amplification = (
                    f"sampling without replacement of {positions} of the {population} records "
                    f"of the smallest shard each round, hidden from {observer} (dp-accounting, "
                    f"{relation})"
                )
        else:
            amplification = (
                "none: the minibatches walk per-epoch permutations of the shard (or its stored "
                "order); no amplification by shuffling is claimed"
            )
            composition = f"a record's uses: at most ⌈k·{positions}/{population}⌉ by round k"
        if self.release.cohorts:
            amplification += "; none from client sampling (the server sees who takes part)"
        return amplification, composition

    def paper_problems(self, where: NoisePlacement) -> list[str]:
        problems = ["add/remove, although the minibatches have a fixed size"]
        if self.paper_rate < 1:
            what = {
                "epochs": "reshuffled each local epoch (every record once per epoch)",
                "without_replacement": "fixed-size samples drawn without replacement",
            }[self.records.batch_sampling]
            problems.append(
                f"the minibatches are not Poisson samples but {what}"
                + (" and the server sees which clients take part" if self.release.cohorts else "")
            )
        return problems
