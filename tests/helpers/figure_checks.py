"""Layout checks of a drawn matplotlib figure, read from its Axes once constrained layout has run:
every panel titled and its title inside the figure, no two text boxes on top of each other, no
legend over a curve, bands inside their axis range (a log axis included), at most 4 panels in a
row. :func:`layout_problems` returns what is wrong in words (an empty list when nothing is), so a
failing test says which text, legend or band is at fault."""

from __future__ import annotations

import itertools

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.text import Text

#: most panels a figure may put side by side
MAX_PER_ROW = 4


def renderer(fig: Figure):
    """Draw ``fig`` (constrained layout included) on an Agg canvas and return its renderer."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def panels(fig: Figure) -> list[Axes]:
    """The figure's panels: its axes that are not colour bars."""
    return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def _name(text: Text) -> str:
    return repr(text.get_text().replace("\n", " ")[:50])


def text_boxes(fig: Figure, rend) -> list[tuple[str, object]]:
    """Every visible text box of ``fig`` with a name: its title, the panels' titles, axis
    labels and texts (annotations, notes), the figure's texts and every legend."""
    texts: list[Text] = list(dict.fromkeys(t for t in (fig._suptitle, *fig.texts) if t))
    for ax in panels(fig):
        texts += [ax.title, ax.xaxis.label, ax.yaxis.label, *ax.texts]
    boxes = [
        (_name(t), t.get_window_extent(rend)) for t in texts if t.get_text() and t.get_visible()
    ]
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    return boxes + [(f"legend {i}", leg.get_window_extent(rend)) for i, leg in enumerate(legends)]


def _line_points(line, ax: Axes, per_segment: int = 20) -> np.ndarray:
    """Display coordinates of points along ``line`` (its vertices and points between them)."""
    xy = np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float)
    xy = xy[np.isfinite(xy).all(axis=1)]
    if len(xy) > 1:
        t = np.linspace(0, 1, per_segment)[:, None, None]
        xy = (xy[:-1] * (1 - t) + xy[1:] * t).reshape(-1, 2)
    points = line.get_transform().transform(xy) if len(xy) else xy
    return points[np.isfinite(points).all(axis=1)] if len(points) else points


def _within(points: np.ndarray, box) -> np.ndarray:
    """Which of the display ``points`` lie in ``box``."""
    x, y = points[:, 0], points[:, 1]
    return (x >= box.x0) & (x <= box.x1) & (y >= box.y0) & (y <= box.y1)


def covered_curves(fig: Figure, rend) -> list[str]:
    """The curves that a legend lies on (points sampled along each line, inside its axes)."""
    legends = [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]
    problems = []
    for leg, ax in itertools.product(legends, panels(fig)):
        box, frame = leg.get_window_extent(rend), ax.get_window_extent(rend)
        for line in ax.lines:
            points = _line_points(line, ax)
            if len(points) and _within(points[_within(points, frame)], box).any():
                problems.append(f"a legend covers the curve {line.get_label()!r}")
    return problems


def bands_outside(ax: Axes) -> list[str]:
    """The bands (``fill_between``) of ``ax`` with a vertex outside its y range, or on a log
    axis at or below zero (such a band falls off the bottom)."""
    low, high = sorted(ax.get_ylim())
    tolerance = 1e-9 * max(abs(low), abs(high), 1e-300)
    problems = []
    for coll in ax.collections:
        if not isinstance(coll, PolyCollection):
            continue
        y = np.concatenate([p.vertices[:, 1] for p in coll.get_paths()] or [np.empty(0)])
        if ax.get_yscale() == "log" and (y <= 0).any():
            problems.append(f"a band of {ax.get_title()!r} reaches {y.min():g} on a log axis")
        elif ((y < low - tolerance) | (y > high + tolerance)).any():
            problems.append(f"a band of {ax.get_title()!r} leaves the y range {low:g}..{high:g}")
    return problems


def per_row(fig: Figure) -> int:
    """The most panels side by side in one row (panels whose vertical spans overlap)."""
    boxes = [ax.get_position() for ax in panels(fig)]
    rows = [sum(1 for o in boxes if o.y0 < b.y1 and b.y0 < o.y1) for b in boxes]
    return max(rows, default=0)


def layout_problems(fig: Figure, *, titled: bool = True) -> list[str]:
    """Everything wrong with ``fig``'s layout, in words (empty when nothing is).

    Args:
        fig: the figure to draw and check.
        titled: whether every panel must have a title.
    """
    rend = renderer(fig)
    problems = []
    for ax in panels(fig):
        if titled and not ax.get_title():
            problems.append(f"a panel has no title (y label {ax.get_ylabel()!r})")
    boxes = text_boxes(fig, rend)
    figure_box = fig.bbox
    for name, box in boxes:
        if (
            box.x0 < figure_box.x0 - 1
            or box.y0 < figure_box.y0 - 1
            or box.x1 > figure_box.x1 + 1
            or box.y1 > figure_box.y1 + 1
        ):
            problems.append(f"{name} leaves the figure")
    for (a, p), (b, q) in itertools.combinations(boxes, 2):
        if p.overlaps(q):
            problems.append(f"{a} overlaps {b}")
    problems += covered_curves(fig, rend)
    for ax in panels(fig):
        problems += bands_outside(ax)
    if per_row(fig) > MAX_PER_ROW:
        problems.append(f"{per_row(fig)} panels in one row (at most {MAX_PER_ROW})")
    return problems


def notes_below_panels(fig: Figure) -> bool:
    """Whether the figure's notes (its texts besides its title) lie below every panel, tick
    labels and axis labels included, and below its legends."""
    rend = renderer(fig)
    notes = [t for t in fig.texts if t is not fig._suptitle and t.get_text()]
    top = max(t.get_window_extent(rend).y1 for t in notes)
    above = [ax.get_tightbbox(rend).y0 for ax in panels(fig)]
    above += [leg.get_window_extent(rend).y0 for leg in fig.legends]
    return top < min(above)


def overlapping(fig: Figure, texts) -> list[tuple[str, str]]:
    """Pairs of ``texts`` (e.g. one axis' tick labels) whose boxes overlap once ``fig`` is
    drawn."""
    rend = renderer(fig)
    boxes = [(t.get_text(), t.get_window_extent(rend)) for t in texts if t.get_text()]
    return [(a, b) for (a, p), (b, q) in itertools.combinations(boxes, 2) if p.overlaps(q)]
