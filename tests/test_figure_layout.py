"""Every figure the package draws, read through its Axes for layout defects
(:mod:`helpers.figure_checks`): the checks themselves on a figure with every defect, then ``compare``'s
``comparison.png`` (with and without its utility row; bands on a log axis), the report's curves
of a run evaluated once, its heatmaps and rounds-to-target with many facet values, the frontier
with two methods at the same non-private accuracy and with one panel per population and
adversary (the equal-total-ε frontier too), and ``TrainingCurves`` of a plain project's
many metrics."""

import math

import numpy as np
import pytest
from helpers.figure_checks import (
    MAX_PER_ROW,
    layout_problems,
    notes_below_panels,
    panels,
    per_row,
    renderer,
)
from helpers.frontier import nonprivate_sweep, private_sweep, total_sweep
from helpers.report import band_y, decentralized_sweep, write_results
from matplotlib.colors import to_hex
from matplotlib.figure import Figure

from pl_privfed import report
from pl_privfed.callbacks import TrainingCurves
from pl_privfed.report import frontier
from pl_privfed.report.frontier_files import NON_PRIVATE, _figure, _Names


def test_the_checks_find_every_defect():
    """A figure with each defect the checks look for: each is named (the checks can fail)."""
    fig = Figure(figsize=(10, 3), layout="constrained")
    axes = fig.subplots(1, 5)
    axes[0].plot([0, 1], [0, 1], label="a curve")
    axes[0].legend(loc="center")  # on the curve
    axes[0].set_title("one title")
    axes[0].text(0.5, 1.0, "a note on the title", transform=axes[0].transAxes, ha="center")
    axes[1].set_yscale("log")
    axes[1].fill_between([1, 2], [0.0, 0.0], [1.0, 2.0])  # reaches 0 on a log axis
    axes[1].set_title("log")
    axes[2].set_title("a title far too long to stay inside a figure " * 4)
    problems = layout_problems(fig)
    assert "a legend covers the curve 'a curve'" in problems
    assert any("overlaps" in p and "a note on the title" in p for p in problems)
    assert any("reaches 0 on a log axis" in p for p in problems)
    assert any("leaves the figure" in p for p in problems)
    assert sum("has no title" in p for p in problems) == 2  # the 4th and the 5th panel
    assert f"5 panels in one row (at most {MAX_PER_ROW})" in problems


def gradient_norm_sweep(root, spread):
    """A PORTER-like sweep whose runs have a GradientNorm history; ``spread`` of the three
    seeds' norms so wide that the 95 % band of ||∇f||² reaches below zero."""

    def summary(point, seed):
        norms = [[k, spread[seed] / (k + 1)] for k in range(5)]
        return {
            "rounds": 4,
            "communication_total_bits_per_agent": {"agent_to_agent": 400.0},
            "full_grad_norm": {"history": norms},
        }

    return write_results(
        root,
        "PORTER",
        {"step_size": [0.01, 0.1]},
        lambda p, s: {"final_val_accuracy": 0.5 + p["step_size"], "rounds": 4},
        lambda p, s: {"val/acc": [(k, 0.1 * k + 0.01 * s) for k in (1, 2, 3, 4)]},
        summary,
    )


def test_comparison_bands_on_the_log_axis_and_the_legend(tmp_path):
    utility = gradient_norm_sweep(tmp_path / "with", spread=(0.55, 0.1, 0.45))
    plain = decentralized_sweep(tmp_path / "plain", "BEER", 0.5)
    fig, _, notes = report.comparison_figure([utility, plain])
    assert layout_problems(fig) == [] and not notes
    utility_axes = [ax for ax in fig.axes if ax.get_yscale() == "log"]
    assert len(utility_axes) == 2
    for ax in utility_axes:  # the unclipped band would reach below 0: cut above 0 instead
        assert band_y(ax).min() > 0
        assert ax.get_ylim()[0] <= band_y(ax).min()
    # one legend below the panels naming both methods, though BEER has no utility curve
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [
        "PORTER (step_size=0.1)",
        "BEER (step_size=0.1, consensus_step_size=0.5)",
    ]
    assert "mean over seeds" in fig.get_suptitle()


def test_comparison_without_its_utility_row_keeps_its_titles(tmp_path):
    porter = decentralized_sweep(tmp_path / "porter", "PORTER", 0.6)
    beer = decentralized_sweep(tmp_path / "beer", "BEER", 0.5)
    fig, _, _ = report.comparison_figure([porter, beer])
    assert len(fig.axes) == 2 and all(ax.get_title() for ax in fig.axes)
    assert layout_problems(fig) == [] and notes_below_panels(fig)
    fig.savefig(tmp_path / "comparison.png", dpi=120)  # as compare writes it: still inside
    assert layout_problems(fig) == []


def test_a_run_evaluated_once(tmp_path):
    """Validated at round 20 only: its dot sits at round 20 of the loss panel's 1–20 axis,
    with a note; the loss, spread widely over seeds, is on a log axis with its band above 0."""
    path = write_results(
        tmp_path,
        "AlphaNormEC",
        {"beta": [0.01, 0.1], "step_size": [0.1]},
        lambda p, s: {"final_val_accuracy": 0.5 + p["beta"] + 0.01 * s, "rounds": 20},
        lambda p, s: {
            "train/loss": [(k, (0.2, 2.0, 0.5)[s] / k) for k in range(1, 21)],
            "val/acc": [(20, 0.5 + p["beta"] + 0.01 * s)],
        },
    )
    fig = report.report_figures(path)[0]["curves.png"]
    loss, acc = fig.axes
    assert layout_problems(fig) == []
    assert loss.get_yscale() == "log" and band_y(loss).min() > 0
    low, high = acc.get_xlim()
    assert low <= 1 and high >= 21  # the whole run, a round either side of the point at least
    assert [t.get_text() for t in acc.texts] == ["one evaluation only (round 20)"]
    assert {line.get_marker() for line in acc.lines} == {"o"}  # a visible dot
    assert not loss.texts


def test_heatmaps_and_rounds_to_target_wrap_after_four_panels(tmp_path):
    """Six values of the second facet: rows of at most four per value of the first; six
    heterogeneity levels: the rounds-to-target panels wrap too."""
    ps = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    grid = {
        "beta": [0.01, 0.1],
        "step_size": [0.1, 1.0],
        "server_normalization": [True, False],
        "participation_prob": ps,
    }
    path = write_results(
        tmp_path / "heat",
        "FedAlphaNormEC",
        grid,
        lambda p, s: {"final_val_accuracy": 0.5 + p["beta"], "rounds": 2},
        seeds=(0, 1),
    )
    heatmap = report.report_figures(path, x="beta", y="step_size")[0]["heatmap.png"]
    assert len(panels(heatmap)) == 12 and per_row(heatmap) == 4
    assert layout_problems(heatmap) == []
    # each value of server normalization starts its own row: 4 + 2, 4 + 2
    rows = sorted({round(ax.get_position().y0, 3) for ax in panels(heatmap)}, reverse=True)
    norm = {round(ax.get_position().y0, 3): ax.get_title().split(",")[0] for ax in panels(heatmap)}
    assert (
        len(rows) == 4
        and [norm[r] for r in rows] == ["server norm.=false"] * 2 + ["server norm.=true"] * 2
    )

    levels = [1, 2, 3, 4, 5, 6]
    path = write_results(
        tmp_path / "rounds",
        "FedAvgPerUpdateClipping",
        {"clip_threshold": [0.1, None], "local_batches": [1, 5], "classes_per_client": levels},
        lambda p, s: {
            "final_val_accuracy": 0.5,
            "rounds": 9,
            "rounds_to_target": 3 + s,
            "final_full_grad_norm": 0.1,
        },
        seeds=(0, 1),
    )
    rounds = report.report_figures(path)[0]["rounds_to_target.png"]
    assert len(panels(rounds)) == 6 and per_row(rounds) == 4
    assert layout_problems(rounds) == []
    assert len(rounds.legends) == 1  # the local-step counts once, below the panels


def references(ax):
    """The non-private references drawn in ``ax`` (a band, or a line where they agree)."""
    return sum(a.get_label() == NON_PRIVATE for a in (*ax.lines, *ax.patches))


def legend_fraction(fig):
    """The share of the figure's area its legends take."""
    rend = renderer(fig)
    width, height = fig.get_size_inches() * fig.dpi
    boxes = [leg.get_window_extent(rend) for leg in fig.legends]
    return sum(b.width * b.height for b in boxes) / (width * height)


def test_frontier_two_methods_at_the_same_non_private_accuracy(tmp_path):
    sweeps = [
        private_sweep(tmp_path, name="frontier_a"),
        nonprivate_sweep(tmp_path, name="frontier_a_nonprivate"),
        private_sweep(tmp_path, name="frontier_b"),
        nonprivate_sweep(tmp_path, name="frontier_b_nonprivate"),
    ]
    assert (tmp_path / "out" / "frontier.png") in frontier(sweeps, tmp_path / "out")
    points = report.frontier_points(sweeps)
    fig = _figure(points, _Names("final_test_accuracy", "final_val_accuracy"))
    assert layout_problems(fig) == []
    (ax,) = fig.axes
    assert not ax.texts  # no label beside the reference, where two would print as one
    (legend,) = fig.legends
    # one reference band for the non-private accuracies, last; the seeds said once, above
    assert [t.get_text() for t in legend.get_texts()] == ["a", "b", NON_PRIVATE]
    assert "mean over 3 seeds" in fig._suptitle.get_text()


def test_frontier_one_panel_per_population_and_adversary(tmp_path):
    """Four methods in two settings (1,000 clients against the models, 10,000 against the
    server) and two record-level methods: two panels, each with its own methods and one
    non-private band; the legend, below the panels, takes less than a fifth of the figure,
    and the labels drop the population their panel's title gives."""
    sweeps, labels = [], []
    for name, clients, adversary in [
        ("a", 1000, "models"),
        ("b", 1000, "models"),
        ("c", 10000, "server"),
        ("d", 10000, "server"),
    ]:
        where = {"clients": clients, "adversary": adversary}
        sweeps += [
            private_sweep(tmp_path, name=f"frontier_{name}", **where),
            nonprivate_sweep(tmp_path, name=f"frontier_{name}_nonprivate", clients=clients),
        ]
        label = f"method {name}, a long description of its tuning, {clients:,} clients"
        labels += [label, label]
    points = report.frontier_points(sweeps, labels=labels)
    fig = _figure(points, _Names("final_test_accuracy", "final_val_accuracy"))
    assert layout_problems(fig) == []
    axes = panels(fig)
    assert [ax.get_title() for ax in axes] == [
        "1,000 clients, ε against whoever sees the models",
        "10,000 clients, ε against the server",
    ]
    assert [references(ax) for ax in axes] == [1, 1]  # one non-private reference each
    assert [len(ax.lines) - references(ax) for ax in axes] == [2, 2]  # each its own methods
    (legend,) = fig.legends
    texts = [t.get_text() for t in legend.get_texts()]
    assert texts[-1] == NON_PRIVATE and texts.count(NON_PRIVATE) == 1
    assert "method a, a long description of its tuning" in texts
    assert legend_fraction(fig) < 0.2
    assert legend.get_window_extent(renderer(fig)).y1 < min(
        ax.get_window_extent(renderer(fig)).y0 for ax in axes
    )


def test_total_epsilon_figure_compares_like_with_like(tmp_path):
    """The equal-total-ε figure: one panel per setting, its x the total ε, the non-private
    twins one band; a compact legend."""
    from pl_privfed.report.total_files import total_frontier

    val = {(1.0, 0.1): 0.80, (1.0, 1.0): 0.70, (8.0, 0.1): 0.82, (8.0, 1.0): 0.86}
    test = {(1.0, 0.1): 0.78, (1.0, 1.0): 0.72, (8.0, 0.1): 0.80, (8.0, 1.0): 0.85}
    sweeps = [
        total_sweep(tmp_path, "total_a", val, test),
        total_sweep(tmp_path, "total_b", val, test, clients=10000, adversary="server"),
    ]
    twins = [
        nonprivate_sweep(tmp_path, name="frontier_a_nonprivate"),
        nonprivate_sweep(tmp_path, name="frontier_b_nonprivate"),
    ]
    written = total_frontier(sweeps, tmp_path / "out", nonprivate=twins)
    assert [p.name for p in written] == ["total.png", "total.csv", "total.md"]
    from pl_privfed.report.random_search import total_epsilon_points
    from pl_privfed.report.total_files import _figure as total_figure

    points = total_epsilon_points(sweeps, labels=["a", "b"])
    fig = total_figure(points, {"a": 0.93, "b": 0.95}, {})

    assert layout_problems(fig) == []
    assert len(panels(fig)) == 2 and legend_fraction(fig) < 0.2
    assert [references(ax) for ax in panels(fig)] == [1, 1]
    assert panels(fig)[0].get_xlabel().startswith("total ε")


def test_training_curves_of_many_metrics_wrap_and_one_value_is_noted():
    """A plain project's 12 logged metrics: 3 rows of 4 panels, not 12 in a row; a metric
    logged once (round 20) is a dot on the run's 1–20 axis with a note."""
    curves = TrainingCurves(keys=[f"metric_{i}" for i in range(11)] + ["val_acc"])
    for i in range(11):
        curves.history[f"metric_{i}"] = [(k, float(i + k)) for k in range(1, 21)]
    curves.history["val_acc"] = [(20, 0.7)]
    fig = curves.figure()
    assert len(fig.axes) == 12 and per_row(fig) == 4
    assert fig.get_figwidth() <= 4.5 * 4 and layout_problems(fig) == []
    last = fig.axes[-1]
    assert last.get_title() == "val_acc" and [t.get_text() for t in last.texts] == [
        "one value only (round 20)"
    ]
    assert last.get_xlim() == fig.axes[0].get_xlim()
    assert last.get_xlim()[0] <= 1 and last.get_xlim()[1] >= 21
    assert math.isclose(np.ptp(fig.axes[0].get_xlim()), np.ptp(last.get_xlim()))


@pytest.mark.parametrize("count", [1, 3, 4])
def test_training_curves_of_few_metrics_stay_in_one_row(count):
    curves = TrainingCurves(keys=[f"m{i}" for i in range(count)])
    for i in range(count):
        curves.history[f"m{i}"] = [(k, float(k)) for k in range(1, 4)]
    fig = curves.figure()
    assert per_row(fig) == count and layout_problems(fig) == []


def test_the_curves_legend_covers_no_curve(tmp_path):
    """Curves crossing the whole panel leave no free corner: the legend goes below the panels
    (inside, ``loc="best"`` put it on a curve, as on docs/figures/report_curves.png)."""
    zigzag = [(k, (k % 2) * 0.9 + 0.05) for k in range(1, 13)]
    path = write_results(
        tmp_path,
        "AlphaNormEC",
        {"beta": [0.01, 0.03, 0.1, 0.3], "step_size": [0.1]},
        lambda p, s: {"final_val_accuracy": 0.5 + p["beta"], "rounds": 12},
        lambda p, s: {
            "train/loss": [(k, 1.0 / k) for k in range(1, 13)],
            "val/acc": [(k, abs(v - p["beta"])) for k, v in zigzag],
        },
        seeds=(0,),
    )
    fig = report.report_figures(path)[0]["curves.png"]
    assert layout_problems(fig) == []
    (legend,) = fig.legends
    assert len(legend.get_texts()) == 4 and not any(ax.get_legend() for ax in fig.axes)


def test_more_than_ten_families_never_share_a_colour(tmp_path):
    """The equal-total-ε figure drew its 11th family (distributed DP-SGD) in the colour of its
    first (``C{i % 10}``), so the legend named two methods by one colour."""
    from pl_privfed.report.random_search import total_epsilon_points
    from pl_privfed.report.total_files import _figure as total_figure

    val = {(1.0, 0.1): 0.80, (1.0, 1.0): 0.70, (8.0, 0.1): 0.82, (8.0, 1.0): 0.86}
    names = [f"m{i}" for i in range(12)]
    sweeps = [total_sweep(tmp_path, f"total_{n}", val, val, seeds=1) for n in names]
    fig = total_figure(total_epsilon_points(sweeps, labels=names), {}, {})
    drawn = [line for line in panels(fig)[0].get_lines() if not line.get_label().startswith("_")]
    assert len(drawn) == len(names)
    assert len({to_hex(line.get_color()) for line in drawn}) == len(names)
