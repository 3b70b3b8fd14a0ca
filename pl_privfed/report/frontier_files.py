"""``pl-privfed compare --frontier``: the privacy–utility frontier drawn
(``frontier.png``) and tabulated (``frontier.csv``, ``frontier.md``)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pl_privfed.report.figures import band, legend_below
from pl_privfed.report.frontier_data import (
    FRONTIER_EPSILONS,
    FRONTIER_SELECTION,
    FrontierPoint,
    frontier_points,
)
from pl_privfed.report.runs import DEFAULT_METRIC, TEST
from pl_privfed.report.text import fmt_num, fmt_pm, is_accuracy, limits, markdown
from pl_privfed.results import finite_float

__all__ = ["frontier"]


@dataclass(frozen=True)
class _Names:
    """How the frontier's files name and scale its two metrics."""

    metric: str
    select: str
    random_search: str | None = None

    @property
    def factor(self) -> float:
        """The reported metric's factor to its drawn unit (100 for an accuracy)."""
        return 100.0 if is_accuracy(self.metric) else 1.0

    @property
    def val_factor(self) -> float:
        """The selection metric's factor to its drawn unit."""
        return 100.0 if is_accuracy(self.select) else 1.0

    @property
    def unit(self) -> str:
        """`` (%)`` for an accuracy, else nothing."""
        return " (%)" if self.factor == 100.0 else ""

    @property
    def name(self) -> str:
        """The reported metric's name in captions."""
        return "test accuracy" if self.metric == TEST else self.metric

    @property
    def val_name(self) -> str:
        """The selection metric's name in captions."""
        return "val accuracy" if self.select == DEFAULT_METRIC else self.select


def _private_curve(
    ax: Axes, method: str, private: list[FrontierPoint], names: _Names, color: str
) -> None:
    """A method's private points: the mean of the reported metric against the certified ε,
    with its 95 % band over seeds."""
    data = pd.DataFrame(
        [{"epsilon": p.x, "value": v} for p in private for v in (p.values or [p.test.mean])]
    )
    seeds = max(p.test.n for p in private)
    label = f"{method} ({seeds} seed{'s' if seeds != 1 else ''})"
    band(
        ax,
        data,
        x="epsilon",
        factor=names.factor,
        label=label,
        limits=limits(names.metric),
        color=color,
    )


def _non_private_line(
    ax: Axes, method: str, point: FrontierPoint, names: _Names, color: str
) -> None:
    """A method's non-private accuracy: a dashed line across the figure, named in the legend
    (a text at the line's end would print on top of another method's at a close accuracy)."""
    y = point.test.mean * names.factor
    ax.axhline(y, color=color, linestyle="--", linewidth=1.2, label=f"{method}: non-private")


def _figure(points: list[FrontierPoint], names: _Names) -> Figure:
    """``frontier.png``: one curve per method on a log ε axis, its non-private accuracy dashed."""
    fig = Figure(figsize=(7.5, 5.2), layout="constrained")
    ax = fig.add_subplot()
    ticks: set[float] = set()
    for i, method in enumerate(dict.fromkeys(p.method for p in points)):
        color = f"C{i % 10}"
        mine = [p for p in points if p.method == method]
        private = sorted(
            (p for p in mine if p.private and p.test.n and math.isfinite(p.x) and p.x > 0),
            key=lambda p: p.x,
        )
        if private:
            ticks.update(finite_float(p.target) or p.x for p in private)
            _private_curve(ax, method, private, names, color)
        for p in mine:
            if not p.private and p.test.n:
                _non_private_line(ax, method, p, names, color)
    ax.set_xscale("log")
    if ticks:
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
    ax.set_xlabel("certified ε (mean over seeds; log scale)")
    ax.set_ylabel(f"{names.name}{names.unit}")
    ax.set_title(
        f"Privacy–utility frontier: {names.name}, mean over seeds with 95 % t-band;\n"
        f"{FRONTIER_SELECTION}; dashed: non-private;\n"
        "x: the selected runs' certified ε (the selection's cost: frontier.md)",
        fontsize=8,
    )
    ax.grid(alpha=0.3)
    legend_below(fig)  # below the axes: it covers no curve
    return fig


def _selection_columns(p: FrontierPoint, names: _Names) -> dict[str, object]:
    """A private point's selection cost in ``frontier.csv``: how many candidate runs were
    compared, their composition's ε and, if asked, the random-search bound."""
    if not p.private:
        return {"selection_runs": "", "epsilon_with_selection": ""}
    columns: dict[str, object] = {
        "selection_runs": p.cost.runs,
        "epsilon_with_selection": fmt_num(p.cost.composed),
    }
    if names.random_search is not None:
        columns["epsilon_random_search"] = fmt_num(p.cost.random_search)
        columns["random_search"] = names.random_search
    return columns


def _csv_row(p: FrontierPoint, names: _Names) -> dict[str, object]:
    """One point's row of ``frontier.csv``."""
    metric, select, factor = names.metric, names.select, names.factor
    return {
        "method": p.method,
        "private": "true" if p.private else "false",
        "target_epsilon": p.target,
        "certified_epsilon": fmt_num(p.certified.mean),
        "certified_epsilon_low": fmt_num(p.certified.low),
        "certified_epsilon_high": fmt_num(p.certified.high),
        **_selection_columns(p, names),
        "adversary": p.adversary,
        "selected": " ".join(f"{k}={v}" for k, v in p.selected.items()),
        **{f"selected_{k}": v for k, v in p.selected.items()},
        "configurations": p.candidates,
        "seeds": p.test.n,
        f"{metric}_mean": fmt_num(p.test.mean, factor),
        f"{metric}_low": fmt_num(p.test.low, factor),
        f"{metric}_high": fmt_num(p.test.high, factor),
        f"{metric}_half_width": fmt_num(p.test.half_width, factor),
        f"{select}_mean": fmt_num(p.val.mean, names.val_factor),
        f"{select}_half_width": fmt_num(p.val.half_width, names.val_factor),
        "selected_on": f"{select} (validation)",
    }


def _eps(value: float) -> str:
    """An ε in the table (empty where unknown)."""
    return f"{value:.3g}" if math.isfinite(value) else ""


def _md_row(p: FrontierPoint, names: _Names) -> list[str]:
    """One point's row of ``frontier.md``."""
    certified = (f"{p.certified.mean:.3g}" if p.certified.n else "") if p.private else "—"
    with_selection = [f"{_eps(p.cost.composed)} ({p.cost.runs} runs)" if p.private else "—"]
    if names.random_search is not None:
        with_selection.append(_eps(p.cost.random_search) if p.private else "—")
    return [
        p.method,
        p.target or "non-private",
        certified,
        *with_selection,
        p.adversary or ("—" if not p.private else ""),
        # raw names: the step size is γ for one algorithm and η for another
        ", ".join(f"{k}={v}" for k, v in p.selected.items()),
        str(p.test.n),
        fmt_pm(p.test, names.factor),
        fmt_pm(p.val, names.val_factor),
    ]


def _markdown(points: list[FrontierPoint], names: _Names) -> str:
    """``frontier.md``: the table and how its points were selected."""
    name, unit = names.name, names.unit
    columns = [
        "method",
        "target ε",
        "certified ε (selected runs)",
        "ε with selection (candidate runs composed)",
        *(
            [f"ε with selection, random search ({names.random_search}; P&S 2022)"]
            if names.random_search is not None
            else []
        ),
        "adversary",
        "selected (on validation)",
        "seeds",
        f"{name}{unit}, mean ± 95 % half-width",
        f"{names.val_name}{unit}, mean ± 95 % half-width",
    ]
    lines = [f"## Privacy–utility frontier: {name} at each ε, {FRONTIER_SELECTION}", ""]
    lines += markdown(columns, [_md_row(p, names) for p in points])
    lines += [
        "",
        f"Selection: at each target ε the configuration with the best mean {names.select} "
        f"over seeds ({FRONTIER_EPSILONS}). The {name} of the selected configuration is "
        "reported (mean over seeds, 95 % Student-t interval). Certified ε: the mean ε the "
        "selected runs' accountant reported, which holds for the point only if its "
        "configuration had been fixed without looking at the other candidates. ε with "
        "selection: the choice reads every candidate run (configurations × seeds, trained on "
        "the same clients' data), so its cost to the training data is every candidate's "
        "releases composed by the runs' accountant, whatever the validation data.",
    ]
    if names.random_search is not None:
        lines.append(
            "ε with selection, random search: Papernot & Steinke (ICLR 2022) Thm. 2/6 by "
            f"dp-accounting's RDP accountant, for a random search whose number of candidates "
            f"is drawn from a {names.random_search} distribution with mean = the "
            "configurations compared, each candidate one configuration with its seeds, only "
            "the best released: a bound for that procedure, not for the grid that was run."
        )
    lines.append(
        "The validation examples are held out of every client's training data: no ε covers "
        "them, so the selection is free for them only if they are not private "
        "(docs/privacy.md)."
    )
    return "\n".join(lines) + "\n"


def frontier(
    results_paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = "final_test_accuracy",
    select: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
    random_search: str | None = None,
) -> list[Path]:
    """Draw the privacy–utility frontier: test accuracy against certified ε, one curve per
    method; return the written paths.

    The points are :func:`~pl_privfed.report.frontier_points`'s. Writes ``frontier.png``
    (``metric``, % for an accuracy, against the mean certified ε on a log scale, one line per
    method with its 95 % band over seeds clipped to the metric's range, and each method's
    non-private accuracy as a dashed line in the same colour, named in the legend below the
    axes), ``frontier.csv`` (one row per
    point: method, private, target and certified ε, the selection's cost (``selection_runs``,
    ``epsilon_with_selection``, with ``random_search`` ``epsilon_random_search``), adversary,
    the selected hyperparameters (``selected`` and one ``selected_<name>`` column each),
    seeds, ``metric`` and ``select`` as mean, 95 % interval and half-width) and
    ``frontier.md`` (the table). Every caption says how the configuration was selected and
    what each ε counts.

    Args:
        results_paths: one sweep's ``results.csv`` (or its folder) each.
        out_dir: where to write.
        metric: the reported metric.
        select: the validation metric that selects the configuration at each ε.
        labels: one method label per file.
        random_search: also Papernot & Steinke's random-search bound, with this distribution
            of the number of candidates (:func:`~pl_privfed.report.frontier_points`).

    Returns:
        The written files.

    Raises:
        ValueError: as :func:`~pl_privfed.report.frontier_points`.
    """
    points = frontier_points(
        results_paths, metric=metric, select=select, labels=labels, random_search=random_search
    )
    names = _Names(metric, select, random_search)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "frontier.png", out / "frontier.csv", out / "frontier.md"]
    _figure(points, names).savefig(written[0], dpi=120)
    pd.DataFrame([_csv_row(p, names) for p in points]).to_csv(written[1], index=False)
    written[2].write_text(_markdown(points, names))
    return written
