"""Paper-style figures and tables from a sweep's ``results.csv``: ``pl-privfed report``.

Only finished runs are drawn. :func:`make_report` writes

* ``heatmap.png``: the highest test accuracy over (x, y), by default (β, γ), values annotated,
  one panel per value of every other parameter that varies (α, server normalization, ...), on
  one colour scale, as in paper 002 Figs. 4-8 and 11-12;
* ``heatmap_server_normalization_difference.png`` when ``server_normalization`` varies: with
  minus without server normalization, in accuracy points (paper 002 Fig. 12);
* ``curves.png``: training loss and test accuracy against rounds of the best y for each value
  of x, from the runs' ``curves.csv`` (paper 002 Figs. 3, 9, 13);
* ``table.md`` and ``table.csv``: method, β, γ (and every other varying parameter), final and
  best test accuracy, ε where present, sorted by method then best accuracy (paper 002 Tables 7
  and 10);
* ``rounds_to_target.png`` when the runs measured the full-gradient norm
  (:class:`~pl_privfed.callbacks.GradientNorm`): the fewest rounds to reach the target against
  the clipping threshold, one line per number of local steps, one panel per number of classes
  per client, the step sizes tuned (minimum over the other parameters), as in paper 003
  Figs. 1–2;
* ``accuracy_vs_transmissions.png`` when the participation probability varies: test accuracy of
  the best run per ``p`` against the total client-to-server transmissions ``k · p · M`` (measured:
  round × the run's transmissions per round), as in paper 004 Fig. 2.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from pl_privfed.callbacks.summary import finite_float
from pl_privfed.sweep import RESULT_COLUMNS

__all__ = ["compare_methods", "load_results", "make_report"]

_NOT_PARAMETERS = {"run", "status", "run_dir", *RESULT_COLUMNS}
_SYMBOLS = {"beta": "β", "step_size": "γ", "alpha": "α", "epsilon": "ε", "delta": "δ"}
_SERVER_NORM = "server_normalization"


def _order(text: str) -> tuple:
    """Sort key: numbers numerically, then everything else as text."""
    value = finite_float(text)
    return (0, value, "") if value is not None else (1, 0.0, str(text))


def _symbol(column: str) -> str:
    return _SYMBOLS.get(column, column)


def load_results(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a ``results.csv`` written by :func:`pl_privfed.sweep.run_sweep`."""
    return _read_csv(path)[1]


def _read_csv(path: str | os.PathLike) -> tuple[list[str], list[dict[str, str]]]:
    with Path(path).open(newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def _run_dir(row: dict[str, str], results_csv: Path) -> Path:
    """The run directory of a row: as recorded, else ``runs/<run>`` beside the CSV (a CSV read
    from another working directory or a moved sweep folder)."""
    recorded = Path(row.get("run_dir") or "")
    if row.get("run_dir") and recorded.is_dir():
        return recorded
    return results_csv.parent / "runs" / (row.get("run") or "")


def _summary(run_dir: Path) -> dict:
    try:
        data = json.loads((run_dir / "summary.json").read_text())
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _method(row: dict[str, str], run_dir: Path) -> str:
    """The algorithm's class name from the run's ``summary.json`` (+ " + server norm")."""
    name, server_norm = "?", row.get(_SERVER_NORM) == "true"
    summary = _summary(run_dir)
    config = summary.get("config")
    model = config.get("model") if isinstance(config, dict) else None
    algorithm = model.get("algorithm") if isinstance(model, dict) else None
    if isinstance(algorithm, dict) and algorithm.get("class_path"):
        name = str(algorithm["class_path"]).rsplit(".", 1)[-1]
        init_args = algorithm.get("init_args") or {}
        if _SERVER_NORM in init_args:
            server_norm = init_args[_SERVER_NORM] is True
    elif summary.get("algorithm"):
        name = str(summary["algorithm"]).split("(", 1)[0]
    return name + (" + server norm" if server_norm else "")


def _read_curves(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    path = run_dir / "curves.csv"
    if not path.is_file():
        return curves
    with path.open(newline="") as f:
        for rec in csv.DictReader(f):
            step, value = finite_float(rec.get("round")), finite_float(rec.get("value"))
            if step is not None and value is not None:
                curves[rec.get("metric") or ""].append((int(step), value))
    return curves


def _best(rows: Iterable[dict[str, str]], metric: str) -> dict[str, str] | None:
    scored = [(s, r) for r in rows if (s := finite_float(r.get(metric))) is not None]
    return max(scored, key=lambda t: t[0])[1] if scored else None


def _cells(rows: Sequence[dict[str, str]], x: str, y: str, metric: str) -> dict[tuple, float]:
    """The highest ``metric`` per (x, y) cell, over every other column."""
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[(r[x], r[y])].append(r)
    out = {}
    for cell, members in groups.items():
        best = _best(members, metric)
        if best is not None:
            out[cell] = finite_float(best[metric])
    return out


def _draw_heatmap(
    ax,
    values: dict[tuple, float],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    title: str,
    bounds: tuple[float, float],
    diff: bool = False,
):
    """One annotated heatmap (values in accuracy points) on ``ax``; returns the image."""
    data = np.full((len(ys), len(xs)), np.nan)
    for (xv, yv), value in values.items():
        data[ys.index(yv), xs.index(xv)] = 100.0 * value
    cmap = colormaps["RdBu" if diff else "viridis"].with_extremes(bad="0.85")
    vmin, vmax = bounds
    image = ax.imshow(
        np.ma.masked_invalid(data), cmap=cmap, vmin=vmin, vmax=vmax, origin="lower", aspect="auto"
    )
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(_symbol(x))
    ax.set_ylabel(_symbol(y))
    ax.set_title(title, fontsize=9)
    span = (vmax - vmin) or 1.0
    for i in range(len(ys)):
        for j in range(len(xs)):
            value = data[i, j]
            if not np.isfinite(value):
                continue
            level = (value - vmin) / span
            dark = abs(level - 0.5) > 0.3 if diff else level < 0.6
            ax.text(j, i, f"{value:+.1f}" if diff else f"{value:.1f}", ha="center", va="center",
                    fontsize=8, color="white" if dark else "black")  # fmt: skip
    return image


def _heatmap_figure(
    path: Path,
    panels: dict[tuple, dict[tuple, float]],
    columns: Sequence[str],
    xs: list[str],
    ys: list[str],
    *,
    x: str,
    y: str,
    title: str,
    diff: bool = False,
) -> Path:
    """One panel per facet value (``columns``), one shared colour scale; rows follow all
    facets but the last, columns the last one."""
    keys = sorted(panels, key=lambda k: tuple(_order(v) for v in k))
    bounds = _bounds((v for p in panels.values() for v in p.values()), symmetric=diff)
    if len(columns) >= 2:
        ncols = len({k[-1] for k in keys})
    else:
        ncols = min(len(keys), 4)
    nrows = math.ceil(len(keys) / ncols)
    width = max(3.6, 1.4 + 0.75 * len(xs))
    height = max(2.9, 1.3 + 0.5 * len(ys))
    fig = Figure(figsize=(width * ncols + 1.0, height * nrows), layout="constrained")
    image = None
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        label = f"{_facet_title(columns, key)}: {title}" if columns else title
        image = _draw_heatmap(
            ax, panels[key], xs, ys, x=x, y=y, title=label, bounds=bounds, diff=diff
        )
    if image is not None:
        fig.colorbar(image, ax=fig.axes, label="accuracy points" if diff else "accuracy (%)")
    fig.savefig(path, dpi=120)
    return path


def _facet_title(columns: Sequence[str], values: Sequence[str]) -> str:
    return ", ".join(f"{_symbol(c)}={v}" for c, v in zip(columns, values, strict=True))


def _bounds(values: Iterable[float | None], symmetric: bool = False) -> tuple[float, float]:
    finite = [100.0 * v for v in values if v is not None]
    if not finite:
        return (-1.0, 1.0) if symmetric else (0.0, 100.0)
    if symmetric:
        bound = max(1e-6, max(abs(v) for v in finite))
        return -bound, bound
    low, high = min(finite), max(finite)
    return (low, high) if high > low else (low - 0.5, high + 0.5)


def make_report(
    results_csv: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    x: str = "beta",
    y: str = "step_size",
    facet: str | Sequence[str] | None = None,
    metric: str = "best_test_accuracy",
) -> list[Path]:
    """Write the heatmaps, the curves figure and the table of a sweep; return the written paths.

    Args:
        results_csv: a sweep's ``results.csv`` (:func:`pl_privfed.sweep.run_sweep`).
        out_dir: where to write (default ``report/`` beside the CSV).
        x: the column on the heatmaps' x axis, one curve per value (default β).
        y: the column on the heatmaps' y axis, tuned per x for the curves (default γ).
        facet: column(s) with one heatmap per value; default every other parameter that
            varies. Parameters that vary but are neither x, y nor a facet are maximized over.
        metric: the accuracy column of the heatmaps and of the choice of the best runs.

    Where the default x (``beta``) or y (``step_size``) is not a column of the CSV (a grid over
    other parameters), the first other parameter that varies takes its place. A grid over one
    parameter gets no heatmap: its curves (one per value) and table.

    Raises:
        ValueError: when x, y or a facet is not a parameter column of the CSV.
    """
    results_csv = Path(results_csv)
    header, all_rows = _read_csv(results_csv)
    params = [c for c in header if c not in _NOT_PARAMETERS]
    facets_given = [facet] if isinstance(facet, str) else list(facet or [])
    varying_all = [c for c in params if len({r.get(c) for r in all_rows}) > 1]
    one_parameter = len(params) == 1 and (x, y) == ("beta", "step_size")
    if one_parameter:  # a one-dimensional grid: no heatmap; curves and table per value
        x, y = params[0], None
    elif x == "beta" and x not in params:  # the default x, a grid without β: its first parameter
        x = next((c for c in varying_all + params if c != y), x)
    if y == "step_size" and y not in params:
        y = next((c for c in varying_all + params if c != x), y)
    for role, column in [("x", x), ("y", y), *(("facet", f) for f in facets_given)]:
        if column not in params and not (role == "y" and one_parameter):
            raise ValueError(
                f"{role}={column!r} is not a parameter column of {results_csv}: {params}"
            )
    if x == y:
        raise ValueError(f"x and y must differ, got x=y={x!r}")
    out = Path(out_dir) if out_dir is not None else results_csv.parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    rows = [r for r in all_rows if r.get("status") == "finished"]
    varying = [c for c in params if len({r.get(c) for r in rows}) > 1]
    facets = facets_given if facet is not None else [c for c in varying if c not in (x, y)]
    facets = [c for c in facets if c not in (x, y)]
    xs = sorted({r[x] for r in rows}, key=_order)
    ys = sorted({r[y] for r in rows}, key=_order) if y is not None else []
    written: list[Path] = []

    # the highest accuracy over (x, y), one panel per facet value, one colour scale
    groups: dict[tuple, list[dict[str, str]]] = defaultdict(list)
    for r in rows:
        groups[tuple(r[c] for c in facets)].append(r)
    if groups and y is not None:
        panels = {key: _cells(members, x, y, metric) for key, members in groups.items()}
        title = "highest test accuracy (%)" if metric == "best_test_accuracy" else f"{metric} (%)"
        written.append(
            _heatmap_figure(out / "heatmap.png", panels, facets, xs, ys, x=x, y=y, title=title)
        )

    # with minus without server normalization
    if _SERVER_NORM in varying and _SERVER_NORM not in (x, y):
        rest = [c for c in facets if c != _SERVER_NORM]
        sides: dict[tuple, dict[str, list[dict[str, str]]]] = defaultdict(lambda: defaultdict(list))
        for r in rows:
            sides[tuple(r[c] for c in rest)][r[_SERVER_NORM]].append(r)
        diffs: dict[tuple, dict[tuple, float]] = {}
        for key, side in sides.items():
            on, off = _cells(side["true"], x, y, metric), _cells(side["false"], x, y, metric)
            diffs[key] = {c: on[c] - off[c] for c in on.keys() & off.keys()}
        written.append(
            _heatmap_figure(
                out / "heatmap_server_normalization_difference.png",
                diffs,
                rest,
                xs,
                ys,
                x=x,
                y=y,
                title="with − without server norm. (points)",
                diff=True,
            )
        )

    # training loss and test accuracy of the best y for each x
    if rows:
        fig = Figure(figsize=(11, 4), layout="constrained")
        loss_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        losses: list[float] = []
        others = [c for c in varying if c not in (x, y)]
        for xv in xs:
            best = _best((r for r in rows if r[x] == xv), metric)
            if best is None:
                continue
            curves = _read_curves(_run_dir(best, results_csv))
            label = ", ".join(f"{_symbol(c)}={best[c]}" for c in (x, y, *others) if c)
            for ax, key in ((loss_ax, "train/loss"), (acc_ax, "test/acc")):
                if curves.get(key):
                    steps, values = zip(*sorted(curves[key]), strict=True)
                    ax.plot(steps, values, label=label, marker="." if len(steps) < 30 else None)
                    if key == "train/loss":
                        losses += values
        for ax, name in ((loss_ax, "training loss"), (acc_ax, "test accuracy")):
            tuned = f"best {_symbol(y)} per {_symbol(x)}" if y else f"per {_symbol(x)}"
            ax.set_title(f"{name}, {tuned}", fontsize=9)
            ax.set_xlabel("round")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.grid(alpha=0.3)
        if losses and min(losses) > 0 and max(losses) > 10 * min(losses):  # orders of magnitude
            loss_ax.set_yscale("log")
        for ax in (acc_ax, loss_ax):
            if ax.lines:
                ax.legend(fontsize=7)
                break
        written.append(out / "curves.png")
        fig.savefig(written[-1], dpi=120)

    # the paper-style table
    swept = [c for c in (x, y) if c] + [c for c in varying if c not in (x, y, _SERVER_NORM)]
    with_eps = any(finite_float(r.get("epsilon")) is not None for r in rows)
    columns = ["method", *(_symbol(c) for c in swept), "final accuracy (%)", "best accuracy (%)"]
    columns += ["ε"] if with_eps else []
    table: list[tuple[tuple, list[str]]] = []
    for r in rows:
        method = _method(r, _run_dir(r, results_csv))
        final, best = finite_float(r.get("final_test_accuracy")), finite_float(r.get(metric))
        cells_ = [method, *(r.get(c) or "" for c in swept)]
        cells_ += ["" if v is None else f"{100 * v:.2f}" for v in (final, best)]
        if with_eps:
            eps = finite_float(r.get("epsilon"))
            cells_.append("" if eps is None else f"{eps:.3g}")
        table.append(((method, best is None, -(best or 0.0)), cells_))
    table.sort(key=lambda t: t[0])
    with (out / "table.csv").open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        writer.writerows(cells_ for _, cells_ in table)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cells_) + " |" for _, cells_ in table]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    written += [out / "table.md", out / "table.csv"]
    if any(finite_float(r.get("final_full_grad_norm")) is not None for r in rows):
        written.append(_rounds_to_target_figure(out / "rounds_to_target.png", rows, params))
    participation = next((c for c in _PARTICIPATION if c in varying), None)
    if participation is not None:
        path = _transmissions_figure(
            out / "accuracy_vs_transmissions.png", rows, participation, results_csv
        )
        if path is not None:
            written.append(path)
    return written


_PARTICIPATION = ("participation_prob", "probability", "cohort_size")
_CLIP = ("clip_threshold", "threshold")
_STEPS = ("steps", "local_batches")
_FACETS = ("classes_per_client", "concentration")


def _none_last(text: str) -> tuple:
    return (1, 0.0, "") if text in ("null", "None", "") else (0, *_order(text)[1:])


def _rounds_to_target_figure(path: Path, rows: list[dict[str, str]], params: list[str]) -> Path:
    """Paper 003 Figs. 1-2: fewest rounds to the gradient-norm target against the clipping
    threshold (``null`` = no clipping, drawn last as "none"), one line per local-step count, one
    panel per heterogeneity level; runs that never reached it are drawn as × at the top."""
    x = next((c for c in _CLIP if c in params), None) or params[0]
    series = next((c for c in _STEPS if c in params and c != x), None)
    facet = next((c for c in _FACETS if c in params and c not in (x, series)), None)
    facets = sorted({r.get(facet, "") for r in rows}, key=_order) if facet else [""]
    xs = sorted({r[x] for r in rows}, key=_none_last)
    ceiling = max((finite_float(r.get("rounds")) or 0.0 for r in rows), default=1.0)
    fig = Figure(figsize=(4.6 * len(facets), 3.6), layout="constrained")
    for k, fv in enumerate(facets):
        ax = fig.add_subplot(1, len(facets), k + 1)
        members = [r for r in rows if not facet or r.get(facet) == fv]
        for sv in sorted({r.get(series, "") for r in members} if series else {""}, key=_order):
            best: list[float] = []
            for xv in xs:
                cell = [r for r in members if r[x] == xv and (not series or r.get(series) == sv)]
                reached = [finite_float(r.get("rounds_to_target")) for r in cell]
                reached = [v for v in reached if v is not None]
                best.append(min(reached) if reached else math.nan)
            label = f"{_symbol(series)}={sv}" if series else None
            line = ax.plot(range(len(xs)), best, marker="o", label=label)[0]
            missing = [i for i, v in enumerate(best) if math.isnan(v)]
            ax.plot(missing, [ceiling] * len(missing), "x", color=line.get_color())
        ax.set_xticks(range(len(xs)), [("none" if v in ("null", "None") else v) for v in xs])
        ax.set_xlabel(f"{_symbol(x)} (clipping threshold)" if x in _CLIP else _symbol(x))
        ax.set_ylabel("rounds to target")
        ax.set_title(f"{facet}={fv}" if facet else "rounds to ||∇f|| target", fontsize=9)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return path


def _transmissions_figure(
    path: Path, rows: list[dict[str, str]], column: str, results_csv: Path
) -> Path | None:
    """Paper 004 Fig. 2: test accuracy of the best run per participation value against the
    cumulative client-to-server transmissions."""
    fig = Figure(figsize=(5.5, 4), layout="constrained")
    ax = fig.add_subplot(1, 1, 1)
    for value in sorted({r[column] for r in rows}, key=_order):
        best = _best((r for r in rows if r[column] == value), "best_test_accuracy")
        if best is None:
            continue
        sent, rounds = finite_float(best.get("client_transmissions")), finite_float(best["rounds"])
        curve = sorted(_read_curves(_run_dir(best, results_csv)).get("test/acc", []))
        if not curve or not sent or not rounds:
            continue
        per_round = sent / rounds
        ax.plot([k * per_round for k, _ in curve], [v for _, v in curve], marker=".",
                label=f"{column}={value}")  # fmt: skip
    if not ax.lines:
        return None
    ax.set_xlabel("client-to-server transmissions (k · p · M)")
    ax.set_ylabel("test accuracy")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)
    return path


def _sent_bits_per_round(summary: dict) -> float | None:
    """Mean bits one agent or client *sends* per round: the per-agent totals of every channel but
    the server's broadcast, divided by the rounds run."""
    totals = summary.get("communication_total_bits_per_agent")
    rounds = finite_float(summary.get("rounds"))
    if not isinstance(totals, dict) or not rounds:
        return None
    sent = [finite_float(v) for k, v in totals.items() if k != "server_to_client"]
    sent = [v for v in sent if v is not None]
    return sum(sent) / rounds if sent else None


def compare_methods(
    results_csvs: Sequence[str | os.PathLike],
    out_dir: str | os.PathLike,
    *,
    metric: str = "best_test_accuracy",
) -> list[Path]:
    """Side by side, the best run of each sweep against rounds and against bits (paper 001 §5).

    One sweep per method (e.g. ``paper001_a9a_porter_dp_eps0.01`` and
    ``paper001_a9a_soteriafl_eps0.01``, each tuning its step sizes). From each ``results.csv`` the
    finished run with the highest ``metric`` is drawn, as paper 001 Figs. 2–3 draw the best-tuned
    runs: the train utility ``||∇f(x̄)||²`` (from the run's
    :class:`~pl_privfed.callbacks.GradientNorm` history, at the agents' average for a
    decentralized method) and the test accuracy (``curves.csv``), each against the round and
    against the bits one agent sent. The bits axis is ``round ×`` the run's mean bits sent per
    agent per round (the per-agent totals of ``summary.json`` over the rounds run: every channel
    but the server's broadcast down), so curves of methods with different message sizes can be
    compared. Writes ``comparison.png`` and ``comparison.csv`` (method, the best run's
    parameters, final accuracy, final utility, bits sent per agent, ε).

    Raises:
        ValueError: with fewer than one results file, or a file without a finished run.
    """
    if not results_csvs:
        raise ValueError("compare_methods needs at least one results.csv")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fig = Figure(figsize=(10, 7), layout="constrained")
    axes = [fig.add_subplot(2, 2, k + 1) for k in range(4)]
    table: list[list[str]] = []
    for path in map(Path, results_csvs):
        header, rows = _read_csv(path)
        best = _best((r for r in rows if r.get("status") == "finished"), metric)
        if best is None:
            raise ValueError(f"{path} has no finished run with a {metric} value")
        run_dir = _run_dir(best, path)
        summary = _summary(run_dir)
        params = [c for c in header if c not in _NOT_PARAMETERS and len({r[c] for r in rows}) > 1]
        # raw names: the Greek letters of the α-NormEC grids mean other things here (η, γ)
        setting = ", ".join(f"{c}={best[c]}" for c in params)
        label = f"{_method(best, run_dir)} ({setting})" if setting else _method(best, run_dir)
        per_round = _sent_bits_per_round(summary)
        history = (summary.get("full_grad_norm") or {}).get("history") or []
        utility = [(int(r), float(v) ** 2) for r, v in history]
        accuracy = sorted(_read_curves(run_dir).get("test/acc", []))
        color = None
        for k, curve in enumerate((utility, utility, accuracy, accuracy)):
            against_bits = k % 2 == 1
            if not curve or (against_bits and per_round is None):
                continue
            xs = [r * per_round if against_bits else r for r, _ in curve]
            line = axes[k].plot(xs, [v for _, v in curve], label=label, color=color)[0]
            color = line.get_color()
        utility_final = utility[-1][1] if utility else None
        eps = finite_float(best.get("epsilon"))
        final = finite_float(best.get("final_test_accuracy"))
        total = None if per_round is None else per_round * finite_float(summary.get("rounds"))
        table.append(
            [
                label,
                "" if final is None else f"{100 * final:.2f}",
                "" if utility_final is None else f"{utility_final:.4g}",
                "" if total is None else f"{total:.4g}",
                "" if eps is None else f"{eps:.3g}",
            ]
        )
    titles = ("train utility ||∇f(x̄)||²", "test accuracy")
    for k, ax in enumerate(axes):
        ax.set_title(titles[k // 2], fontsize=9)
        ax.set_xlabel("bits sent per agent" if k % 2 else "round")
        ax.grid(alpha=0.3)
        if k < 2 and ax.lines:
            ax.set_yscale("log")
    if axes[0].lines or axes[2].lines:
        (axes[0] if axes[0].lines else axes[2]).legend(fontsize=7)
    written = [out / "comparison.png", out / "comparison.csv"]
    fig.savefig(written[0], dpi=120)
    with written[1].open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(
            ["method", "final accuracy (%)", "final utility", "bits sent per agent", "ε"]
        )
        writer.writerows(table)
    return written
