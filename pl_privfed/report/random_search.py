"""A frontier at equal *total* ε: what a private random search over a family's grid selects.

The ordinary frontier (:mod:`~pl_privfed.report.frontier_data`) reports each family's best
configuration at a per-run ε, and the tuning's own privacy cost beside it. Here the tuning is
paid for inside the ε: every run of a sweep with ``calibration: random_search``
(:class:`~pl_privfed.privacy.DPNoise`) was calibrated so that Papernot & Steinke's random search
("Hyperparameter Tuning with Rényi Differential Privacy", ICLR 2022) — draw a random number
``K`` of candidates, each a configuration drawn uniformly from the grid, train them, release
only the one with the best validation accuracy — costs the target ε *in total*. The accuracy
such a search delivers is a random variable; its expectation is computed exactly from the
finished runs of the whole grid at one seed: with ``N`` configurations ranked by validation
accuracy (``j = 1`` the worst), the winner is the ``j``-th with probability
``E[(j/N)^K − ((j−1)/N)^K] = G(j/N) − G((j−1)/N)``, ``G`` the probability generating function
of ``K`` (:func:`candidate_count_pgf`); tied configurations share their probability evenly (a
random tie-break). Each seed is one independent search; the point is the mean over seeds with
its 95 % Student-t interval (three seeds or more; none below).
"""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import brentq

from pl_privfed.privacy.selection import repetition_shape
from pl_privfed.report.configs import check_selection_metric
from pl_privfed.report.frontier_data import frontier_runs, majority_class, population
from pl_privfed.report.runs import DEFAULT_METRIC, get, params
from pl_privfed.report.stats import MIN_SEEDS, Interval, mean_interval
from pl_privfed.results import SEED_PARAMETERS, finite_float

__all__ = [
    "MIN_SEEDS",
    "TotalPoint",
    "candidate_count_pgf",
    "expected_selected",
    "total_epsilon_points",
    "truncated_negative_binomial_gamma",
    "winner_probabilities",
]


def _tnb_mean(gamma: float, shape: float) -> float:
    """The mean of the truncated negative binomial with parameters ``γ`` and ``η = shape``
    (Papernot & Steinke, p. 5): ``η(1 − γ)/(γ(1 − γ^η))``, at ``η = 0`` (logarithmic)
    ``(1 − γ)/(γ log(1/γ))``."""
    if gamma >= 1:
        return 1.0
    log_gamma = math.log(gamma)
    if shape == 0:
        return (1 - gamma) / (-gamma * log_gamma)
    return shape * (1 - gamma) / (-gamma * math.expm1(shape * log_gamma))


def truncated_negative_binomial_gamma(mean: float, shape: float) -> float:
    """``γ`` of the truncated negative binomial of shape ``η`` with the given mean (the
    parameterization of dp-accounting's ``RepeatAndSelectDpEvent``; geometric: ``1/mean``).

    Raises:
        ValueError: with ``mean < 1`` or ``shape`` not a finite number ``>= 0``.
    """
    if not (mean >= 1 and math.isfinite(mean)):
        raise ValueError(f"the mean number of candidates must be >= 1, got {mean!r}")
    if not (shape >= 0 and math.isfinite(shape)):
        raise ValueError(f"a truncated negative binomial's shape must be >= 0, got {shape!r}")
    if mean == 1:
        return 1.0
    if shape == 1:
        return 1.0 / mean
    # the mean falls from infinity (γ → 0) to 1 (γ → 1): solve in log γ
    return math.exp(
        brentq(lambda lg: _tnb_mean(math.exp(lg), shape) - mean, -745.0, -1e-12, xtol=1e-14)
    )


def candidate_count_pgf(
    mean: float, distribution: str | float
) -> Callable[[np.ndarray], np.ndarray]:
    """The probability generating function ``G(x) = E[x^K]`` of the number of candidates
    ``K`` of a random search with the given mean: Poisson ``exp(μ(x − 1))`` (Papernot &
    Steinke Thm. 6, ``K = 0`` possible: ``G(0) = e^{−μ}``); truncated negative binomial of
    shape ``η`` (Thm. 2, ``K >= 1``) ``((1 − (1 − γ)x)^{−η} − 1)/(γ^{−η} − 1)``, at ``η = 0``
    (logarithmic) ``log(1 − (1 − γ)x)/log γ``, ``γ`` from the mean
    (:func:`truncated_negative_binomial_gamma`).

    Raises:
        ValueError: with ``mean < 1`` or a bad distribution
            (:func:`~pl_privfed.privacy.selection.repetition_shape`).
    """
    shape = repetition_shape(distribution)
    if not (mean >= 1 and math.isfinite(mean)):
        raise ValueError(f"the mean number of candidates must be >= 1, got {mean!r}")
    if math.isinf(shape):
        return lambda x: np.exp(mean * (np.asarray(x, dtype=float) - 1.0))
    gamma = truncated_negative_binomial_gamma(mean, shape)
    if gamma >= 1:
        return lambda x: np.asarray(x, dtype=float)  # K = 1 always
    if shape == 0:
        return lambda x: np.log1p(-(1 - gamma) * np.asarray(x, dtype=float)) / math.log(gamma)
    denominator = math.expm1(-shape * math.log(gamma))
    return lambda x: (
        np.expm1(-shape * np.log1p(-(1 - gamma) * np.asarray(x, dtype=float))) / (denominator)
    )


def winner_probabilities(
    validation: Sequence[float], mean: float, distribution: str | float
) -> np.ndarray:
    """The probability that each of ``N`` configurations is the one a random search releases:
    ``K`` candidates (``mean``, ``distribution``: :func:`candidate_count_pgf`) drawn uniformly
    with replacement from the configurations, the best ``validation`` released. With the
    configurations ranked from the worst, the best drawn is among the ``j`` worst with
    probability ``G(j/N)``; configurations with equal validation split their group's
    probability evenly, a non-finite validation ranks below every other. The probabilities sum
    to ``1 − G(0)``: with ``K = 0`` (Poisson) nothing is released.

    Raises:
        ValueError: without any configuration, or as :func:`candidate_count_pgf`.
    """
    scores = np.array([finite_float(v) for v in validation], dtype=float)
    if scores.size == 0:
        raise ValueError("a random search needs at least one candidate configuration")
    pgf = candidate_count_pgf(mean, distribution)
    n = scores.size
    scores = np.where(np.isfinite(scores), scores, -np.inf)
    levels, counts = np.unique(scores, return_counts=True)  # ascending
    upper = np.cumsum(counts)
    group = pgf(upper / n) - pgf((upper - counts) / n)
    return (group / counts)[np.searchsorted(levels, scores)]


def expected_selected(
    validation: Sequence[float],
    test: Sequence[float],
    mean: float,
    distribution: str | float,
    nothing: float = 0.0,
) -> float:
    """The expected ``test`` value of the configuration a random search releases
    (:func:`winner_probabilities`), ``nothing`` counted when it releases none (``K = 0``,
    Poisson only: 0 is the conservative count). A candidate without a finite test value (a
    diverged run) counts as 0.

    Raises:
        ValueError: when ``validation`` and ``test`` differ in length, or as
            :func:`winner_probabilities`.
    """
    if len(validation) != len(test):
        raise ValueError(
            f"validation and test need one value per configuration, got {len(validation)} "
            f"and {len(test)}"
        )
    probabilities = winner_probabilities(validation, mean, distribution)
    values = np.array([finite_float(v) or 0.0 for v in test], dtype=float)
    released = float(probabilities.sum())
    return float(probabilities @ values + max(0.0, 1.0 - released) * nothing)


@dataclass
class TotalPoint:
    """One method at one total ε: the expected test accuracy of its random search.

    Attributes:
        method: the method's label.
        target: the total ε of the search (``noise.epsilon`` of its runs).
        test: the expected test accuracy over the seeds (one search each; interval only from
            :data:`MIN_SEEDS` seeds).
        per_seed: each seed's expected test accuracy, by seed.
        candidates: the configurations of the grid (``N``).
        mean: the mean number of candidates ``E[K]`` the runs were calibrated for.
        distribution: the distribution of ``K``.
        run_epsilon: the ε each run certified alone (over every run of the point).
        adversary: against whom the ε holds.
        clients: the population (the datamodule's ``num_clients``; ``None`` when not recorded).
        best: each configuration's probability of being released, with its values (the most
            likely first).
        majority: the share of the test set's most common class (``None`` when not recorded).
    """

    method: str
    target: float
    test: Interval
    per_seed: dict[str, float]
    candidates: int
    mean: float
    distribution: str
    run_epsilon: Interval
    adversary: str
    clients: int | None
    best: list[tuple[str, float]] = field(default_factory=list)
    majority: float | None = None


def _search_settings(members: pd.DataFrame, where: str) -> tuple[float, str]:
    """The random search the runs were calibrated for, the same for every run."""
    settings = set()
    for summary in members["_summary"]:
        calibrated = get(summary, "privacy", "calibrated_for") or {}
        if get(summary, "privacy", "calibration") != "random_search":
            raise ValueError(
                f"{where}: a run was not calibrated for a random search (calibration: "
                f"{get(summary, 'privacy', 'calibration')!r}); the equal-total-ε frontier needs "
                "runs with noise.calibration: random_search"
            )
        settings.add((float(calibrated["search_mean"]), str(calibrated["search_distribution"])))
    if len(settings) != 1:
        raise ValueError(f"{where}: runs calibrated for different random searches: {settings}")
    return settings.pop()


def _config(row: pd.Series, varying: list[str]) -> str:
    return " ".join(f"{c}={row[c]}" for c in varying)


def total_epsilon_points(
    results_paths: Sequence[str | os.PathLike],
    *,
    metric: str = "final_test_accuracy",
    select: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
) -> list[TotalPoint]:
    """The equal-total-ε frontier of one or more sweeps run with ``calibration:
    random_search``: per method (a file, or ``labels``) and total ε, per seed the expected
    ``metric`` of what the random search the runs were calibrated for selects on ``select``
    (:func:`expected_selected` over that seed's finished runs, one per configuration of the
    grid), then the mean and interval over seeds. Non-private runs are left out.

    Raises:
        ValueError: without a results file, with a test ``select`` metric, when the runs of
            one point were calibrated for different searches or not for one, or when no point
            has a finished run.
    """
    check_selection_metric(select)
    paths = [Path(p) for p in results_paths]
    if not paths:
        raise ValueError("the equal-total-ε frontier needs at least one results.csv")
    runs = frontier_runs(paths, labels)
    points = []
    for (method, target), members in runs[runs["_target"] != ""].groupby(
        ["_label", "_target"], sort=False
    ):
        where = f"{method} at total ε = {target}"
        mean, distribution = _search_settings(members, where)
        seed = next(c for c in (*SEED_PARAMETERS, "_dir") if c in members)
        varying = [
            c for c in params(members) if c not in SEED_PARAMETERS and members[c].nunique() > 1
        ]
        per_seed, released = {}, {}
        sizes = set()
        for seed_value, grid in members.groupby(seed, sort=True):
            probabilities = winner_probabilities(grid[select].tolist(), mean, distribution)
            per_seed[str(seed_value)] = expected_selected(
                grid[select].tolist(), grid[metric].tolist(), mean, distribution
            )
            sizes.add(len(grid))
            for (_, row), p in zip(grid.iterrows(), probabilities, strict=True):
                key = _config(row, varying)
                released[key] = released.get(key, 0.0) + p / members[seed].nunique()
        if len(sizes) > 1:
            warnings.warn(
                f"{where}: the seeds have grids of {sorted(sizes)} finished configurations; "
                "each seed's search is computed over its own",
                UserWarning,
                stacklevel=2,
            )
        interval = mean_interval(per_seed.values())  # no interval under MIN_SEEDS seeds
        adversaries = sorted(
            {str(get(s, "privacy", "adversary") or "") for s in members["_summary"]}
        )
        points.append(
            TotalPoint(
                method=str(method),
                target=float(target),
                test=interval,
                per_seed=per_seed,
                candidates=max(sizes),
                mean=mean,
                distribution=distribution,
                run_epsilon=mean_interval(members["epsilon"]),
                adversary="/".join(a for a in adversaries if a),
                clients=population(members["_summary"]),
                majority=majority_class(members["_summary"]),
                best=sorted(released.items(), key=lambda kv: -kv[1]),
            )
        )
    if not points:
        raise ValueError(
            f"no finished private run in {', '.join(map(str, paths))}: no equal-total-ε frontier"
        )
    methods = list(dict.fromkeys(p.method for p in points))
    return sorted(points, key=lambda p: (methods.index(p.method), p.target))
