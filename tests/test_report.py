"""``pl-privfed report`` and ``compare`` (:mod:`pl_privfed.report`): every figure drawn from small
synthetic ``results.csv`` files, checked through its matplotlib Axes (panels, labels, titles that
do not overlap, bands within the metric's range, notes for panels left out); the statistics
against a hand computation; and the one-line errors of a results file that is missing, garbage,
empty or without a finished run."""

import numpy as np
import pytest
from helpers.architecture import PACKAGE_DIR, all_imports, module_name, top_level
from helpers.figure_checks import layout_problems, notes_below_panels, overlapping
from helpers.report import band_y, decentralized_sweep, heat, write_results

from pl_privfed import algorithms, report
from pl_privfed.cli import main
from pl_privfed.report.symbols import SYMBOLS, symbol

#: t_{0.975, 2}, from a table of Student's t distribution (two-sided 95 %, 2 degrees of freedom)
T_975_2 = 4.302652729911275


SEED_ACC = (0.97, 0.995, 1.0)  # near 100 %: the unclipped 95 % interval runs above it


def fed_sweep(root):
    """FedAlphaNormEC over (β, η, server normalization, p): every kind of report figure."""
    grid = {
        "beta": [0.01, 0.1],
        "step_size": [0.1, 1.0],
        "server_normalization": [True, False],
        "participation_prob": [0.5, 1.0],
    }

    def result(point, seed):
        acc = SEED_ACC[seed] - point["beta"] - (0.1 if point["server_normalization"] else 0.0)
        return {
            "final_val_accuracy": acc,
            "best_val_accuracy": acc,
            "final_test_accuracy": acc,
            "rounds": 4,
            "client_transmissions": 4 * 10 * point["participation_prob"],
            "final_full_grad_norm": 0.1,
            "rounds_to_target": 2 + seed,
        }

    def curves(point, seed):
        acc = result(point, seed)["final_val_accuracy"]
        return {
            "train/loss": [(k, 0.05 * (seed + 1) / k) for k in (1, 2, 3, 4)],
            "val/acc": [(k, min(1.0, acc * k / 4 + 0.005 * seed)) for k in (1, 2, 3, 4)],
        }

    return write_results(root, "FedAlphaNormEC", grid, result, curves)


def test_every_report_figure_from_a_small_results_file(tmp_path):
    path = fed_sweep(tmp_path)
    figures, tables, notes = report.report_figures(path)
    assert set(figures) == {
        "heatmap.png",
        "heatmap_server_normalization_difference.png",
        "curves.png",
        "rounds_to_target.png",
        "accuracy_vs_transmissions.png",
    }

    # heatmap: one panel per (server normalization, p), 2 × 2, and a colour bar; titles apart
    heatmap = figures["heatmap.png"]
    panels = [ax for ax in heatmap.axes if heat(ax)]
    assert len(panels) == 4 and len(heatmap.axes) == 5
    assert {ax.get_title() for ax in panels} == {
        f"server norm.=false, p={p}" for p in ("0.5", "1.0")
    } | {f"server norm.=true, p={p}" for p in ("0.5", "1.0")}
    assert "mean over seeds" in heatmap.get_suptitle()
    assert layout_problems(heatmap) == []  # titles inside the figure, apart, 2 panels a row
    # FedAlphaNormEC's step size is η (paper 004), β its β
    assert {(ax.get_xlabel(), ax.get_ylabel()) for ax in panels} == {("β", "η")}
    ((low, high),) = {heat(ax).get_clim() for ax in panels}  # one range, the data's (issue 49)
    assert 0.0 < low < high < 100.0

    diff = figures["heatmap_server_normalization_difference.png"]
    assert len([ax for ax in diff.axes if heat(ax)]) == 2  # one per p
    low, high = heat(diff.axes[0]).get_clim()
    assert low == -high == pytest.approx(-10.0)  # server normalization costs 10 points here

    # curves: loss and accuracy, bands within [0, ∞) and [0, 100] %
    curves = figures["curves.png"]
    loss_ax, acc_ax = curves.axes
    assert acc_ax.get_ylabel() == "validation accuracy (%)" and loss_ax.get_xlabel() == "round"
    assert all("η=" in line.get_label() and "β=" in line.get_label() for line in acc_ax.lines)
    accuracies = band_y(acc_ax)
    assert accuracies.max() <= 100.0 and accuracies.min() >= 0.0
    assert band_y(loss_ax).min() >= 0.0
    # the unclipped interval of a drawn curve does run above 100 %: the clipping is needed
    final = [min(1.0, (a - 0.01) + 0.005 * s) for s, a in enumerate(SEED_ACC)]
    assert report.mean_interval(final).high > 1.0
    assert layout_problems(curves) == []  # the legend below the panels, off every curve

    transmissions = figures["accuracy_vs_transmissions.png"]
    (ax,) = transmissions.axes
    assert [line.get_label() for line in ax.lines] == ["p=0.5", "p=1.0"]
    assert band_y(ax).max() <= 100.0

    rounds = figures["rounds_to_target.png"]
    assert len(rounds.axes) == 1 and "rounds to target" in rounds.axes[0].get_ylabel()
    assert list(rounds.axes[0].lines[0].get_ydata()) == [3.0, 3.0]  # mean of 2, 3, 4 per β
    assert all(
        layout_problems(figures[name]) == []
        for name in (
            "rounds_to_target.png",
            "accuracy_vs_transmissions.png",
            "heatmap_server_normalization_difference.png",
        )
    )
    assert not [n for n in notes if "omitted" in n]  # every panel had data
    assert "| method | β | η | p |" in tables["table.md"]


def test_a_panel_without_data_is_left_out_with_a_note(tmp_path, capsys):
    """No run logged val/acc: the curves figure has the loss panel only, and says so."""
    grid = {"beta": [0.01, 0.1], "step_size": [0.1, 1.0]}
    path = write_results(
        tmp_path,
        "AlphaNormEC",
        grid,
        lambda p, s: {"final_val_accuracy": 0.5 + p["beta"]},
        lambda p, s: {"train/loss": [(1, 1.0), (2, 0.5)]},
    )
    figures, tables, notes = report.report_figures(path)
    (ax,) = figures["curves.png"].axes
    assert ax.get_ylabel() == "training loss"
    note = "Panels omitted (no data): validation accuracy (%) (no run logged val/acc)"
    assert [t.get_text().replace("\n", " ") for t in figures["curves.png"].texts] == [note]
    assert notes_below_panels(figures["curves.png"])
    assert layout_problems(figures["curves.png"]) == []
    assert notes == [f"curves.png: {note}"] and note in tables["table.md"]
    assert {(a.get_xlabel(), a.get_ylabel()) for a in figures["heatmap.png"].axes if heat(a)} == {
        ("β", "γ")
    }  # α-NormEC's step size is γ (paper 002)
    with pytest.raises(SystemExit) as exit_:
        main(["report", str(path), "--out", str(tmp_path / "out")])
    assert exit_.value.code == 0 and note in capsys.readouterr().out


@pytest.mark.parametrize(
    "name",
    ["PORTER", "BEER", "SoteriaFL", "FedAvgPerUpdateClipping", "AlphaNormEC", "DistributedDPSGD"],
)
def test_the_step_size_is_labelled_by_the_algorithms_own_symbol(name, tmp_path):
    expected = {
        "PORTER": "η",
        "BEER": "η",
        "SoteriaFL": "η",
        "FedAvgPerUpdateClipping": "η_g",
        "AlphaNormEC": "γ",
        "DistributedDPSGD": "γ",
    }[name]
    assert getattr(algorithms, name).hyperparameter_symbols["step_size"] == expected
    path = decentralized_sweep(tmp_path, name, 0.6)
    figures, tables, _ = report.report_figures(path, x="consensus_step_size")
    (panel, _colorbar) = figures["heatmap.png"].axes
    assert panel.get_ylabel() == expected
    if name in ("PORTER", "BEER"):  # the consensus step size is γ (paper 001)
        assert panel.get_xlabel() == "γ"
        assert "| method | γ | η | seeds |" in tables["table.md"]


def test_compare_leaves_out_the_gradient_norm_panels_with_a_note(tmp_path, capsys):
    porter = decentralized_sweep(tmp_path / "porter", "PORTER", 0.6)
    beer = decentralized_sweep(tmp_path / "beer", "BEER", 0.5)
    fig, table, notes = report.comparison_figure([porter, beer])
    assert len(fig.axes) == 2  # accuracy against rounds and bits; no utility without GradientNorm
    assert [ax.get_xlabel() for ax in fig.axes] == ["round", "bits sent per agent"]
    assert {ax.get_ylabel() for ax in fig.axes} == {"validation accuracy (%)"}
    assert all(ax.get_title().startswith("validation accuracy (%)") for ax in fig.axes)
    assert all(band_y(ax).max() <= 100.0 for ax in fig.axes)
    assert any(
        "Panels omitted" in t.get_text() and "GradientNorm" in t.get_text() for t in fig.texts
    )
    assert "no run has a GradientNorm history" in notes[0]
    # the empty utility row left out: titles inside, the note below the panels and the legend
    assert layout_problems(fig) == [] and notes_below_panels(fig)
    assert all(overlapping(fig, ax.get_xticklabels()) == [] for ax in fig.axes)
    assert list(table["method"]) == [
        "PORTER (step_size=0.1, consensus_step_size=0.5)",
        "BEER (step_size=0.1, consensus_step_size=0.5)",
    ]
    with pytest.raises(SystemExit) as exit_:
        main(["compare", str(porter), str(beer), "--out", str(tmp_path / "cmp")])
    out = capsys.readouterr().out
    assert exit_.value.code == 0 and "train utility" in out and "GradientNorm" in out
    assert "Panels omitted" in (tmp_path / "cmp" / "comparison.md").read_text()
    # no bits recorded either: the accuracy against rounds alone
    fig, _, notes = report.comparison_figure(
        [decentralized_sweep(tmp_path / "nb", "BEER", 0.5, bits=False)]
    )
    assert len(fig.axes) == 1 and "no run recorded its bits per agent" in notes[0]


def test_the_statistics_over_three_seeds_by_hand(tmp_path):
    """Mean, sample std and the Student-t 95 % interval (t_{0.975, 2} from a table) over 3
    seeds, in the aggregation, the table and the curve bands."""
    values = (0.70, 0.74, 0.78)
    path = write_results(
        tmp_path,
        "AlphaNormEC",
        {"step_size": [0.1]},
        lambda p, s: {"final_val_accuracy": values[s], "final_test_accuracy": values[s] - 0.1},
        lambda p, s: {"val/acc": [(1, values[s])]},
    )
    mean, std = 0.74, 0.04  # sqrt(((-0.04)² + 0 + 0.04²) / 2)
    half = T_975_2 * std / np.sqrt(3)
    (config,) = report.aggregate(report.load_results(path), ["step_size", "seed"]).to_dict(
        "records"
    )
    assert config["seeds"] == 3 and config["final_val_accuracy:n"] == 3
    assert config["final_val_accuracy:mean"] == pytest.approx(mean)
    assert config["final_val_accuracy:std"] == pytest.approx(std)
    assert config["final_val_accuracy:low"] == pytest.approx(mean - half)
    assert config["final_val_accuracy:high"] == pytest.approx(mean + half)
    interval = report.mean_interval(values)
    assert (interval.low, interval.high) == (pytest.approx(0.6406345), pytest.approx(0.8393655))
    figures, tables, _ = report.report_figures(path)
    row = tables["table.csv"].splitlines()[1]
    assert '74.00 ± 4.00,"[64.06, 83.94]",64.00 ± 4.00,"[54.06, 73.94]"' in row
    (acc_ax,) = figures["curves.png"].axes
    assert band_y(acc_ax).min() == pytest.approx(100 * (mean - half))
    assert band_y(acc_ax).max() == pytest.approx(100 * (mean + half))
    one = report.mean_interval([0.5])
    assert one.n == 1 and np.isnan(one.std) and np.isnan(one.low)


def test_a_bad_results_file_is_one_line_naming_it(tmp_path, capsys):
    good = decentralized_sweep(tmp_path / "good", "PORTER", 0.6)
    header = good.read_text().splitlines()[0]
    failed = tmp_path / "failed" / "results.csv"
    failed.parent.mkdir()
    failed.write_text(header + "\n0000-x,failed: boom" + "," * (header.count(",") - 1) + "\n")
    empty = tmp_path / "empty.csv"
    empty.write_text(header + "\n")
    garbage = tmp_path / "garbage.csv"
    garbage.write_bytes(bytes(range(256)) * 4)
    blank = tmp_path / "blank.csv"
    blank.write_text("")
    folder = tmp_path / "folder"
    folder.mkdir()
    cases = {
        failed: "no finished run among its 1 run",
        empty: "an empty results file",
        garbage: "not a results.csv",
        blank: "not a results.csv",
        folder: "a folder without results.csv",
        tmp_path / "missing.csv": "no such results file",
    }
    for path, message in cases.items():
        with pytest.raises(ValueError, match=message):
            report.load_results(path)
        for command in (
            ["report", str(path)],
            ["compare", str(path), "--out", str(tmp_path / "c")],
        ):
            with pytest.raises(SystemExit) as exit_:
                main(command)
            err = capsys.readouterr().err
            assert exit_.value.code == 2, (command, err)
            assert err.startswith(f"pl-privfed: error: {path}") and err.count("\n") == 1, err
            assert message in err
    # a folder with a results.csv stands for it
    assert len(report.load_results(good.parent)) == 12
    assert not (tmp_path / "c").exists()


def test_the_symbols_registry_agrees_with_every_algorithm_class():
    """report/symbols.py holds each algorithm's ``hyperparameter_symbols`` without importing
    the algorithms: one entry per exported algorithm class, equal to the class's own."""
    classes = {n: getattr(algorithms, n) for n in algorithms.__all__}
    classes = {
        n: c
        for n, c in classes.items()
        if isinstance(c, type) and issubclass(c, algorithms.FederatedAlgorithm)
    }
    assert set(SYMBOLS) == set(classes)
    assert {n: c.hyperparameter_symbols for n, c in classes.items()} == SYMBOLS
    # an unknown class has FederatedAlgorithm's symbols; several are joined
    assert symbol("step_size", ["MyAlgorithm"]) == "γ"
    assert symbol("step_size", ["PORTER", "AlphaNormEC", "MyAlgorithm"]) == "γ/η"
    assert symbol("epsilon") == "ε" and symbol("rounds") == "rounds"


def test_the_report_does_not_import_the_algorithms():
    """The report reads results files: it imports only its own modules, the results' layout
    (pl_privfed.results), its names' loading on first use (pl_privfed.lazy) and the privacy
    accounting that composes the candidate runs' histories for the selection's privacy cost
    (pl_privfed.privacy, which itself imports only checks, rng and compat), never the algorithm
    stack."""
    imported = {
        top_level(i.module)
        for i in all_imports(PACKAGE_DIR)
        if top_level(module_name(i.source)) == "report"
    }
    assert imported == {"report", "results", "privacy", "lazy"}
    below = {
        top_level(i.module)
        for i in all_imports(PACKAGE_DIR)
        if top_level(module_name(i.source)) == "privacy"
    }
    assert below <= {"privacy", "checks", "rng", "compat"}  # compat: dp-accounting's internals
