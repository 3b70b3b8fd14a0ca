"""``pl-privfed compare --total-epsilon``: the frontier at equal total ε (tuning included) drawn
(``total.png``) and tabulated (``total.csv``, ``total.md``) from sweeps run with
``calibration: random_search`` (:mod:`~pl_privfed.report.random_search`)."""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from pl_privfed.report.figures import MAX_PER_ROW, band, legend_below, series_color
from pl_privfed.report.frontier_data import frontier_points
from pl_privfed.report.frontier_files import (
    MAJORITY,
    NON_PRIVATE,
    log_epsilon_axis,
    majority_line,
    non_private_band,
    setting_of,
    setting_panels,
    setting_title,
    short_label,
    suptitle_small,
)
from pl_privfed.report.random_search import MIN_SEEDS, TotalPoint, total_epsilon_points
from pl_privfed.report.runs import DEFAULT_METRIC
from pl_privfed.report.text import fmt_num, markdown

__all__ = ["TOTAL_SELECTION", "total_frontier", "winners"]

#: what the equal-total-ε frontier's figure, table and caption say about the tuning
TOTAL_SELECTION = (
    "expected test accuracy of what a private random search (Papernot & Steinke 2022) over the "
    "family's grid selects on validation accuracy, its total ε (tuning included) the target"
)


def _pct(value: float) -> str:
    return f"{100 * value:.1f}" if math.isfinite(value) else ""


def winners(points: Sequence[TotalPoint]) -> dict[float, list[str]]:
    """Per total ε (and setting), the method with the highest mean expected accuracy, and every
    method whose 95 % interval overlaps the leader's (the ones it does not beat clearly)."""
    result: dict[float, list[str]] = {}
    for target in sorted({p.target for p in points}):
        at = [p for p in points if p.target == target and math.isfinite(p.test.mean)]
        if not at:
            continue
        lead = max(at, key=lambda p: p.test.mean)
        tied = [p.method for p in at if p is not lead and p.test.overlaps(lead.test)]
        result[target] = [lead.method, *tied]
    return result


def _csv_row(p: TotalPoint) -> dict[str, object]:
    """One point's row of ``total.csv``."""
    return {
        "method": p.method,
        "clients": p.clients or "",
        "adversary": p.adversary,
        "total_epsilon": f"{p.target:g}",
        "search_distribution": p.distribution,
        "search_mean": f"{p.mean:g}",
        "configurations": p.candidates,
        "run_epsilon_mean": fmt_num(p.run_epsilon.mean),
        "seeds": p.test.n,
        "expected_test_accuracy_mean": fmt_num(p.test.mean, 100.0),
        "expected_test_accuracy_low": fmt_num(p.test.low, 100.0),
        "expected_test_accuracy_high": fmt_num(p.test.high, 100.0),
        "expected_test_accuracy_half_width": fmt_num(p.test.half_width, 100.0),
        "per_seed": " ".join(f"{s}={100 * v:.2f}" for s, v in p.per_seed.items()),
        "most_likely_released": " ".join(f"[{config}]:{share:.2f}" for config, share in p.best[:2]),
    }


def _md_row(p: TotalPoint) -> list[str]:
    half = p.test.half_width
    value = _pct(p.test.mean) + (f" ± {100 * half:.1f}" if math.isfinite(half) else "")
    config, share = p.best[0] if p.best else ("", math.nan)
    return [
        p.method,
        f"{p.target:g}",
        f"{p.run_epsilon.mean:.3g}",
        f"{p.distribution}, mean {p.mean:g}, of {p.candidates}",
        p.adversary,
        str(p.test.n),
        value,
        f"{config} ({share:.0%})" if config else "",
    ]


def _markdown(points: Sequence[TotalPoint]) -> str:
    """``total.md``: the table and what it computes."""
    columns = [
        "method",
        "total ε (tuning included)",
        "ε of one run",
        "candidates K (distribution, mean, of the grid's)",
        "adversary",
        "seeds",
        "expected test accuracy (%), mean ± 95 % half-width",
        "most likely released (its probability)",
    ]
    lines = ["## Frontier at equal total ε: the tuning paid for", ""]
    lines += markdown(columns, [_md_row(p) for p in points])
    lines += [
        "",
        f"Each row: the {TOTAL_SELECTION}. Every run was calibrated (`calibration: "
        "random_search`) so that dp-accounting's `RepeatAndSelectDpEvent` over its releases, "
        "with the number of candidates K drawn from the distribution named, certifies the "
        "total ε at δ of the runs (an RDP bound, Papernot & Steinke Thm. 2/6); ε of one run "
        "is what each run certifies alone. With the grid's configurations ranked by "
        "validation accuracy, the j-th worst is released with probability "
        "E[(j/N)^K − ((j−1)/N)^K] (ties share it), so the expected test accuracy is exact "
        "given the runs; one seed is one search, and the interval (Student-t over seeds) is "
        f"given from {MIN_SEEDS} seeds.",
    ]
    return "\n".join(lines) + "\n"


def _figure(
    points: Sequence[TotalPoint], references: dict[str, float], labels: dict[str, str]
) -> Figure:
    """``total.png``: one panel per setting, each method's expected accuracy against the total
    ε with its 95 % band over seeds, the non-private accuracies as one grey band."""
    methods = list(dict.fromkeys(p.method for p in points))
    settings = {m: setting_of([p for p in points if p.method == m]) for m in methods}
    count = len(set(settings.values()))
    fig = Figure(figsize=(max(6.4, min(count, MAX_PER_ROW) * 4.4 + 0.6), 4.6), layout="constrained")
    axes = setting_panels(fig, settings)
    for setting, ax in axes.items():
        ticks: set[float] = set()
        mine = [m for m in methods if settings[m] == setting]
        for method in mine:
            rows = [
                {"epsilon": p.target, "value": v}
                for p in points
                if p.method == method
                for v in p.per_seed.values()
            ]
            ticks.update(p.target for p in points if p.method == method)
            band(
                ax,
                pd.DataFrame(rows),
                x="epsilon",
                factor=100.0,
                label=short_label(labels.get(method, method), setting),
                limits=(0.0, 100.0),
                color=series_color(methods.index(method), len(methods)),
            )
        reference = [100 * references[m] for m in mine if m in references]
        if reference:
            non_private_band(ax, reference, NON_PRIVATE)
        majority_line(ax, [p.majority for p in points if p.method in mine])
        log_epsilon_axis(ax, ticks, "total ε of the search, tuning included (log scale)")
        ax.set_title(setting_title(setting), fontsize=9)
        ax.set_ylabel("")
    next(iter(axes.values())).set_ylabel("expected test accuracy (%)")
    seeds = sorted({p.test.n for p in points})
    suptitle_small(
        fig,
        f"Frontier at equal total ε: {TOTAL_SELECTION}; mean over "
        f"{'/'.join(map(str, seeds))} seeds (one search each) with 95 % t-band",
    )
    legend_below(fig, last=[NON_PRIVATE, MAJORITY])
    return fig


def _stem(path: str | os.PathLike) -> str:
    """A results file's sweep folder name (the folder itself when given)."""
    path = Path(path)
    return (path if path.is_dir() else path.parent).name


def total_frontier(
    results_paths: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    nonprivate: Sequence[str | os.PathLike] = (),
    metric: str = "final_test_accuracy",
    select: str = DEFAULT_METRIC,
    labels: Sequence[str] | None = None,
    nonprivate_labels: Sequence[str] | None = None,
) -> list[Path]:
    """Draw and tabulate the frontier at equal total ε (:func:`~pl_privfed.report.random_search.
    total_epsilon_points`): ``total.png`` (one panel per population and adversary), ``total.csv``
    and ``total.md``; return the written paths. ``nonprivate``: the methods' non-private twins
    (their best configuration on validation, :func:`~pl_privfed.report.frontier_points`), drawn
    as one reference band per panel, matched to the methods by ``nonprivate_labels`` (default
    the folder's name, as the frontier's).

    Raises:
        ValueError: as :func:`~pl_privfed.report.random_search.total_epsilon_points`.
    """
    if labels is None:
        labels = [_stem(p).removeprefix("total_").removeprefix("frontier_") for p in results_paths]
    if nonprivate and nonprivate_labels is None:
        nonprivate_labels = [
            _stem(p).removeprefix("frontier_").removesuffix("_nonprivate") for p in nonprivate
        ]
    points = total_epsilon_points(results_paths, metric=metric, select=select, labels=labels)
    references = {}
    if nonprivate:
        twins = frontier_points(nonprivate, metric=metric, select=select, labels=nonprivate_labels)
        for p in twins:
            if not p.private and p.test.n:
                references[p.method] = p.test.mean
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "total.png", out / "total.csv", out / "total.md"]
    _figure(points, references, {}).savefig(written[0], dpi=120)
    pd.DataFrame([_csv_row(p) for p in points]).to_csv(written[1], index=False)
    written[2].write_text(_markdown(points))
    return written
