"""The privacy–utility frontier's data: per method and target ε, the configuration selected on
validation, with its reported metric and certified ε over its seeds."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from pl_privfed.report.configs import aggregate, best, check_selection_metric, warn_missing
from pl_privfed.report.runs import (
    DEFAULT_METRIC,
    NULL,
    check_summaries,
    get,
    load_results,
    params,
    sorted_values,
    values,
)
from pl_privfed.report.selection_cost import SelectionCost, selection_cost, warn_note
from pl_privfed.report.stats import Interval
from pl_privfed.report.text import fmt_names
from pl_privfed.results import SEED_PARAMETERS, finite_float, result_columns

__all__ = [
    "FRONTIER_EPSILONS",
    "FRONTIER_SELECTION",
    "FrontierPoint",
    "frontier_points",
    "frontier_runs",
    "population",
]

#: what the frontier's figure, table and caption say about the selection
FRONTIER_SELECTION = "configuration selected on validation accuracy at each ε"
#: what the frontier's ε columns count (its table and caption)
FRONTIER_EPSILONS = (
    "certified ε: the selected runs alone; ε with selection: every candidate run composed "
    "(docs/privacy.md)"
)


@dataclass
class FrontierPoint:
    """One point of a privacy–utility frontier: the configuration selected on validation
    at one target ε (or the non-private one) of one method.

    Attributes:
        method: the method's label.
        target: the target ε as written in the results (``""`` for the non-private point).
        private: whether the runs add noise.
        selected: the selected configuration's hyperparameters (column → value).
        candidates: how many configurations were compared at this ε.
        test: the reported metric (test accuracy) over the selected configuration's seeds.
        val: the selection metric (validation accuracy) over the same seeds.
        certified: the ε the runs certified (column ``epsilon``) over the same seeds.
        adversary: against whom the runs certified it (``""`` when not recorded).
        rows: the selected configuration's run directories.
        values: the reported metric of each of those runs (that has it), as drawn.
        cost: what the selection among the candidates costs the training data
            (:class:`~pl_privfed.report.selection_cost.SelectionCost`; empty for a non-private
            point).
        clients: the population the runs trained on (their summaries' ``data.num_clients``;
            ``None`` when not recorded or not the same for every run).
        majority: the share of the test set's most common class (their summaries'
            ``data.test_majority_class``; ``None`` when not recorded or not the same).
    """

    method: str
    target: str
    private: bool
    selected: dict[str, str]
    candidates: int
    test: Interval
    val: Interval
    certified: Interval
    adversary: str
    rows: list[str]
    values: tuple[float, ...] = field(default=())
    cost: SelectionCost = field(default_factory=SelectionCost)
    clients: int | None = None
    majority: float | None = None

    @property
    def x(self) -> float:
        """Where the point lies on the ε axis: the mean certified ε, else the target."""
        if self.certified.n:
            return self.certified.mean
        return finite_float(self.target) or math.nan


def _config_target(summary: dict) -> str | None:
    """The target ε of a run from its summary (its privacy report's ``target_epsilon``, else its
    resolved config's), as text."""
    target = get(summary, "privacy", "target_epsilon")
    if finite_float(target) is None:
        target = get(summary, "config", "model", "algorithm", "init_args", "noise", "epsilon")
    return None if finite_float(target) is None else str(target)


def population(summaries: Iterable[object]) -> int | None:
    """The number of clients (agents) the runs of ``summaries`` trained on (``data.num_clients``),
    ``None`` when a run does not record it or the runs differ."""
    sizes = {get(s, "data", "num_clients") for s in summaries}
    if len(sizes) != 1:
        return None
    size = finite_float(sizes.pop())
    return None if size is None else int(size)


def majority_class(summaries: Iterable[object]) -> float | None:
    """The share of the test set's most common class that the runs of ``summaries`` recorded
    (``data.test_majority_class``: what a constant predictor scores), ``None`` when a run does
    not record it or the runs differ."""
    shares = {finite_float(get(s, "data", "test_majority_class")) for s in summaries}
    return shares.pop() if len(shares) == 1 else None


def _adversary(row: pd.Series) -> str:
    """Against whom the run's ε holds: the ``privacy_adversary`` or ``adversary`` column, else
    its summary's ``privacy.adversary``; ``""`` when not recorded."""
    for column in ("privacy_adversary", "adversary"):
        if row.get(column):
            return str(row[column])
    return str(get(row["_summary"], "privacy", "adversary") or "")


def _default_label(path: Path) -> str:
    """A results file's method label: its sweep folder's name without ``frontier_`` and
    ``_nonprivate`` (a private sweep and its non-private twin make one method); a folder given
    for its ``results.csv`` is that sweep folder."""
    name = (path if path.is_dir() else path.parent).name or path.stem
    return name.removeprefix("frontier_").removesuffix("_nonprivate") or name


def _finished(runs: pd.DataFrame, path: Path) -> pd.DataFrame:
    """The finished runs; the others are named in a warning."""
    unfinished = runs.loc[runs["status"] != "finished", "run"].tolist()
    if unfinished:
        warnings.warn(
            f"{len(unfinished)} of {len(runs)} runs in {path} did not finish and are left out "
            f"of the frontier: {fmt_names(unfinished)}",
            UserWarning,
            stacklevel=6,
        )
    return runs[runs["status"] == "finished"]


def _column(runs: pd.DataFrame, name: str, suffix: str) -> str | None:
    """The column ``name`` or the first one ending in ``suffix``."""
    return next((c for c in runs.columns if c == name or c.endswith(suffix)), None)


def _targets(runs: pd.DataFrame, target_col: str | None, noise_col: str | None) -> pd.Series:
    """Each run's target ε as text (``""`` for a non-private run): the column, else the run's
    config, else its certified ε."""
    noise_off = runs[noise_col].isin(NULL) if noise_col else pd.Series(False, runs.index)
    target = runs[target_col] if target_col else pd.Series("", runs.index)
    from_runs = [
        (_config_target(s) or f"{e:.3g}") if not t and math.isfinite(e) else t
        for t, e, s in zip(target, runs["epsilon"], runs["_summary"], strict=True)
    ]
    target = pd.Series(from_runs, index=runs.index).where(~noise_off, "")
    return target.map(lambda t: f"{v:g}" if (v := finite_float(t)) is not None else t)


def _method_runs(path: Path, label: str | None) -> pd.DataFrame:
    """One file's finished runs with ``_label`` (the method) and ``_target``."""
    runs = _finished(load_results(path, finished=False), path)
    check_summaries(runs)
    target_col = _column(runs, "target_epsilon", "noise.epsilon")
    noise_col = _column(runs, "noise", "init_args.noise")
    target = _targets(runs, target_col, noise_col)
    method = label or _default_label(path)
    if label is None and "method" in runs:
        method = runs["method"].where(runs["method"] != "", method)
    drop = [c for c in (target_col, noise_col, "method") if c in runs]
    return runs.drop(columns=drop).assign(_label=method, _target=target)


def frontier_runs(paths: Sequence[Path], labels: Sequence[str] | None) -> pd.DataFrame:
    """The finished runs of every file with ``_label`` (the method) and ``_target`` (the target
    ε as text, ``""`` for a non-private run); unfinished runs are named in a warning."""
    frames = []
    for i, path in enumerate(paths):  # a loop, not a comprehension: the warnings' stack level
        frames.append(_method_runs(path, labels[i] if labels else None))
    runs = pd.concat(frames, ignore_index=True)
    text = [c for c in params(runs) if c not in result_columns()]
    runs = runs.fillna(dict.fromkeys(text, ""))
    _refuse_repeats(runs)
    return runs


def _refuse_repeats(runs: pd.DataFrame) -> None:
    """Two finished runs of one method at one target with the same parameters and seed would
    be pooled as two seeds (a narrower interval than the runs support): refuse, naming them.
    They differ only outside the sweep's parameters, e.g. in arguments after ``--`` (which are
    part of a run's identity), or come from two records of the same sweep."""
    key = ["_label", "_target", *params(runs)]
    repeated = runs[runs.duplicated(key, keep=False)]
    if repeated.empty:
        return
    _, first = next(iter(repeated.groupby(key, sort=False, dropna=False)))
    names = [str(r.get("run") or r["_dir"]) for _, r in first.iterrows()]
    setting = ", ".join(f"{c}={first.iloc[0][c]}" for c in params(runs))
    raise ValueError(
        f"{first.iloc[0]['_label']}: runs {' and '.join(names)} have the same parameters and "
        f"seed ({setting}) and would be pooled as two seeds: they differ only outside the "
        "sweep's parameters (arguments after `--`, or two records of one sweep); keep one"
    )


def _point(
    method: str,
    target: str,
    members: pd.DataFrame,
    config_params: list[str],
    varying: list[str],
    metric: str,
    select: str,
    random_search: str | None = None,
) -> FrontierPoint | None:
    """The configuration of ``members`` (one method's runs at one target) selected on
    ``select``, ``None`` without one."""
    configs = aggregate(members, config_params, [metric, select]) if len(members) else members
    selected = best(configs, select) if len(members) else members
    if selected.empty:
        return None
    selected = selected.iloc[0]
    chosen = members[members["_dir"].isin(set(selected["_dirs"]))]
    adversaries = sorted({a for a in (_adversary(r) for _, r in chosen.iterrows()) if a})
    cost = SelectionCost()
    if target:
        cost = selection_cost(members, list(configs["_dirs"]), random_search)
        warn_note(method, target, cost)
    return FrontierPoint(
        method=method,
        target=target,
        private=bool(target),
        selected={c: v for c in varying if (v := selected[c])},
        candidates=len(configs),
        test=Interval.of(selected, metric),
        val=Interval.of(selected, select),
        certified=Interval.of(selected, "epsilon"),
        adversary="/".join(adversaries),
        rows=list(selected["_dirs"]),
        values=tuple(values(chosen, metric).dropna()),
        cost=cost,
        clients=population(chosen["_summary"]),
        majority=majority_class(chosen["_summary"]),
    )


def frontier_points(
    results_paths: Sequence[str | os.PathLike],
    *,
    metric: str = "final_test_accuracy",
    select: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
    random_search: str | None = None,
) -> list[FrontierPoint]:
    """The privacy–utility frontier of one or more sweeps, without drawing it.

    Every ``results.csv`` is one method (label: ``labels``, else a ``method`` column, else the
    sweep folder's name without ``frontier_``/``_nonprivate``; files with the same label are
    pooled, e.g. a private sweep and its non-private twin). Unfinished runs are left out with a
    warning. A finished run is *non-private* when its ``noise`` parameter is ``null`` or it
    certified no ε; the others are grouped by their target ε (the
    ``model.algorithm.init_args.noise.epsilon`` column, else the run's config). At each target
    ε, and for the non-private runs, the configuration (every non-seed parameter, e.g. the step
    size) with the best mean ``select`` (a validation metric) over its seeds is selected, and
    its ``metric`` (the test accuracy), certified ε (column ``epsilon``) and adversary are
    reported over its seeds (mean and 95 % interval). The certified ε is the selected runs'
    alone; choosing among the candidates is a release of every candidate run, and each private
    point carries its cost (:func:`~pl_privfed.report.selection_cost.selection_cost`): every
    candidate run (configurations × seeds) composed by the runs' accountant, and with
    ``random_search`` Papernot & Steinke's bound for random search (docs/privacy.md, "The
    selection's privacy cost").

    Args:
        results_paths: one sweep's ``results.csv`` (or its folder) each.
        metric: the reported metric.
        select: the validation metric that selects the configuration at each ε.
        labels: one method label per file.
        random_search: also the random-search bound, with the number of candidates drawn from
            this distribution (``"poisson"``, ``"geometric"``, ``"logarithmic"`` or a truncated
            negative binomial's η), its mean the number of configurations.

    Returns:
        The points, per method in input order: the private ones by target ε, then the
        non-private one.

    Raises:
        ValueError: without a results file, with a missing or unreadable file, with as many
            labels as files not given, with a test ``select`` metric, or when no run finished
            with ``select``.
    """
    check_selection_metric(select)
    if random_search is not None:
        from pl_privfed.privacy.selection import repetition_shape  # accounting: torch (Opacus)

        repetition_shape(random_search)  # a bad distribution fails before any accounting
    paths = [Path(p) for p in results_paths]
    if not paths:
        raise ValueError("the frontier needs at least one results.csv (one sweep per method)")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(
            f"--labels gives {len(labels)} label(s) for {len(paths)} results file(s): one each"
        )
    points: list[FrontierPoint] = []
    for method, rows in frontier_runs(paths, labels).groupby("_label", sort=False):
        warn_missing(rows, select, str(method))
        config_params = [c for c in params(rows) if c not in SEED_PARAMETERS]
        varying = [c for c in config_params if rows[c].nunique() > 1] or config_params
        for target in [*sorted_values(t for t in rows["_target"] if t), ""]:
            members = rows[rows["_target"] == target]
            point = _point(
                str(method), target, members, config_params, varying, metric, select, random_search
            )
            points += [point] if point else []
    if not points:
        raise ValueError(
            f"no finished run with a {select} value in {', '.join(map(str, paths))}: "
            "no frontier to draw"
        )
    return points
