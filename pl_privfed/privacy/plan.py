"""From an algorithm's declaration to its accounting: pure functions of a :class:`Release`.

Given what an algorithm releases (:class:`~pl_privfed.privacy.Release`) and the run's noise
settings (:class:`~pl_privfed.privacy.DPNoise`):

* :func:`relation` and :func:`sensitivity` — the neighbouring relation of the reported ε and how
  far one privacy unit moves a noised vector under it;
* :func:`round_mechanisms` — the Gaussian releases of one round under the defensible accounting
  (local DP: replace-one, no amplification by client sampling, which the server observes; record
  sampling amplified only as what it is), :func:`paper_mechanisms` — under the papers'
  convention (add/remove, Poisson amplification at the nominal rate), :func:`release_plan` —
  every release of a run;
* :func:`accounting_basis` and :func:`paper_accounting_basis` — what each ε assumes, in words;
* :func:`calibrate` — the noise std of a run (a noise multiplier, the papers' formula, or the σ
  at which the accountant certifies a target ε), :func:`check` — whether the accountant can
  compose the run's releases.

No privacy mathematics lives here either: ε comes from the accountants of
:mod:`pl_privfed.privacy.accounting` (Opacus, dp-accounting).
"""

from __future__ import annotations

import math
from collections import Counter

from pl_privfed.privacy.accounting import PrivacyAccountant
from pl_privfed.privacy.calibration import calibrate_noise_std, paper_noise_std
from pl_privfed.privacy.mechanism import AccountingBasis, Mechanism
from pl_privfed.privacy.noise import DPNoise, Neighbouring, relation_factor
from pl_privfed.privacy.release import BatchSampling, Release

__all__ = [
    "accounting_basis",
    "calibrate",
    "calibration_rounds",
    "check",
    "check_record_sampling",
    "paper_accounting_basis",
    "paper_mechanisms",
    "record_round_mechanisms",
    "relation",
    "release_plan",
    "round_mechanisms",
    "sensitivity",
]


def relation(release: Release, noise: DPNoise) -> Neighbouring:
    """The relation of the reported (defensible) ε: ``noise.neighbouring`` if given, else
    replace-one for local DP and add/remove for central DP (docs/privacy.md)."""
    if noise.neighbouring is not None:
        return noise.neighbouring
    return "replace_one" if release.placement == "local" else "add_remove"


def sensitivity(release: Release, relation: Neighbouring) -> float:
    """How far one privacy unit can move the noised quantity under ``relation``: ``Φ`` under
    add/remove and ``2Φ`` under replace-one by default (``Φ/n`` and ``2Φ/n`` for central noise
    on an average over ``n`` clients), or the declaration's own values."""
    factor = relation_factor(relation)
    if relation == "replace_one" and release.replace_one_sensitivity is not None:
        return release.replace_one_sensitivity
    if release.sensitivity is not None:
        return release.sensitivity * factor
    if release.bound is None:
        raise ValueError(f"noise needs an operator with a bounded output ({release.unit})")
    value = release.bound * factor
    return value / release.aggregated_over if release.aggregated_over != 1 else value


def round_mechanisms(
    release: Release, noise: DPNoise, noise_std: float, round_index: int
) -> list[Mechanism]:
    """The Gaussian releases of round ``round_index`` at noise std ``noise_std``, as the
    defensible accounting composes them.

    Client-level: one release per round at noise multiplier ``σ / sensitivity`` and **no
    amplification by client sampling**: the server sees who transmits, so a client's privacy
    loss composes over every round it can take part in. Record-level: a record's releases as
    the data draws it (:func:`record_round_mechanisms`).
    """
    sens = sensitivity(release, relation(release, noise))
    records = release.records
    if records is None:
        return [Mechanism(noise_std / sens, 1.0, release.unit, sampling="none")]
    return record_round_mechanisms(
        noise_std / (sens * math.sqrt(records.gaussians_per_use)),
        positions=records.positions,
        population=records.population,
        batch_sampling=records.batch_sampling,
        round_index=round_index,
        privacy_unit=release.unit,
    )


def paper_mechanisms(release: Release, noise_std: float) -> list[Mechanism]:
    """The releases of one round as the papers account them: add/remove, and Poisson
    amplification at the nominal rate (reported beside the defensible ε)."""
    records = release.records
    gaussians = 1 if records is None else records.paper_gaussians_per_release
    count = 1 if records is None else records.paper_releases_per_round
    multiplier = noise_std / (sensitivity(release, "add_remove") * math.sqrt(gaussians))
    return [Mechanism(multiplier, release.paper_rate, release.unit)] * count


def release_plan(
    release: Release, noise: DPNoise, noise_std: float, rounds: int
) -> list[tuple[Mechanism, int]]:
    """Every release of ``rounds`` rounds at noise std ``noise_std`` (defensible), as
    ``(mechanism, count)`` pairs: what ``calibration: target`` solves over."""
    if not release.round_dependent:
        return [(m, rounds) for m in round_mechanisms(release, noise, noise_std, 0)]
    counts: Counter = Counter()
    kinds: dict[tuple, Mechanism] = {}
    for k in range(rounds):
        for m in round_mechanisms(release, noise, noise_std, k):
            counts[m.key()] += 1
            kinds.setdefault(m.key(), m)
    return [(kinds[key], count) for key, count in counts.items()]


def calibration_rounds(noise: DPNoise, num_rounds: int) -> int:
    """``K`` of the calibration: ``noise.rounds``, else the run's number of rounds."""
    return noise.rounds or num_rounds


def calibrate(release: Release, noise: DPNoise, rounds: int) -> float:
    """The noise std ``σ`` of a run of ``rounds`` rounds, fixed when the run starts.

    ``noise_multiplier``: ``σ = multiplier × sensitivity`` (of the reported ε);
    ``calibration: paper``: the papers' ``σ = c · q · Φ · sqrt(K log(1/δ))/ε``
    (:func:`~pl_privfed.privacy.paper_noise_std`, at the papers' rate ``q`` and ``K`` counting
    their steps); ``calibration: target``: the ``σ`` at which the defensible accounting of the
    run certifies ``epsilon`` (:func:`~pl_privfed.privacy.calibrate_noise_std`).
    """
    rel = relation(release, noise)
    if noise.noise_multiplier is not None:
        return noise.noise_multiplier * sensitivity(release, rel)
    if noise.calibration == "paper":
        bound = release.paper_bound if release.paper_bound is not None else release.bound
        if bound is None:
            raise ValueError(f"noise needs an operator with a bounded output ({release.unit})")
        return paper_noise_std(
            sensitivity=bound,
            epsilon=noise.epsilon,
            delta=noise.delta,
            rounds=rounds * release.paper_steps_per_round,
            constant=noise.constant,
            sample_rate=release.paper_rate,
        )
    return calibrate_noise_std(
        target_epsilon=noise.epsilon,
        delta=noise.delta,
        plan=lambda std: release_plan(release, noise, std, rounds),
        accountant=noise.accountant,
    )


def check(release: Release, noise: DPNoise, noise_std: float) -> None:
    """Raise ``ValueError`` before training if the run's releases are not accountable: a
    record-level accounting that does not hold for the data, or releases the accountant cannot
    compose (e.g. sampling without replacement with Poisson-subsampled releases)."""
    records = release.records
    if records is not None:
        check_record_sampling(
            records.batch_sampling, relation(release, noise), records.release_size,
            records.population,
        )  # fmt: skip
    plans = (round_mechanisms(release, noise, noise_std, 0), paper_mechanisms(release, noise_std))
    for mechanisms in plans:
        probe = PrivacyAccountant(noise.accountant)
        for mechanism in mechanisms:
            probe.check(mechanism)
            probe.step_mechanism(mechanism)


# ---------------------------------------------------------------------------- what ε assumes
def accounting_basis(release: Release, noise: DPNoise) -> AccountingBasis:
    """What the defensible ε assumes."""
    rel = relation(release, noise)
    sens = sensitivity(release, rel)
    records = release.records
    if records is not None:
        amplification, composition = record_sampling_basis(
            records.batch_sampling, records.positions, records.population, rel, release.observer
        )
        if release.cohorts:
            amplification += "; none from client sampling (the server sees who takes part)"
        return AccountingBasis(rel, sens, amplification, composition=composition)
    if release.placement == "central":
        amplification = "none: every client takes part in every round"
    elif release.participation < 1:
        amplification = (
            f"none: {release.observer} sees which clients transmit, so client sampling (rate "
            f"{release.participation:g}) does not amplify against it"
        )
    else:
        amplification = "none: every client sends every round"
    return AccountingBasis(
        rel, sens, amplification,
        composition="every round of the run (a client may take part in any)",
    )  # fmt: skip


def paper_accounting_basis(release: Release) -> AccountingBasis:
    """What the papers' ε assumes, and where that fails for this mechanism."""
    rate = release.paper_rate
    problems = []
    if release.records is not None:
        problems.append("add/remove, although the minibatches have a fixed size")
        if rate < 1:
            what = {
                "epochs": "reshuffled each local epoch (every record once per epoch)",
                "without_replacement": "fixed-size samples drawn without replacement",
            }[release.records.batch_sampling]
            problems.append(
                f"the minibatches are not Poisson samples but {what}"
                + (" and the server sees which clients take part" if release.cohorts else "")
            )
    elif release.placement == "local":
        if release.participation < 1:
            problems.append(
                "Poisson amplification at the client rate does not hold against the server, "
                "which sees who transmits"
            )
        problems.append(
            "add/remove understates what one client can change in its own message "
            "(replace-one: twice the bound)"
        )
    return AccountingBasis(
        "add_remove",
        sensitivity(release, "add_remove"),
        f"Poisson sampling at rate {rate:.6g}" if rate < 1 else "none",
        "; ".join(problems) or None,
    )


# ---------------------------------------------------------------------------- record level
def record_round_mechanisms(
    noise_multiplier: float,
    *,
    positions: int,
    population: int,
    batch_sampling: BatchSampling,
    round_index: int,
    privacy_unit: str,
) -> list[Mechanism]:
    """A record's releases in round ``round_index`` of a client drawing ``positions`` of its
    ``population`` records per round (record-level local DP).

    * ``"without_replacement"``: each round an independent uniform sample without replacement;
      a record is in it with probability ``positions / population`` and then in one release
      (whose noise multiplier is ``noise_multiplier``): one release sampled without replacement
      (dp-accounting), unamplified when the sample is the whole shard.
    * ``"epochs"``: the client walks per-epoch permutations of its shard (or its stored order),
      ``positions`` stream positions per round, every record once per ``population`` positions;
      by the end of round ``k`` a record has been used at most ``⌈(k+1)·positions/population⌉``
      times, so the round adds that count's increment of unamplified releases (a certificate
      for every record, no amplification by shuffling claimed).
    """
    if batch_sampling == "without_replacement":
        if positions >= population:
            return [Mechanism(noise_multiplier, 1.0, privacy_unit, sampling="none")]
        return [
            Mechanism(
                noise_multiplier,
                positions / population,
                privacy_unit,
                sampling="without_replacement",
                population=int(population),
            )
        ]
    uses = math.ceil((round_index + 1) * positions / population) - math.ceil(
        round_index * positions / population
    )
    return [Mechanism(noise_multiplier, 1.0, privacy_unit, sampling="none")] * uses


def record_sampling_basis(
    batch_sampling: BatchSampling, positions: int, population: int, relation: str, observer: str
) -> tuple[str, str]:
    """``(amplification, composition)`` texts of a record-level accounting."""
    if batch_sampling == "without_replacement":
        if positions >= population:
            return "none: every round uses the whole shard", "every round of the run"
        return (
            f"sampling without replacement of {positions} of the {population} records of the "
            f"smallest shard each round, hidden from {observer} (dp-accounting RDP, "
            f"{relation})",
            "every round of the run",
        )
    return (
        "none: the minibatches walk per-epoch permutations of the shard (or its stored order); "
        "no amplification by shuffling is claimed",
        f"a record's uses: at most ⌈k·{positions}/{population}⌉ by round k",
    )


def check_record_sampling(
    batch_sampling: str, relation: str, per_release: int, population: int
) -> None:
    """``ValueError`` unless the record-level accounting holds for this data."""
    if batch_sampling not in ("epochs", "without_replacement"):
        raise ValueError(
            f"batch_sampling must be 'epochs' or 'without_replacement', got {batch_sampling!r}"
        )
    if per_release > population:
        raise ValueError(
            f"a release uses {per_release} examples but the smallest shard has {population}: a "
            "record would enter one release more than once (its sensitivity would grow); lower "
            "the batch size or give every client more data"
        )
    if batch_sampling == "without_replacement" and relation != "replace_one":
        raise ValueError(
            "sampling without replacement is analysed under the replace-one relation "
            f"(dp-accounting), got noise.neighbouring={relation!r}: set it to replace_one or null"
        )
