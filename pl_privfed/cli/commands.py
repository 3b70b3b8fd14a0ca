"""The subcommands beside ``fit``, ``validate`` and ``test``: ``sweep``, ``report``, ``compare``
and ``demo``, each a typed function and one registration (:func:`~.registry.subcommand`).

Each loads its module when it runs (matplotlib and the sweep machinery stay out of a ``fit``;
torch and Lightning out of ``report`` and ``compare``).
"""

from __future__ import annotations

import sys
from pathlib import Path

from pl_privfed.cli.registry import subcommand

__all__ = ["compare", "demo", "report", "sweep"]

_SWEEP_EPILOG = (
    "Arguments after `--` are added to every run, e.g. "
    "`-- --config=configs/paper/paper_reading.yaml` or `-- --trainer.max_steps=20`; they "
    "are part of each run's identity, so a shortened run is never reused as a full one."
)


@subcommand("sweep", epilog=_SWEEP_EPILOG)
def sweep(
    sweep: str,
    *overrides: str,
    out: str | None = None,
    dry_run: bool = False,
    rerun: bool = False,
    batch: bool = False,
    separate: bool = False,
    where: list[str] | None = None,
) -> int:
    """Run a W&B grid sweep file locally (batched where points can share a federation,
    resumable).

    The points that differ only in the algorithm's arguments (step size, target ε, ...) and in
    their seed train as one federation per group, each point still with its own run folder,
    summary.json and results.csv row (--separate: one `pl-privfed fit` process per point).
    Every point's arguments are parsed as `fit` parses them before the first one runs: a
    misspelt key is refused at once, in one line. SIGTERM or Ctrl-C stop the sweep as they stop
    a fit (its running fit saves its round; exit status 143 or 130); run again, it resumes.

    Args:
        sweep: the sweep YAML (configs/sweeps/*.yaml)
        overrides: arguments added to every run (after `--`)
        out: output directory (default sweeps/<name>)
        dry_run: print the commands only
        rerun: run the points that finished before as well
        batch: train the points that can share a federation as one grid per group (the
            default; kept for earlier command lines)
        separate: run every point as its own `pl-privfed fit` process (no batching)
        where: run only the points with these values, KEY=V1,V2 each (a parameter's name or
            the end of it: noise.epsilon=1.0,8.0 seed=0); each keeps its run folder
    """
    from pl_privfed.cli.app import check_fit_arguments
    from pl_privfed.sweep import SweepLockedError, failed_runs, run_sweep
    from pl_privfed.sweep.signals import SweepInterrupted

    if batch and separate:
        raise ValueError("--batch and --separate ask for opposite things: give one")
    try:
        path = run_sweep(
            sweep,
            out,
            overrides=list(overrides),
            dry_run=dry_run,
            rerun=rerun,
            batch=not separate,
            where=where or (),
            check=check_fit_arguments,
        )
    except SweepLockedError as error:
        print(f"pl-privfed sweep: {error}", file=sys.stderr)
        return 2
    except SweepInterrupted as stopped:  # its line was printed when the signal came
        return stopped.code
    if dry_run:
        return 0
    failed = failed_runs(path)
    note = f"; {len(failed)} run(s) failed: {', '.join(failed)}" if failed else ""
    print(f"[pl-privfed sweep] results: {path}{note}")
    return 1 if failed else 0


@subcommand("report")
def report(
    results: list[str],
    out: str | None = None,
    x: str = "beta",
    y: str = "step_size",
    facet: str | None = None,
    metric: str = "final_val_accuracy",
    vmin: float | None = None,
    vmax: float | None = None,
) -> int:
    """Heatmaps, curves and a paper-style table from a sweep's results.csv.

    Configurations selected on the validation split, mean ± std and 95 % intervals over seeds,
    the selected configurations' test accuracy.

    Args:
        results: results.csv written by `pl-privfed sweep` (several: one set)
        out: output directory (default: report/ beside)
        x: heatmap x column
        y: heatmap y column
        facet: one panel per value of this column (default: all others)
        metric: validation column that selects (or best_val_accuracy)
        vmin: heatmap colour minimum (default the values' minimum)
        vmax: heatmap colour maximum (default the values' maximum)
    """
    from pl_privfed.report import make_report

    written = make_report(results, out, x=x, y=y, facet=facet, metric=metric, vmin=vmin, vmax=vmax)
    for path in written:
        print(path)
    md = next(p for p in written if p.name == "table.md").read_text()
    if "## Notes" in md:  # panels left out for want of data, overlapping intervals
        print(md.split("## Notes", 1)[1].strip())
    return 0


def _compare_epilog() -> str:
    from pl_privfed.report import FRONTIER_EPSILONS, FRONTIER_SELECTION

    return (
        f"With --frontier: {FRONTIER_SELECTION}; {FRONTIER_EPSILONS}; --random-search adds "
        "Papernot & Steinke's bound for a random search. Frontier: pl-privfed compare --frontier "
        "sweeps/frontier/frontier_<config>/results.csv sweeps/frontier/frontier_<config>_"
        "nonprivate/results.csv ... --out DIR [--labels A A ...]; files with the same label (by "
        "default the sweep folder's name without frontier_ and _nonprivate) are one method. "
        "Equal total ε (tuning included): pl-privfed compare --total-epsilon "
        "sweeps/total/total_<config>/results.csv ... [--nonprivate sweeps/frontier/frontier_"
        "<config>_nonprivate/results.csv ...] --out DIR."
    )


@subcommand("compare", epilog=_compare_epilog)
def compare(
    results: list[str],
    *,
    out: str,
    metric: str = "final_val_accuracy",
    frontier: bool = False,
    labels: list[str] | None = None,
    random_search: str | None = None,
    keep_runs: str | None = None,
    total_epsilon: bool = False,
    nonprivate: list[str] | None = None,
) -> int:
    """The best run of each sweep side by side, against rounds and bits; with --frontier, test
    accuracy against certified ε per method.

    The best configuration (on validation) of each sweep against rounds and against bits (train
    utility ||∇f(x̄)||² and validation accuracy, paper 001 Figs. 2-3), mean over seeds with 95 %
    bands; test accuracy with intervals in the table. With --frontier: the privacy-utility
    frontier, test accuracy against certified ε, one curve per method with 95 % bands over
    seeds, the non-private accuracy beside it.

    Args:
        results: results.csv files, one sweep per method
        out: output directory
        metric: validation column that selects
        frontier: draw the privacy-utility frontier (frontier.png, .csv, .md): at each target ε
            the configuration selected on validation, its test accuracy against the certified ε
        labels: with --frontier: one method label per file
        random_search: with --frontier: also Papernot & Steinke's ε of random search over each
            point's configurations, the number of candidates drawn from this distribution
            (poisson, geometric, logarithmic, or a truncated negative binomial's shape η >= 0)
        keep_runs: with --frontier: also copy each results.csv and its runs' summaries into
            this folder (one subfolder per sweep with results.csv and summaries.jsonl, merged
            with an earlier copy), which compare --frontier reads again on any machine
            (docs/frontier_runs/ keeps the docs' frontiers so); also with --total-epsilon
        total_epsilon: the frontier at equal total ε (total.png, .csv, .md) of sweeps run with
            noise.calibration: random_search: per total ε the expected test accuracy of what
            the random search their runs were calibrated for selects on validation, over seeds
        nonprivate: with --total-epsilon: the methods' non-private twins' results.csv, drawn as
            one reference band per panel
    """
    from pl_privfed.report import compare_methods
    from pl_privfed.report import frontier as draw_frontier

    if total_epsilon and frontier:
        raise ValueError("--total-epsilon and --frontier draw different frontiers: give one")
    if nonprivate is not None and not total_epsilon:
        raise ValueError("--nonprivate goes with --total-epsilon")
    if total_epsilon and random_search is not None:
        raise ValueError(
            "--random-search goes with --frontier (with --total-epsilon the runs name their search)"
        )
    if total_epsilon:
        from pl_privfed.report.total_files import total_frontier

        written = total_frontier(
            results, out, nonprivate=nonprivate or (), select=metric, labels=labels
        )
        if keep_runs is not None:  # only what the frontier accepted goes into the record
            from pl_privfed.report.frontier_record import keep_runs as keep

            written = [*keep(results, keep_runs), *written]
        for path in written:
            print(path)
        print(written[-1].read_text(), end="")
        return 0
    if labels is not None and not frontier:
        raise ValueError("--labels goes with --frontier")
    if random_search is not None and not frontier:
        raise ValueError("--random-search goes with --frontier")
    if keep_runs is not None and not frontier:
        raise ValueError("--keep-runs goes with --frontier")
    if frontier:
        written = draw_frontier(
            results, out, select=metric, labels=labels, random_search=random_search
        )
        if keep_runs is not None:  # only what the frontier accepted goes into the record
            from pl_privfed.report.frontier_record import keep_runs as keep

            written = [*keep(results, keep_runs), *written]
        for path in written:
            print(path)
        print(written[-1].read_text(), end="")
        return 0
    for path in compare_methods(results, out, metric=metric):
        print(path)
    text = (Path(out) / "comparison.md").read_text()
    notes = text.split("Notes:", 1)[1].strip() if "Notes:" in text else ""
    if notes:
        print(notes)
    return 0


@subcommand("demo")
def demo(out: str = "logs/demo", configs: str | None = None) -> int:
    """Train on the embedded digits: a useful private run beside its non-private twin and a
    second algorithm at the same ε; prints a table, saves a figure.

    Args:
        out: output directory
        configs: directory of the demo configs
    """
    from pl_privfed.cli.app import run_trainer_command
    from pl_privfed.demo import main as demo_main

    return demo_main(out, configs, runner=run_trainer_command)  # each run as `pl-privfed fit`
