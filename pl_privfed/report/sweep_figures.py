"""The figures of a sweep's report besides its heatmaps: the training curves of the selected
configurations, the rounds to a gradient-norm target (paper 003 Figs. 1–2) and the accuracy
against the transmissions (paper 004 Fig. 2)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pl_privfed.report.configs import best
from pl_privfed.report.figures import (
    MAX_PER_ROW,
    band,
    grid,
    legend_below,
    log_floor,
    omitted_note,
    one_point_note,
    suptitle,
)
from pl_privfed.report.runs import NULL, SERVER_NORM, order, seed_curves, sorted_values
from pl_privfed.report.symbols import symbol
from pl_privfed.report.text import limits

__all__ = ["curves_figure", "rounds_to_target_figure", "transmissions_figure"]

#: the curves figure's panels: logged metric -> (name, factor to the drawn unit)
_PANELS = {"train/loss": ("training loss", 1.0), "val/acc": ("validation accuracy (%)", 100.0)}
_STYLES = ["-", "--", ":", "-."]
_CLIP = ("clip_threshold", "threshold")
_STEPS = ("steps", "local_batches")
_FACETS = ("classes_per_client", "concentration")


def _curve_label(
    row: pd.Series, columns: Sequence[str], names: Sequence[str], metric: str, several_methods: bool
) -> str:
    """A curve's legend entry: its method (when several), parameters and seeds."""
    label = ", ".join(f"{symbol(c, names)}={row[c]}" for c in columns if c)
    label = f"{row['_method']}: {label}" if several_methods else label
    if row[f"{metric}:n"] > 1:
        label += f" ({int(row[f'{metric}:n'])} seeds)"
    return label


def _curves_panel(
    ax: Axes, key: str, drawn: list, methods: list[str], xs: list[str], x: str, tuned: str
) -> None:
    """One panel of :func:`curves_figure`: the curves of ``key``, one per drawn configuration."""
    name, factor = _PANELS[key]
    means = np.concatenate([d.groupby("round")["value"].mean().to_numpy() for _, _, d in drawn])
    log = key == "train/loss" and means.min() > 0 and means.max() > 10 * means.min()
    low, high = limits(key)
    if log:  # the band cut a decade below the lowest mean, not off the bottom of the log axis
        low = max(low, log_floor([d for _, _, d in drawn], factor=factor))
    for row, label, data in drawn:
        style = _STYLES[methods.index(row["_method"]) % len(_STYLES)]
        color = f"C{xs.index(row[x]) % 10}"
        band(ax, data, factor=factor, label=label, limits=(low, high), linestyle=style, color=color)
    ax.set_title(f"{name}, {tuned};\nmean over seeds, 95 % t-band", fontsize=9)
    ax.set_xlabel("round")
    ax.set_ylabel(name)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    if log:
        ax.set_yscale("log")


def curves_figure(
    configs: pd.DataFrame,
    x: str,
    y: str | None,
    varying: Sequence[str],
    metric: str,
    names: Sequence[str],
) -> tuple[Figure | None, str | None]:
    """Training loss and validation accuracy (%) of the best y for each x and each method, mean
    over seeds with 95 % bands; panels without data are left out with a note.

    Returns:
        The figure (``None`` when nothing can be drawn) and the note (``None`` without one).
    """
    others = [c for c in varying if c not in (x, y, SERVER_NORM)]
    selected = best(configs, metric, ["_method", x])
    methods = sorted(set(selected["_method"]))
    xs = sorted_values(selected[x])
    drawn: dict[str, list] = {key: [] for key in _PANELS}
    for _, row in selected.iterrows():
        label = _curve_label(row, (x, y, *others), names, metric, len(methods) > 1)
        for key in _PANELS:
            data = seed_curves(row["_dirs"], key)
            if data is not None:
                drawn[key].append((row, label, data))
    present = [k for k in _PANELS if drawn[k]]
    omitted = [f"{_PANELS[k][0]} (no run logged {k})" for k in _PANELS if not drawn[k]]
    if selected.empty:
        return None, f"not drawn: no run has {metric} to select the curves by"
    if not present:
        return None, "not drawn: no run logged train/loss or val/acc (curves.csv)"
    fig = Figure(figsize=(5.6 * len(present), 4.4), layout="constrained")
    tuned = f"best {symbol(y, names)} per {symbol(x, names)}" if y else f"per {symbol(x, names)}"
    axes = grid(fig, len(present), len(present))
    for ax, key in zip(axes, present, strict=True):
        _curves_panel(ax, key, drawn[key], methods, xs, x, tuned)
    # one round axis for both panels: a single validation sits where it happened in the run
    lows, highs = zip(*(ax.get_xlim() for ax in axes))
    for ax in axes:
        ax.set_xlim(min(lows), max(highs))
        one_point_note(ax)
    legend_below(fig)
    return fig, omitted_note(fig, omitted)


def _none_last(text: str) -> tuple:
    """Sort key: numbers numerically, ``null`` (no clipping) last."""
    return (1, 0.0, "") if text in (*NULL, "") else (0, *order(text)[1:])


def _fewest_rounds(configs: pd.DataFrame, keys: list[str]) -> dict[tuple, float]:
    """The fewest mean rounds to the target per ``keys``, among the configurations every seed of
    which reached it."""
    reached = configs[configs["rounds_to_target:n"] == configs["seeds"]]
    fewest = reached.groupby(keys)["rounds_to_target:mean"].min() if len(reached) else {}
    return {k if isinstance(k, tuple) else (k,): v for k, v in fewest.items()}


def rounds_to_target_figure(
    configs: pd.DataFrame, params: list[str], names: Sequence[str]
) -> Figure:
    """Paper 003 Figs. 1-2: fewest mean rounds (over seeds) to the gradient-norm target against
    the clipping threshold (``null`` = no clipping, drawn last as "none"), one line per
    local-step count, one panel per heterogeneity level; a configuration counts only if every
    seed reached the target; cells that never did are drawn as × at the top."""
    x = next((c for c in _CLIP if c in params), None) or params[0]
    series = next((c for c in _STEPS if c in params and c != x), None)
    facet = next((c for c in _FACETS if c in params and c not in (x, series)), None)
    xs = sorted(set(configs[x]), key=_none_last)
    ceiling = np.nanmax([configs["rounds:mean"].max(), 1.0])
    fewest = _fewest_rounds(configs, [k for k in (facet, series, x) if k])
    facets = sorted_values(configs[facet]) if facet else [""]
    ncols = min(len(facets), MAX_PER_ROW)
    fig = Figure(
        figsize=(4.6 * ncols, 3.8 * math.ceil(len(facets) / ncols) + 0.4), layout="constrained"
    )
    for ax, fv in zip(grid(fig, len(facets), ncols), facets, strict=True):
        members = configs[configs[facet] == fv] if facet else configs
        for sv in sorted_values(members[series]) if series else [""]:
            key = tuple(k for k in (fv if facet else None, sv if series else None) if k is not None)
            fewest_here = [fewest.get((*key, xv), math.nan) for xv in xs]
            label = f"{symbol(series, names)}={sv}" if series else None
            (line,) = ax.plot(range(len(xs)), fewest_here, marker="o", label=label)
            missing = [i for i, v in enumerate(fewest_here) if math.isnan(v)]
            ax.plot(missing, [ceiling] * len(missing), "x", color=line.get_color())
        ax.set_xticks(range(len(xs)), ["none" if v in NULL else v for v in xs])
        clip = f"{symbol(x, names)} (clipping threshold)" if x in _CLIP else symbol(x, names)
        ax.set_xlabel(clip)
        ax.set_ylabel("rounds to target (mean over seeds)")
        title = f"{symbol(facet, names)}={fv}" if facet else "rounds to ||∇f|| target"
        ax.set_title(title, fontsize=9)
        ax.grid(alpha=0.3)
    legend_below(fig)
    suptitle(fig, "fewest rounds to the gradient-norm target (×: not reached by every seed)")
    return fig


def transmissions_figure(
    configs: pd.DataFrame, column: str, metric: str, names: Sequence[str]
) -> Figure | None:
    """Paper 004 Fig. 2: validation accuracy (%) of the best configuration per participation
    value against the cumulative client-to-server transmissions, mean over seeds, 95 % band."""
    fig = Figure(figsize=(6, 4.2), layout="constrained")
    ax = fig.add_subplot()
    selected = best(configs, metric, [column])
    selected = selected.iloc[
        sorted(range(len(selected)), key=lambda i: order(selected[column].iloc[i]))
    ]
    for _, row in selected.iterrows():
        sent, rounds = row["client_transmissions:mean"], row["rounds:mean"]
        data = seed_curves(row["_dirs"], "val/acc")
        if data is None or not math.isfinite(sent) or not rounds:
            continue
        band(
            ax,
            data.assign(sent=data["round"] * (sent / rounds)),
            x="sent",
            factor=100.0,
            label=f"{symbol(column, names)}={row[column]}",
            limits=limits("val/acc"),
        )
    if not ax.lines:
        return None
    ax.set_xlabel("client-to-server transmissions (k · p · M)")
    ax.set_ylabel("validation accuracy (%)")
    ax.set_title(
        "validation accuracy of the best configuration per participation;\n"
        "mean over seeds, 95 % t-band",
        fontsize=9,
    )
    ax.grid(alpha=0.3)
    legend_below(fig)
    return fig
