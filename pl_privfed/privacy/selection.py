"""The privacy cost of selecting among runs on private data (hyperparameter tuning).

A run certifies an ε for what *it* releases. Choosing the best of several runs by a metric
computed on private data (the clients' validation examples) is itself a release of those data:
the chosen configuration, and the numbers reported for it, depend on every candidate. Two
charges for it, both computed by the accountant libraries from the runs' recorded histories
(``summary.json``'s ``privacy.accounting.history``, :meth:`PrivacyAccountant.history
<pl_privfed.privacy.PrivacyAccountant.history>`), never by a formula of this package:

* :func:`composed_epsilon` — every candidate run composed on the same data, by the package's
  own :class:`~pl_privfed.privacy.PrivacyAccountant` (the accountant each run used: `auto` is
  dp-accounting's PLD for every history). Valid for any selection
  rule, a grid included: it charges releasing every candidate's whole output.
* :func:`random_search_epsilon` — Papernot & Steinke, "Hyperparameter Tuning with Rényi
  Differential Privacy" (ICLR 2022, arXiv:2110.03620): if the number of candidates ``K`` is
  itself random (truncated negative binomial, Thm. 2, p. 5; Poisson, Thm. 6, p. 7) and only the
  best candidate is released, the tuning costs far less than ``K``-fold composition. Computed by
  dp-accounting's ``RepeatAndSelectDpEvent`` on the candidate's RDP curve
  (``dp_accounting.rdp.RdpAccountant``, which implements both theorems). It holds for *that*
  procedure only: a random number of candidates, each a configuration drawn at random, and
  nothing but the winner released. A fixed grid of configurations is not that procedure.
* :func:`random_search_noise_std` — the other way round: the noise std at which a random search
  over runs of a given release plan costs a given *total* ε (``calibration: random_search``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.rdp import RdpAccountant

from pl_privfed.privacy.accounting import AccountantName, PrivacyAccountant
from pl_privfed.privacy.calibration import ReleasePlan, solve_for_epsilon
from pl_privfed.privacy.mechanism import Mechanism, ReleaseKey

__all__ = [
    "SHAPES",
    "composed_epsilon",
    "merged_releases",
    "random_search_epsilon",
    "random_search_noise_std",
    "repetition_shape",
]

#: a record of :meth:`PrivacyAccountant.history`: noise_multiplier, sample_rate, sampling,
#: population, releases
History = Sequence[Mapping]

#: the named distributions of the number of candidates (dp-accounting's ``shape``): Poisson
#: (Thm. 6), geometric (Thm. 2 with η = 1), logarithmic (Thm. 2 with η = 0)
SHAPES = {"poisson": math.inf, "geometric": 1.0, "logarithmic": 0.0}


#: dp-accounting's default RDP orders from 1.5 up: below it its Poisson-subsampled curve does not
#: converge at small noise multipliers (it drops those orders with a warning each); the bound
#: is a minimum over orders, so fewer orders only loosen it
_ORDERS = [order for order in RdpAccountant().orders if order >= 1.5]


def merged_releases(histories: Iterable[History]) -> dict[ReleaseKey, int]:
    """The releases of every history, counted per distinct release
    (:meth:`~pl_privfed.privacy.Mechanism.key`, in the order first recorded); ``ValueError``
    for a record that is not a release (as :class:`~pl_privfed.privacy.Mechanism`)."""
    counts: dict[ReleaseKey, int] = {}
    for history in histories:
        for record in history:
            key = Mechanism.from_record(record).key()
            counts[key] = counts.get(key, 0) + int(record["releases"])
    return counts


def composed_epsilon(
    histories: Iterable[History], delta: float, accountant: AccountantName = "auto"
) -> float:
    """The ε of running every history on the same data: their releases composed by one
    :class:`~pl_privfed.privacy.PrivacyAccountant` (``accountant`` as the runs named it), at
    ``delta``. One history gives back its run's own ε; ``n`` copies of it are the same
    releases ``n`` times over.

    Raises:
        ValueError: without any release, or for a bad record (as
            :class:`~pl_privfed.privacy.Mechanism`).
    """
    counts = merged_releases(histories)
    if not counts:
        raise ValueError("composed_epsilon needs at least one history with a release")
    acc = PrivacyAccountant(accountant)
    for (sigma, rate, sampling, population), releases in counts.items():
        acc.step(
            noise_multiplier=sigma,
            sample_rate=rate,
            num_steps=releases,
            sampling=sampling,  # type: ignore[arg-type]
            population=population,
        )
    return acc.get_epsilon(delta)


def repetition_shape(name: str | float) -> float:
    """dp-accounting's ``shape`` of the distribution of the number of candidates: ``"poisson"``,
    ``"geometric"``, ``"logarithmic"`` or a truncated negative binomial's η ≥ 0 (a number)."""
    if isinstance(name, str) and name.lower() in SHAPES:
        return SHAPES[name.lower()]
    try:
        shape = float(name)
    except (TypeError, ValueError):
        shape = math.nan
    if not shape >= 0:  # NaN too
        raise ValueError(
            f"random search distribution must be one of {', '.join(SHAPES)} or a truncated "
            f"negative binomial's shape η >= 0, got {name!r}"
        )
    return shape


def _event(history: History) -> tuple[dp_accounting.DpEvent, bool]:
    """The history as one dp-accounting event, and whether it needs the replace-one relation
    (releases sampled without replacement)."""
    events, replace_one = [], False
    for (sigma, rate, sampling, population), releases in merged_releases([history]).items():
        gaussian = dp_accounting.GaussianDpEvent(sigma)
        if sampling == "without_replacement":
            replace_one = True
            size = round(rate * population)
            event = dp_accounting.SampledWithoutReplacementDpEvent(population, size, gaussian)
        elif rate < 1:
            event = dp_accounting.PoissonSampledDpEvent(rate, gaussian)
        else:
            event = gaussian
        events.append(dp_accounting.SelfComposedDpEvent(event, releases))
    return dp_accounting.ComposedDpEvent(events), replace_one


def random_search_epsilon(
    history: History, delta: float, mean: float, shape: str | float = "poisson"
) -> float:
    """Papernot & Steinke (ICLR 2022)'s ε of random search: run one candidate (``history``: its
    releases, e.g. one configuration's seeds composed) a random number ``K`` of times, ``K``
    drawn with mean ``mean`` from the distribution ``shape`` (:func:`repetition_shape`), and
    release only the best. Thm. 2 (p. 5, truncated negative binomial, geometric and
    logarithmic included) and Thm. 6 (p. 7, Poisson), applied by dp-accounting's
    ``RepeatAndSelectDpEvent`` to the candidate's RDP curve, then converted to ``(ε, δ)`` by the
    same accountant. An RDP bound: compare it with the candidate's own RDP ε, not a PLD one.

    Raises:
        ValueError: with ``mean < 1``, a bad ``shape`` or an empty history.
    """
    if not mean >= 1:
        raise ValueError(f"random search needs a mean number of candidates >= 1, got {mean!r}")
    if not history:
        raise ValueError("random_search_epsilon needs a history with a release")
    event, replace_one = _event(history)
    relation = dp_accounting.NeighboringRelation
    acc = RdpAccountant(
        orders=_ORDERS,
        neighboring_relation=relation.REPLACE_ONE if replace_one else relation.ADD_OR_REMOVE_ONE,
    )
    acc.compose(dp_event.RepeatAndSelectDpEvent(event, float(mean), repetition_shape(shape)))
    return float(acc.get_epsilon(delta))


def random_search_noise_std(
    *,
    target_epsilon: float,
    delta: float,
    plan: ReleasePlan,
    mean: float,
    shape: str | float = "poisson",
    epsilon_tolerance: float = 0.01,
    start: float = 1.0,
) -> float:
    """The noise std at which a random search over runs with the releases ``plan(std)`` spends
    ``target_epsilon`` in total at ``delta``: :func:`random_search_epsilon` of the run's
    releases, with ``mean`` candidates on average drawn from ``shape``, solved for the std by
    the bisection of :func:`~pl_privfed.privacy.calibrate_noise_std` (the total ε is within
    ``epsilon_tolerance`` below the target, never above it).

    Raises:
        ValueError: for a target that is not positive, ``mean < 1`` or a bad ``shape``.
    """
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise ValueError(f"target_epsilon must be positive, got {target_epsilon!r}")
    if not mean >= 1:
        raise ValueError(f"random search needs a mean number of candidates >= 1, got {mean!r}")
    repetition_shape(shape)

    def total(std: float) -> float:
        history = [
            {**mechanism.key().as_dict(), "releases": count}
            for mechanism, count in plan(std)
            if count > 0
        ]
        return random_search_epsilon(history, delta, mean, shape)

    return solve_for_epsilon(total, target_epsilon, delta, epsilon_tolerance, start=start)
