"""What an algorithm releases: the one privacy declaration each algorithm makes.

An algorithm states, as one frozen :class:`Release`, what leaves a client in a round and how a
privacy unit (a client, or one of its records) enters it: the bound on one unit's contribution
to a noised vector, how clients take part (the cohort and how the server normalizes its sum)
and, for record-level DP, how a client's records are drawn into its noised releases
(:class:`RecordUse`). Where the noise goes is the run's choice (``DPNoise.placement``), not the
declaration's. Everything else — the adversaries, the sensitivity under each neighbouring
relation, the Gaussian mechanisms of every round against each adversary and under the papers'
convention, what each ε assumes, the noise calibration — is derived from it by the pure
functions of :mod:`pl_privfed.privacy.plan`, which ask the release's kind
(:func:`~pl_privfed.privacy.level_of`: :class:`~pl_privfed.privacy.ClientLevel` or
:class:`~pl_privfed.privacy.RecordLevel`), and a run's accountants are kept by
:class:`~pl_privfed.privacy.PrivacyLedger`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pl_privfed.checks import check_positive_int

__all__ = [
    "BatchSampling",
    "Cohort",
    "RecordUse",
    "Release",
    "check_record_arguments",
    "minibatch_population",
    "minibatch_records",
]

#: How the datamodule draws a client's examples of a round (``FederatedDataModule.batch_sampling``)
BatchSampling = Literal["epochs", "without_replacement"]

#: How a round's participants are drawn and how the server normalizes their sum:
#: ``"all"`` (every client, every round), ``"poisson"`` (each client independently, the sum
#: divided by a fixed number: the expected cohort), ``"fixed"`` (a uniformly random cohort of
#: exactly ``cohort_size``), ``"realized"`` (independently, averaged over the clients that took
#: part: the denominator depends on who did), ``"cyclic"`` (``separation`` fixed groups, group
#: ``t mod separation`` at round ``t``: public, no secret sampling; the sum divided by the group
#: size).
Cohort = Literal["all", "poisson", "fixed", "realized", "cyclic"]


@dataclass(frozen=True)
class RecordUse:
    """How a client's records enter its noised releases (record-level DP).

    Attributes:
        positions: stream positions (records) a client reads per round.
        population: records of the smallest shard (``m``).
        batch_sampling: ``"epochs"`` (per-epoch permutations, or the stored order) or
            ``"without_replacement"`` (an independent sample every round).
        release_size: records one noised release averages over (``b``; its sensitivity).
        gaussians_per_use: Gaussian draws a record's use meets (local GD's ``τ`` steps on the
            same sample: the release's noise multiplier is divided by its square root).
        paper_rate: the papers' Poisson rate of a record.
        paper_releases_per_round: the papers' releases per round.
        paper_gaussians_per_release: Gaussian draws the papers count in one release.
    """

    positions: int
    population: int
    batch_sampling: BatchSampling
    release_size: int
    gaussians_per_use: int = 1
    paper_rate: float = 1.0
    paper_releases_per_round: int = 1
    paper_gaussians_per_release: int = 1


@dataclass(frozen=True)
class Release:
    """What one round releases about one privacy unit (module docstring).

    Attributes:
        unit: what is protected and by whom, in words (e.g. ``"client-level local DP (each
            client noises its own message)"``).
        bound: ``Φ``, the norm bound of one client's message (the operator's bound times its
            factor); ``None`` when the operator bounds nothing (then no noise can be
            calibrated). Where the noise goes (``DPNoise.placement``) is the run's choice, not
            the declaration's: central and distributed noise are on the *sum* of the messages,
            whose sensitivity is ``Φ`` (add/remove) or ``2Φ`` (replace-one), whatever the
            server then divides it by.
        observer: who sees the noised messages (the adversary of local DP).
        sensitivity: how far one unit moves the noised quantity under add/remove (default
            ``Φ``).
        replace_one_sensitivity: the same under replace-one (default twice the add/remove
            sensitivity).
        participation: the probability that a client takes part in a round.
        cohort: how the participants are drawn and the sum normalized (:data:`Cohort`).
        clients: ``N``, the clients of the population (0: not stated).
        cohort_size: the clients of a ``"fixed"`` cohort (``B``); for the other cohorts the
            expected number of participants.
        records: how records enter the releases (record-level DP), else ``None``.
        separation: the fewest rounds between two rounds of one client (a ``"cyclic"``
            cohort's number of groups; 1 otherwise).
        paper_bound: ``Φ`` of the papers' calibration formula (default :attr:`bound`).
        paper_steps_per_round: the papers' ``K`` counts this many steps per round.
    """

    unit: str
    bound: float | None
    observer: str = "the server"
    sensitivity: float | None = None
    replace_one_sensitivity: float | None = None
    participation: float = 1.0
    cohort: Cohort = "all"
    clients: int = 0
    cohort_size: float = 0.0
    records: RecordUse | None = None
    paper_bound: float | None = None
    paper_steps_per_round: int = 1
    separation: int = 1

    @property
    def cohorts(self) -> bool:
        """Whether a sampler draws each round's cohort (the server sees who takes part)."""
        return self.cohort != "all"

    @property
    def guaranteed_participants(self) -> int | None:
        """The fewest clients that take part in any round (``None``: no guarantee)."""
        if self.cohort == "all":
            return self.clients or None
        if self.cohort in ("fixed", "cyclic"):
            return int(self.cohort_size)
        return None


def check_record_arguments(batch_size: int, local_dataset_size: int | None) -> None:
    """``ValueError`` unless ``b`` is a positive integer and ``m`` (if given) one ``>= b``."""
    check_positive_int("batch_size", batch_size)
    if local_dataset_size is not None:
        check_positive_int("local_dataset_size", local_dataset_size)
        if local_dataset_size < batch_size:
            raise ValueError(
                f"local_dataset_size must be >= batch_size={batch_size}, got {local_dataset_size!r}"
            )


def minibatch_population(
    b: int,
    m: int | None,
    /,
    *,
    batch_size: int,
    local_batches: int,
    client_sizes: list[int],
    batch_sampling: BatchSampling = "epochs",
    **_: object,
) -> tuple[int, BatchSampling]:
    """``(m, batch sampling)`` for an algorithm that noises the average of ``b`` of a client's
    ``m`` records per round (PORTER-DP, SoteriaFL), checked against the data before training
    (the keywords: what ``configure_data`` receives from the datamodule).

    ``b`` must be the examples per client and round the datamodule delivers; ``m`` defaults to
    the smallest shard (the conservative rate) and may not exceed it, so a run's ε cannot
    silently assume the wrong rate.
    """
    delivered = int(batch_size) * int(local_batches)
    if delivered != b:
        raise ValueError(
            f"batch_size={b} (b: the sensitivity and the sampling rate b/m) but "
            f"the datamodule delivers {delivered} examples per agent and round: set the "
            f"algorithm's batch_size: {delivered} or the data's batch_size: {b}"
        )
    smallest = min(int(v) for v in client_sizes)
    if m is not None and m > smallest:
        raise ValueError(
            f"local_dataset_size={m} (m) is more than the smallest "
            f"shard ({smallest} records): the rate b/m would understate that agent's "
            "privacy loss; leave it null to take the smallest shard"
        )
    return m or smallest, batch_sampling


def minibatch_records(
    batch_size: int, local_dataset_size: int | None, batch_sampling: BatchSampling
) -> RecordUse:
    """How records enter the releases of a client that noises the average of ``b`` of its
    ``m`` records each round (PORTER-DP, SoteriaFL): one release per round, the papers'
    Poisson rate ``b/m``."""
    if local_dataset_size is None:
        raise ValueError(
            "record-level noise needs local_dataset_size (m, records per agent): give it, "
            "or train through FederatedModule, which takes the smallest shard of the data"
        )
    return RecordUse(
        batch_size,
        local_dataset_size,
        batch_sampling,
        release_size=batch_size,
        paper_rate=batch_size / local_dataset_size,
    )
