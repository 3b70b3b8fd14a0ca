"""What every report figure shares: curves with their 95 % bands and annotated heatmaps drawn by
seaborn on the axes of a :class:`~matplotlib.figure.Figure`, panel grids, titles and the note
that names the panels left out.

The figures are built without pyplot (no global figure state in a long sweep or a server), so
seaborn's axes-level functions draw on them; its figure-level ``relplot`` and ``FacetGrid``
would create pyplot figures of their own (docs/paper_experiments.md, "The statistics and the
figures").
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pl_privfed.report.runs import order
from pl_privfed.report.stats import t_band
from pl_privfed.report.symbols import symbol

__all__ = ["band", "grid", "heatmap_figure", "omitted_note", "suptitle"]


def band(
    ax: Axes,
    data: pd.DataFrame,
    *,
    x: str = "round",
    factor: float = 1.0,
    label: str | None = None,
    limits: tuple[float, float] = (-math.inf, math.inf),
    **style,
) -> Line2D:
    """The mean over seeds of a curve with its 95 % Student-t band clipped to ``limits``
    (:func:`seaborn.lineplot`).

    Args:
        ax: where to draw.
        data: one row per seed and point: ``x`` and ``value``.
        x: the column of the x axis.
        factor: what the values are multiplied by (100 for an accuracy in percent).
        label: the curve's label (its legend entry).
        limits: the metric's range, which the band is clipped to.
        **style: passed to :meth:`matplotlib.axes.Axes.plot` (colour, line style).

    Returns:
        The mean's line.
    """
    data = data.assign(value=data["value"] * factor)
    spread = data.groupby(x)["value"].std().fillna(0.0).gt(0).any()  # else no band, as one seed
    before = len(ax.lines)
    sns.lineplot(
        data=data,
        x=x,
        y="value",
        estimator="mean",
        ax=ax,
        legend=False,
        label=label,
        errorbar=t_band(limits) if spread else None,
        err_kws={"linewidth": 0},
        marker="." if data[x].nunique() < 30 else None,
        **style,
    )
    return ax.lines[before]


def omitted_note(fig: Figure, omitted: Sequence[str]) -> str | None:
    """A note at the bottom of ``fig`` naming the panels left out for want of data."""
    if not omitted:
        return None
    note = "Panels omitted (no data): " + "; ".join(omitted)
    text = textwrap.fill(note, int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.005, text, fontsize=7, style="italic", va="bottom")
    lines = text.count("\n") + 1  # room below the panels (constrained layout ignores fig.text)
    bottom = 0.15 * lines / fig.get_figheight()
    fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))  # left, bottom, width, height
    return note


def grid(fig: Figure, count: int, ncols: int) -> list[Axes]:
    """``count`` axes in rows of ``ncols`` (unused cells removed)."""
    if not count:
        return []
    nrows = math.ceil(count / ncols)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[count:]:
        ax.remove()
    return list(axes[:count])


def suptitle(fig: Figure, title: str) -> None:
    """The figure's title, wrapped to its width (never between a number and its ``%``)."""
    title = title.replace(" %", "\u00a0%")  # a no-break space: textwrap keeps "95 %" together
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=10)


def _cell_texts(data: np.ndarray, half: np.ndarray, diff: bool) -> np.ndarray:
    """Each cell's annotation: the mean (signed for a difference) and ``±`` the half-width."""
    texts = np.full(data.shape, "", dtype=object)
    for (i, j), value in np.ndenumerate(data):
        if np.isfinite(value):
            texts[i, j] = f"{value:+.1f}" if diff else f"{value:.1f}"
            texts[i, j] += f"\n±{half[i, j]:.1f}" if np.isfinite(half[i, j]) else ""
    return texts


def _panel(
    ax: Axes, own: pd.DataFrame, xs: list[str], ys: list[str], x: str, y: str, **heatmap
) -> None:
    """One annotated heatmap of ``own``'s ``mean`` (``± half``), y upwards (seaborn.heatmap)."""
    cells = own.drop_duplicates([y, x]).set_index([y, x])
    data, half = (
        cells[k].astype(float).unstack().reindex(index=ys, columns=xs).to_numpy()
        for k in ("mean", "half")
    )
    sns.heatmap(
        pd.DataFrame(data, index=ys, columns=xs),
        ax=ax,
        mask=~np.isfinite(data),
        cbar=False,
        annot=_cell_texts(data, half, heatmap.pop("diff")),
        fmt="",
        annot_kws={"fontsize": 7},
        xticklabels=xs,
        yticklabels=ys,
        **heatmap,
    )
    ax.invert_yaxis()  # the smallest y at the bottom, as on a plot
    ax.set_facecolor("0.85")  # a cell without data
    ax.tick_params(axis="y", labelrotation=0)


def heatmap_figure(
    cells: pd.DataFrame,
    facets: Sequence[str],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    names: Sequence[str],
    title: str,
    bounds: tuple[float, float],
    unit: str,
    diff: bool = False,
) -> Figure:
    """One annotated heatmap per facet value of ``cells`` on one colour range and colour bar,
    the common title above them all.

    Args:
        cells: columns ``facets``, ``x``, ``y``, ``mean`` and ``half`` (in the drawn unit).
        facets: one panel per combination of their values (in rows per value of the first).
        xs: the x values in order; ys: the y values.
        x: the x column; y: the y column.
        names: the algorithms, whose symbols name the axes.
        title: the figure's title; unit: the colour bar's label.
        bounds: the colour range.
        diff: a difference (a diverging colour map, signed annotations).

    Returns:
        The figure.
    """
    keys = sorted(
        {tuple(r) for r in cells[list(facets)].itertuples(index=False)},
        key=lambda k: tuple(order(v) for v in k),
    )
    ncols = len({k[-1] for k in keys}) if len(facets) >= 2 else min(len(keys), 4)
    width, height = max(3.6, 1.6 + 0.8 * len(xs)), max(3.0, 1.4 + 0.6 * len(ys))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(width * ncols + 1.2, height * nrows + 0.7), layout="constrained")
    style = {"cmap": "RdBu" if diff else "viridis", "vmin": bounds[0], "vmax": bounds[1]}
    for ax, key in zip(grid(fig, len(keys), ncols), keys, strict=True):
        own = cells[(cells[list(facets)] == list(key)).all(axis=1)] if facets else cells
        _panel(ax, own, xs, ys, x, y, diff=diff, **style)
        ax.set_xlabel(symbol(x, names))
        ax.set_ylabel(symbol(y, names))
        if facets:
            label = ", ".join(f"{symbol(c, names)}={v}" for c, v in zip(facets, key, strict=True))
            ax.set_title(textwrap.fill(label, max(int(width * 9), 20)), fontsize=9)
    suptitle(fig, title)
    if fig.axes:
        fig.colorbar(fig.axes[0].collections[0], ax=fig.axes, label=unit)
    return fig
