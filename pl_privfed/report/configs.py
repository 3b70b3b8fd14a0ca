"""Configurations: the runs that differ only in their seed, aggregated, and the one selected on
a validation metric."""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import pandas as pd

from pl_privfed.report.runs import values
from pl_privfed.report.stats import interval_table
from pl_privfed.report.text import fmt_names
from pl_privfed.results import SEED_PARAMETERS, result_columns

__all__ = ["aggregate", "best", "check_selection_metric", "warn_missing"]


def aggregate(
    runs: pd.DataFrame, params: Sequence[str], metrics: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per configuration (``runs`` grouped by every parameter but the seeds, in
    first-seen order).

    Args:
        runs: :func:`~pl_privfed.report.load_results`'s table.
        params: the parameter columns (seeds among them are averaged over).
        metrics: columns to aggregate besides the result columns.

    Returns:
        Its parameter values, ``_method``, ``_algorithm``, ``seeds`` (its runs), ``_dirs``
        (their directories) and, for every result column ``m`` (and for ``metrics``),
        :func:`~pl_privfed.report.interval_table`'s ``m:n``, ``m:mean``, ``m:std``, ``m:low``,
        ``m:high`` over the seeds.
    """
    keys = [c for c in params if c not in SEED_PARAMETERS] or ["_all"]
    metrics = list(dict.fromkeys([*result_columns(), *metrics]))
    runs = runs.assign(_all="", **{m: values(runs, m) for m in metrics})
    grouped = runs.groupby(keys, sort=False, dropna=False)
    table = grouped.agg(
        _method=("_method", "first"),
        _algorithm=("_algorithm", "first"),
        seeds=("run", "size"),
        _dirs=("_dir", list),
    )
    stats = [interval_table(grouped[m]).add_prefix(f"{m}:") for m in metrics]
    return pd.concat([table, *stats], axis=1).reset_index().drop(columns="_all", errors="ignore")


def best(configs: pd.DataFrame, metric: str, by: Sequence[str] = ()) -> pd.DataFrame:
    """The configuration with the highest mean ``metric`` (a validation metric), per group of
    ``by`` (the first one on a tie)."""
    scored = configs.dropna(subset=[f"{metric}:mean"])
    if scored.empty or not by:
        return scored.loc[[scored[f"{metric}:mean"].idxmax()]] if len(scored) else scored
    return scored.loc[scored.groupby(list(by), sort=False)[f"{metric}:mean"].idxmax()]


def check_selection_metric(metric: str) -> None:
    """Refuse to select on the test set.

    Raises:
        ValueError: naming ``metric`` when it is a test metric.
    """
    if "test" in metric:
        raise ValueError(
            f"metric={metric!r} would select on the test set: select on a validation metric "
            "(final_val_accuracy, best_val_accuracy); the test accuracy is reported for the "
            "selected configurations"
        )


#: result columns that say what a run did, not how well: numbers in these alone leave a report
#: nothing to show (:func:`warn_missing` refuses such a file)
_BOOKKEEPING = ("best_val_round", "rounds", "wall_time_s", "client_transmissions")


def warn_missing(runs: pd.DataFrame, metric: str, where: str, stacklevel: int = 3) -> None:
    """Name in one warning the finished runs without a numeric ``metric`` (left out of the
    selection), those whose value is written but is not a finite number (``nan``, ``abc``: the
    results file's fault, not the run's) apart from those without one (no evaluation ran?),
    and the other result columns written but not as finite numbers (their cells stay empty).

    Raises:
        ValueError: naming the same, when no finished run has a number in any result column
            but the bookkeeping ones (rounds, wall time, round of the best, transmissions):
            nothing is left to report (before, a file whose accuracies and losses were all
            ``nan`` or text but whose rounds were numbers gave empty tables, exit 0).
    """
    missing = values(runs, metric).isna()
    unreadable = runs.get("_unreadable", pd.Series([{}] * len(runs), index=runs.index))
    bad = missing & unreadable.map(lambda cells: metric in cells)
    parts = []
    if bad.any():
        names = [f"{r} ({c[metric]!r})" for r, c in zip(runs["run"][bad], unreadable[bad])]
        parts.append(f"a {metric} that is not a finite number: {fmt_names(names)}")
    if (missing & ~bad).any():
        empty = runs.loc[missing & ~bad, "run"].tolist()
        parts.append(f"no {metric} (no evaluation ran?): {fmt_names(empty)}")
    others: dict[str, list[str]] = {}
    for run, cells in zip(runs["run"], unreadable):
        for column in (c for c in cells if c != metric):
            others.setdefault(column, []).append(f"{run} ({cells[column]!r})")
    listed = "; ".join(f"{column} of {fmt_names(names)}" for column, names in others.items())
    outcomes = [c for c in result_columns() if c not in _BOOKKEEPING]
    if len(runs) and all(values(runs, c).isna().all() for c in outcomes):
        found = "; ".join([*parts, *([f"not finite numbers: {listed}"] if listed else [])])
        raise ValueError(
            f"{where}: none of its {len(runs)} finished runs has a numeric result ({found}): "
            "nothing to report"
        )
    lines = (
        [
            f"{int(missing.sum())} of {len(runs)} finished runs in {where} have "
            f"{'; '.join(parts)}; they are left out of the heatmaps and the selection"
        ]
        if parts
        else []
    )
    if listed:
        lines.append(f"values in {where} that are not finite numbers are left out: {listed}")
    if lines:
        warnings.warn("; ".join(lines), UserWarning, stacklevel=stacklevel)
