"""``pl-privfed compare --frontier``: the privacy–utility frontier drawn
(``frontier.png``) and tabulated (``frontier.csv``, ``frontier.md``)."""

from __future__ import annotations

import math
import os
import re
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from pl_privfed.report.figures import MAX_PER_ROW, band, grid, legend_below, series_color
from pl_privfed.report.frontier_data import (
    FRONTIER_EPSILONS,
    FRONTIER_SELECTION,
    FrontierPoint,
    frontier_points,
)
from pl_privfed.report.runs import DEFAULT_METRIC, TEST
from pl_privfed.report.text import fmt_num, fmt_pm, is_accuracy, limits, markdown
from pl_privfed.results import finite_float

__all__ = [
    "MAJORITY",
    "frontier",
    "log_epsilon_axis",
    "majority_line",
    "non_private_band",
    "setting_of",
    "setting_panels",
    "setting_title",
    "suptitle_small",
]


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
    ax: Axes, label: str, private: list[FrontierPoint], names: _Names, color: str
) -> None:
    """A method's private points: the mean of the reported metric against the certified ε,
    with its 95 % band over seeds."""
    data = pd.DataFrame(
        [{"epsilon": p.x, "value": v} for p in private for v in (p.values or [p.test.mean])]
    )
    band(
        ax,
        data,
        x="epsilon",
        factor=names.factor,
        label=label,
        limits=limits(names.metric),
        color=color,
    )


def seeds_label(method: str, seeds: int, common: int | None) -> str:
    """A curve's legend label: the method, with its number of seeds where the methods differ
    in it (else the caption says it once)."""
    if seeds == common:
        return method
    return f"{method} ({seeds} seed{'s' if seeds != 1 else ''})"


def short_label(method: str, setting: tuple[int | None, str]) -> str:
    """``method`` without the population its panel's title already gives (``, 1,000
    clients``): shorter legend entries, more of them to a row."""
    clients = setting[0]
    if not clients:
        return method
    return re.sub(rf",? {clients:,} (clients|agents)\b", "", method).strip(", ") or method


def setting_of(points: Sequence[object]) -> tuple[int | None, str]:
    """A method's setting, what its panel compares like with like: the population its private
    points trained on and the adversary their ε holds against (``clients``, ``adversary``)."""
    private = [p for p in points if getattr(p, "adversary", "")]
    clients = {p.clients for p in private} or {None}
    adversaries = {p.adversary for p in private} or {""}
    return (clients.pop() if len(clients) == 1 else None, "/".join(sorted(adversaries)))


def setting_title(setting: tuple[int | None, str]) -> str:
    """A panel's title: its population and adversary (``1,000 clients, ε against the
    models``)."""
    clients, adversary = setting
    who = {"models": "whoever sees the models", "server": "the server"}.get(adversary, adversary)
    parts = [f"{clients:,} clients" if clients else "", f"ε against {who}" if who else ""]
    return ", ".join(p for p in parts if p) or "private runs"


def setting_panels(
    fig: Figure, methods: dict[str, tuple[int | None, str]]
) -> dict[tuple[int | None, str], Axes]:
    """One panel per setting of ``methods`` (method → setting), in order of first appearance,
    side by side (wrapping after :data:`~pl_privfed.report.figures.MAX_PER_ROW`), sharing the y
    axis so that the panels' accuracies compare."""
    settings = list(dict.fromkeys(methods.values()))
    axes = grid(fig, len(settings), min(len(settings), MAX_PER_ROW))
    for ax in axes[1:]:
        ax.sharey(axes[0])
    return dict(zip(settings, axes, strict=True))


def non_private_band(ax: Axes, values: Sequence[float], label: str) -> None:
    """The non-private accuracies of the panel's methods as one grey band from the lowest to
    the highest (a line where they agree): the reference every private curve is read against,
    one legend entry however many methods."""
    low, high = min(values), max(values)
    if high - low < 0.05:
        ax.axhline((low + high) / 2, color="0.55", linewidth=2.5, alpha=0.6, label=label)
    else:
        ax.axhspan(low, high, color="0.82", alpha=0.8, linewidth=0, label=label, zorder=0)


def majority_line(ax: Axes, shares: Sequence[float | None]) -> None:
    """The majority class's test accuracy (%) as a dotted line: the floor a private point can
    fall below (a constant predictor scores it), where every point of the panel records the
    same share (:data:`MAJORITY` in the legend)."""
    floors = set(shares)
    if len(floors) == 1 and (floor := floors.pop()) is not None:
        ax.axhline(100.0 * floor, color="0.3", linestyle=":", linewidth=1.5, label=MAJORITY)


def log_epsilon_axis(ax: Axes, ticks: set[float], label: str) -> None:
    """A log ε axis with a tick at every target."""
    ax.set_xscale("log")
    if ticks:
        ax.set_xticks(sorted(ticks), [f"{t:g}" for t in sorted(ticks)])
        ax.minorticks_off()
    ax.set_xlabel(label)
    ax.grid(alpha=0.3)


#: the legend entry of the non-private band
NON_PRIVATE = "non-private, each method's selected (lowest to highest)"
#: the legend entry of the majority-class line (a constant predictor's test accuracy)
MAJORITY = "majority class (a constant predictor)"


def _figure(points: list[FrontierPoint], names: _Names) -> Figure:
    """``frontier.png``: one panel per setting (population and adversary: only methods of one
    setting are compared in a panel), one curve per method on a log ε axis, the panel's
    non-private accuracies as one grey band; one legend below the panels, the band last."""
    methods = list(dict.fromkeys(p.method for p in points))
    settings = {m: setting_of([p for p in points if p.method == m]) for m in methods}
    seeds = {
        m: max((p.test.n for p in points if p.method == m and p.private), default=0)
        for m in methods
    }
    common = next(iter(set(seeds.values()))) if len(set(seeds.values())) == 1 else None
    count = len(set(settings.values()))
    fig = Figure(figsize=(max(6.4, min(count, MAX_PER_ROW) * 4.4 + 0.6), 4.8), layout="constrained")
    axes = setting_panels(fig, settings)
    for setting, ax in axes.items():
        ticks: set[float] = set()
        references = []
        for method in (m for m in methods if settings[m] == setting):
            color = series_color(methods.index(method), len(methods))
            mine = [p for p in points if p.method == method]
            private = sorted(
                (p for p in mine if p.private and p.test.n and math.isfinite(p.x) and p.x > 0),
                key=lambda p: p.x,
            )
            if private:
                ticks.update(finite_float(p.target) or p.x for p in private)
                label = seeds_label(short_label(method, setting), seeds[method], common)
                _private_curve(ax, label, private, names, color)
            references += [p.test.mean * names.factor for p in mine if not p.private and p.test.n]
        if references:
            non_private_band(ax, references, NON_PRIVATE)
        if names.factor == 100.0:
            majority_line(ax, [p.majority for p in points if settings[p.method] == setting])
        log_epsilon_axis(ax, ticks, "certified ε (mean over seeds; log scale)")
        ax.set_title(setting_title(setting), fontsize=9)
        ax.set_ylabel("")
    next(iter(axes.values())).set_ylabel(f"{names.name}{names.unit}")
    over = f"mean over {common} seeds" if common else "mean over seeds"
    suptitle_small(
        fig,
        f"Privacy–utility frontier: {names.name}, {over} with 95 % t-band; "
        f"{FRONTIER_SELECTION}; x: the selected runs' certified ε (the selection's cost: "
        "frontier.md)",
    )
    legend_below(fig, last=[NON_PRIVATE, MAJORITY])  # below the panels: it covers no curve
    return fig


def suptitle_small(fig: Figure, text: str) -> None:
    """The figure's caption above its panels, wrapped to its width, small."""
    fig.suptitle(
        textwrap.fill(text.replace(" %", "\u00a0%"), int(fig.get_figwidth() * 14)), fontsize=8
    )


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
    floors = {p.method: p.majority for p in points if p.majority is not None}
    if floors and names.factor == 100.0:
        distinct = set(floors.values())
        shares = (
            f"{100 * distinct.pop():.2f} %"
            if len(distinct) == 1
            else ", ".join(f"{m} {100 * f:.2f} %" for m, f in floors.items())
        )
        lines.append(
            f"Majority class (the test set's most common class: what a constant predictor "
            f"scores, the dotted line): {shares}; a point at or below it has learnt nothing "
            "a constant answer would not."
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
    (one panel per setting — the population and the adversary of the methods' ε, shared
    accuracy axis —, each with ``metric``, % for an accuracy, against the mean certified ε on a
    log scale, one line per method with its 95 % band over seeds clipped to the metric's range,
    and the panel's non-private accuracies as one grey band from the lowest to the highest; one
    legend below the panels), ``frontier.csv`` (one row per
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
