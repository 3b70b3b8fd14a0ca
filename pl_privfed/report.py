"""Paper-style figures and tables from a sweep's ``results.csv``: ``pl-privfed report`` and
``pl-privfed compare``, on :mod:`pandas` (tables, group-by over seeds) and :mod:`matplotlib`.

**Statistics.** Runs that differ only in their seed (a parameter in
:data:`~pl_privfed.results.SEED_PARAMETERS`) are one *configuration*. Every number is aggregated
over its seeds as the mean, the sample standard deviation (``ddof = 1``) and a 95 % Student-t
interval of the mean, ``mean ± t_{0.975, n−1} · std / √n`` (:func:`scipy.stats.t.ppf`; the same
as :func:`scipy.stats.t.interval` with the standard error; none with one seed):
:func:`interval_table` for a pandas group-by, :func:`mean_interval` for a list. A curve's band is
that interval at each round every seed logged, clipped to the metric's range in the figures
(accuracy in [0, 100] %, losses and gradient norms ≥ 0); tables give the interval unclipped.

**Selection.** Every choice of a configuration — the best y per x, the best cell of a heatmap,
the run a curve shows — is made on the **validation** metric (default ``final_val_accuracy``);
the test accuracy is only *reported*, for the selected configurations. Accuracies are in percent.

:func:`make_report` writes ``heatmap.png`` (one panel per value of the facets, one colour range),
``heatmap_server_normalization_difference.png`` (when server normalization varies),
``curves.png`` (training loss and validation accuracy of the best y per x and method, 95 %
bands), ``table.md``/``table.csv``, ``rounds_to_target.png`` (runs with a gradient-norm target,
paper 003 Figs. 1–2) and ``accuracy_vs_transmissions.png`` (when the participation varies,
paper 004 Fig. 2). :func:`compare_methods` draws the best configuration of each sweep side by side
(paper 001 Figs. 2–3); :func:`frontier` the privacy–utility frontier of several sweeps.
Axes and tables name each hyperparameter by the symbol of its algorithm's paper
(:attr:`~pl_privfed.algorithms.FederatedAlgorithm.hyperparameter_symbols`: the step size is γ
for the α-NormEC family, η for PORTER, BEER, SoteriaFL and the FedAvg family). A panel without
data is left out, and a note on the figure and in the tables says so.

Runs without the selection metric are named in a warning, never drawn as grey cells. A results
file that is missing, not a ``results.csv``, empty or without a finished run is a
:class:`ValueError` naming it.
"""

from __future__ import annotations

import json
import math
import os
import textwrap
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from scipy import stats as scipy_stats

from pl_privfed import algorithms as _algorithms
from pl_privfed.results import NON_PARAMETER_COLUMNS, RESULT_COLUMNS, SEED_PARAMETERS, finite_float

__all__ = [
    "FRONTIER_SELECTION",
    "FrontierPoint",
    "Interval",
    "aggregate",
    "compare_methods",
    "comparison_figure",
    "frontier",
    "frontier_points",
    "interval_table",
    "load_results",
    "make_report",
    "mean_interval",
    "overlap_notes",
    "report_figures",
]

_DEFAULT_METRIC = "final_val_accuracy"
_TEST = "final_test_accuracy"
_SERVER_NORM = "server_normalization"
#: symbols of parameters that belong to no algorithm (operators, privacy)
_GENERIC_SYMBOLS = {"beta": "β", "alpha": "α", "threshold": "τ", "epsilon": "ε", "delta": "δ",
                    _SERVER_NORM: "server norm."}  # fmt: skip
_PARTICIPATION = ("participation_prob", "probability", "cohort_size")
_CLIP = ("clip_threshold", "threshold")
_STEPS = ("steps", "local_batches")
_FACETS = ("classes_per_client", "concentration")
_NULL = ("null", "None")
#: what the frontier's figure, table and caption say about the selection
FRONTIER_SELECTION = (
    "step size selected on validation accuracy at each ε (not itself private, as in the papers)"
)


# --------------------------------------------------------------------------- statistics


@dataclass(frozen=True)
class Interval:
    """A metric over the seeds of one configuration: ``n`` seeds with a value, their ``mean``,
    sample ``std`` (``nan`` when ``n < 2``) and 95 % Student-t interval ``low``–``high`` of the
    mean (``nan`` when ``n < 2``)."""

    n: int
    mean: float
    std: float
    low: float
    high: float

    @classmethod
    def of(cls, row: pd.Series, metric: str) -> Interval:
        """The interval of ``metric`` in a row of :func:`aggregate`'s table."""
        return cls(int(row[f"{metric}:n"]),
                   *(float(row[f"{metric}:{s}"]) for s in ("mean", "std", "low", "high")))  # fmt: skip

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        """Whether the two 95 % intervals overlap (true when either is undefined)."""
        if not (math.isfinite(self.low) and math.isfinite(other.low)):
            return True
        return self.low <= other.high and other.low <= self.high


def interval_table(grouped, confidence: float = 0.95) -> pd.DataFrame:
    """``n``, ``mean``, ``std`` (``ddof = 1``) and the Student-t interval ``low``, ``high`` of
    the mean of each group of a pandas ``SeriesGroupBy``, one row per group."""
    table = grouped.agg(["count", "mean", "std"]).rename(columns={"count": "n"})
    n = table["n"].astype(float)
    t = scipy_stats.t.ppf(0.5 + confidence / 2, n.where(n > 1) - 1)
    half = t * table["std"] / np.sqrt(n.where(n > 1))
    return table.assign(low=table["mean"] - half, high=table["mean"] + half)


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean, sample standard deviation and Student-t interval of the finite ``values``
    (:func:`interval_table`); with equal values the interval is the mean.

    >>> r = mean_interval([0.70, 0.72, 0.74])
    >>> round(r.mean, 4), round(r.std, 4), round(r.low, 4), round(r.high, 4)
    (0.72, 0.02, 0.6703, 0.7697)
    """
    data = pd.Series([finite_float(v) for v in values], dtype=float).dropna()
    if data.empty:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    row = interval_table(data.groupby(np.zeros(len(data))), confidence).iloc[0]
    return Interval(int(row["n"]), *(float(row[s]) for s in ("mean", "std", "low", "high")))


def _is_accuracy(metric: str) -> bool:
    return "accuracy" in metric or metric.endswith("/acc")


def _limits(metric: str) -> tuple[float, float]:
    """The range of ``metric`` as drawn: accuracy in percent, losses and norms non-negative."""
    if _is_accuracy(metric):
        return 0.0, 100.0
    if any(k in metric for k in ("loss", "norm", "utility")):
        return 0.0, math.inf
    return -math.inf, math.inf


def _scale(metric: str, values: Iterable[float] = ()) -> float:
    """100 for an accuracy stored as a fraction (every value ≤ 1), else 1."""
    if not _is_accuracy(metric):
        return 1.0
    return 1.0 if any(v > 1 for v in values if math.isfinite(v)) else 100.0


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


def _pm(interval: Interval, scale: float) -> str:
    """``mean ± 95 % half-width`` (the mean alone with one seed)."""
    if interval.n == 0:
        return ""
    if interval.n < 2:
        return f"{interval.mean * scale:.2f}"
    return f"{interval.mean * scale:.2f} ± {interval.half_width * scale:.2f}"


def _num(value: float, scale: float = 1.0) -> str:
    return "" if not math.isfinite(value) else f"{value * scale:.6g}"


def overlap_notes(intervals: dict[str, Interval], what: str = "test accuracy") -> list[str]:
    """One sentence per pair of labels whose 95 % intervals of ``what`` overlap (the data do
    not separate them), or that cannot be compared (a single seed)."""
    notes = []
    labels = [k for k, v in intervals.items() if v.n]
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            ia, ib = intervals[a], intervals[b]
            if ia.n < 2 or ib.n < 2:
                notes.append(f"{a} and {b}: {what} from {ia.n} and {ib.n} seed(s): no interval, "
                             "the difference is not established")  # fmt: skip
            elif ia.overlaps(ib):
                notes.append(f"{a} and {b}: the 95 % intervals of {what} overlap "
                             f"({_fmt_ci(ia, 100)} and {_fmt_ci(ib, 100)} %): the difference is "
                             f"not established at {min(ia.n, ib.n)} seeds")  # fmt: skip
    return notes


# --------------------------------------------------------------------------- reading


def _order(text: str) -> tuple:
    """Sort key: numbers numerically, then everything else as text."""
    value = finite_float(text)
    return (0, value, "") if value is not None else (1, 0.0, str(text))


def _sorted(values: Iterable[str]) -> list[str]:
    return sorted(set(values), key=_order)


def _paths(results: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    return [Path(results)] if isinstance(results, str | os.PathLike) else [Path(p) for p in results]


def load_results(
    results: str | os.PathLike | Sequence[str | os.PathLike], *, finished: bool = True
) -> pd.DataFrame:
    """The runs of one or more ``results.csv`` (:func:`pl_privfed.sweep.run_sweep`), read as one.

    Parameter columns stay text (as written, ``0.1`` and ``true``); the
    :data:`~pl_privfed.results.RESULT_COLUMNS` are numbers (``nan`` where missing or not
    finite). Added columns: ``_csv`` (the file), ``_dir`` (the run directory: as recorded, else
    ``runs/<run>`` beside the file), ``_summary`` (its ``summary.json``), ``_algorithm`` (the
    algorithm's class name) and ``_method`` (``DP-`` in front when the run is private,
    ``+ server norm`` behind when it normalizes the server step). A folder stands for its
    ``results.csv``.

    Args:
        finished: keep the finished runs only, and refuse a file set without one.

    Raises:
        ValueError: naming the file, when it is missing, not a ``results.csv``, empty, or (with
            ``finished``) holds no finished run.
    """
    _summary.cache_clear()  # a run may have gone on since the last report of this process
    _curve_file.cache_clear()
    frames = []
    for path in _paths(results):
        if path.is_dir():
            if not (path / "results.csv").is_file():
                raise ValueError(f"{path}: a folder without results.csv (run `pl-privfed sweep`)")
            path = path / "results.csv"
        if not path.is_file():
            raise ValueError(f"{path}: no such results file (run `pl-privfed sweep` first)")
        try:
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)
        except ValueError as exc:  # pandas' parser errors, a binary file, an empty file
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ValueError(f"{path}: not a results.csv ({reason})") from None
        missing = [c for c in ("run", "status") if c not in frame.columns]
        if missing:
            raise ValueError(f"{path}: not a results.csv written by `pl-privfed sweep` (no "
                             f"{' or '.join(missing)} column)")  # fmt: skip
        if frame.empty:
            raise ValueError(f"{path}: an empty results file (no runs): nothing to report")
        frames.append(frame.assign(_csv=str(path)))
    if not frames:
        raise ValueError("no results.csv given")
    runs = pd.concat(frames, ignore_index=True).fillna("")
    for column in RESULT_COLUMNS:
        runs[column] = _values(runs, column)
    if finished:
        done = runs["status"] == "finished"
        if not done.any():
            counts = runs["status"].str.slice(0, 60).value_counts()
            seen = "; ".join(f"{n} {s or 'without status'}" for s, n in counts.head(3).items())
            names = ", ".join(sorted(set(runs["_csv"])))
            raise ValueError(f"{names}: no finished run among its {len(runs)} run(s) ({seen}): "
                             "nothing to report")  # fmt: skip
        runs = runs[done].reset_index(drop=True)
    runs["_dir"] = [str(_run_dir(r)) for r in runs.to_dict("records")]
    runs["_summary"] = [_summary(d) for d in runs["_dir"]]
    named = [_method(r) for r in runs.to_dict("records")]
    runs["_algorithm"] = [a for a, _ in named]
    runs["_method"] = [m for _, m in named]
    return runs


def _params(runs: pd.DataFrame) -> list[str]:
    """The parameter columns of the results (seeds included)."""
    return [c for c in runs.columns if c not in NON_PARAMETER_COLUMNS and not c.startswith("_")]


def _run_dir(row: dict) -> Path:
    recorded = Path(row.get("run_dir") or "")
    if row.get("run_dir") and recorded.is_dir():
        return recorded
    return Path(row["_csv"]).parent / "runs" / (row.get("run") or "")


@cache
def _summary(run_dir: str) -> dict:
    try:
        data = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _get(data: object, *keys: str) -> object:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _method(row: dict) -> tuple[str, str]:
    """The algorithm's class name and the method's label of a run (from its summary)."""
    summary = row["_summary"]
    name, server_norm = "?", row.get(_SERVER_NORM) == "true"
    algorithm = _get(summary, "config", "model", "algorithm")
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
    label = f"DP-{name}" if private and "DP" not in name else name
    return name, label + (" + server norm" if server_norm else "")


def _symbol(column: str | None, algorithm_names: Iterable[str] = ()) -> str:
    """The symbol of a hyperparameter in the papers of ``algorithm_names`` (their
    ``hyperparameter_symbols``; several joined by ``/``), else a generic one, else the column."""
    if column is None:
        return ""
    classes = [getattr(_algorithms, n, None) for n in set(algorithm_names)]
    classes = [c for c in classes if isinstance(c, type)
               and issubclass(c, _algorithms.FederatedAlgorithm)] or [_algorithms.FederatedAlgorithm]  # fmt: skip
    found = sorted({c.hyperparameter_symbols[column] for c in classes
                    if column in c.hyperparameter_symbols})  # fmt: skip
    return "/".join(found) if found else _GENERIC_SYMBOLS.get(column, column)


@cache
def _curve_file(run_dir: str) -> pd.DataFrame:
    try:
        curves = pd.read_csv(Path(run_dir) / "curves.csv")[["metric", "round", "value"]]
    except (OSError, ValueError, KeyError):
        return pd.DataFrame()
    curves["value"] = pd.to_numeric(curves["value"], errors="coerce")
    return curves[np.isfinite(curves["value"])]


def _mean_curve(run_dirs: Sequence[str], metric: str) -> pd.DataFrame | None:
    """:func:`interval_table` of a curve over the runs at each round every one of them logged
    (``None`` without such a round)."""
    frames = [_curve_file(d).assign(_dir=d) for d in run_dirs if len(_curve_file(d))]
    if not frames:
        return None
    curves = pd.concat(frames, ignore_index=True)
    curves = curves[curves["metric"] == metric].drop_duplicates(["_dir", "round"], keep="last")
    table = interval_table(curves.groupby("round")["value"])
    table = table[table["n"] == curves["_dir"].nunique()]
    return table if len(table) else None


def _utility_curve(run_dirs: Sequence[str]) -> pd.DataFrame | None:
    """``||∇f(x̄)||²`` over rounds (the runs' GradientNorm histories), over seeds."""
    frames = []
    for d in run_dirs:
        history = _get(_summary(d), "full_grad_norm", "history") or []
        if history:
            frames.append(pd.DataFrame(history, columns=["round", "value"]).assign(_dir=d))
    if not frames:
        return None
    data = pd.concat(frames, ignore_index=True)
    data = data.assign(value=data["value"].astype(float) ** 2)
    table = interval_table(data.groupby("round")["value"])
    table = table[table["n"] == data["_dir"].nunique()]
    return table if len(table) else None


# --------------------------------------------------------------------------- configurations


def _values(runs: pd.DataFrame, column: str) -> pd.Series:
    """A column as finite numbers (``nan`` elsewhere; all ``nan`` when there is no such column)."""
    values = pd.to_numeric(runs[column], errors="coerce") if column in runs else math.nan
    values = pd.Series(values, index=runs.index, dtype=float)
    return values.where(np.isfinite(values))


def aggregate(
    runs: pd.DataFrame, params: Sequence[str], metrics: Sequence[str] = ()
) -> pd.DataFrame:
    """One row per configuration (``runs`` grouped by every parameter but the seeds, in
    first-seen order): its parameter values, ``_method``, ``_algorithm``, ``seeds`` (its runs),
    ``_dirs`` (their directories) and, for every result column ``m``, :func:`interval_table`'s
    ``m:n``, ``m:mean``, ``m:std``, ``m:low``, ``m:high`` over the seeds (and for ``metrics``)."""
    keys = [c for c in params if c not in SEED_PARAMETERS] or ["_all"]
    metrics = list(dict.fromkeys([*RESULT_COLUMNS, *metrics]))
    runs = runs.assign(_all="", **{m: _values(runs, m) for m in metrics})
    grouped = runs.groupby(keys, sort=False, dropna=False)
    table = grouped.agg(_method=("_method", "first"), _algorithm=("_algorithm", "first"),
                        seeds=("run", "size"), _dirs=("_dir", list))  # fmt: skip
    stats = [interval_table(grouped[m]).add_prefix(f"{m}:") for m in metrics]
    return pd.concat([table, *stats], axis=1).reset_index().drop(columns="_all", errors="ignore")


def _best(configs: pd.DataFrame, metric: str, by: Sequence[str] = ()) -> pd.DataFrame:
    """The configuration with the highest mean ``metric`` (a validation metric), per group of
    ``by`` (the first one on a tie)."""
    scored = configs.dropna(subset=[f"{metric}:mean"])
    if scored.empty or not by:
        return scored.loc[[scored[f"{metric}:mean"].idxmax()]] if len(scored) else scored
    return scored.loc[scored.groupby(list(by), sort=False)[f"{metric}:mean"].idxmax()]


def _check_selection_metric(metric: str) -> None:
    if "test" in metric:
        raise ValueError(
            f"metric={metric!r} would select on the test set: select on a validation metric "
            "(final_val_accuracy, best_val_accuracy); the test accuracy is reported for the "
            "selected configurations"
        )


def _warn_missing(runs: pd.DataFrame, metric: str, where: str) -> None:
    missing = runs.loc[_values(runs, metric).isna(), "run"].tolist()
    if missing:
        shown = ", ".join(missing[:8]) + (", ..." if len(missing) > 8 else "")
        warnings.warn(f"{len(missing)} of {len(runs)} finished runs in {where} have no {metric} "
                      f"(no evaluation ran?): {shown}; they are left out of the heatmaps and the "
                      "selection", UserWarning, stacklevel=3)  # fmt: skip


# --------------------------------------------------------------------------- drawing


def _band(ax, xs, table: pd.DataFrame, scale: float, label: str | None, limits, **style):
    """The mean of ``table`` (:func:`interval_table`) with its 95 % band clipped to
    ``limits``; returns the line."""
    mean = table["mean"].to_numpy(float) * scale
    low = np.clip(table["low"].fillna(table["mean"]).to_numpy(float) * scale, *limits)
    high = np.clip(table["high"].fillna(table["mean"]).to_numpy(float) * scale, *limits)
    (line,) = ax.plot(list(xs), mean, label=label, marker="." if len(mean) < 30 else None,
                      **style)  # fmt: skip
    if np.any(high > low):
        ax.fill_between(list(xs), low, high, color=line.get_color(), alpha=0.2, linewidth=0)
    return line


def _omitted_note(fig: Figure, omitted: Sequence[str]) -> str | None:
    """A note at the bottom of ``fig`` naming the panels left out for want of data."""
    if not omitted:
        return None
    note = "Panels omitted (no data): " + "; ".join(omitted)
    text = textwrap.fill(note, int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.005, text, fontsize=7, style="italic", va="bottom")
    lines = text.count("\n") + 1  # room below the panels (constrained layout ignores fig.text)
    fig.get_layout_engine().set(rect=(0, 0.15 * lines / fig.get_figheight(), 1, 1))
    return note


def _grid(fig: Figure, count: int, ncols: int):
    """``count`` axes in rows of ``ncols`` (unused cells removed)."""
    if not count:
        return []
    nrows = math.ceil(count / ncols)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.remove()
    return list(axes[:count])


def _suptitle(fig: Figure, title: str) -> None:
    """The figure's title, wrapped to its width."""
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=10)


def _heatmap_figure(cells: pd.DataFrame, facets: Sequence[str], xs: list[str], ys: list[str],
                    *, x: str, y: str, names: Sequence[str], title: str,
                    bounds: tuple[float, float], unit: str, diff: bool = False) -> Figure:  # fmt: skip
    """One annotated heatmap per facet value of ``cells`` (columns ``facets``, x, y, ``mean``
    and ``half``, in the drawn unit) on one colour range, the common title above them all."""
    keys = sorted({tuple(r) for r in cells[list(facets)].itertuples(index=False)},
                  key=lambda k: tuple(_order(v) for v in k))  # fmt: skip
    ncols = len({k[-1] for k in keys}) if len(facets) >= 2 else min(len(keys), 4)
    width, height = max(3.6, 1.6 + 0.8 * len(xs)), max(3.0, 1.4 + 0.6 * len(ys))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(width * ncols + 1.2, height * nrows + 0.7), layout="constrained")
    cmap = colormaps["RdBu" if diff else "viridis"].with_extremes(bad="0.85")
    vmin, vmax = bounds
    image = None
    for ax, key in zip(_grid(fig, len(keys), ncols), keys, strict=True):
        own = cells[(cells[list(facets)] == list(key)).all(axis=1)] if facets else cells
        grid = own.drop_duplicates([y, x]).set_index([y, x])
        data, half = (grid[k].astype(float).unstack().reindex(index=ys, columns=xs).to_numpy()
                      for k in ("mean", "half"))  # fmt: skip
        image = ax.imshow(np.ma.masked_invalid(data), cmap=cmap, vmin=vmin, vmax=vmax,
                          origin="lower", aspect="auto")  # fmt: skip
        ax.set_xticks(range(len(xs)), xs)
        ax.set_yticks(range(len(ys)), ys)
        ax.set_xlabel(_symbol(x, names))
        ax.set_ylabel(_symbol(y, names))
        if facets:
            label = ", ".join(f"{_symbol(c, names)}={v}" for c, v in zip(facets, key, strict=True))
            ax.set_title(textwrap.fill(label, max(int(width * 9), 20)), fontsize=9)
        for (i, j), value in np.ndenumerate(data):
            if not np.isfinite(value):
                continue
            level = min(max((value - vmin) / ((vmax - vmin) or 1.0), 0.0), 1.0)
            dark = abs(level - 0.5) > 0.3 if diff else level < 0.6
            text = f"{value:+.1f}" if diff else f"{value:.1f}"
            if np.isfinite(half[i, j]):
                text += f"\n±{half[i, j]:.1f}"
            ax.text(j, i, text, ha="center", va="center", fontsize=7,
                    color="white" if dark else "black")  # fmt: skip
    _suptitle(fig, title)
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label=unit)
    return fig


# --------------------------------------------------------------------------- the report


def _axes(config_params: list[str], varying: list[str], x: str,
          y: str | None, facets_given: list[str], where: Path) -> tuple[str, str | None]:  # fmt: skip
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
            raise ValueError(f"{role}={column!r} is not a parameter column of {where}: "
                             f"{config_params}")  # fmt: skip
    if x == y:
        raise ValueError(f"x and y must differ, got x=y={x!r}")
    return x, y


def report_figures(
    results_csv: str | os.PathLike | Sequence[str | os.PathLike],
    *,
    x: str = "beta",
    y: str = "step_size",
    facet: str | Sequence[str] | None = None,
    metric: str = _DEFAULT_METRIC,
    vmin: float | None = None,
    vmax: float | None = None,
) -> tuple[dict[str, Figure], dict[str, str], list[str]]:
    """The report of :func:`make_report` without writing it: the figures (file name →
    :class:`~matplotlib.figure.Figure`), the tables (file name → text) and the notes (figure
    panels left out, overlapping intervals). Arguments and errors as :func:`make_report`."""
    _check_selection_metric(metric)
    paths = _paths(results_csv)
    if not paths:
        raise ValueError("make_report needs at least one results.csv")
    runs = load_results(paths)
    config_params = [c for c in _params(runs) if c not in SEED_PARAMETERS]
    varying = [c for c in config_params if runs[c].nunique() > 1]
    facets_given = [facet] if isinstance(facet, str) else list(facet or [])
    x, y = _axes(config_params, varying, x, y, facets_given, paths[0])
    _warn_missing(runs, metric, str(paths[0]))
    configs = aggregate(runs, config_params, [metric])
    names = list(configs["_algorithm"].unique())
    facets = facets_given if facet is not None else [c for c in varying if c not in (x, y)]
    facets = [c for c in facets if c not in (x, y)]
    xs = _sorted(configs[x])
    ys = _sorted(configs[y]) if y else []
    scale = _scale(metric, _values(runs, metric))
    unit = "validation accuracy (%)" if _is_accuracy(metric) else metric
    mean = f"{metric}:mean"
    figures: dict[str, Figure] = {}
    notes: list[str] = []

    cells = _best(configs, metric, [*facets, x, y]) if y else configs.iloc[:0]
    if y and len(cells):
        cells = cells.assign(mean=cells[mean] * scale,
                             half=(cells[f"{metric}:high"] - cells[f"{metric}:low"]) / 2 * scale)  # fmt: skip
        if _is_accuracy(metric):
            bounds = (0.0 if vmin is None else vmin, 100.0 if vmax is None else vmax)
        else:
            low, high = cells["mean"].min(), cells["mean"].max()
            low, high = (low, high) if high > low else (low - 0.5, high + 0.5)
            bounds = (low if vmin is None else vmin, high if vmax is None else vmax)
        name = metric.replace("_", " ").replace("val ", "validation ")
        title = (f"{name}{' (%)' if _is_accuracy(metric) else ''}, mean over seeds "
                 "(± the 95 % t-interval's half-width)")  # fmt: skip
        figures["heatmap.png"] = _heatmap_figure(cells, facets, xs, ys, x=x, y=y, names=names,
                                                 title=title, bounds=bounds, unit=unit)  # fmt: skip
        if _SERVER_NORM in varying and _SERVER_NORM not in (x, y):
            figures.update(_difference_figure(configs, facets, xs, ys, x=x, y=y, names=names,
                                              metric=metric, scale=scale))  # fmt: skip
    elif y:
        warnings.warn(f"no finished run in {paths[0]} has {metric}: no heatmap drawn",
                      UserWarning, stacklevel=2)  # fmt: skip

    curves, note = _curves_figure(configs, x, y, varying, metric, names)
    if curves is not None:
        figures["curves.png"] = curves
    notes += [f"curves.png: {note}"] if note else []
    if runs["final_full_grad_norm"].notna().any():
        figures["rounds_to_target.png"] = _rounds_to_target_figure(configs, config_params, names)
    participation = next((c for c in _PARTICIPATION if c in varying), None)
    if participation is not None:
        fig = _transmissions_figure(configs, participation, metric, names)
        if fig is not None:
            figures["accuracy_vs_transmissions.png"] = fig
    tables, overlap = _tables(configs, x, y, varying, metric, names)
    notes += overlap
    if notes:
        tables["table.md"] += "\n## Notes\n\n" + "".join(f"- {n}\n" for n in notes)
    return figures, tables, notes


def _difference_figure(configs: pd.DataFrame, facets: Sequence[str], xs: list[str],
                       ys: list[str], *, x: str, y: str, names: Sequence[str], metric: str,
                       scale: float) -> dict[str, Figure]:  # fmt: skip
    """With minus without server normalization, the best configuration per cell of each."""
    rest = [c for c in facets if c != _SERVER_NORM]
    sides = _best(configs, metric, [*rest, _SERVER_NORM, x, y]).set_index([*rest, x, y])
    on, off = (sides.loc[sides[_SERVER_NORM] == v, f"{metric}:mean"] for v in ("true", "false"))
    diff = ((on - off).dropna() * scale).rename("mean").reset_index().assign(half=math.nan)
    if diff.empty:
        return {}
    bound = max([1e-6, *diff["mean"].abs()])
    name = metric.replace("_", " ").replace("val ", "validation ")
    fig = _heatmap_figure(diff, rest, xs, ys, x=x, y=y, names=names, diff=True,
                          title=f"with − without server normalization: {name}, in points",
                          bounds=(-bound, bound), unit="points" if scale == 100 else metric)  # fmt: skip
    return {"heatmap_server_normalization_difference.png": fig}


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
        vmin, vmax: the heatmaps' colour range, in the metric's units (percent for
            accuracies); default 0 and 100 for an accuracy, else the values' range.

    Where the default x (``beta``) or y (``step_size``) is not a column (a grid over other
    parameters), the first other parameter that varies takes its place. A grid over one
    parameter gets no heatmap: its curves (one per value) and table.

    Raises:
        ValueError: when a file is missing, not a results file, empty or without a finished
            run; when x, y or a facet is not a parameter column; for a test ``metric``.
    """
    figures, tables, _ = report_figures(results_csv, x=x, y=y, facet=facet, metric=metric,
                                        vmin=vmin, vmax=vmax)  # fmt: skip
    first = _paths(results_csv)[0]
    first = first / "results.csv" if first.is_dir() else first
    out = Path(out_dir) if out_dir is not None else first.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    order = ["heatmap.png", "heatmap_server_normalization_difference.png", "curves.png",
             "table.md", "table.csv", "rounds_to_target.png", "accuracy_vs_transmissions.png"]  # fmt: skip
    written = []
    for name in order:
        if name in figures:
            figures[name].savefig(out / name, dpi=120)
        elif name in tables:
            (out / name).write_text(tables[name])
        else:
            continue
        written.append(out / name)
    return written


def _curves_figure(configs: pd.DataFrame, x: str, y: str | None, varying: Sequence[str],
                   metric: str, names: Sequence[str]) -> tuple[Figure | None, str | None]:  # fmt: skip
    """Training loss and validation accuracy (%) of the best y for each x and each method, mean
    over seeds with 95 % bands; panels without data are left out with a note."""
    others = [c for c in varying if c not in (x, y, _SERVER_NORM)]
    best = _best(configs, metric, ["_method", x])
    methods = sorted(set(best["_method"]))
    xs = _sorted(best[x])
    panels = {"train/loss": ("training loss", 1.0), "val/acc": ("validation accuracy (%)", 100.0)}
    drawn: dict[str, list] = {key: [] for key in panels}
    for _, row in best.iterrows():
        label = ", ".join(f"{_symbol(c, names)}={row[c]}" for c in (x, y, *others) if c)
        label = f"{row['_method']}: {label}" if len(methods) > 1 else label
        if row[f"{metric}:n"] > 1:
            label += f" ({int(row[f'{metric}:n'])} seeds)"
        for key in panels:
            table = _mean_curve(row["_dirs"], key)
            if table is not None:
                drawn[key].append((row, label, table))
    present = [k for k in panels if drawn[k]]
    omitted = [f"{panels[k][0]} (no run logged {k})" for k in panels if not drawn[k]]
    if best.empty:
        return None, f"not drawn: no run has {metric} to select the curves by"
    if not present:
        return None, "not drawn: no run logged train/loss or val/acc (curves.csv)"
    fig = Figure(figsize=(5.6 * len(present), 4.4), layout="constrained")
    tuned = f"best {_symbol(y, names)} per {_symbol(x, names)}" if y else f"per {_symbol(x, names)}"
    styles = ["-", "--", ":", "-."]
    for ax, key in zip(_grid(fig, len(present), len(present)), present, strict=True):
        name, scale = panels[key]
        for row, label, table in drawn[key]:
            style = styles[methods.index(row["_method"]) % len(styles)]
            color = f"C{xs.index(row[x]) % 10}"
            _band(ax, table.index, table, scale, label, _limits(key), linestyle=style, color=color)
        ax.set_title(f"{name}, {tuned};\nmean over seeds, 95 % t-band", fontsize=9)
        ax.set_xlabel("round")
        ax.set_ylabel(name)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        means = np.concatenate([t["mean"].to_numpy(float) for _, _, t in drawn[key]])
        if key == "train/loss" and means.min() > 0 and means.max() > 10 * means.min():
            ax.set_yscale("log")
    fig.axes[-1].legend(fontsize=7)
    return fig, _omitted_note(fig, omitted)


def _tables(configs: pd.DataFrame, x: str, y: str | None, varying: Sequence[str], metric: str,
            names: Sequence[str]) -> tuple[dict[str, str], list[str]]:  # fmt: skip
    """``table.md`` (per method the configuration selected on validation with its test
    accuracy, then every configuration) and ``table.csv``; and the overlap notes."""
    swept = [c for c in (x, y) if c] + [c for c in varying if c not in (x, y, _SERVER_NORM)]
    with_eps = bool(configs["epsilon:n"].sum())
    val_name = "val" if metric == _DEFAULT_METRIC else metric
    columns = ["method", *(_symbol(c, names) for c in swept), "seeds",
               f"{val_name} accuracy (%)", f"{val_name} 95 % CI", "test accuracy (%)",
               "test 95 % CI", "best val accuracy (%)", *(["ε"] if with_eps else [])]  # fmt: skip

    def cells(row: pd.Series) -> list[str]:
        val, test = Interval.of(row, metric), Interval.of(row, _TEST)
        eps = Interval.of(row, "epsilon")
        return [row["_method"], *(row[c] for c in swept), str(row["seeds"]), _fmt(val, 100),
                _fmt_ci(val, 100), _fmt(test, 100), _fmt_ci(test, 100),
                _fmt(Interval.of(row, "best_val_accuracy"), 100),
                *([f"{eps.mean:.3g}" if eps.n else ""] if with_eps else [])]  # fmt: skip

    score = configs[f"{metric}:mean"]
    ordered = configs.assign(_na=score.isna(), _key=-score.fillna(0.0))
    ordered = ordered.sort_values(["_method", "_na", "_key"], kind="stable")
    selected = _best(configs, metric, ["_method"]).sort_values("_method", kind="stable")
    table = pd.DataFrame([cells(r) for _, r in ordered.iterrows()], columns=columns, dtype=str)
    table["selected"] = np.where(ordered.index.isin(selected.index), "yes", "")
    lines = [f"## Selected on validation ({metric}), with their test accuracy", ""]
    lines += _markdown(columns, [cells(r) for _, r in selected.iterrows()])
    lines += ["", "## Every configuration", "", *_markdown(columns, table[columns].values)]
    notes = overlap_notes({r["_method"]: Interval.of(r, _TEST) for _, r in selected.iterrows()})
    return {"table.md": "\n".join(lines) + "\n", "table.csv": table.to_csv(index=False)}, notes


def _markdown(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def _none_last(text: str) -> tuple:
    return (1, 0.0, "") if text in (*_NULL, "") else (0, *_order(text)[1:])


def _rounds_to_target_figure(configs: pd.DataFrame, params: list[str],
                             names: Sequence[str]) -> Figure:  # fmt: skip
    """Paper 003 Figs. 1-2: fewest mean rounds (over seeds) to the gradient-norm target against
    the clipping threshold (``null`` = no clipping, drawn last as "none"), one line per
    local-step count, one panel per heterogeneity level; a configuration counts only if every
    seed reached the target; cells that never did are drawn as × at the top."""
    x = next((c for c in _CLIP if c in params), None) or params[0]
    series = next((c for c in _STEPS if c in params and c != x), None)
    facet = next((c for c in _FACETS if c in params and c not in (x, series)), None)
    xs = sorted(set(configs[x]), key=_none_last)
    ceiling = np.nanmax([configs["rounds:mean"].max(), 1.0])
    reached = configs[configs["rounds_to_target:n"] == configs["seeds"]]
    keys = [k for k in (facet, series, x) if k]
    fewest = reached.groupby(keys)["rounds_to_target:mean"].min() if len(reached) else {}
    fewest = {k if isinstance(k, tuple) else (k,): v for k, v in fewest.items()}
    facets = _sorted(configs[facet]) if facet else [""]
    fig = Figure(figsize=(4.6 * len(facets), 3.8), layout="constrained")
    for ax, fv in zip(_grid(fig, len(facets), len(facets)), facets, strict=True):
        members = configs[configs[facet] == fv] if facet else configs
        for sv in _sorted(members[series]) if series else [""]:
            key = tuple(k for k in (fv if facet else None, sv if series else None) if k is not None)
            best = [fewest.get((*key, xv), math.nan) for xv in xs]
            label = f"{_symbol(series, names)}={sv}" if series else None
            (line,) = ax.plot(range(len(xs)), best, marker="o", label=label)
            missing = [i for i, v in enumerate(best) if math.isnan(v)]
            ax.plot(missing, [ceiling] * len(missing), "x", color=line.get_color())
        ax.set_xticks(range(len(xs)), ["none" if v in _NULL else v for v in xs])
        clip = f"{_symbol(x, names)} (clipping threshold)" if x in _CLIP else _symbol(x, names)
        ax.set_xlabel(clip)
        ax.set_ylabel("rounds to target (mean over seeds)")
        ax.set_title(f"{_symbol(facet, names)}={fv}" if facet else "rounds to ||∇f|| target",
                     fontsize=9)  # fmt: skip
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7)
    _suptitle(fig, "fewest rounds to the gradient-norm target (×: not reached by every seed)")
    return fig


def _transmissions_figure(configs: pd.DataFrame, column: str, metric: str,
                          names: Sequence[str]) -> Figure | None:  # fmt: skip
    """Paper 004 Fig. 2: validation accuracy (%) of the best configuration per participation
    value against the cumulative client-to-server transmissions, mean over seeds, 95 % band."""
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    best = _best(configs, metric, [column])
    best = best.iloc[sorted(range(len(best)), key=lambda i: _order(best[column].iloc[i]))]
    for _, row in best.iterrows():
        sent, rounds = row["client_transmissions:mean"], row["rounds:mean"]
        table = _mean_curve(row["_dirs"], "val/acc")
        if table is None or not math.isfinite(sent) or not rounds:
            continue
        _band(ax, table.index * (sent / rounds), table, 100.0,
              f"{_symbol(column, names)}={row[column]}", _limits("val/acc"))  # fmt: skip
    if not ax.lines:
        return None
    ax.set_xlabel("client-to-server transmissions (k · p · M)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title("validation accuracy of the best configuration per participation;\n"
                 "mean over seeds, 95 % t-band", fontsize=9)  # fmt: skip
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


# --------------------------------------------------------------------------- compare


def _sent_bits_per_round(summary: dict) -> float | None:
    """Mean bits one agent or client *sends* per round: the per-agent totals of every channel but
    the server's broadcast, divided by the rounds run."""
    totals = summary.get("communication_total_bits_per_agent")
    rounds = finite_float(summary.get("rounds"))
    if not isinstance(totals, dict) or not rounds:
        return None
    sent = [v for k, v in totals.items() if k != "server_to_client" and finite_float(v) is not None]
    return sum(map(float, sent)) / rounds if sent else None


def comparison_figure(
    results_csvs: Sequence[str | os.PathLike], *, metric: str = _DEFAULT_METRIC
) -> tuple[Figure, pd.DataFrame, list[str]]:
    """:func:`compare_methods` without writing: the figure, the table and the notes (panels left
    out for want of data, overlapping test intervals)."""
    _check_selection_metric(metric)
    if not results_csvs:
        raise ValueError("compare_methods needs at least one results.csv")
    header = ["method", "seeds", "val accuracy (%)", "val 95 % CI", "test accuracy (%)",
              "test 95 % CI", "final utility", "bits sent per agent", "ε"]  # fmt: skip
    rows, tests, drawn = [], {}, []
    for path in _paths(results_csvs):
        runs = load_results(path)
        _warn_missing(runs, metric, str(path))
        params = [c for c in _params(runs) if c not in SEED_PARAMETERS]
        best = _best(aggregate(runs, params, [metric]), metric)
        if best.empty:
            raise ValueError(f"{path} has no finished run with a {metric} value")
        best = best.iloc[0]
        varying = [c for c in params if runs[c].nunique() > 1]
        # raw names: one label per method, each method's own symbols would collide across files
        setting = ", ".join(f"{c}={best[c]}" for c in varying)
        label = f"{best['_method']} ({setting})" if setting else best["_method"]
        if label in tests:  # the same method twice (e.g. two privacy levels): name the file
            label += f" [{path.parent.name}]"
        per_round = mean_interval(_sent_bits_per_round(_summary(d)) for d in best["_dirs"])
        utility, accuracy = _utility_curve(best["_dirs"]), _mean_curve(best["_dirs"], "val/acc")
        drawn.append((label, per_round, utility, accuracy))
        total = per_round.mean * best["rounds:mean"] if per_round.n else math.nan
        val, test = Interval.of(best, metric), Interval.of(best, _TEST)
        eps = Interval.of(best, "epsilon")
        tests[label] = test
        rows.append([label, str(best["seeds"]), _fmt(val, 100), _fmt_ci(val, 100),
                     _fmt(test, 100), _fmt_ci(test, 100),
                     "" if utility is None else f"{utility['mean'].iloc[-1]:.4g}",
                     "" if not math.isfinite(total) else f"{total:.4g}",
                     f"{eps.mean:.3g}" if eps.n else ""])  # fmt: skip
    panels = [  # (title, curve index, against bits, scale, limits key)
        ("train utility ||∇f(x̄)||² against rounds", 2, False, 1.0, "utility"),
        ("train utility ||∇f(x̄)||² against bits", 2, True, 1.0, "utility"),
        ("validation accuracy (%) against rounds", 3, False, 100.0, "val/acc"),
        ("validation accuracy (%) against bits", 3, True, 100.0, "val/acc"),
    ]

    def has_data(panel) -> bool:
        _, k, bits, _, _ = panel
        return any(d[k] is not None and (not bits or d[1].n) for d in drawn)

    present = [p for p in panels if has_data(p)]

    def why(panel) -> str:
        if not any(d[panel[1]] is not None for d in drawn):
            return "no run has a GradientNorm history" if panel[1] == 2 else "no run logged val/acc"
        return "no run recorded its bits per agent"

    omitted = [f"{p[0]} ({why(p)})" for p in panels if p not in present]
    fig = Figure(figsize=(10, 3.8 * max(1, math.ceil(len(present) / 2)) + 0.3),
                 layout="constrained")  # fmt: skip
    for ax, (title, k, bits, scale, limits) in zip(_grid(fig, len(present), 2), present,
                                                    strict=True):  # fmt: skip
        for i, (label, per_round, *curves) in enumerate(drawn):
            table = curves[k - 2]
            if table is None or (bits and not per_round.n):
                continue
            xs = table.index * per_round.mean if bits else table.index
            _band(ax, xs, table, scale, label, _limits(limits), color=f"C{i % 10}")
        ax.set_title(f"{title}, mean over seeds, 95 % t-band", fontsize=9)
        ax.set_xlabel("bits sent per agent" if bits else "round")
        if bits:  # 1e5 rather than 100000: the tick labels stay apart
            ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
        ax.set_ylabel("||∇f(x̄)||²" if k == 2 else "validation accuracy (%)")
        ax.grid(alpha=0.3)
        if k == 2:
            ax.set_yscale("log")
    if present:
        fig.axes[0].legend(fontsize=7)
    notes = [n for n in [_omitted_note(fig, omitted)] if n] + overlap_notes(tests)
    return fig, pd.DataFrame(rows, columns=header, dtype=str), notes


def compare_methods(
    results_csvs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = _DEFAULT_METRIC,
) -> list[Path]:
    """Side by side, the best configuration of each sweep against rounds and against bits
    (paper 001 §5), aggregated over seeds.

    One sweep per method. From each ``results.csv`` the configuration with the highest mean
    validation ``metric`` is drawn, as paper 001 Figs. 2–3 draw the best-tuned runs: the train
    utility ``||∇f(x̄)||²`` (from the runs' :class:`~pl_privfed.callbacks.GradientNorm`
    histories) and the validation accuracy (%, ``curves.csv``), each the mean over seeds with a
    95 % band, against the round and against the bits one agent sent (``round ×`` the mean bits
    sent per agent per round: every channel but the server's broadcast). A panel without data
    (no GradientNorm history, no recorded bits) is left out, with a note on the figure and in
    ``comparison.md``. Writes ``comparison.png``, ``comparison.csv`` (method, the selected
    parameters, seeds, validation and test accuracy as mean ± std with their 95 % intervals,
    final utility, bits sent per agent, ε) and ``comparison.md`` (the table and the notes).

    Raises:
        ValueError: with no results file, a file that is missing, not a results file, empty or
            without a finished run, or a test metric.
    """
    fig, table, notes = comparison_figure(results_csvs, metric=metric)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "comparison.png", out / "comparison.csv", out / "comparison.md"]
    fig.savefig(written[0], dpi=120)
    table.to_csv(written[1], index=False)
    lines = _markdown(list(table.columns), table.values)
    if notes:
        lines += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    written[2].write_text("\n".join(lines) + "\n")
    return written


# --------------------------------------------------------------------------- the frontier


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

    @property
    def x(self) -> float:
        """Where the point lies on the ε axis: the mean certified ε, else the target."""
        if self.certified.n:
            return self.certified.mean
        return finite_float(self.target) or math.nan


def _config_target(summary: dict) -> str | None:
    """The target ε of a run from its summary (its privacy report's ``target_epsilon``, else its
    resolved config's), as text."""
    target = _get(summary, "privacy", "target_epsilon")
    if finite_float(target) is None:
        target = _get(summary, "config", "model", "algorithm", "init_args", "noise", "epsilon")
    return None if finite_float(target) is None else str(target)


def _adversary(row: pd.Series) -> str:
    """Against whom the run's ε holds: the ``privacy_adversary`` or ``adversary`` column, else
    its summary's ``privacy.adversary``; ``""`` when not recorded."""
    for column in ("privacy_adversary", "adversary"):
        if row.get(column):
            return str(row[column])
    return str(_get(row["_summary"], "privacy", "adversary") or "")


def _default_label(path: Path) -> str:
    """A results file's method label: its sweep folder's name without ``frontier_`` and
    ``_nonprivate`` (a private sweep and its non-private twin make one method)."""
    name = path.parent.name or path.stem
    return name.removeprefix("frontier_").removesuffix("_nonprivate") or name


def _frontier_runs(paths: Sequence[Path], labels: Sequence[str] | None) -> pd.DataFrame:
    """The finished runs of every file with ``_label`` (the method) and ``_target`` (the target
    ε as text, ``""`` for a non-private run); unfinished runs are named in a warning."""
    frames = []
    for i, path in enumerate(paths):
        runs = load_results(path, finished=False)
        unfinished = runs.loc[runs["status"] != "finished", "run"].tolist()
        if unfinished:
            shown = ", ".join(unfinished[:8]) + (", ..." if len(unfinished) > 8 else "")
            warnings.warn(f"{len(unfinished)} of {len(runs)} runs in {path} did not finish and are "
                          f"left out of the frontier: {shown}", UserWarning, stacklevel=4)  # fmt: skip
        runs = runs[runs["status"] == "finished"]
        target_col = next((c for c in runs.columns
                           if c == "target_epsilon" or c.endswith("noise.epsilon")), None)  # fmt: skip
        noise_col = next((c for c in runs.columns if c == "noise" or c.endswith("init_args.noise")),
                         None)  # fmt: skip
        noise_off = runs[noise_col].isin(_NULL) if noise_col else pd.Series(False, runs.index)
        target = runs[target_col] if target_col else pd.Series("", runs.index)
        from_runs = [(_config_target(s) or f"{e:.3g}") if not t and math.isfinite(e) else t
                     for t, e, s in zip(target, runs["epsilon"], runs["_summary"], strict=True)]  # fmt: skip
        target = pd.Series(from_runs, index=runs.index).where(~noise_off, "")
        target = target.map(lambda t: f"{v:g}" if (v := finite_float(t)) is not None else t)
        method = labels[i] if labels else _default_label(path)
        if not labels and "method" in runs:
            method = runs["method"].where(runs["method"] != "", method)
        drop = [c for c in (target_col, noise_col, "method") if c in runs]
        frames.append(runs.drop(columns=drop).assign(_label=method, _target=target))
    runs = pd.concat(frames, ignore_index=True)
    text = [c for c in _params(runs) if c not in RESULT_COLUMNS]
    return runs.fillna(dict.fromkeys(text, ""))


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
    reported over its seeds (mean and 95 % interval). This selection reads the validation split
    and is not itself private, as in the papers.

    Returns:
        The points, per method in input order: the private ones by target ε, then the
        non-private one.

    Raises:
        ValueError: without a results file, with a missing or unreadable file, with as many
            labels as files not given, with a test ``select`` metric, or when no run finished
            with ``select``.
    """
    _check_selection_metric(select)
    paths = [Path(p) for p in results_paths]
    if not paths:
        raise ValueError("the frontier needs at least one results.csv (one sweep per method)")
    if labels is not None and len(labels) != len(paths):
        raise ValueError(
            f"--labels gives {len(labels)} label(s) for {len(paths)} results file(s): one each"
        )
    runs = _frontier_runs(paths, labels)
    points: list[FrontierPoint] = []
    for method, rows in runs.groupby("_label", sort=False):
        _warn_missing(rows, select, str(method))
        params = [c for c in _params(rows) if c not in SEED_PARAMETERS]
        varying = [c for c in params if rows[c].nunique() > 1] or params
        for target in [*_sorted(t for t in rows["_target"] if t), ""]:
            members = rows[rows["_target"] == target]
            configs = aggregate(members, params, [metric, select]) if len(members) else members
            best = _best(configs, select) if len(members) else members
            if best.empty:
                continue
            best = best.iloc[0]
            dirs = set(best["_dirs"])
            chosen = members[members["_dir"].isin(dirs)]
            adversaries = sorted({a for a in (_adversary(r) for _, r in chosen.iterrows()) if a})
            points.append(FrontierPoint(
                method=str(method), target=target, private=bool(target),
                selected={c: v for c in varying if (v := best[c])}, candidates=len(configs),
                test=Interval.of(best, metric), val=Interval.of(best, select),
                certified=Interval.of(best, "epsilon"), adversary="/".join(adversaries),
                rows=list(best["_dirs"])))  # fmt: skip
    if not points:
        raise ValueError(f"no finished run with a {select} value in "
                         f"{', '.join(map(str, paths))}: no frontier to draw")  # fmt: skip
    return points


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

    The points are :func:`frontier_points`'s. Writes ``frontier.png`` (``metric``, % for an
    accuracy, against the mean certified ε on a log scale, one line per method with its 95 %
    band over seeds clipped to the metric's range, and each method's non-private accuracy as a
    dashed line in the same colour), ``frontier.csv`` (one row per point: method, private,
    target and certified ε, adversary, the selected hyperparameters, seeds, ``metric`` and
    ``select`` as mean, 95 % interval and half-width) and ``frontier.md`` (the table). Every
    caption says that the step size is selected on validation accuracy at each ε, which is not
    itself private, as in the papers.

    Raises:
        ValueError: as :func:`frontier_points`.
    """
    points = frontier_points(results_paths, metric=metric, select=select, labels=labels)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    scale = 100.0 if _is_accuracy(metric) else 1.0
    val_scale = 100.0 if _is_accuracy(select) else 1.0
    unit = " (%)" if scale == 100.0 else ""
    name = "test accuracy" if metric == _TEST else metric
    val_name = "val accuracy" if select == _DEFAULT_METRIC else select
    written = [out / "frontier.png", out / "frontier.csv", out / "frontier.md"]

    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    ax = fig.add_subplot()
    ticks: set[float] = set()
    for i, method in enumerate(dict.fromkeys(p.method for p in points)):
        color = f"C{i % 10}"
        private = sorted((p for p in points if p.method == method and p.private and p.test.n
                          and math.isfinite(p.x) and p.x > 0), key=lambda p: p.x)  # fmt: skip
        if private:
            ticks.update(finite_float(p.target) or p.x for p in private)
            table = pd.DataFrame([vars(p.test) for p in private])
            seeds = max(p.test.n for p in private)
            label = f"{method} ({seeds} seed{'s' if seeds != 1 else ''})"
            _band(ax, [p.x for p in private], table, scale, label, _limits(metric), color=color)
        for p in points:
            if p.method == method and not p.private and p.test.n:
                y = p.test.mean * scale
                ax.axhline(y, color=color, linestyle="--", linewidth=1.2,
                           label=None if private else f"{method} (non-private only)")  # fmt: skip
                ax.annotate("non-private", (1.0, y), xycoords=("axes fraction", "data"),
                            xytext=(3, 0), textcoords="offset points", color=color,
                            fontsize=7, va="center")  # fmt: skip
    ax.set_xscale("log")
    if ticks:
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
    ax.set_xlabel("certified ε (mean over seeds; log scale)")
    ax.set_ylabel(f"{name}{unit}")
    ax.set_title(f"Privacy–utility frontier: {name}, mean over seeds with 95 % t-band;\n"
                 f"{FRONTIER_SELECTION}; dashed: non-private", fontsize=8)  # fmt: skip
    ax.grid(alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7)
    fig.savefig(written[0], dpi=120)

    table = pd.DataFrame([{
        "method": p.method, "private": "true" if p.private else "false",
        "target_epsilon": p.target, "certified_epsilon": _num(p.certified.mean),
        "certified_epsilon_low": _num(p.certified.low),
        "certified_epsilon_high": _num(p.certified.high), "adversary": p.adversary,
        "selected": " ".join(f"{k}={v}" for k, v in p.selected.items()),
        "configurations": p.candidates, "seeds": p.test.n,
        f"{metric}_mean": _num(p.test.mean, scale), f"{metric}_low": _num(p.test.low, scale),
        f"{metric}_high": _num(p.test.high, scale),
        f"{metric}_half_width": _num(p.test.half_width, scale),
        f"{select}_mean": _num(p.val.mean, val_scale),
        f"{select}_half_width": _num(p.val.half_width, val_scale),
        "selected_on": f"{select} (validation, not itself private)"} for p in points])  # fmt: skip
    table.to_csv(written[1], index=False)

    columns = ["method", "target ε", "certified ε", "adversary", "selected (on validation)",
               "seeds", f"{name}{unit}, mean ± 95 % half-width",
               f"{val_name}{unit}, mean ± 95 % half-width"]  # fmt: skip
    rows = [[p.method, p.target or "non-private",
             (f"{p.certified.mean:.3g}" if p.certified.n else "") if p.private else "—",
             p.adversary or ("—" if not p.private else ""),
             # raw names: the step size is γ for one algorithm and η for another
             ", ".join(f"{k}={v}" for k, v in p.selected.items()), str(p.test.n),
             _pm(p.test, scale), _pm(p.val, val_scale)] for p in points]  # fmt: skip
    lines = [f"## Privacy–utility frontier: {name} at each ε, {FRONTIER_SELECTION}", ""]
    lines += _markdown(columns, rows)
    lines += ["", f"Selection: at each target ε the configuration with the best mean {select} "
              f"over seeds; {FRONTIER_SELECTION}. The {name} of the selected configuration is "
              "reported (mean over seeds, 95 % Student-t interval); certified ε is the mean ε "
              "the runs' accountant reported."]  # fmt: skip
    written[2].write_text("\n".join(lines) + "\n")
    return written
