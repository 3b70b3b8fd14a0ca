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
from collections import Counter
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from pl_privfed.report.runs import order
from pl_privfed.report.stats import t_band
from pl_privfed.report.symbols import symbol

__all__ = [
    "MAX_PER_ROW",
    "band",
    "grid",
    "heatmap_figure",
    "legend_below",
    "log_floor",
    "omitted_note",
    "one_point_note",
    "suptitle",
]

#: the most panels a figure puts side by side (more would make a figure too wide to read)
MAX_PER_ROW = 4


def series_color(index: int, count: int) -> str | tuple[float, ...]:
    """The colour of series ``index`` of ``count`` in one figure: matplotlib's ``C0``…``C9``
    while they are enough, else ``tab20`` with its ten dark hues first and their light twins
    after, so that up to 20 series (the frontier figures' families) never share a colour."""
    if count <= 10:
        return f"C{index % 10}"
    i = index % 20
    return tuple(colormaps["tab20"](2 * i if i < 10 else 2 * (i - 10) + 1))


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
    import seaborn as sns  # on use: with scipy.stats about 1 s of CPU to import

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
        # one point (one evaluation): a dot big enough to see; a few: small dots on the line
        marker="o" if data[x].nunique() == 1 else "." if data[x].nunique() < 30 else None,
        **style,
    )
    return ax.lines[before]


def omitted_note(fig: Figure, omitted: Sequence[str]) -> str | None:
    """A note at the bottom of ``fig`` naming the panels left out for want of data, below the
    figure's legend (:func:`legend_below`) when it has one."""
    if not omitted:
        return None
    note = "Panels omitted (no data): " + "; ".join(omitted)
    text = textwrap.fill(note, int(fig.get_figwidth() * 17))
    fig.text(0.01, 0.005, text, fontsize=7, style="italic", va="bottom")
    lines = text.count("\n") + 1  # room below the panels (constrained layout ignores fig.text)
    bottom = 0.15 * lines / fig.get_figheight()
    for legend in fig.legends:  # anchored above the note: its room is then taken by hand too
        legend.set_loc("lower center")
        legend.set_bbox_to_anchor((0, bottom, 1, 1 - bottom), transform=fig.transFigure)
        height = legend.get_window_extent(FigureCanvasAgg(fig).get_renderer()).height
        bottom += (height + 4) / fig.dpi / fig.get_figheight()
    fig.get_layout_engine().set(rect=(0, bottom, 1, 1 - bottom))  # left, bottom, width, height
    return note


def grid(fig: Figure, count: int | Sequence[int], ncols: int) -> list[Axes]:
    """``count`` axes in rows of ``ncols`` (unused cells removed); with a sequence of counts,
    each group starts a row of its own (e.g. one group per value of a first facet) and wraps
    onto further rows when it has more than ``ncols``."""
    groups = [count] if isinstance(count, int) else list(count)
    if not sum(groups):
        return []
    nrows = sum(math.ceil(n / ncols) for n in groups)
    cells = fig.subplots(nrows, ncols, squeeze=False)
    used, row = [], 0
    for n in groups:
        used += [cells[row + i // ncols, i % ncols] for i in range(n)]
        row += math.ceil(n / ncols)
    for ax in cells.ravel():
        if not any(ax is u for u in used):
            ax.remove()
    return used


def legend_below(fig: Figure, fontsize: float = 7, last: Sequence[str] = ()) -> None:
    """One legend for the whole figure, below its panels (outside every axes, so that it never
    covers a curve), with each label once (the same method in several panels), the labels
    ``last`` at its end; in as many columns as the figure's width holds."""
    entries: dict[str, object] = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    for label in last:
        if label in entries:
            entries[label] = entries.pop(label)
    if not entries:
        return
    column = max(map(len, entries)) * 0.6 * fontsize + 40  # points: the text, the handle, a gap
    widest = max(1, min(len(entries), int(0.95 * fig.get_figwidth() * 72 // column)))
    ncols = math.ceil(len(entries) / math.ceil(len(entries) / widest))  # rows evenly filled
    fig.legend(
        list(entries.values()),
        list(entries),
        loc="outside lower center",
        ncols=ncols,
        fontsize=fontsize,
        frameon=False,
    )


def log_floor(frames: Sequence[pd.DataFrame], x: str = "round", factor: float = 1.0) -> float:
    """Where a band on a log y axis is cut: a decade below the lowest positive mean of the
    ``frames`` (one row per seed and point, ``x`` and ``value``). A Student-t band over few
    seeds often reaches zero or below, which a log axis cannot draw: the band would fall off
    the bottom of the axes; cut there, it still shows that the interval is wide."""
    means = pd.concat([f.groupby(x)["value"].mean() * factor for f in frames])
    positive = means[means > 0]
    return float(positive.min()) / 10 if len(positive) else 0.0


def one_point_note(ax: Axes, x: str = "round") -> None:
    """When every curve of ``ax`` has a single point (one evaluation), say so in the panel and
    give its x axis at least one unit (one round) on each side of the point, rather than a dot
    alone on an axis a few hundredths wide."""
    xs = {float(v) for line in ax.lines for v in line.get_xdata()}
    if len(xs) != 1 or any(len(line.get_xdata()) != 1 for line in ax.lines):
        return
    (value,) = xs
    low, high = ax.get_xlim()
    pad = max(1.0, 0.05 * abs(value))
    ax.set_xlim(min(low, value - pad), max(high, value + pad))
    ax.text(
        0.02,
        0.98,
        f"one evaluation only ({x} {value:g})",
        transform=ax.transAxes,
        fontsize=7,
        style="italic",
        va="top",
    )


def suptitle(fig: Figure, title: str) -> None:
    """The figure's title, wrapped to its width (never between a number and its ``%``)."""
    title = title.replace(" %", "\u00a0%")  # a no-break space: textwrap keeps "95 %" together
    fig.suptitle(textwrap.fill(title, int(fig.get_figwidth() * 11)), fontsize=10)


def _cell_texts(
    data: np.ndarray, half: np.ndarray, diff: bool, seeds: np.ndarray | None = None
) -> np.ndarray:
    """Each cell's annotation: the mean (signed for a difference) and ``±`` the half-width
    (from 3 seeds on), else the seeds' values in brackets (``seeds``: text per cell)."""
    texts = np.full(data.shape, "", dtype=object)
    for (i, j), value in np.ndenumerate(data):
        if np.isfinite(value):
            texts[i, j] = f"{value:+.1f}" if diff else f"{value:.1f}"
            if np.isfinite(half[i, j]):
                texts[i, j] += f"\n±{half[i, j]:.1f}"
            elif seeds is not None and isinstance(seeds[i, j], str) and seeds[i, j]:
                texts[i, j] += f"\n({seeds[i, j]})"
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
    seeds = (
        cells["seeds_text"].unstack().reindex(index=ys, columns=xs).to_numpy()
        if "seeds_text" in cells
        else None
    )
    import seaborn as sns  # on use: with scipy.stats about 1 s of CPU to import

    sns.heatmap(
        pd.DataFrame(data, index=ys, columns=xs),
        ax=ax,
        mask=~np.isfinite(data),
        cbar=False,
        annot=_cell_texts(data, half, heatmap.pop("diff"), seeds),
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
        cells: columns ``facets``, ``x``, ``y``, ``mean`` and ``half`` (in the drawn unit;
            ``nan`` where too few seeds give no interval) and optionally ``seeds_text`` (the
            seeds' values shown in brackets where there is no interval).
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
    # a row per value of the first facet (wrapped after MAX_PER_ROW panels), else rows of 4
    groups = list(Counter(k[0] for k in keys).values()) if len(facets) >= 2 else [len(keys)]
    ncols = min(max(groups, default=1), MAX_PER_ROW)
    width, height = max(3.6, 1.6 + 0.8 * len(xs)), max(3.0, 1.4 + 0.6 * len(ys))
    nrows = sum(math.ceil(n / ncols) for n in groups)
    fig = Figure(figsize=(width * ncols + 1.2, height * nrows + 0.7), layout="constrained")
    style = {"cmap": "RdBu" if diff else "viridis", "vmin": bounds[0], "vmax": bounds[1]}
    for ax, key in zip(grid(fig, groups, ncols), keys, strict=True):
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
