"""``pl-privfed compare``: the best configuration of each sweep side by side, against rounds and
against bits (paper 001 Figs. 2–3)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pl_privfed.report.configs import aggregate, best, check_selection_metric, warn_missing
from pl_privfed.report.figures import (
    band,
    grid,
    legend_below,
    log_floor,
    omitted_note,
    one_point_note,
    suptitle,
)
from pl_privfed.report.runs import (
    DEFAULT_METRIC,
    TEST,
    check_summaries,
    load_results,
    params,
    paths,
    seed_curves,
    summary,
    utility_curve,
)
from pl_privfed.report.stats import Interval, mean_interval
from pl_privfed.report.text import fmt_ci, fmt_sd, limits, markdown, overlap_notes
from pl_privfed.results import SEED_PARAMETERS, finite_float

__all__ = ["compare_methods", "comparison_figure"]

_HEADER = [
    "method",
    "seeds",
    "val accuracy (%)",
    "val 95 % CI",
    "test accuracy (%)",
    "test 95 % CI",
    "final utility",
    "bits sent per agent",
    "ε",
]


@dataclass(frozen=True)
class _Panel:
    """One panel of the comparison: a curve against rounds or bits."""

    title: str
    curve: str  # "utility" or "accuracy"
    bits: bool
    factor: float
    limits: str  # the metric whose range clips the band


_PANELS = [
    _Panel("train utility ||∇f(x̄)||² against rounds", "utility", False, 1.0, "utility"),
    _Panel("train utility ||∇f(x̄)||² against bits", "utility", True, 1.0, "utility"),
    _Panel("validation accuracy (%) against rounds", "accuracy", False, 100.0, "val/acc"),
    _Panel("validation accuracy (%) against bits", "accuracy", True, 100.0, "val/acc"),
]


@dataclass(frozen=True)
class _Method:
    """The selected configuration of one sweep: its label, its bits sent per agent per round
    and its curves of each run (``None`` without data)."""

    label: str
    per_round: Interval
    utility: pd.DataFrame | None
    accuracy: pd.DataFrame | None

    def curve(self, panel: _Panel) -> pd.DataFrame | None:
        """The curve ``panel`` draws of this method (``None`` when it has no data for it)."""
        data = self.utility if panel.curve == "utility" else self.accuracy
        return None if data is None or (panel.bits and not self.per_round.n) else data


def _sent_bits_per_round(data: dict) -> float | None:
    """Mean bits one agent or client *sends* per round: the per-agent totals of every channel but
    the server's broadcast, divided by the rounds run."""
    totals = data.get("communication_total_bits_per_agent")
    rounds = finite_float(data.get("rounds"))
    if not isinstance(totals, dict) or not rounds:
        return None
    sent = [v for k, v in totals.items() if k != "server_to_client" and finite_float(v) is not None]
    return sum(map(float, sent)) / rounds if sent else None


def _selected(path: Path, metric: str) -> tuple[pd.Series, list[str]]:
    """A sweep's best configuration on ``metric`` and the parameters that vary in it."""
    runs = load_results(path)
    warn_missing(runs, metric, str(path), stacklevel=4)
    check_summaries(runs)
    config_params = [c for c in params(runs) if c not in SEED_PARAMETERS]
    selected = best(aggregate(runs, config_params, [metric]), metric)
    if selected.empty:
        raise ValueError(f"{path} has no finished run with a {metric} value")
    return selected.iloc[0], [c for c in config_params if runs[c].nunique() > 1]


def _row(method: _Method, selected: pd.Series, metric: str) -> list[str]:
    """The method's row of the comparison table."""
    total = method.per_round.mean * selected["rounds:mean"] if method.per_round.n else math.nan
    val, test = Interval.of(selected, metric), Interval.of(selected, TEST)
    eps = Interval.of(selected, "epsilon")
    utility = method.utility
    final = "" if utility is None else f"{utility.groupby('round')['value'].mean().iloc[-1]:.4g}"
    return [
        method.label,
        str(selected["seeds"]),
        fmt_sd(val, 100),
        fmt_ci(val, 100),
        fmt_sd(test, 100),
        fmt_ci(test, 100),
        final,
        "" if not math.isfinite(total) else f"{total:.4g}",
        f"{eps.mean:.3g}" if eps.n else "",
    ]


def _why(panel: _Panel, methods: list[_Method]) -> str:
    """Why ``panel`` has no data."""
    if panel.curve == "utility" and all(m.utility is None for m in methods):
        return "no run has a GradientNorm history"
    if panel.curve == "accuracy" and all(m.accuracy is None for m in methods):
        return "no run logged val/acc"
    return "no run recorded its bits per agent"


def _draw(ax: Axes, panel: _Panel, methods: list[_Method]) -> None:
    """One panel: each method's curve, mean over seeds with its 95 % band (on the utility's log
    axis cut a decade below the lowest mean rather than falling off the bottom)."""
    utility = panel.curve == "utility"
    low, high = limits(panel.limits)
    if utility:
        low = max(low, log_floor([d for m in methods if (d := m.curve(panel)) is not None]))
    for i, method in enumerate(methods):
        data = method.curve(panel)
        if data is None:
            continue
        data = data.assign(bits=data["round"] * method.per_round.mean) if panel.bits else data
        band(
            ax,
            data,
            x="bits" if panel.bits else "round",
            factor=panel.factor,
            label=method.label,
            limits=(low, high),
            color=f"C{i % 10}",
        )
    ax.set_title(panel.title, fontsize=9)
    ax.set_xlabel("bits sent per agent" if panel.bits else "round")
    if panel.bits:  # 1e5 rather than 100000: the tick labels stay apart
        ax.ticklabel_format(axis="x", style="sci", scilimits=(-3, 3))
    one_point_note(ax, "bits" if panel.bits else "round")
    ax.set_ylabel("||∇f(x̄)||²" if utility else "validation accuracy (%)")
    ax.grid(alpha=0.3)
    if utility:
        ax.set_yscale("log")


def _figure(methods: list[_Method]) -> tuple[Figure, str | None]:
    """The panels that have data, in rows of two, and the note naming the others."""
    present = [p for p in _PANELS if any(m.curve(p) is not None for m in methods)]
    omitted = [f"{p.title} ({_why(p, methods)})" for p in _PANELS if p not in present]
    height = 3.8 * max(1, math.ceil(len(present) / 2)) + 0.9  # + the title and the legend
    fig = Figure(figsize=(10, height), layout="constrained")
    for ax, panel in zip(grid(fig, len(present), 2), present, strict=True):
        _draw(ax, panel, methods)
    legend_below(fig)  # every method once, below the panels: it covers no curve
    suptitle(fig, "the best configuration of each sweep: mean over seeds with 95 % t-band")
    return fig, omitted_note(fig, omitted)


def comparison_figure(
    results_csvs: Sequence[str | os.PathLike], *, metric: str = DEFAULT_METRIC
) -> tuple[Figure, pd.DataFrame, list[str]]:
    """:func:`compare_methods` without writing.

    Returns:
        The figure, the table and the notes (panels left out for want of data, overlapping test
        intervals).

    Raises:
        ValueError: as :func:`compare_methods`.
    """
    check_selection_metric(metric)
    if not results_csvs:
        raise ValueError("compare_methods needs at least one results.csv")
    rows, tests, methods = [], {}, []
    for path in paths(results_csvs):
        selected, varying = _selected(path, metric)
        # raw names: one label per method, each method's own symbols would collide across files
        setting = ", ".join(f"{c}={selected[c]}" for c in varying)
        label = f"{selected['_method']} ({setting})" if setting else selected["_method"]
        if label in tests:  # the same method twice (e.g. two privacy levels): name the file
            label += f" [{path.parent.name}]"
        dirs = selected["_dirs"]
        per_round = mean_interval(_sent_bits_per_round(summary(d)) for d in dirs)
        method = _Method(label, per_round, utility_curve(dirs), seed_curves(dirs, "val/acc"))
        methods.append(method)
        tests[label] = Interval.of(selected, TEST)
        rows.append(_row(method, selected, metric))
    fig, note = _figure(methods)
    notes = [n for n in [note] if n] + overlap_notes(tests)
    return fig, pd.DataFrame(rows, columns=_HEADER, dtype=str), notes


def compare_methods(
    results_csvs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = DEFAULT_METRIC,
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

    Args:
        results_csvs: one sweep's ``results.csv`` (or its folder) per method.
        out_dir: where to write.
        metric: the validation column that selects each sweep's configuration.

    Returns:
        The written files.

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
    lines = markdown(list(table.columns), table.values)
    if notes:
        lines += ["", "Notes:", "", *(f"- {n}" for n in notes)]
    written[2].write_text("\n".join(lines) + "\n")
    return written
