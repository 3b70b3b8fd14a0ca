"""``pl-privfed report``: the heatmaps, curves, tables and paper figures of one sweep."""

from __future__ import annotations

import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pl_privfed.report.configs import aggregate, best, check_selection_metric, warn_missing
from pl_privfed.report.figures import heatmap_figure
from pl_privfed.report.runs import (
    DEFAULT_METRIC,
    SERVER_NORM,
    load_results,
    params,
    paths,
    sorted_values,
    values,
)
from pl_privfed.report.stats import MIN_SEEDS
from pl_privfed.report.sweep_figures import (
    curves_figure,
    rounds_to_target_figure,
    transmissions_figure,
)
from pl_privfed.report.tables import sweep_tables
from pl_privfed.report.text import is_accuracy, scale
from pl_privfed.results import SEED_PARAMETERS

__all__ = ["make_report", "report_figures"]

_PARTICIPATION = ("participation_prob", "probability", "cohort_size")
#: the files of a report, in the order make_report writes them
_FILES = (
    "heatmap.png",
    "heatmap_server_normalization_difference.png",
    "curves.png",
    "table.md",
    "table.csv",
    "rounds_to_target.png",
    "accuracy_vs_transmissions.png",
)


@dataclass(frozen=True)
class _Layout:
    """What the heatmaps show: the axes' columns and values, the facets and the metric."""

    x: str
    y: str | None
    xs: list[str]
    ys: list[str]
    facets: list[str]
    metric: str
    scale: float
    names: list[str]


def _axes(
    config_params: list[str],
    varying: list[str],
    x: str,
    y: str | None,
    facets_given: list[str],
    where: Path,
) -> tuple[str, str | None]:
    """The heatmap's x and y: as given, or the first other varying parameter where the default
    β or γ is not a column; a one-parameter grid has no y."""
    if len(config_params) == 1 and (x, y) == ("beta", "step_size"):
        return config_params[0], None
    if x == "beta" and x not in config_params:
        x = next((c for c in varying + config_params if c != y), x)
    if y == "step_size" and y not in config_params:
        y = next((c for c in varying + config_params if c != x), y)
    for role, column in [("x", x), ("y", y), *(("facet", f) for f in facets_given)]:
        if column not in config_params:
            raise ValueError(
                f"{role}={column!r} is not a parameter column of {where}: {config_params}"
            )
    if x == y:
        raise ValueError(f"x and y must differ, got x=y={x!r}")
    return x, y


def _bounds(cells: pd.DataFrame, metric: str, vmin: float | None, vmax: float | None):
    """The heatmaps' colour range: as given, else the values' (an accuracy's too: on a 0-100 %
    scale 85 % and 94 % looked alike; a single value gets ±0.5 around it)."""
    low, high = cells["mean"].min(), cells["mean"].max()
    low, high = (low, high) if high > low else (low - 0.5, high + 0.5)
    return (low if vmin is None else vmin, high if vmax is None else vmax)


def _heatmaps(
    configs: pd.DataFrame,
    varying: list[str],
    layout: _Layout,
    vmin: float | None,
    vmax: float | None,
) -> dict[str, Figure]:
    """``heatmap.png`` and, when server normalization varies, the difference it makes."""
    x, y, metric, factor = layout.x, layout.y, layout.metric, layout.scale
    cells = best(configs, metric, [*layout.facets, x, y])
    if cells.empty:
        return {}
    low, high = cells[f"{metric}:low"], cells[f"{metric}:high"]
    seeds = cells.get(f"{metric}:values")
    seeds_text = [
        ", ".join(f"{v * factor:.1f}" for v in s) if isinstance(s, tuple) and len(s) > 1 else ""
        for s in (seeds if seeds is not None else [()] * len(cells))
    ]
    cells = cells.assign(
        mean=cells[f"{metric}:mean"] * factor, half=(high - low) / 2 * factor, seeds_text=seeds_text
    )
    name = metric.replace("_", " ").replace("val ", "validation ")
    counts = cells[f"{metric}:n"]
    if counts.max() <= 1:
        spread = "one seed a cell"
    elif counts.min() >= MIN_SEEDS:
        spread = "mean over seeds (± the 95 % t-interval's half-width)"
    else:
        spread = (
            f"mean over seeds (± the 95 % t-interval's half-width from {MIN_SEEDS} seeds; "
            "with 2, the seeds' values in brackets)"
        )
    title = f"{name}{' (%)' if is_accuracy(metric) else ''}, {spread}"
    unit = "validation accuracy (%)" if is_accuracy(metric) else metric
    figures = {
        "heatmap.png": heatmap_figure(
            cells,
            layout.facets,
            layout.xs,
            layout.ys,
            x=x,
            y=y,
            names=layout.names,
            title=title,
            bounds=_bounds(cells, metric, vmin, vmax),
            unit=unit,
        )
    }
    if SERVER_NORM in varying and SERVER_NORM not in (x, y):
        figures.update(_difference_figure(configs, layout))
    return figures


def _difference_figure(configs: pd.DataFrame, layout: _Layout) -> dict[str, Figure]:
    """With minus without server normalization, the best configuration per cell of each."""
    x, y, metric = layout.x, layout.y, layout.metric
    rest = [c for c in layout.facets if c != SERVER_NORM]
    sides = best(configs, metric, [*rest, SERVER_NORM, x, y]).set_index([*rest, x, y])
    on, off = (sides.loc[sides[SERVER_NORM] == v, f"{metric}:mean"] for v in ("true", "false"))
    diff = ((on - off).dropna() * layout.scale).rename("mean").reset_index().assign(half=math.nan)
    if diff.empty:
        return {}
    bound = max([1e-6, *diff["mean"].abs()])
    name = metric.replace("_", " ").replace("val ", "validation ")
    fig = heatmap_figure(
        diff,
        rest,
        layout.xs,
        layout.ys,
        x=x,
        y=y,
        names=layout.names,
        diff=True,
        title=f"with − without server normalization: {name}, in points",
        bounds=(-bound, bound),
        unit="points" if layout.scale == 100 else metric,
    )
    return {"heatmap_server_normalization_difference.png": fig}


def _paper_figures(
    configs: pd.DataFrame,
    runs: pd.DataFrame,
    config_params: list[str],
    varying: list[str],
    layout: _Layout,
) -> dict[str, Figure]:
    """``rounds_to_target.png`` (runs with a gradient-norm target) and
    ``accuracy_vs_transmissions.png`` (when the participation varies)."""
    figures = {}
    if runs["final_full_grad_norm"].notna().any():
        figures["rounds_to_target.png"] = rounds_to_target_figure(
            configs, config_params, layout.names
        )
    participation = next((c for c in _PARTICIPATION if c in varying), None)
    if participation is not None:
        fig = transmissions_figure(configs, participation, layout.metric, layout.names)
        if fig is not None:
            figures["accuracy_vs_transmissions.png"] = fig
    return figures


def report_figures(
    results_csv: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    x: str = "beta",
    y: str = "step_size",
    facet: str | Sequence[str] | None = None,
    metric: str = DEFAULT_METRIC,
    vmin: float | None = None,
    vmax: float | None = None,
) -> tuple[dict[str, Figure], dict[str, str], list[str]]:
    """The report of :func:`make_report` without writing it.

    Returns:
        The figures (file name -> :class:`~matplotlib.figure.Figure`), the tables (file name ->
        text) and the notes (figure panels left out, overlapping intervals).

    Raises:
        ValueError: as :func:`make_report`.
    """
    check_selection_metric(metric)
    files = paths(results_csv)
    if not files:
        raise ValueError("make_report needs at least one results.csv")
    runs = load_results(files)
    warn_missing(runs, metric, str(files[0]))  # and refuse a file with nothing to report
    config_params = [c for c in params(runs) if c not in SEED_PARAMETERS]
    varying = [c for c in config_params if runs[c].nunique() > 1]
    facets_given = [facet] if isinstance(facet, str) else list(facet or [])
    x, y = _axes(config_params, varying, x, y, facets_given, files[0])
    configs = aggregate(runs, config_params, [metric])
    facets = facets_given if facet is not None else [c for c in varying if c not in (x, y)]
    layout = _Layout(
        x=x,
        y=y,
        xs=sorted_values(configs[x]),
        ys=sorted_values(configs[y]) if y else [],
        facets=[c for c in facets if c not in (x, y)],
        metric=metric,
        scale=scale(metric, values(runs, metric)),
        names=list(configs["_algorithm"].unique()),
    )
    figures = _heatmaps(configs, varying, layout, vmin, vmax) if y else {}
    if y and not figures:
        warnings.warn(
            f"no finished run in {files[0]} has {metric}: no heatmap drawn",
            UserWarning,
            stacklevel=2,
        )
    curves, note = curves_figure(configs, x, y, varying, metric, layout.names)
    figures.update({"curves.png": curves} if curves is not None else {})
    figures.update(_paper_figures(configs, runs, config_params, varying, layout))
    notes = [f"curves.png: {note}"] if note else []
    tables, overlap = sweep_tables(configs, x, y, varying, metric, layout.names)
    notes += overlap
    if notes:
        tables["table.md"] += "\n## Notes\n\n" + "".join(f"- {n}\n" for n in notes)
    return figures, tables, notes


def make_report(
    results_csv: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike | None = None,
    *,
    x: str = "beta",
    y: str = "step_size",
    facet: str | Sequence[str] | None = None,
    metric: str = DEFAULT_METRIC,
    vmin: float | None = None,
    vmax: float | None = None,
) -> list[Path]:
    """Write the heatmaps, the curves figure and the table of a sweep; return the written paths
    (``heatmap.png``, ``heatmap_server_normalization_difference.png``, ``curves.png``,
    ``table.md``, ``table.csv``, ``rounds_to_target.png``, ``accuracy_vs_transmissions.png``,
    each when it has data).

    Args:
        results_csv: a sweep's ``results.csv`` (or its folder), or several (e.g. one grid per
            seed), read as one.
        out_dir: where to write (default ``report/`` beside the (first) CSV).
        x: the column on the heatmaps' x axis, one curve per value (default β).
        y: the column on the heatmaps' y axis, tuned per x for the curves (default the step
            size).
        facet: column(s) with one heatmap per value; default every other parameter that
            varies. Parameters that vary but are neither x, y nor a facet are maximized over
            (by the mean of ``metric``); seeds are averaged.
        metric: the validation column that selects configurations and fills the heatmaps
            (default ``final_val_accuracy``; ``best_val_accuracy`` is the best round's).
        vmin: the heatmaps' colour range's lower end, in the metric's units (percent for
            accuracies); default the values' minimum (an accuracy's too: the colours tell
            apart what the grid holds; give 0 and 100 for an absolute scale).
        vmax: its upper end; default the values' maximum.

    Where the default x (``beta``) or y (``step_size``) is not a column (a grid over other
    parameters), the first other parameter that varies takes its place. A grid over one
    parameter gets no heatmap: its curves (one per value) and table.

    Returns:
        The written files.

    Raises:
        ValueError: when a file is missing, not a results file, empty or without a finished
            run; when x, y or a facet is not a parameter column; for a test ``metric``.
    """
    figures, tables, _ = report_figures(
        results_csv, x=x, y=y, facet=facet, metric=metric, vmin=vmin, vmax=vmax
    )
    first = paths(results_csv)[0]
    first = first / "results.csv" if first.is_dir() else first
    out = Path(out_dir) if out_dir is not None else first.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in _FILES:
        if name in figures:
            figures[name].savefig(out / name, dpi=120)
        elif name in tables:
            (out / name).write_text(tables[name])
        else:
            continue
        written.append(out / name)
    return written
