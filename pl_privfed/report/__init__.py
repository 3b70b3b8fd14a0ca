"""Paper-style figures and tables from a sweep's ``results.csv``: ``pl-privfed report`` and
``pl-privfed compare``, on :mod:`pandas` (tables, group-by over seeds), :mod:`seaborn` (curves
with their bands, heatmaps) and :mod:`matplotlib` (the figures).

**Statistics** (:mod:`~pl_privfed.report.stats`). Runs that differ only in their seed (a
parameter in :data:`~pl_privfed.results.SEED_PARAMETERS`) are one *configuration*. Every number
is aggregated over its seeds as the mean, the sample standard deviation (``ddof = 1``) and a
95 % Student-t interval of the mean, ``mean ± t_{0.975, n−1} · std / √n``
(:func:`scipy.stats.t.ppf`; the same as :func:`scipy.stats.t.interval` with the standard error;
none with one seed): :func:`interval_table` for a pandas group-by, :func:`mean_interval` for a
list. A curve's band is that interval at each round every seed logged, clipped to the metric's
range in the figures (accuracy in [0, 100] %, losses and gradient norms ≥ 0); tables give the
interval unclipped.

**Selection.** Every choice of a configuration — the best y per x, the best cell of a heatmap,
the run a curve shows — is made on the **validation** metric (default ``final_val_accuracy``);
the test accuracy is only *reported*, for the selected configurations. Accuracies are in percent.

**Products.** :func:`make_report` (:mod:`~pl_privfed.report.sweep`) writes ``heatmap.png`` (one
panel per value of the facets, one colour range), ``heatmap_server_normalization_difference.png``
(when server normalization varies), ``curves.png`` (training loss and validation accuracy of the
best y per x and method, 95 % bands), ``table.md``/``table.csv``, ``rounds_to_target.png`` (runs
with a gradient-norm target, paper 003 Figs. 1–2) and ``accuracy_vs_transmissions.png`` (when
the participation varies, paper 004 Fig. 2). :func:`compare_methods`
(:mod:`~pl_privfed.report.compare`) draws the best configuration of each sweep side by side
(paper 001 Figs. 2–3); :func:`frontier` (:mod:`~pl_privfed.report.frontier_files`) the
privacy–utility frontier of several sweeps. Axes and tables name each hyperparameter by the
symbol of its algorithm's paper (:mod:`~pl_privfed.report.symbols`, which does not import the
algorithms: the step size is γ for the α-NormEC family, η for PORTER, BEER, SoteriaFL and the
FedAvg family). A panel without data is left out, and a note on the figure and in the tables
says so.

Runs without the selection metric are named in a warning, never drawn as grey cells. A results
file that is missing, not a ``results.csv``, empty or without a finished run is a
:class:`ValueError` naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pl_privfed.lazy import lazy_exports

if TYPE_CHECKING:
    from pl_privfed.report.compare import compare_methods, comparison_figure
    from pl_privfed.report.configs import aggregate
    from pl_privfed.report.frontier_data import (
        FRONTIER_EPSILONS,
        FRONTIER_SELECTION,
        FrontierPoint,
        frontier_points,
    )
    from pl_privfed.report.frontier_files import frontier
    from pl_privfed.report.runs import load_results
    from pl_privfed.report.stats import Interval, interval_table, mean_interval
    from pl_privfed.report.sweep import make_report, report_figures
    from pl_privfed.report.text import overlap_notes

#: each name → its module, imported on first use: ``pl-privfed report`` loads what it draws
#: with and not the frontier's privacy accounting (torch, through Opacus)
_LAZY = {
    "FRONTIER_EPSILONS": "frontier_data",
    "FRONTIER_SELECTION": "frontier_data",
    "FrontierPoint": "frontier_data",
    "Interval": "stats",
    "aggregate": "configs",
    "compare_methods": "compare",
    "comparison_figure": "compare",
    "frontier": "frontier_files",
    "frontier_points": "frontier_data",
    "interval_table": "stats",
    "load_results": "runs",
    "make_report": "sweep",
    "mean_interval": "stats",
    "overlap_notes": "text",
    "report_figures": "sweep",
}


__all__ = [
    "FRONTIER_EPSILONS",
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

__getattr__, __dir__ = lazy_exports(__name__, _LAZY, __all__)
