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

What differs between a client-level and a record-level release is asked of the release's
kind (:func:`~pl_privfed.privacy.level_of`: :class:`~pl_privfed.privacy.ClientLevel` or
:class:`~pl_privfed.privacy.RecordLevel`), never branched on here. No privacy mathematics
lives here either: ε comes from the accountants of :mod:`pl_privfed.privacy.accounting`
(Opacus, dp-accounting).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import Counter

from pl_privfed.privacy.accounting import PrivacyAccountant
from pl_privfed.privacy.calibration import calibrate_noise_std, paper_noise_std
from pl_privfed.privacy.levels import level_of
from pl_privfed.privacy.mechanism import AccountingBasis, Mechanism, ReleaseKey
from pl_privfed.privacy.noise import DPNoise, Neighbouring, relation_factor
from pl_privfed.privacy.placement import ADVERSARIES, Adversary, LocalNoise
from pl_privfed.privacy.release import Release
from pl_privfed.privacy.selection import random_search_noise_std

__all__ = [
    "ADVERSARIES",
    "Adversary",
    "accounting_basis",
    "adversaries",
    "calibrate",
    "calibration_rounds",
    "check",
    "check_placement",
    "describe",
    "not_charged",
    "paper_accounting_basis",
    "paper_mechanisms",
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
    aggregator is trusted: no guarantee against it, :func:`trusted`); both for a record-level
    release (:class:`~pl_privfed.privacy.PrivacyLevel`)."""
    return level_of(release).adversaries(noise)


def trusted(release: Release, noise: DPNoise) -> str | None:
    """What the run assumes it can trust, or ``None``."""
    return level_of(release).trusted(noise)


def describe(release: Release, noise: DPNoise, adversary: Adversary) -> str:
    """Who the adversary is and what it sees, in words."""
    return level_of(release).sees(noise, adversary)


def not_charged(release: Release, noise: DPNoise, rounds: int | None) -> str | None:
    """What a run of ``rounds`` rounds reveals that its ε does not charge, or ``None``
    (:meth:`~pl_privfed.privacy.NoisePlacement.not_charged`: the abort pattern of distributed
    noise run with ``allow_aborts``)."""
    return level_of(release).not_charged(noise, rounds)


def unit(release: Release, noise: DPNoise) -> str:
    """The privacy unit with where the noise goes, e.g. ``"client-level DP, central noise (a
    trusted aggregator noises the sum)"``."""
    return level_of(release).unit(noise)


def relation(release: Release, noise: DPNoise, adversary: Adversary | None = None) -> Neighbouring:
    """The relation of the ε against ``adversary`` (default the headline).

    ``noise.neighbouring`` sets the headline's relation; otherwise the server's is replace-one
    (it knows who takes part: one client's data swapped for any other, which can move a
    bounded message anywhere in the ball) and the models' add/remove (a client present in the
    population or not), or replace-one where the cohort is a fixed-size sample (sampling
    without replacement is analysed under replace-one). Record-level: the server's relation
    for both (the models are post-processing of its view).
    """
    level = level_of(release)
    return level.relation(noise, level.adversaries(noise)[0] if adversary is None else adversary)


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
    (:meth:`~pl_privfed.privacy.RecordLevel.uses`), for both adversaries.
    """
    level = level_of(release)
    adversary = level.adversaries(noise)[0] if adversary is None else adversary
    sens = sensitivity(release, level.relation(noise, adversary))
    return level.mechanisms(noise, noise_std, sens, round_index, adversary)


def paper_mechanisms(
    release: Release, noise_std: float, noise: DPNoise | None = None, round_index: int = 0
) -> list[Mechanism]:
    """The releases of one round as the papers account them: add/remove, and Poisson
    amplification at the nominal rate (reported beside the defensible ε); where the placement
    decides a round's releases (``noise.where.mechanisms``: correlated noise, whose papers
    account the whole run as one Gaussian mechanism), its releases of round ``round_index``
    under add/remove."""
    level = level_of(release)
    if noise is not None:
        sens = sensitivity(release, "add_remove")
        own = noise.where.mechanisms(release, noise, noise_std, sens, round_index, release.unit)
        if own is not None:
            return own
    gaussians = level.paper_gaussians_per_release
    multiplier = noise_std / (sensitivity(release, "add_remove") * math.sqrt(gaussians))
    return [Mechanism(multiplier, level.paper_rate, release.unit)] * level.paper_releases_per_round


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
    if not (level_of(release).round_dependent or noise.where.round_dependent):
        mechs = round_mechanisms(release, noise, noise_std, 0, adversary)
        return [(m, rounds) for m in mechs]
    counts: Counter[ReleaseKey] = Counter()
    kinds: dict[ReleaseKey, Mechanism] = {}
    for k in range(rounds):
        for m in round_mechanisms(release, noise, noise_std, k, adversary):
            counts[m.key()] += 1
            kinds.setdefault(m.key(), m)
    return [(kinds[key], count) for key, count in counts.items()]


#: ``calibration: target``'s σ kept per process (a float each), least recently used first out
CALIBRATION_CACHE_SIZE = 4096


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
    process for the same releases, noise settings and rounds; ``calibration: random_search``:
    the ``σ`` at which a random search over such runs (``noise.search_mean`` candidates on
    average from ``noise.search_distribution``) costs ``epsilon`` in total against the headline
    adversary (:func:`~pl_privfed.privacy.selection.random_search_noise_std`), solved the same
    way.
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
            sample_rate=level_of(release).paper_rate,
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
    step size or their seed share it): keyed by the declaration and every noise setting but
    the seed, which keys the draws, not σ. A declaration or placement that cannot be hashed
    (not a frozen dataclass) is solved every time."""
    settings = tuple(
        (field.name, getattr(noise, field.name))
        for field in dataclasses.fields(noise)
        if field.name != "seed"
    )
    try:
        hash((release, settings))
    except TypeError:
        return _solve(release, noise, rounds)
    return _solve_once(release, type(noise), settings, rounds)


@functools.lru_cache(maxsize=CALIBRATION_CACHE_SIZE)
def _solve_once(release: Release, kind: type[DPNoise], settings: tuple, rounds: int) -> float:
    """:func:`_solve` for the noise settings ``settings`` (name, value pairs of ``kind``)."""
    return _solve(release, kind(**dict(settings)), rounds)


def _solve(release: Release, noise: DPNoise, rounds: int) -> float:
    """The σ at which the accounting of ``release_plan`` certifies ``noise.epsilon``."""
    # start at the power of two nearest the sensitivity (a noise multiplier near 1)
    scale = sensitivity(release, relation(release, noise))
    start = 2.0 ** round(math.log2(scale)) if 0 < scale < math.inf else 1.0
    if noise.calibration == "random_search":
        return random_search_noise_std(
            target_epsilon=noise.epsilon,
            delta=noise.delta,
            plan=lambda std: release_plan(release, noise, std, rounds),
            mean=noise.search_mean,
            shape=noise.search_distribution,
            start=start,
        )
    return calibrate_noise_std(
        target_epsilon=noise.epsilon,
        delta=noise.delta,
        plan=lambda std: release_plan(release, noise, std, rounds),
        accountant=noise.accountant,
        start=start,
    )


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
    (:meth:`~pl_privfed.privacy.PrivacyLevel.check_sum_noise`,
    :meth:`~pl_privfed.privacy.NoisePlacement.check`)."""
    if noise.where.noises_sum:
        level_of(release).check_sum_noise(noise)


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
    level_of(release).check_data(noise)
    plans = [
        *(round_mechanisms(release, noise, noise_std, 0, a) for a in adversaries(release, noise)),
        paper_mechanisms(release, noise_std, noise),
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
    level = level_of(release)
    adversary = level.adversaries(noise)[0] if adversary is None else adversary
    rel = level.relation(noise, adversary)
    amplification, composition = level.amplification(noise, adversary, rel)
    return AccountingBasis(rel, sensitivity(release, rel), amplification, composition=composition)


def paper_accounting_basis(release: Release, noise: DPNoise | None = None) -> AccountingBasis:
    """What the papers' ε assumes, and where that fails for this mechanism."""
    level = level_of(release)
    rate = level.paper_rate
    problems = level.paper_problems(LocalNoise() if noise is None else noise.where)
    return AccountingBasis(
        "add_remove",
        sensitivity(release, "add_remove"),
        f"Poisson sampling at rate {rate:.6g}" if rate < 1 else "none",
        "; ".join(problems) or None,
    )
