"""Reports that refuse what they cannot read (issue 49): a run summary missing or cut is an
error naming the file, ``--keep-runs`` keeps only what the frontier accepted, a report with
nothing numeric refuses in one line, intervals only from 3 seeds, heatmaps scaled to their data.
The refusals run as real ``pl-privfed`` processes (the exit status and the one line are the
point; ``report`` and ``compare`` import no torch, so each costs about a second of CPU)."""

import csv
import json
import math

import pytest
from helpers.frontier import private_sweep, total_sweep
from helpers.processes import refused

from pl_privfed.report import make_report
from pl_privfed.report.stats import mean_interval
from pl_privfed.report.text import fmt_ci, fmt_pm
from pl_privfed.results import result_columns


def test_a_frontier_over_a_missing_or_cut_summary_names_the_file(tmp_path):
    """Before: exit 0 with the "ε with selection" cells empty, warning "no privacy accounting
    in the run's summary.json" without saying which."""
    results = private_sweep(tmp_path / "sweeps")
    runs = sorted((results.parent / "runs").iterdir())
    deleted, cut = runs[0] / "summary.json", runs[1] / "summary.json"
    text = cut.read_text()
    deleted.unlink()
    frontier = ["compare", "--frontier", str(results), "--out", str(tmp_path / "out")]
    err = refused(frontier, tmp_path)
    assert str(deleted) in err and "missing" in err
    deleted.write_text(text)  # back, and the other one cut short
    cut.write_text(text[: len(text) // 2])
    err = refused(frontier, tmp_path)
    assert str(cut) in err and "unreadable" in err


def test_keep_runs_records_only_what_the_frontier_accepted(tmp_path):
    """Before: a duplicate the frontier refused was copied into the record first."""
    a = private_sweep(tmp_path / "a", name="one")
    b = private_sweep(tmp_path / "b", name="two")  # the same runs: one method with --labels
    record = tmp_path / "record"
    args = ["compare", "--frontier", str(a), str(b), "--labels", "m", "m", "--out"]
    err = refused([*args, str(tmp_path / "out"), "--keep-runs", str(record)], tmp_path)
    assert "have the same" in err and not record.exists()


def test_a_report_with_nothing_numeric_refuses_in_one_line(tmp_path):
    """Before: a results.csv whose metrics were all NaN or text, but whose rounds and wall
    times were numbers, gave empty tables, exit 0."""
    results = private_sweep(tmp_path)
    with results.open(newline="") as f:
        rows = list(csv.DictReader(f))
    outcomes = [c for c in result_columns() if c not in ("rounds", "wall_time_s")]
    for i, row in enumerate(rows):
        row.update({c: "nan" if i % 2 else "abc" for c in outcomes if c in row})
        row.update(rounds="300", wall_time_s="12.5")
    with results.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    err = refused(["report", results], tmp_path)
    assert "none of its 12 finished runs has a numeric result" in err, err
    assert "final_val_accuracy" in err and "nothing to report" in err


def test_intervals_need_three_seeds_else_the_seeds_are_shown():
    """Before: "±48.5" from two seeds (t with one degree of freedom is 12.7)."""
    two, three = mean_interval([0.80, 0.84]), mean_interval([0.80, 0.84, 0.82])
    assert math.isnan(two.low) and math.isnan(two.half_width)
    assert fmt_pm(two, 100) == "82.00 (seeds: 80.00, 84.00)"
    assert fmt_ci(two, 100) == "seeds: 80.00, 84.00"
    assert fmt_pm(three, 100).startswith("82.00 ± ") and fmt_ci(three, 100).startswith("[")
    assert fmt_pm(mean_interval([0.8]), 100) == "80.00" and fmt_ci(mean_interval([0.8])) == ""


def test_heatmap_colours_span_the_data(tmp_path):
    """Before: a 0-100 % scale drew 85 % and 94 % in nearly one colour."""
    results = private_sweep(tmp_path)
    from pl_privfed.report import report_figures

    figures, _, _ = report_figures(results, x="model.algorithm.init_args.noise.epsilon")
    low, high = figures["heatmap.png"].axes[0].collections[0].get_clim()
    assert 70 < low < high < 90  # the grid's validation means, 70.3 % to 86.3 %
    texts = [t.get_text() for t in figures["heatmap.png"].axes[0].texts]
    assert all("±" in t for t in texts)  # three seeds a cell
    assert make_report(results, tmp_path / "report")


def test_the_frontier_draws_the_majority_class_where_the_runs_record_it(tmp_path):
    """Before: the a9a frontier's ε = 0.5 point lay below a constant classifier, unmarked."""
    from pl_privfed.report import frontier_points
    from pl_privfed.report.frontier_files import MAJORITY, _figure, _markdown, _Names
    from pl_privfed.report.random_search import total_epsilon_points
    from pl_privfed.report.total_files import _figure as total_figure

    val = {(e, s): 0.8 for e in (1.0, 8.0) for s in (0.1, 1.0)}
    results, total = private_sweep(tmp_path), total_sweep(tmp_path, "total_x", val, val)
    for path in [
        *results.parent.glob("runs/*/summary.json"),
        *total.parent.glob("runs/*/summary.json"),
    ]:
        summary = json.loads(path.read_text())
        summary["data"] = {"test_majority_class": 0.7638}
        path.write_text(json.dumps(summary))
    totals = total_epsilon_points([total])
    lines = total_figure(totals, {}, {}).axes[0].lines
    assert [ln.get_ydata()[0] for ln in lines if ln.get_label() == MAJORITY] == [
        pytest.approx(76.38)
    ]
    points = frontier_points([results])
    assert {p.majority for p in points} == {0.7638}
    names = _Names("final_test_accuracy", "final_val_accuracy", None)
    figure = _figure(points, names)
    (line,) = [ln for ln in figure.axes[0].lines if ln.get_label() == MAJORITY]
    assert line.get_ydata()[0] == pytest.approx(76.38)
    low, high = figure.axes[0].get_ylim()
    assert low < 76.38 < high
    assert "Majority class" in _markdown(points, names) and "76.38 %" in _markdown(points, names)
