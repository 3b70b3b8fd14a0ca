"""Paper-style figures and tables from a sweep's ``results.csv``: ``pl-privfed report``.

Only finished runs are drawn. :func:`make_report` writes

* ``heatmap.png``: the highest test accuracy over (x, y), by default (β, γ), values annotated,
  one panel per value of every other parameter that varies (α, server normalization, ...), on
  one colour scale, as in paper 002 Figs. 4-8 and 11-12;
* ``heatmap_server_normalization_difference.png`` when ``server_normalization`` varies: with
  minus without server normalization, in accuracy points (paper 002 Fig. 12);
* ``curves.png``: training loss and test accuracy against rounds of the best y for each value
  of x, from the runs' ``curves.csv`` (paper 002 Figs. 3, 9, 13);
* ``table.md`` and ``table.csv``: method, β, γ (and every other varying parameter), final and
  best test accuracy, ε where present, sorted by method then best accuracy (paper 002 Tables 7
  and 10).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pl_privfed.callbacks.summary import finite_float
from pl_privfed.sweep import RESULT_COLUMNS

__all__ = ["load_results", "make_report"]

_NOT_PARAMETERS = {"run", "status", "run_dir", *RESULT_COLUMNS}
_SYMBOLS = {"beta": "β", "step_size": "γ", "alpha": "α", "epsilon": "ε", "delta": "δ"}
_SERVER_NORM = "server_normalization"


def _order(text: str) -> tuple:
    """Sort key: numbers numerically, then everything else as text."""
    value = finite_float(text)
    return (0, value, "") if value is not None else (1, 0.0, str(text))


def _symbol(column: str) -> str:
    return _SYMBOLS.get(column, column)


def load_results(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a ``results.csv`` written by :func:`pl_privfed.sweep.run_sweep`."""
    return _read_csv(path)[1]


def _read_csv(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]]]:
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _run_dir(row: dict[str, str], results_csv: Path) -> Path:
    """The run directory of a row: as recorded, else ``runs/<run>`` beside the CSV (a CSV read
    from another working directory or a moved sweep folder)."""
    recorded = Path(row.get("run_dir") or "")
    if row.get("run_dir") and recorded.is_dir():
        return recorded
    return results_csv.parent / "runs" / (row.get("run") or "")


def _method(row: dict[str, str], run_dir: Path) -> str:
    """The algorithm's class name from the run's ``summary.json`` (+ " + server norm")."""
    name, server_norm = "?", row.get(_SERVER_NORM) == "true"
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        summary = {}
    summary = summary if isinstance(summary, dict) else {}
    config = summary.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    algorithm = model.get("algorithm") if isinstance(model, dict) else None
    if isinstance(algorithm, dict) and algorithm.get("class_path"):
        name = str(algorithm["class_path"]).rsplit(".", 1)[-1]
        init_args = algorithm.get("init_args") or {}
        if _SERVER_NORM in init_args:
            server_norm = init_args[_SERVER_NORM] is True
    elif summary.get("algorithm"):
        name = str(summary["algorithm"]).split("(", 1)[0]
    return name + (" + server norm" if server_norm else "")


def _read_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    path = run_dir / "curves.csv"
    if not path.is_file():
        return curves
    with path.open(newline="") as f:
        for rec in csv.DictReader(f):
            step, value = finite_float(rec.get("round")), finite_float(rec.get("value"))
            if step is not None and value is not None:
                curves[rec.get("metric") or ""].append((int(step), value))
    return curves


def _best(rows: Iterable[dict[str, str]], metric: str) -> dict[str, str] | None:
    scored = [(s, r) for r in rows if (s := finite_float(r.get(metric))) is not None]
    return max(scored, key=lambda t: t[0])[1] if scored else None


def _cells(rows: Sequence[dict[str, str]], x: str, y: str, metric: str) -> dict[tuple, float]:
    """The highest ``metric`` per (x, y) cell, over every other column."""
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r[x], r[y])].append(r)
    out = {}
    for cell, members in groups.items():
        best = _best(members, metric)
        if best is not None:
            out[cell] = finite_float(best[metric])
    return out


def _draw_heatmap(
    ax,
    values: dict[tuple, float],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    title: str,
    bounds: tuple[float, float],
    diff: bool = False,
):
    """One annotated heatmap (values in accuracy points) on ``ax``; returns the image."""
    data = np.full((len(ys), len(xs)), np.nan)
    for (xv, yv), value in values.items():
        data[ys.index(yv), xs.index(xv)] = 100.0 * value
    cmap = colormaps["RdBu" if diff else "viridis"].with_extremes(bad="0.85")
    vmin, vmax = bounds
    image = ax.imshow(
        np.ma.masked_invalid(data), cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto"
    )
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(_symbol(x))
    ax.set_ylabel(_symbol(y))
    ax.set_title(title, fontsize=9)
    span = (vmax - vmin) or 1.0
    for i in range(len(ys)):
        for j in range(len(xs)):
            value = data[i, j]
            if not np.isfinite(value):
                continue
            level = (value - vmin) / span
            dark = abs(level - 0.5) > 0.3 if diff else level < 0.6
            ax.text(j, i, f"{value:+.1f}" if diff else f"{value:.1f}", ha="center", va="center",
                    fontsize=8, color="white" if dark else "black")  # fmt: skip
    return image


def _heatmap_figure(
    path: Path,
    panels: dict[tuple, dict[tuple, float]],
    columns: Sequence[str],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    title: str,
    diff: bool = False,
) -> Path:
    """One panel per facet value (``columns``), one shared colour scale; rows follow all
    facets but the last, columns the last one."""
    keys = sorted(panels, key=lambda k: tuple(_order(v) for v in k))
    bounds = _bounds((v for p in panels.values() for v in p.values()), symmetric=diff)
    if len(columns) >= 2:
        ncols = len({k[-1] for k in keys})
    else:
        ncols = min(len(keys), 4)
    nrows = math.ceil(len(keys) / ncols)
    width = max(3.6, 1.4 + 0.75 * len(xs))
    height = max(2.9, 1.3 + 0.5 * len(ys))
    fig = Figure(figsize=(width * ncols + 1.0, height * nrows), layout="constrained")
    image = None
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        label = f"{_facet_title(columns, key)}: {title}" if columns else title
        image = _draw_heatmap(
            ax, panels[key], xs, ys, x=x, y=y, title=label, bounds=bounds, diff=diff
        )
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label="accuracy points" if diff else "accuracy (%)")
    fig.savefig(path, dpi=120)
    return path


def _facet_title(columns: Sequence[str], values: Sequence[str]) -> str:
    return ", ".join(f"{_symbol(c)}={v}" for c, v in zip(columns, values, strict=True))


def _bounds(values: Iterable[float | None], symmetric: bool = False) -> tuple[float, float]:
    finite = [100.0 * v for v in values if v is not None]
    if not finite:
        return (-1.0, 1.0) if symmetric else (0.0, 100.0)
    if symmetric:
        bound = max(1e-6, max(abs(v) for v in finite))
        return -bound, bound
    low, high = min(finite), max(finite)
    return (low, high) if high > low else (low - 0.5, high + 0.5)


def make_report(
    results_csv: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    x: str = "beta",
    y: str = "step_size",
    facet: str | Sequence[str] | None = None,
    metric: str = "best_test_accuracy",
) -> list[Path]:
    """Write the heatmaps, the curves figure and the table of a sweep; return the written paths.

    Args:
        results_csv: a sweep's ``results.csv`` (:func:`pl_privfed.sweep.run_sweep`).
        out_dir: where to write (default ``report/`` beside the CSV).
        x: the column on the heatmaps' x axis, one curve per value (default β).
        y: the column on the heatmaps' y axis, tuned per x for the curves (default γ).
        facet: column(s) with one heatmap per value; default every other parameter that
            varies. Parameters that vary but are neither x, y nor a facet are maximized over.
        metric: the accuracy column of the heatmaps and of the choice of the best runs.

    Where the default x (``beta``) or y (``step_size``) is not a column of the CSV (a grid over
    other parameters), the first other parameter that varies takes its place.

    Raises:
        ValueError: when x, y or a facet is not a parameter column of the CSV.
    """
    results_csv = Path(results_csv)
    header, all_rows = _read_csv(results_csv)
    params = [c for c in header if c not in _NOT_PARAMETERS]
    facets_given = [facet] if isinstance(facet, str) else list(facet or [])
    varying_all = [c for c in params if len({r.get(c) for r in all_rows}) > 1]
    if x == "beta" and x not in params:  # the default x, a grid without β: its first parameter
        x = next((c for c in varying_all + params if c != y), x)
    if y == "step_size" and y not in params:
        y = next((c for c in varying_all + params if c != x), y)
    for role, column in [("x", x), ("y", y), *(("facet", f) for f in facets_given)]:
        if column not in params:
            raise ValueError(
                f"{role}={column!r} is not a parameter column of {results_csv}: {params}"
            )
    if x == y:
        raise ValueError(f"x and y must differ, got x=y={x!r}")
    out = Path(out_dir) if out_dir is not None else results_csv.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in all_rows if r.get("status") == "finished"]
    varying = [c for c in params if len({r.get(c) for r in rows}) > 1]
    facets = facets_given if facet is not None else [c for c in varying if c not in (x, y)]
    facets = [c for c in facets if c not in (x, y)]
    xs = sorted({r[x] for r in rows}, key=_order)
    ys = sorted({r[y] for r in rows}, key=_order)
    written: list[Path] = []

    # the highest accuracy over (x, y), one panel per facet value, one colour scale
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[c] for c in facets)].append(r)
    if groups:
        panels = {key: _cells(members, x, y, metric) for key, members in groups.items()}
        title = "highest test accuracy (%)" if metric == "best_test_accuracy" else f"{metric} (%)"
        written.append(
            _heatmap_figure(out / "heatmap.png", panels, facets, xs, ys, x=x, y=y, title=title)
        )

    # with minus without server normalization
    if _SERVER_NORM in varying and _SERVER_NORM not in (x, y):
        rest = [c for c in facets if c != _SERVER_NORM]
        sides: dict[tuple, dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            sides[tuple(r[c] for c in rest)][r[_SERVER_NORM]].append(r)
        diffs: dict[tuple, dict[tuple, float]] = {}
        for key, side in sides.items():
            on, off = _cells(side["true"], x, y, metric), _cells(side["false"], x, y, metric)
            diffs[key] = {c: on[c] - off[c] for c in on.keys() & off.keys()}
        written.append(
            _heatmap_figure(
                out / "heatmap_server_normalization_difference.png",
                diffs,
                rest,
                xs,
                ys,
                x=x,
                y=y,
                title="with − without server norm. (points)",
                diff=True,
            )
        )

    # training loss and test accuracy of the best y for each x
    if rows:
        fig = Figure(figsize=(11, 4), layout="constrained")
        loss_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        losses: list[float] = []
        others = [c for c in varying if c not in (x, y)]
        for xv in xs:
            best = _best((r for r in rows if r[x] == xv), metric)
            if best is None:
                continue
            curves = _read_curves(_run_dir(best, results_csv))
            label = ", ".join(f"{_symbol(c)}={best[c]}" for c in (x, y, *others))
            for ax, key in ((loss_ax, "train/loss"), (acc_ax, "test/acc")):
                if curves.get(key):
                    steps, values = zip(*sorted(curves[key]), strict=True)
                    ax.plot(steps, values, label=label, marker="." if len(steps) < 30 else None)
                    if key == "train/loss":
                        losses += values
        for ax, name in ((loss_ax, "training loss"), (acc_ax, "test accuracy")):
            ax.set_title(f"{name}, best {_symbol(y)} per {_symbol(x)}", fontsize=9)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        if losses and min(losses) > 0 and max(losses) > 10 * min(losses):  # orders of magnitude
            loss_ax.set_yscale("log")
        for ax in (acc_ax, loss_ax):
            if ax.lines:
                ax.legend(fontsize=7)
                break
        written.append(out / "curves.png")
        fig.savefig(written[-1], dpi=120)

    # the paper-style table
    swept = [x, y, *(c for c in varying if c not in (x, y, _SERVER_NORM))]
    with_eps = any(finite_float(r.get("epsilon")) is not None for r in rows)
    columns = ["method", *(_symbol(c) for c in swept), "final accuracy (%)", "best accuracy (%)"]
    columns += ["ε"] if with_eps else []
    table: list[tuple[tuple, list[str]]] = []
    for r in rows:
        method = _method(r, _run_dir(r, results_csv))
        final, best = finite_float(r.get("final_test_accuracy")), finite_float(r.get(metric))
        cells_ = [method, *(r.get(c) or "" for c in swept)]
        cells_ += ["" if v is None else f"{100 * v:.2f}" for v in (final, best)]
        if with_eps:
            eps = finite_float(r.get("epsilon"))
            cells_.append("" if eps is None else f"{eps:.3g}")
        table.append(((method, best is None, -(best or 0.0)), cells_))
    table.sort(key=lambda t: t[0])
    with (out / "table.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(cells_ for _, cells_ in table)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells_) + " |" for _, cells_ in table]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    written += [out / "table.md", out / "table.csv"]
    return written
