"""From an algorithm's declaration to its accounting: pure functions of a :class:`Release`.

Given what an algorithm releases (:class:`~pl_privfed.privacy.Release`) and the run's noise
settings (:class:`~pl_privfed.privacy.DPNoise`):

* :func:`adversaries` — who could learn something (the server; whoever sees the released
  models), the headline first, given where the noise goes (``noise.where``, a
  :class:`~pl_privfed.privacy.NoisePlacement`, which this module asks and never names);
  :func:`describe`, :func:`unit`, :func:`trusted` — the same in words;
  :func:`check_placement` — the placements refused before training;
* :func:`relation` and :func:`sensitivity` — the neighbouring relation of an adversary's ε and
  how far one privacy unit moves a noised vector (or the noised sum) under it;
* :func:`round_mechanisms` — the Gaussian releases of one round against an adversary under the
  defensible accounting (the server: replace-one, no amplification by client sampling, which it
  observes; whoever sees the models: add/remove, amplification by a secret cohort; record
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

import dataclasses
import math
from collections import Counter

from pl_privfed.checks import check_choice
from pl_privfed.privacy.accounting import PrivacyAccountant
from pl_privfed.privacy.calibration import calibrate_noise_std, paper_noise_std
from pl_privfed.privacy.mechanism import AccountingBasis, Mechanism
from pl_privfed.privacy.noise import DPNoise, Neighbouring, relation_factor
from pl_privfed.privacy.placement import ADVERSARIES, Adversary, LocalNoise
from pl_privfed.privacy.release import BatchSampling, Release

__all__ = [
    "ADVERSARIES",
    "Adversary",
    "accounting_basis",
    "adversaries",
    "calibrate",
    "calibration_rounds",
    "check",
    "check_placement",
    "check_record_sampling",
    "describe",
    "not_charged",
    "paper_accounting_basis",
    "paper_mechanisms",
    "record_round_mechanisms",
    "relation",
    "release_plan",
    "round_mechanisms",
    "sensitivity",
    "trusted",
    "unit",
]


def adversaries(release: Release, noise: DPNoise) -> list[Adversary]:
    """The adversaries a run reports an ε against, the headline first: the server for local
    and distributed noise (it sees the most), whoever sees the models for central noise (the
    aggregator is trusted: no guarantee against it, :func:`trusted`)."""
    if release.records is not None:
        return list(ADVERSARIES)
    return list(noise.where.adversaries)


def trusted(release: Release, noise: DPNoise) -> str | None:
    """What the run assumes it can trust, or ``None``."""
    return noise.where.trusted() if release.records is None else None


def describe(release: Release, noise: DPNoise, adversary: Adversary) -> str:
    """Who the adversary is and what it sees, in words."""
    if adversary == "models":
        if release.records is not None:
            return (
                "whoever sees the released models (a post-processing of what "
                f"{release.observer} sees: no smaller ε is claimed)"
            )
        return "whoever sees the released models, but not who took part in a round"
    if release.records is not None:
        return LocalNoise().server_view(release.observer)
    return noise.where.server_view(release.observer)


def not_charged(release: Release, noise: DPNoise, rounds: int | None) -> str | None:
    """What a run of ``rounds`` rounds reveals that its ε does not charge, or ``None``
    (:meth:`~pl_privfed.privacy.NoisePlacement.not_charged`: the abort pattern of distributed
    noise run with ``allow_aborts``)."""
    return noise.where.not_charged(release, rounds) if release.records is None else None


def unit(release: Release, noise: DPNoise) -> str:
    """The privacy unit with where the noise goes, e.g. ``"client-level DP, central noise (a
    trusted aggregator noises the sum)"``."""
    if release.records is not None:
        return release.unit
    return f"{release.unit}, {noise.where.phrase()}"


def relation(release: Release, noise: DPNoise, adversary: Adversary | None = None) -> Neighbouring:
    """The relation of the ε against ``adversary`` (default the headline).

    ``noise.neighbouring`` sets the headline's relation; otherwise the server's is replace-one
    (it knows who takes part: one client's data swapped for any other, which can move a
    bounded message anywhere in the ball) and the models' add/remove (a client present in the
    population or not), or replace-one where the cohort is a fixed-size sample (sampling
    without replacement is analysed under replace-one). Record-level: the server's relation
    for both (the models are post-processing of its view).
    """
    headline = adversaries(release, noise)[0]
    adversary = headline if adversary is None else adversary
    if noise.neighbouring is not None and (adversary == headline or release.records is not None):
        return noise.neighbouring
    if adversary == "server" or release.records is not None:
        return "replace_one"
    return "replace_one" if release.cohort == "fixed" else "add_remove"


def sensitivity(release: Release, relation: Neighbouring) -> float:
    """How far one privacy unit can move the noised quantity under ``relation``: ``Φ`` under
    add/remove and ``2Φ`` under replace-one by default (a message, or the sum central and
    distributed noise is added to), or the declaration's own values."""
    factor = relation_factor(relation)
    if relation == "replace_one" and release.replace_one_sensitivity is not None:
        return release.replace_one_sensitivity
    if release.sensitivity is not None:
        return release.sensitivity * factor
    if release.bound is None:
        raise ValueError(f"noise needs an operator with a bounded output ({release.unit})")
    return release.bound * factor


def round_mechanisms(
    release: Release,
    noise: DPNoise,
    noise_std: float,
    round_index: int,
    adversary: Adversary | None = None,
) -> list[Mechanism]:
    """The Gaussian releases of round ``round_index`` at noise std ``noise_std`` against
    ``adversary`` (default the headline), as the defensible accounting composes them.

    Client-level, against the server: one release per round at noise multiplier ``σ /
    sensitivity`` and **no amplification by client sampling** (the server sees who takes
    part), for a client's own noise (local) or the noise the sum is guaranteed to hold
    (distributed). Against whoever sees only the models: the sum's noise ``σ`` (central,
    distributed; local: only the client's own ``σ`` is counted), amplified by a secret Poisson
    cohort at its rate, or by a fixed-size cohort as sampling without replacement of ``B`` of
    the ``N`` clients; no amplification when every client takes part or the server averages
    over the realized cohort. Record-level: a record's releases as the data draws it
    (:func:`record_round_mechanisms`), for both adversaries.
    """
    adversary = adversaries(release, noise)[0] if adversary is None else adversary
    sens = sensitivity(release, relation(release, noise, adversary))
    records = release.records
    label = unit(release, noise)
    if records is not None:
        return record_round_mechanisms(
            noise_std / (sens * math.sqrt(records.gaussians_per_use)),
            positions=records.positions,
            population=records.population,
            batch_sampling=records.batch_sampling,
            round_index=round_index,
            privacy_unit=label,
        )
    multiplier = noise_std / sens
    if adversary == "models" and release.participation < 1:
        if release.cohort == "poisson":
            return [Mechanism(multiplier, release.participation, label, sampling="poisson")]
        if release.cohort == "fixed":
            n, b = int(release.clients), int(release.cohort_size)
            return [Mechanism(multiplier, b / n, label, "without_replacement", population=n)]
    return [Mechanism(multiplier, 1.0, label, sampling="none")]


def paper_mechanisms(release: Release, noise_std: float) -> list[Mechanism]:
    """The releases of one round as the papers account them: add/remove, and Poisson
    amplification at the nominal rate (reported beside the defensible ε)."""
    records = release.records
    gaussians = 1 if records is None else records.paper_gaussians_per_release
    count = 1 if records is None else records.paper_releases_per_round
    multiplier = noise_std / (sensitivity(release, "add_remove") * math.sqrt(gaussians))
    return [Mechanism(multiplier, release.paper_rate, release.unit)] * count


def release_plan(
    release: Release,
    noise: DPNoise,
    noise_std: float,
    rounds: int,
    adversary: Adversary | None = None,
) -> list[tuple[Mechanism, int]]:
    """Every release of ``rounds`` rounds at noise std ``noise_std`` against ``adversary``
    (default the headline), as ``(mechanism, count)`` pairs: what ``calibration: target``
    solves over."""
    if not release.round_dependent:
        mechs = round_mechanisms(release, noise, noise_std, 0, adversary)
        return [(m, rounds) for m in mechs]
    counts: Counter = Counter()
    kinds: dict[tuple, Mechanism] = {}
    for k in range(rounds):
        for m in round_mechanisms(release, noise, noise_std, k, adversary):
            counts[m.key()] += 1
            kinds.setdefault(m.key(), m)
    return [(kinds[key], count) for key, count in counts.items()]


#: σ of ``calibration: target`` by its releases, noise settings and rounds (:func:`calibrate`)
_CALIBRATED: dict[str, float] = {}


def calibration_rounds(noise: DPNoise, num_rounds: int) -> int:
    """``K`` of the calibration: ``noise.rounds``, else the run's number of rounds."""
    return noise.rounds or num_rounds


def calibrate(release: Release, noise: DPNoise, rounds: int) -> float:
    """The noise std ``σ`` of a run of ``rounds`` rounds, fixed when the run starts: a client's
    noise (local), or the noise of the sum (central, distributed).

    ``noise_multiplier``: ``σ = multiplier × sensitivity`` (the headline's);
    ``calibration: paper``: the papers' ``σ = c · q · Φ · sqrt(K log(1/δ))/ε``
    (:func:`~pl_privfed.privacy.paper_noise_std`, at the papers' rate ``q`` and ``K`` counting
    their steps; for central and distributed noise ``Φ`` is the sensitivity of the sum that is
    noised, so the average carries ``σ/n`` — not the ``σ`` the papers size for one message);
    ``calibration: target``: the ``σ`` at which the accounting against the headline adversary
    certifies ``epsilon`` (:func:`~pl_privfed.privacy.calibrate_noise_std`), solved once per
    process for the same releases, noise settings and rounds.
    """
    check_placement(release, noise)
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
    # the accounting sees σ only through noise multipliers σ / sensitivity, and every
    # sensitivity is a multiple of the bound Φ: σ is solved for the release at Φ = 1 and
    # scaled, so configurations that differ only in Φ share one solve (where the round's
    # multipliers confirm the scaling; else the release is solved as it is)
    unit, scale = _unit_bound(release, noise, rounds)
    return scale * _solved(unit, noise, rounds)


def _solved(release: Release, noise: DPNoise, rounds: int) -> float:
    """``calibration: target``'s σ for ``release``, solved once per process for the same
    releases, noise settings and rounds (a grid's configurations that differ only in their
    step size or their seed share it). The key is the dataclasses' repr, which names every
    field (an object without one misses, never collides), with the noise's seed set aside:
    it keys the draws, not σ."""
    key = repr((release, dataclasses.replace(noise, seed=0), rounds))
    if key not in _CALIBRATED:
        # start at the power of two nearest the sensitivity (a noise multiplier near 1)
        scale = sensitivity(release, relation(release, noise))
        start = 2.0 ** round(math.log2(scale)) if 0 < scale < math.inf else 1.0
        _CALIBRATED[key] = calibrate_noise_std(
            target_epsilon=noise.epsilon,
            delta=noise.delta,
            plan=lambda std: release_plan(release, noise, std, rounds),
            accountant=noise.accountant,
            start=start,
        )
    return _CALIBRATED[key]


def _unit_bound(release: Release, noise: DPNoise, rounds: int) -> tuple[Release, float]:
    """``release`` with its bound and sensitivities divided by ``Φ`` and the factor ``Φ``;
    ``(release, 1.0)`` where it has no positive bound or its mechanisms at ``σ = Φ`` do not
    equal the unit release's at ``σ = 1`` (a sensitivity that is not a multiple of ``Φ``)."""
    bound = release.bound
    if not (isinstance(bound, (int, float)) and math.isfinite(bound) and bound > 0) or bound == 1:
        return release, 1.0

    def scaled(value: float | None) -> float | None:
        return None if value is None else value / bound

    unit = dataclasses.replace(
        release,
        bound=1.0,
        sensitivity=scaled(release.sensitivity),
        replace_one_sensitivity=scaled(release.replace_one_sensitivity),
    )
    probe = min(rounds, 2)  # round-dependent releases: the first rounds' mechanisms
    mine = release_plan(release, noise, bound, probe)
    theirs = release_plan(unit, noise, 1.0, probe)
    same = len(mine) == len(theirs) and all(
        count == other_count
        and math.isclose(m.noise_multiplier, o.noise_multiplier, rel_tol=1e-12)
        and m.key()[1:] == o.key()[1:]
        for (m, count), (o, other_count) in zip(mine, theirs)
    )
    return (unit, bound) if same else (release, 1.0)


def check_placement(release: Release, noise: DPNoise) -> None:
    """``ValueError`` before training where the noise placement's accounting does not hold:
    the noise of a sum (central, distributed) needs a client-level release, a fixed
    denominator and the relation its cohort is analysed under; then the placement's own rule
    (:meth:`~pl_privfed.privacy.NoisePlacement.check`)."""
    where = noise.where
    if not where.noises_sum:
        return
    name = where.name
    if release.records is not None:
        raise ValueError(
            f"noise.placement={name!r}: {release.unit} is noised inside each client "
            "(record-level DP), where only placement: local applies"
        )
    if release.cohort == "realized":
        raise ValueError(
            f"noise.placement={name!r} needs a fixed denominator, but the sampler "
            "averages over the clients that took part (BernoulliSampler): one client would "
            "change every other's weight, so the sensitivity of the noised average is not "
            "bounded; use PoissonSampler (divides by the expected cohort) or FixedSizeSampler"
        )
    models = relation(release, noise, "models")
    if release.cohort == "poisson" and release.participation < 1 and models != "add_remove":
        raise ValueError(
            f"noise.neighbouring={noise.neighbouring!r}: amplification by a Poisson cohort is "
            "analysed under add/remove (Opacus); set neighbouring: add_remove or null"
        )
    if release.cohort == "fixed" and release.participation < 1 and models != "replace_one":
        raise ValueError(
            f"noise.neighbouring={noise.neighbouring!r}: a fixed-size cohort is sampled "
            "without replacement, analysed under replace-one (dp-accounting); set "
            "neighbouring: replace_one or null"
        )
    where.check(release)


def check(release: Release, noise: DPNoise, noise_std: float, rounds: int | None = None) -> None:
    """Raise ``ValueError`` before training if the run's releases are not accountable: a
    placement whose accounting does not hold (:func:`check_placement`) or whose rule does not
    hold over the run's ``rounds`` rounds (``None``: unknown, checked as one round; e.g.
    distributed noise that may abort a round:
    :meth:`~pl_privfed.privacy.NoisePlacement.check_rounds`), a record-level accounting that
    does not hold for the data, or releases the accountant cannot compose (e.g. sampling
    without replacement with Poisson-subsampled releases)."""
    check_placement(release, noise)
    noise.where.check_rounds(release, rounds)
    records = release.records
    if records is not None:
        rel = relation(release, noise)
        check_record_sampling(records.batch_sampling, rel, records.release_size, records.population)
    plans = [
        *(round_mechanisms(release, noise, noise_std, 0, a) for a in adversaries(release, noise)),
        paper_mechanisms(release, noise_std),
    ]
    for mechanisms in plans:
        probe = PrivacyAccountant(noise.accountant)
        for mechanism in mechanisms:
            probe.check(mechanism)
            probe.step_mechanism(mechanism)


# ---------------------------------------------------------------------------- what ε assumes
def accounting_basis(
    release: Release, noise: DPNoise, adversary: Adversary | None = None
) -> AccountingBasis:
    """What the defensible ε against ``adversary`` (default the headline) assumes."""
    adversary = adversaries(release, noise)[0] if adversary is None else adversary
    rel = relation(release, noise, adversary)
    sens = sensitivity(release, rel)
    records = release.records
    if records is not None:
        amplification, composition = record_sampling_basis(
            records.batch_sampling, records.positions, records.population, rel, release.observer
        )
        if release.cohorts:
            amplification += "; none from client sampling (the server sees who takes part)"
        return AccountingBasis(rel, sens, amplification, composition=composition)
    rate, where = release.participation, noise.where
    if adversary == "server":
        seen = where.server_sees()
        if rate < 1:
            amplification = (
                f"none: {release.observer} sees which clients transmit (and {seen}), so "
                f"client sampling (rate {rate:g}) does not amplify against it"
            )
        else:
            amplification = f"none: every client sends every round ({release.observer} sees {seen})"
        amplification += where.server_note()
    elif release.cohort == "poisson" and rate < 1:
        amplification = (
            f"Poisson sampling of clients at rate {rate:g}, secret from whoever sees only the "
            "models; the server divides by a fixed number"
        )
    elif release.cohort == "fixed" and rate < 1:
        amplification = (
            f"sampling without replacement of {int(release.cohort_size)} of the "
            f"{release.clients} clients each round, secret from whoever sees only the models "
            "(dp-accounting, replace-one)"
        )
    elif release.cohort == "realized" and rate < 1:
        amplification = (
            "none: the server averages over the clients that took part, so the model depends "
            "on how many did"
        )
    else:
        amplification = "none: every client takes part in every round"
    if adversary == "models":
        amplification += where.models_note()
    composition = "every round of the run (a client may take part in any)"
    return AccountingBasis(rel, sens, amplification, composition=composition)


def paper_accounting_basis(release: Release, noise: DPNoise | None = None) -> AccountingBasis:
    """What the papers' ε assumes, and where that fails for this mechanism."""
    rate = release.paper_rate
    where = LocalNoise() if noise is None else noise.where
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
    elif "server" in where.adversaries:
        if release.participation < 1:
            problems.append(
                "Poisson amplification at the client rate does not hold against the server, "
                "which sees who transmits"
            )
        problems.append(
            "add/remove understates what one client can change in its own message "
            "(replace-one: twice the bound)"
        )
    elif release.participation < 1 and release.cohort != "poisson":
        problems.append(f"the cohort is not a Poisson sample ({release.cohort})")
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
            f"smallest shard each round, hidden from {observer} (dp-accounting, "
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
    check_choice("batch_sampling", batch_sampling, ("epochs", "without_replacement"))
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
