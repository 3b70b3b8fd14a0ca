"""Paper-style figures and tables from a sweep's ``results.csv``: ``pl-privfed report``.

Only finished runs are drawn. Runs that differ only in their seed (a parameter in
:data:`~pl_privfed.results.SEED_PARAMETERS`, e.g. ``seed: {values: [0, 1, 2]}``) are one
*configuration*: every number below is aggregated over its seeds as the mean, the sample standard
deviation and a 95 % Student-t interval (:func:`scipy.stats.t.interval`; none with one seed).
Every choice of a configuration — the best γ per β, the best cell of a heatmap, the run a curve
shows — is made on the **validation** metric (default ``final_val_accuracy``, the held-out split
of the training data at the last round); the test accuracy is only *reported*, for the selected
configurations. Accuracies are in percent everywhere (heatmaps, curves, tables).
:func:`make_report` writes

* ``heatmap.png``: the mean validation accuracy of the best configuration per (x, y) cell, by
  default (β, γ), annotated with the mean and the 95 % interval's half-width, one panel per value
  of every other parameter that varies (α, server normalization, ...), on a fixed colour range
  (``vmin``, ``vmax``; default 0–100 %), as in paper 002 Figs. 4-8 and 11-12;
* ``heatmap_server_normalization_difference.png`` when ``server_normalization`` varies: with
  minus without server normalization, in accuracy points (paper 002 Fig. 12);
* ``curves.png``: training loss and validation accuracy against rounds of the best y for each
  value of x and each method (both server-normalization variants), the mean over seeds with a
  95 % band (paper 002 Figs. 3, 9, 13);
* ``table.md`` and ``table.csv``: per method the configuration selected on validation with its
  test accuracy (mean ± std and 95 % interval), then every configuration, and notes where two
  methods' test intervals overlap (paper 002 Tables 7 and 10);
* ``rounds_to_target.png`` when the runs measured the full-gradient norm
  (:class:`~pl_privfed.callbacks.GradientNorm`): the fewest mean rounds to reach the target
  against the clipping threshold, one line per number of local steps, one panel per number of
  classes per client, as in paper 003 Figs. 1–2;
* ``accuracy_vs_transmissions.png`` when the participation probability varies: validation
  accuracy of the best configuration per ``p`` against the client-to-server transmissions
  ``k · p · M``, as in paper 004 Fig. 2.

:func:`compare_methods` (``pl-privfed compare``) draws the best configuration of each sweep side
by side; :func:`frontier` (``pl-privfed compare --frontier``) draws the privacy–utility frontier
of several sweeps: the test accuracy of the configuration selected on validation at each target
ε against the certified ε, one curve per method with a 95 % band over seeds, the non-private
accuracy beside it (``frontier.png``, ``frontier.csv``, ``frontier.md``).

Runs without the selection metric (no evaluation ran) are named in a warning, never drawn as
silent grey cells.
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats as scipy_stats

from pl_privfed.results import NON_PARAMETER_COLUMNS, SEED_PARAMETERS, finite_float

__all__ = [
    "FRONTIER_SELECTION",
    "Configuration",
    "FrontierPoint",
    "Interval",
    "aggregate",
    "compare_methods",
    "frontier",
    "frontier_points",
    "load_results",
    "make_report",
    "mean_interval",
    "overlap_notes",
]

_SYMBOLS = {"beta": "β", "step_size": "γ", "alpha": "α", "epsilon": "ε", "delta": "δ"}
_SERVER_NORM = "server_normalization"
_DEFAULT_METRIC = "final_val_accuracy"


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Interval:
    """A metric over the seeds of one configuration.

    Attributes:
        n: the number of seeds with a value.
        mean: their mean (``nan`` when ``n = 0``).
        std: their sample standard deviation (``ddof=1``; ``nan`` when ``n < 2``).
        low, high: the 95 % Student-t interval of the mean (``nan`` when ``n < 2``).
    """

    n: int
    mean: float
    std: float
    low: float
    high: float

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        """Whether the two 95 % intervals overlap (true when either is undefined)."""
        if not (math.isfinite(self.low) and math.isfinite(other.low)):
            return True
        return self.low <= other.high and other.low <= self.high

    def scaled(self, factor: float) -> Interval:
        return Interval(
            self.n, self.mean * factor, self.std * factor, self.low * factor, self.high * factor
        )


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean, sample standard deviation and Student-t interval of ``values``.

    The interval is :func:`scipy.stats.t.interval` with ``n − 1`` degrees of freedom around the
    mean with the standard error :func:`scipy.stats.sem`; with equal values it is the mean.

    >>> r = mean_interval([0.70, 0.72, 0.74])
    >>> round(r.mean, 4), round(r.std, 4), round(r.low, 4), round(r.high, 4)
    (0.72, 0.02, 0.6703, 0.7697)
    """
    data = np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
    n = len(data)
    if n == 0:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    mean = float(data.mean())
    if n == 1:
        return Interval(1, mean, math.nan, math.nan, math.nan)
    std = float(data.std(ddof=1))
    if std == 0:
        return Interval(n, mean, 0.0, mean, mean)
    low, high = scipy_stats.t.interval(confidence, df=n - 1, loc=mean, scale=scipy_stats.sem(data))
    return Interval(n, mean, std, float(low), float(high))


def _percent(metric: str) -> bool:
    return "accuracy" in metric or metric.endswith("/acc")


def _fmt(interval: Interval, scale: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (``mean`` alone with one seed; empty without a value)."""
    if interval.n == 0:
        return ""
    if interval.n == 1:
        return f"{interval.mean * scale:.{digits}f}"
    return f"{interval.mean * scale:.{digits}f} ± {interval.std * scale:.{digits}f}"


def _fmt_ci(interval: Interval, scale: float = 1.0, digits: int = 2) -> str:
    if interval.n < 2:
        return ""
    return f"[{interval.low * scale:.{digits}f}, {interval.high * scale:.{digits}f}]"


# --------------------------------------------------------------------------- reading


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


def _read_many(paths: Sequence[Path]) -> tuple[list[str], list[dict[str, str]]]:
    """The rows of several ``results.csv`` files (e.g. one grid per seed), columns united;
    each row remembers its file (for run directories recorded relative to it)."""
    header: list[str] = []
    rows: list[dict[str, str]] = []
    for path in paths:
        names, own = _read_csv(path)
        header += [c for c in names if c not in header]
        rows += [{**r, "_csv": str(path)} for r in own]
    return header, rows


def _run_dir(row: dict[str, str], results_csv: Path | None = None) -> Path:
    """The run directory of a row: as recorded, else ``runs/<run>`` beside the CSV (a CSV read
    from another working directory or a moved sweep folder)."""
    recorded = Path(row.get("run_dir") or "")
    if row.get("run_dir") and recorded.is_dir():
        return recorded
    base = Path(row["_csv"]).parent if row.get("_csv") else Path(results_csv or ".").parent
    return base / "runs" / (row.get("run") or "")


def _summary(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _method(row: dict[str, str], run_dir: Path) -> str:
    """The algorithm's class name from the run's ``summary.json``, ``DP-`` in front when the
    run is private (it adds noise), ``+ server norm`` behind when it normalizes the server
    step."""
    name, server_norm = "?", row.get(_SERVER_NORM) == "true"
    summary = _summary(run_dir)
    config = summary.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    algorithm = model.get("algorithm") if isinstance(model, dict) else None
    init_args: dict = {}
    if isinstance(algorithm, dict) and algorithm.get("class_path"):
        name = str(algorithm["class_path"]).rsplit(".", 1)[-1]
        init_args = algorithm.get("init_args") or {}
        if _SERVER_NORM in init_args:
            server_norm = init_args[_SERVER_NORM] is True
    elif summary.get("algorithm"):
        name = str(summary["algorithm"]).split("(", 1)[0]
    private = summary.get("private")
    if private is None:
        private = init_args.get("noise") is not None or finite_float(row.get("epsilon")) is not None
    if private and "DP" not in name:
        name = f"DP-{name}"
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


# --------------------------------------------------------------------------- configurations


@dataclass
class Configuration:
    """The finished runs of one setting of the non-seed parameters."""

    key: tuple[str, ...]
    values: dict[str, str]
    rows: list[dict[str, str]]
    method: str

    def stat(self, metric: str) -> Interval:
        return mean_interval(finite_float(r.get(metric)) for r in self.rows)


def aggregate(
    rows: Sequence[dict[str, str]], params: Sequence[str], results_csv: Path | None = None
) -> list[Configuration]:
    """Group finished ``rows`` by every parameter but the seeds (:data:`SEED_PARAMETERS`): one
    :class:`Configuration` per setting, in first-seen order."""
    keys = [c for c in params if c not in SEED_PARAMETERS]
    groups: dict[tuple, Configuration] = {}
    for row in rows:
        key = tuple(row.get(c, "") for c in keys)
        if key not in groups:
            method = _method(row, _run_dir(row, results_csv))
            groups[key] = Configuration(key, dict(zip(keys, key, strict=True)), [], method)
        groups[key].rows.append(row)
    return list(groups.values())


def _best(configs: Iterable[Configuration], metric: str) -> Configuration | None:
    """The configuration with the highest mean ``metric`` (a validation metric)."""
    scored = [(c.stat(metric).mean, c) for c in configs if c.stat(metric).n]
    return max(scored, key=lambda t: t[0])[1] if scored else None


def _cells(configs: Sequence[Configuration], x: str, y: str, metric: str) -> dict[tuple, Interval]:
    """The best configuration's ``metric`` per (x, y) cell, over every other column."""
    groups: dict[tuple, list[Configuration]] = defaultdict(list)
    for c in configs:
        groups[(c.values[x], c.values[y])].append(c)
    out = {}
    for cell, members in groups.items():
        best = _best(members, metric)
        if best is not None:
            out[cell] = best.stat(metric)
    return out


def _mean_curve(
    run_dirs: Sequence[Path], key: str
) -> tuple[list[int], np.ndarray, np.ndarray, np.ndarray] | None:
    """Mean of a curve over seeds at the rounds every seed logged, with a 95 % band."""
    curves = [dict(_read_curves(d).get(key, [])) for d in run_dirs]
    curves = [c for c in curves if c]
    if not curves:
        return None
    rounds = sorted(set.intersection(*(set(c) for c in curves)))
    if not rounds:
        return None
    stats = [mean_interval(c[r] for c in curves) for r in rounds]
    mean = np.array([s.mean for s in stats])
    low = np.array([s.low if math.isfinite(s.low) else s.mean for s in stats])
    high = np.array([s.high if math.isfinite(s.high) else s.mean for s in stats])
    return rounds, mean, low, high


def _plot_band(ax, xs, curve, scale: float, label: str, linestyle: str = "-", color=None):
    _, mean, low, high = curve
    line = ax.plot(xs, mean * scale, label=label, linestyle=linestyle, color=color,
                   marker="." if len(xs) < 30 else None)[0]  # fmt: skip
    if np.any(high > low):
        ax.fill_between(xs, low * scale, high * scale, color=line.get_color(), alpha=0.2)
    return line


# --------------------------------------------------------------------------- heatmaps


def _draw_heatmap(
    ax,
    values: dict[tuple, Interval],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    title: str,
    bounds: tuple[float, float],
    scale: float,
    diff: bool = False,
):
    """One annotated heatmap on ``ax`` (mean, and ± the 95 % half-width with several seeds);
    returns the image."""
    data = np.full((len(ys), len(xs)), np.nan)
    half = np.full((len(ys), len(xs)), np.nan)
    for (xv, yv), value in values.items():
        data[ys.index(yv), xs.index(xv)] = scale * value.mean
        half[ys.index(yv), xs.index(xv)] = scale * value.half_width
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
            level = min(max((value - vmin) / span, 0.0), 1.0)
            dark = abs(level - 0.5) > 0.3 if diff else level < 0.6
            text = f"{value:+.1f}" if diff else f"{value:.1f}"
            if np.isfinite(half[i, j]):
                text += f"\n±{half[i, j]:.1f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
    return image


def _heatmap_figure(
    path: Path,
    panels: dict[tuple, dict[tuple, Interval]],
    columns: Sequence[str],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    title: str,
    bounds: tuple[float, float],
    scale: float,
    unit: str,
    diff: bool = False,
) -> Path:
    """One panel per facet value (``columns``), one colour range (``bounds``); rows follow all
    facets but the last, columns the last one."""
    keys = sorted(panels, key=lambda k: tuple(_order(v) for v in k))
    if len(columns) >= 2:
        ncols = len({k[-1] for k in keys})
    else:
        ncols = min(len(keys), 4)
    nrows = math.ceil(len(keys) / ncols)
    width = max(3.6, 1.4 + 0.8 * len(xs))
    height = max(2.9, 1.3 + 0.6 * len(ys))
    fig = Figure(figsize=(width * ncols + 1.0, height * nrows), layout="constrained")
    image = None
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        label = f"{_facet_title(columns, key)}: {title}" if columns else title
        image = _draw_heatmap(ax, panels[key], xs, ys, x=x, y=y, title=label, bounds=bounds,
                              scale=scale, diff=diff)  # fmt: skip
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label=unit)
    fig.savefig(path, dpi=120)
    return path


def _facet_title(columns: Sequence[str], values: Sequence[str]) -> str:
    return ", ".join(f"{_symbol(c)}={v}" for c, v in zip(columns, values, strict=True))


def _symmetric_bound(values: Iterable[Interval], scale: float) -> tuple[float, float]:
    finite = [abs(scale * v.mean) for v in values if v.n]
    bound = max([1e-6, *finite])
    return -bound, bound


def _auto_bounds(values: Iterable[Interval], scale: float) -> tuple[float, float]:
    finite = [scale * v.mean for v in values if v.n]
    if not finite:
        return 0.0, 1.0
    low, high = min(finite), max(finite)
    return (low, high) if high > low else (low - 0.5, high + 0.5)


def _check_selection_metric(metric: str) -> None:
    if "test" in metric:
        raise ValueError(
            f"metric={metric!r} would select on the test set: select on a validation metric "
            "(final_val_accuracy, best_val_accuracy); the test accuracy is reported for the "
            "selected configurations"
        )


def _warn_missing(rows: Sequence[dict[str, str]], metric: str, where: str) -> None:
    missing = [r.get("run", "?") for r in rows if finite_float(r.get(metric)) is None]
    if missing:
        shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
        warnings.warn(
            f"{len(missing)} of {len(rows)} finished runs in {where} have no {metric} (no "
            f"evaluation ran?): {shown}; they are left out of the heatmaps and the selection",
            UserWarning,
            stacklevel=3,
        )


# --------------------------------------------------------------------------- the report


def make_report(
    results_csv: str | os.PathLike | Sequence[str | os.PathLike],
    out_dir: str | os.PathLike | None = None,
    *,
    x: str = "beta",
    y: str = "step_size",
    facet: str | Sequence[str] | None = None,
    metric: str = _DEFAULT_METRIC,
    vmin: float | None = None,
    vmax: float | None = None,
) -> list[Path]:
    """Write the heatmaps, the curves figure and the table of a sweep; return the written paths.

    Args:
        results_csv: a sweep's ``results.csv`` (:func:`pl_privfed.sweep.run_sweep`), or several
            (e.g. one grid per seed), read as one.
        out_dir: where to write (default ``report/`` beside the (first) CSV).
        x: the column on the heatmaps' x axis, one curve per value (default β).
        y: the column on the heatmaps' y axis, tuned per x for the curves (default γ).
        facet: column(s) with one heatmap per value; default every other parameter that
            varies. Parameters that vary but are neither x, y nor a facet are maximized over
            (by the mean of ``metric``); seeds are averaged.
        metric: the validation column that selects configurations and fills the heatmaps
            (default ``final_val_accuracy``; ``best_val_accuracy`` is the best round's). A test
            column is refused.
        vmin, vmax: the heatmaps' colour range, in the metric's units (percent for
            accuracies); default 0 and 100 for an accuracy, else the values' range.

    Where the default x (``beta``) or y (``step_size``) is not a column of the CSV (a grid over
    other parameters), the first other parameter that varies takes its place. A grid over one
    parameter gets no heatmap: its curves (one per value) and table.

    Raises:
        ValueError: when x, y or a facet is not a parameter column of the CSV, or ``metric``
            is a test metric.
    """
    _check_selection_metric(metric)
    paths = (
        [Path(results_csv)]
        if isinstance(results_csv, str | os.PathLike)
        else [Path(p) for p in results_csv]
    )
    if not paths:
        raise ValueError("make_report needs at least one results.csv")
    results_csv = paths[0]
    header, all_rows = _read_many(paths)
    params = [c for c in header if c not in NON_PARAMETER_COLUMNS]
    config_params = [c for c in params if c not in SEED_PARAMETERS]
    facets_given = [facet] if isinstance(facet, str) else list(facet or [])
    varying_all = [c for c in config_params if len({r.get(c) for r in all_rows}) > 1]
    one_parameter = len(config_params) == 1 and (x, y) == ("beta", "step_size")
    if one_parameter:  # a one-dimensional grid: no heatmap; curves and table per value
        x, y = config_params[0], None
    elif x == "beta" and x not in config_params:  # the default x, a grid without β
        x = next((c for c in varying_all + config_params if c != y), x)
    if y == "step_size" and y not in config_params:
        y = next((c for c in varying_all + config_params if c != x), y)
    for role, column in [("x", x), ("y", y), *(("facet", f) for f in facets_given)]:
        if column not in config_params and not (role == "y" and one_parameter):
            raise ValueError(
                f"{role}={column!r} is not a parameter column of {results_csv}: {config_params}"
            )
    if x == y:
        raise ValueError(f"x and y must differ, got x=y={x!r}")
    out = Path(out_dir) if out_dir is not None else results_csv.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in all_rows if r.get("status") == "finished"]
    _warn_missing(rows, metric, str(results_csv))
    configs = aggregate(rows, config_params, results_csv)
    varying = [c for c in config_params if len({r.get(c) for r in rows}) > 1]
    facets = facets_given if facet is not None else [c for c in varying if c not in (x, y)]
    facets = [c for c in facets if c not in (x, y)]
    xs = sorted({c.values[x] for c in configs}, key=_order)
    ys = sorted({c.values[y] for c in configs}, key=_order) if y is not None else []
    percent = _percent(metric)
    scale = 100.0 if percent else 1.0
    unit = "validation accuracy (%)" if percent else metric
    written: list[Path] = []

    # the mean validation metric over (x, y), one panel per facet value, one colour range
    groups: dict[tuple, list[Configuration]] = defaultdict(list)
    for c in configs:
        groups[tuple(c.values[f] for f in facets)].append(c)
    panels = {key: _cells(members, x, y, metric) for key, members in groups.items()} if y else {}
    if any(panels.values()):
        if percent:
            bounds = (0.0 if vmin is None else vmin, 100.0 if vmax is None else vmax)
        else:
            auto = _auto_bounds((v for p in panels.values() for v in p.values()), scale)
            bounds = (auto[0] if vmin is None else vmin, auto[1] if vmax is None else vmax)
        name = metric.replace("_", " ").replace("val ", "validation ")
        title = f"{name} (%), mean over seeds" if percent else f"{name}, mean over seeds"
        written.append(_heatmap_figure(out / "heatmap.png", panels, facets, xs, ys, x=x, y=y,
                                       title=title, bounds=bounds, scale=scale, unit=unit))  # fmt: skip
    elif rows and y is not None:
        warnings.warn(
            f"no finished run in {results_csv} has {metric}: no heatmap drawn",
            UserWarning,
            stacklevel=2,
        )

    # with minus without server normalization
    if _SERVER_NORM in varying and _SERVER_NORM not in (x, y) and any(panels.values()):
        rest = [c for c in facets if c != _SERVER_NORM]
        sides: dict[tuple, dict[str, list[Configuration]]] = defaultdict(lambda: defaultdict(list))
        for c in configs:
            sides[tuple(c.values[f] for f in rest)][c.values[_SERVER_NORM]].append(c)
        diffs: dict[tuple, dict[tuple, Interval]] = {}
        for key, side in sides.items():
            on, off = _cells(side["true"], x, y, metric), _cells(side["false"], x, y, metric)
            diffs[key] = {
                c: Interval(1, on[c].mean - off[c].mean, math.nan, math.nan, math.nan)
                for c in on.keys() & off.keys()
            }
        bound = _symmetric_bound((v for p in diffs.values() for v in p.values()), scale)
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
                bounds=bound,
                scale=scale,
                unit="points" if percent else metric,
                diff=True,
            )
        )

    if rows:
        written.append(_curves_figure(out / "curves.png", configs, x, y, varying, metric))
    written += _write_tables(out, configs, x, y, varying, metric)
    if any(finite_float(r.get("final_full_grad_norm")) is not None for r in rows):
        written.append(
            _rounds_to_target_figure(out / "rounds_to_target.png", configs, config_params)
        )
    participation = next((c for c in _PARTICIPATION if c in varying), None)
    if participation is not None:
        path = _transmissions_figure(
            out / "accuracy_vs_transmissions.png", configs, participation, metric
        )
        if path is not None:
            written.append(path)
    return written


def _curves_figure(
    path: Path,
    configs: Sequence[Configuration],
    x: str,
    y: str | None,
    varying: Sequence[str],
    metric: str,
) -> Path:
    """Training loss and validation accuracy (%) of the best y for each x and each method
    (with and without server normalization), mean over seeds with a 95 % band."""
    fig = Figure(figsize=(11, 4), layout="constrained")
    loss_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
    losses: list[float] = []
    others = [c for c in varying if c not in (x, y, _SERVER_NORM)]
    methods = sorted({c.method for c in configs})
    styles = ["-", "--", ":", "-."]
    colors: dict[str, object] = {}
    for m_index, method in enumerate(methods):
        for xv in sorted({c.values[x] for c in configs}, key=_order):
            members = [c for c in configs if c.values[x] == xv and c.method == method]
            best = _best(members, metric)
            if best is None:
                continue
            dirs = [_run_dir(r) for r in best.rows]
            label = ", ".join(f"{_symbol(c)}={best.values[c]}" for c in (x, y, *others) if c)
            label = f"{method}: {label}" if len(methods) > 1 else label
            if best.stat(metric).n > 1:
                label += f" ({best.stat(metric).n} seeds)"
            for ax, key, scale in ((loss_ax, "train/loss", 1.0), (acc_ax, "val/acc", 100.0)):
                curve = _mean_curve(dirs, key)
                if curve is None:
                    continue
                style = styles[m_index % len(styles)]
                line = _plot_band(ax, curve[0], curve, scale, label, style, colors.get(xv))
                colors.setdefault(xv, line.get_color())
                if key == "train/loss":
                    losses += list(curve[1])
    for ax, name in ((loss_ax, "training loss"), (acc_ax, "validation accuracy (%)")):
        tuned = f"best {_symbol(y)} per {_symbol(x)}" if y else f"per {_symbol(x)}"
        ax.set_title(f"{name}, {tuned}; mean over seeds, 95 % band", fontsize=9)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    acc_ax.set_ylabel("%")
    if losses and min(losses) > 0 and max(losses) > 10 * min(losses):  # orders of magnitude
        loss_ax.set_yscale("log")
    for ax in (acc_ax, loss_ax):
        if ax.lines:
            ax.legend(fontsize=7)
            break
    fig.savefig(path, dpi=120)
    return path


def _epsilon(config: Configuration) -> str:
    eps = config.stat("epsilon")
    return "" if eps.n == 0 else f"{eps.mean:.3g}"


def _write_tables(
    out: Path,
    configs: Sequence[Configuration],
    x: str,
    y: str | None,
    varying: Sequence[str],
    metric: str,
) -> list[Path]:
    """``table.md`` (the configuration selected on validation per method with its test
    accuracy, every configuration, notes on overlapping intervals) and ``table.csv``."""
    swept = [c for c in (x, y) if c] + [c for c in varying if c not in (x, y, _SERVER_NORM)]
    with_eps = any(c.stat("epsilon").n for c in configs)
    selected: dict[str, Configuration] = {}
    for method in sorted({c.method for c in configs}):
        best = _best((c for c in configs if c.method == method), metric)
        if best is not None:
            selected[method] = best
    val_name = "val" if metric == _DEFAULT_METRIC else metric
    columns = ["method", *(_symbol(c) for c in swept), "seeds", f"{val_name} accuracy (%)",
               f"{val_name} 95 % CI", "test accuracy (%)", "test 95 % CI",
               "best val accuracy (%)"]  # fmt: skip
    columns += ["ε"] if with_eps else []

    def cells(c: Configuration) -> list[str]:
        val, test = c.stat(metric), c.stat("final_test_accuracy")
        row = [c.method, *(c.values.get(s, "") for s in swept), str(len(c.rows))]
        row += [_fmt(val, 100), _fmt_ci(val, 100), _fmt(test, 100), _fmt_ci(test, 100)]
        row += [_fmt(c.stat("best_val_accuracy"), 100)]
        return row + ([_epsilon(c)] if with_eps else [])

    def order(c: Configuration) -> tuple:
        mean = c.stat(metric).mean
        return (c.method, not math.isfinite(mean), -(mean if math.isfinite(mean) else 0.0))

    ordered = sorted(configs, key=order)
    chosen = {id(c) for c in selected.values()}
    with (out / "table.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*columns, "selected"])
        writer.writerows([*cells(c), "yes" if id(c) in chosen else ""] for c in ordered)

    def md(rows_: list[list[str]]) -> list[str]:
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        return lines + ["| " + " | ".join(r) + " |" for r in rows_]

    lines = [f"## Selected on validation ({metric}), with their test accuracy", ""]
    lines += md([cells(c) for c in selected.values()])
    lines += ["", "## Every configuration", "", *md([cells(c) for c in ordered])]
    notes = overlap_notes({m: c.stat("final_test_accuracy") for m, c in selected.items()})
    if notes:
        lines += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    return [out / "table.md", out / "table.csv"]


def overlap_notes(intervals: dict[str, Interval], what: str = "test accuracy") -> list[str]:
    """One sentence per pair of labels whose 95 % intervals of ``what`` overlap (the data do
    not separate them), or that cannot be compared (a single seed)."""
    notes = []
    labels = [k for k, v in intervals.items() if v.n]
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            ia, ib = intervals[a], intervals[b]
            if ia.n < 2 or ib.n < 2:
                notes.append(
                    f"{a} and {b}: {what} from {ia.n} and {ib.n} seed(s): no interval, the "
                    "difference is not established"
                )
            elif ia.overlaps(ib):
                notes.append(
                    f"{a} and {b}: the 95 % intervals of {what} overlap "
                    f"({_fmt_ci(ia, 100)} and {_fmt_ci(ib, 100)} %): the difference is not "
                    f"established at {min(ia.n, ib.n)} seeds"
                )
    return notes


_PARTICIPATION = ("participation_prob", "probability", "cohort_size")
_CLIP = ("clip_threshold", "threshold")
_STEPS = ("steps", "local_batches")
_FACETS = ("classes_per_client", "concentration")


def _none_last(text: str) -> tuple:
    return (1, 0.0, "") if text in ("null", "None", "") else (0, *_order(text)[1:])


def _rounds_to_target_figure(
    path: Path, configs: Sequence[Configuration], params: list[str]
) -> Path:
    """Paper 003 Figs. 1-2: fewest mean rounds (over seeds) to the gradient-norm target against
    the clipping threshold (``null`` = no clipping, drawn last as "none"), one line per
    local-step count, one panel per heterogeneity level; a configuration counts only if every
    seed reached the target; cells that never did are drawn as × at the top."""
    x = next((c for c in _CLIP if c in params), None) or params[0]
    series = next((c for c in _STEPS if c in params and c != x), None)
    facet = next((c for c in _FACETS if c in params and c not in (x, series)), None)
    facets = sorted({c.values.get(facet, "") for c in configs}, key=_order) if facet else [""]
    xs = sorted({c.values[x] for c in configs}, key=_none_last)
    ceiling = max((finite_float(r.get("rounds")) or 0.0 for c in configs for r in c.rows),
                  default=1.0)  # fmt: skip
    fig = Figure(figsize=(4.6 * len(facets), 3.6), layout="constrained")
    for k, fv in enumerate(facets):
        ax = fig.add_subplot(1, len(facets), k + 1)
        members = [c for c in configs if not facet or c.values.get(facet) == fv]
        for sv in sorted({c.values.get(series, "") for c in members} if series else {""},
                         key=_order):  # fmt: skip
            best: list[float] = []
            for xv in xs:
                cell = [c for c in members
                        if c.values[x] == xv and (not series or c.values.get(series) == sv)]  # fmt: skip
                reached = [c.stat("rounds_to_target") for c in cell]
                reached = [s.mean for s, c in zip(reached, cell, strict=True)
                           if s.n and s.n == len(c.rows)]  # fmt: skip
                best.append(min(reached) if reached else math.nan)
            label = f"{_symbol(series)}={sv}" if series else None
            line = ax.plot(range(len(xs)), best, marker="o", label=label)[0]
            missing = [i for i, v in enumerate(best) if math.isnan(v)]
            ax.plot(missing, [ceiling] * len(missing), "x", color=line.get_color())
        ax.set_xticks(range(len(xs)), [("none" if v in ("null", "None") else v) for v in xs])
        ax.set_xlabel(f"{_symbol(x)} (clipping threshold)" if x in _CLIP else _symbol(x))
        ax.set_ylabel("rounds to target (mean over seeds)")
        ax.set_title(f"{facet}={fv}" if facet else "rounds to ||∇f|| target", fontsize=9)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return path


def _transmissions_figure(
    path: Path, configs: Sequence[Configuration], column: str, metric: str
) -> Path | None:
    """Paper 004 Fig. 2: validation accuracy (%) of the best configuration per participation
    value against the cumulative client-to-server transmissions, mean over seeds with a band."""
    fig = Figure(figsize=(5.5, 4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for value in sorted({c.values[column] for c in configs}, key=_order):
        best = _best((c for c in configs if c.values[column] == value), metric)
        if best is None:
            continue
        sent = best.stat("client_transmissions").mean
        rounds = best.stat("rounds").mean
        curve = _mean_curve([_run_dir(r) for r in best.rows], "val/acc")
        if curve is None or not math.isfinite(sent) or not rounds:
            continue
        per_round = sent / rounds
        _plot_band(ax, [k * per_round for k in curve[0]], curve, 100.0, f"{column}={value}")
    if not ax.lines:
        return None
    ax.set_xlabel("client-to-server transmissions (k · p · M)")
    ax.set_ylabel("validation accuracy (%)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return path


def _sent_bits_per_round(summary: dict) -> float | None:
    """Mean bits one agent or client *sends* per round: the per-agent totals of every channel but
    the server's broadcast, divided by the rounds run."""
    totals = summary.get("communication_total_bits_per_agent")
    rounds = finite_float(summary.get("rounds"))
    if not isinstance(totals, dict) or not rounds:
        return None
    sent = [finite_float(v) for k, v in totals.items() if k != "server_to_client"]
    sent = [v for v in sent if v is not None]
    return sum(sent) / rounds if sent else None


def _utility_curve(run_dirs: Sequence[Path]):
    """``||∇f(x̄)||²`` over rounds (the runs' GradientNorm histories), mean over seeds."""
    histories = []
    for d in run_dirs:
        history = (_summary(d).get("full_grad_norm") or {}).get("history") or []
        histories.append({int(r): float(v) ** 2 for r, v in history})
    histories = [h for h in histories if h]
    if not histories:
        return None
    rounds = sorted(set.intersection(*(set(h) for h in histories)))
    stats = [mean_interval(h[r] for h in histories) for r in rounds]
    mean = np.array([s.mean for s in stats])
    low = np.array([s.low if math.isfinite(s.low) else s.mean for s in stats])
    high = np.array([s.high if math.isfinite(s.high) else s.mean for s in stats])
    return rounds, mean, low, high


def compare_methods(
    results_csvs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = _DEFAULT_METRIC,
) -> list[Path]:
    """Side by side, the best configuration of each sweep against rounds and against bits
    (paper 001 §5), aggregated over seeds.

    One sweep per method (e.g. ``paper001_a9a_porter_dp_eps0.01`` and
    ``paper001_a9a_soteriafl_eps0.01``, each tuning its step sizes over several seeds). From
    each ``results.csv`` the configuration with the highest mean validation ``metric`` is drawn,
    as paper 001 Figs. 2–3 draw the best-tuned runs: the train utility ``||∇f(x̄)||²`` (from the
    runs' :class:`~pl_privfed.callbacks.GradientNorm` histories) and the validation accuracy
    (%, ``curves.csv``), each the mean over seeds with a 95 % band, against the round and
    against the bits one agent sent (``round ×`` the mean bits sent per agent per round: every
    channel but the server's broadcast down). Writes ``comparison.png``, ``comparison.csv``
    (method, the selected parameters, seeds, validation and test accuracy as mean ± std with
    their 95 % intervals, final utility, bits sent per agent, ε) and ``comparison.md`` (the
    table and a note for every pair of methods whose test intervals overlap).

    Raises:
        ValueError: with no results file, a file without a finished run, or a test metric.
    """
    _check_selection_metric(metric)
    if not results_csvs:
        raise ValueError("compare_methods needs at least one results.csv")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(10, 7), layout="constrained")
    axes = [fig.add_subplot(2, 2, k + 1) for k in range(4)]
    header_row = ["method", "seeds", "val accuracy (%)", "val 95 % CI", "test accuracy (%)",
                  "test 95 % CI", "final utility", "bits sent per agent", "ε"]  # fmt: skip
    table: list[list[str]] = []
    tests: dict[str, Interval] = {}
    for path in map(Path, results_csvs):
        header, rows = _read_many([path])
        finished = [r for r in rows if r.get("status") == "finished"]
        _warn_missing(finished, metric, str(path))
        params = [c for c in header if c not in NON_PARAMETER_COLUMNS and c not in SEED_PARAMETERS]
        best = _best(aggregate(finished, params, path), metric)
        if best is None:
            raise ValueError(f"{path} has no finished run with a {metric} value")
        varying = [c for c in params if len({r.get(c) for r in rows}) > 1]
        # raw names: the Greek letters of the α-NormEC grids mean other things here (η, γ)
        setting = ", ".join(f"{c}={best.values[c]}" for c in varying)
        label = f"{best.method} ({setting})" if setting else best.method
        if label in tests:  # the same method twice (e.g. two privacy levels): name the file
            label += f" [{path.parent.name}]"
        dirs = [_run_dir(r) for r in best.rows]
        summaries = [_summary(d) for d in dirs]
        per_round = mean_interval(_sent_bits_per_round(s) for s in summaries)
        utility = _utility_curve(dirs)
        accuracy = _mean_curve(dirs, "val/acc")
        color = None
        for k, (curve, scale) in enumerate(
            ((utility, 1.0), (utility, 1.0), (accuracy, 100.0), (accuracy, 100.0))
        ):
            against_bits = k % 2 == 1
            if curve is None or (against_bits and per_round.n == 0):
                continue
            xs = [r * per_round.mean if against_bits else r for r in curve[0]]
            line = _plot_band(axes[k], xs, curve, scale, label, color=color)
            color = line.get_color()
        utility_final = "" if utility is None else f"{utility[1][-1]:.4g}"
        total = per_round.mean * best.stat("rounds").mean if per_round.n else math.nan
        val, test = best.stat(metric), best.stat("final_test_accuracy")
        tests[label] = test
        table.append([label, str(len(best.rows)), _fmt(val, 100), _fmt_ci(val, 100),
                      _fmt(test, 100), _fmt_ci(test, 100), utility_final,
                      "" if not math.isfinite(total) else f"{total:.4g}",
                      _epsilon(best)])  # fmt: skip
    titles = ("train utility ||∇f(x̄)||²", "validation accuracy (%)")
    for k, ax in enumerate(axes):
        ax.set_title(f"{titles[k // 2]}, mean over seeds", fontsize=9)
        ax.set_xlabel("bits sent per agent" if k % 2 else "round")
        ax.grid(alpha=0.3)
        if k < 2 and ax.lines:
            ax.set_yscale("log")
    if axes[0].lines or axes[2].lines:
        (axes[0] if axes[0].lines else axes[2]).legend(fontsize=7)
    written = [out / "comparison.png", out / "comparison.csv", out / "comparison.md"]
    fig.savefig(written[0], dpi=120)
    with written[1].open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header_row)
        writer.writerows(table)
    lines = ["| " + " | ".join(header_row) + " |", "|" + "---|" * len(header_row)]
    lines += ["| " + " | ".join(r) + " |" for r in table]
    notes = overlap_notes(tests)
    if notes:
        lines += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    written[2].write_text("\n".join(lines) + "\n")
    return written


# --------------------------------------------------------------------------- the frontier

#: what the frontier's figure, table and caption say about the selection
FRONTIER_SELECTION = (
    "step size selected on validation accuracy at each ε (not itself private, as in the papers)"
)
_NULL = ("null", "None")


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
        rows: the selected configuration's runs.
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
    rows: list[dict[str, str]]

    @property
    def x(self) -> float:
        """Where the point lies on the ε axis: the mean certified ε, else the target."""
        if self.certified.n:
            return self.certified.mean
        return finite_float(self.target) or math.nan


def _target_column(header: Sequence[str]) -> str | None:
    """The column of the target ε: ``model.algorithm.init_args.noise.epsilon`` as
    :func:`~pl_privfed.results.column_names` writes it (any ``…noise.epsilon``)."""
    for name in header:
        if name == "target_epsilon" or name.endswith("noise.epsilon"):
            return name
    return None


def _noise_column(header: Sequence[str]) -> str | None:
    return next((c for c in header if c == "noise" or c.endswith("init_args.noise")), None)


def _config_target(row: dict[str, str]) -> str | None:
    """The target ε of a run from its ``summary.json`` (its privacy report's
    ``target_epsilon``, else its resolved config's), as text."""
    summary = _summary(_run_dir(row))
    privacy = summary.get("privacy")
    target = privacy.get("target_epsilon") if isinstance(privacy, dict) else None
    if finite_float(target) is not None:
        return str(target)
    config = summary.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    algorithm = model.get("algorithm") if isinstance(model, dict) else None
    init_args = algorithm.get("init_args") if isinstance(algorithm, dict) else None
    noise = init_args.get("noise") if isinstance(init_args, dict) else None
    value = noise.get("epsilon") if isinstance(noise, dict) else None
    return None if finite_float(value) is None else str(value)


def _adversary(row: dict[str, str]) -> str:
    """Against whom the run's ε holds: the ``privacy_adversary`` or ``adversary`` column, else
    its ``summary.json`` (``privacy.adversary``); ``""`` when not recorded."""
    for column in ("privacy_adversary", "adversary"):
        if row.get(column):
            return str(row[column])
    privacy = _summary(_run_dir(row)).get("privacy")
    return str(privacy.get("adversary") or "") if isinstance(privacy, dict) else ""


def _default_label(path: Path) -> str:
    """A results file's method label: its sweep folder's name without ``frontier_`` and
    ``_nonprivate`` (a private sweep and its non-private twin make one method)."""
    name = path.parent.name or path.stem
    return name.removeprefix("frontier_").removesuffix("_nonprivate") or name


def _read_frontier(
    paths: Sequence[Path], labels: Sequence[str] | None
) -> tuple[dict[str, list[dict[str, str]]], dict[str, list[str]]]:
    """The finished rows of every method (files with the same label are pooled; a ``method``
    column names the method of each row when no labels are given), each with ``_target``
    (``""`` for a non-private run), and every method's parameter columns."""
    rows_of: dict[str, list[dict[str, str]]] = {}
    params_of: dict[str, list[str]] = {}
    for i, path in enumerate(paths):
        header, rows = _read_many([path])
        target_col, noise_col = _target_column(header), _noise_column(header)
        unfinished = [r.get("run", "?") for r in rows if r.get("status") != "finished"]
        if unfinished:
            shown = ", ".join(unfinished[:8]) + (", ..." if len(unfinished) > 8 else "")
            warnings.warn(
                f"{len(unfinished)} of {len(rows)} runs in {path} did not finish and are left "
                f"out of the frontier: {shown}",
                UserWarning,
                stacklevel=3,
            )
        params = [c for c in header if c not in NON_PARAMETER_COLUMNS and c != "method"]
        params = [c for c in params if c not in (target_col, noise_col, *SEED_PARAMETERS)]
        for row in rows:
            if row.get("status") != "finished":
                continue
            label = labels[i] if labels else (row.get("method") or _default_label(path))
            noise_off = noise_col is not None and row.get(noise_col) in _NULL
            target = "" if noise_off or target_col is None else (row.get(target_col) or "")
            if not noise_off and not target and finite_float(row.get("epsilon")) is not None:
                target = _config_target(row) or f"{finite_float(row['epsilon']):.3g}"
            value = finite_float(target)
            target = f"{value:g}" if value is not None else target  # 1.0 and 1: one ε
            rows_of.setdefault(label, []).append({**row, "_target": target})
            known = params_of.setdefault(label, [])
            known += [c for c in params if c not in known]
    return rows_of, params_of


def frontier_points(
    results_paths: Sequence[str | os.PathLike],
    *,
    metric: str = "final_test_accuracy",
    select: str = _DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
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
    reported over its seeds (mean and 95 % interval, :func:`mean_interval`). This selection
    reads the validation split and is not itself private, as in the papers.

    Returns:
        The points, per method in input order: the private ones by target ε, then the
        non-private one.

    Raises:
        ValueError: without a results file, with a missing file, with as many labels as files
            not given, with a test ``select`` metric, or when no run finished with ``select``.
    """
    _check_selection_metric(select)
    paths = [Path(p) for p in results_paths]
    if not paths:
        raise ValueError("the frontier needs at least one results.csv (one sweep per method)")
    for path in paths:
        if not path.is_file():
            raise ValueError(f"{path}: no such results file (run `pl-privfed sweep` first)")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(
            f"--labels gives {len(labels)} label(s) for {len(paths)} results file(s): one each"
        )
    rows_of, params_of = _read_frontier(paths, labels)
    points: list[FrontierPoint] = []
    for method, rows in rows_of.items():
        _warn_missing(rows, select, method)
        params = params_of[method]
        varying = [c for c in params if len({r.get(c) for r in rows}) > 1] or params
        targets = sorted({r["_target"] for r in rows if r["_target"]}, key=_order)
        for target in [*targets, ""]:
            members = [r for r in rows if r["_target"] == target]
            configs = aggregate(members, params) if members else []
            best = _best(configs, select)
            if best is None:
                continue
            adversaries = sorted({a for a in map(_adversary, best.rows) if a})
            points.append(FrontierPoint(
                method=method, target=target, private=bool(target),
                selected={c: v for c in varying if (v := best.values.get(c, ""))},
                candidates=len(configs), test=best.stat(metric), val=best.stat(select),
                certified=best.stat("epsilon"), adversary="/".join(adversaries),
                rows=best.rows))  # fmt: skip
    if not points:
        raise ValueError(
            f"no finished run with a {select} value in {', '.join(map(str, paths))}: "
            "no frontier to draw"
        )
    return points


def _pm(interval: Interval, scale: float) -> str:
    """``mean ± 95 % half-width`` (the mean alone with one seed)."""
    if interval.n == 0:
        return ""
    if interval.n < 2:
        return f"{interval.mean * scale:.2f}"
    return f"{interval.mean * scale:.2f} ± {interval.half_width * scale:.2f}"


def _num(value: float, scale: float = 1.0) -> str:
    return "" if not math.isfinite(value) else f"{value * scale:.6g}"


def frontier(
    results_paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = "final_test_accuracy",
    select: str = _DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
) -> list[Path]:
    """Draw the privacy–utility frontier: test accuracy against certified ε, one curve per
    method; return the written paths.

    The points are :func:`frontier_points`'s (the configuration selected on the validation
    ``select`` at each target ε, its test ``metric`` over seeds). Writes

    * ``frontier.png``: ``metric`` (%, for an accuracy) against the mean certified ε (log
      scale), one line per method with its 95 % band over seeds, and each method's non-private
      accuracy as a dashed horizontal line in the same colour, labelled "non-private";
    * ``frontier.csv``: one row per point (method, private, target and certified ε, adversary,
      the selected hyperparameters, seeds, ``metric`` and ``select`` as mean, 95 % interval and
      half-width, in percent for accuracies);
    * ``frontier.md``: the table (``metric`` as mean ± 95 % half-width).

    Every caption says that the step size is selected on validation accuracy at each ε, which
    is not itself private, as in the papers.

    Raises:
        ValueError: as :func:`frontier_points`.
    """
    points = frontier_points(results_paths, metric=metric, select=select, labels=labels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scale = 100.0 if _percent(metric) else 1.0
    val_scale = 100.0 if _percent(select) else 1.0
    unit = " (%)" if scale == 100.0 else ""
    name = "test accuracy" if metric == "final_test_accuracy" else metric
    val_name = "val accuracy" if select == _DEFAULT_METRIC else select
    written = [out / "frontier.png", out / "frontier.csv", out / "frontier.md"]

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    methods = list(dict.fromkeys(p.method for p in points))
    ticks: set[float] = set()
    for i, method in enumerate(methods):
        color = f"C{i % 10}"
        private = sorted((p for p in points if p.method == method and p.private and p.test.n
                          and math.isfinite(p.x) and p.x > 0), key=lambda p: p.x)  # fmt: skip
        if private:
            xs = [p.x for p in private]
            ticks.update(finite_float(p.target) or p.x for p in private)
            mean = np.array([p.test.mean for p in private])
            low = np.array([p.test.low if math.isfinite(p.test.low) else p.test.mean
                            for p in private])  # fmt: skip
            high = np.array([p.test.high if math.isfinite(p.test.high) else p.test.mean
                             for p in private])  # fmt: skip
            seeds = max(p.test.n for p in private)
            label = f"{method} ({seeds} seed{'s' if seeds != 1 else ''})"
            _plot_band(ax, xs, (xs, mean, low, high), scale, label, color=color)
        for p in points:
            if p.method == method and not p.private and p.test.n:
                y = p.test.mean * scale
                label = None if private else f"{method} (non-private only)"
                ax.axhline(y, color=color, linestyle="--", linewidth=1.2, label=label)
                ax.annotate("non-private", (1.0, y), xycoords=("axes fraction", "data"),
                            xytext=(3, 0), textcoords="offset points", color=color,
                            fontsize=7, va="center")  # fmt: skip
    ax.set_xscale("log")
    if ticks:
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
    ax.set_xlabel("certified ε (mean over seeds; log scale)")
    ax.set_ylabel(f"{name}{unit}")
    ax.set_title(f"Privacy–utility frontier: {name}, mean over seeds with 95 % band;\n"
                 f"{FRONTIER_SELECTION}; dashed: non-private", fontsize=8)  # fmt: skip
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.savefig(written[0], dpi=120)

    header = ["method", "private", "target_epsilon", "certified_epsilon", "certified_epsilon_low",
              "certified_epsilon_high", "adversary", "selected", "configurations", "seeds",
              f"{metric}_mean", f"{metric}_low", f"{metric}_high", f"{metric}_half_width",
              f"{select}_mean", f"{select}_half_width", "selected_on"]  # fmt: skip
    with written[1].open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(header)
        for p in points:
            t, v, e = p.test, p.val, p.certified
            writer.writerow([
                p.method, "true" if p.private else "false", p.target, _num(e.mean),
                _num(e.low), _num(e.high), p.adversary,
                " ".join(f"{k}={val}" for k, val in p.selected.items()), p.candidates, t.n,
                _num(t.mean, scale), _num(t.low, scale), _num(t.high, scale),
                _num(t.half_width, scale), _num(v.mean, val_scale), _num(v.half_width, val_scale),
                f"{select} (validation, not itself private)"])  # fmt: skip

    columns = ["method", "target ε", "certified ε", "adversary", "selected (on validation)",
               "seeds", f"{name}{unit}, mean ± 95 % half-width",
               f"{val_name}{unit}, mean ± 95 % half-width"]  # fmt: skip
    lines = [f"## Privacy–utility frontier: {name} at each ε, {FRONTIER_SELECTION}", ""]
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for p in points:
        certified = "" if not p.certified.n else f"{p.certified.mean:.3g}"
        # raw names: the step size is γ for one algorithm and η for another
        selected = ", ".join(f"{k}={val}" for k, val in p.selected.items())
        cells = [p.method, p.target or "non-private", certified if p.private else "—",
                 p.adversary or ("—" if not p.private else ""), selected, str(p.test.n),
                 _pm(p.test, scale), _pm(p.val, val_scale)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Selection: at each target ε the configuration with the best mean {select} "
              f"over seeds; {FRONTIER_SELECTION}. The {name} of the selected configuration is "
              "reported (mean over seeds, 95 % Student-t interval); certified ε is the mean ε "
              "the runs' accountant reported."]  # fmt: skip
    written[2].write_text("\n".join(lines) + "\n")
    return written
