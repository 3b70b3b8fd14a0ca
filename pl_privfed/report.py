"""Paper-style figures and tables from a sweep's ``results.csv``: ``pl-privfed report``.

* ``heatmap[_<facet>].png``: the highest test accuracy over (x, y) — by default (β, γ) — one
  panel per value of every other swept parameter (α, server normalization, ...), as in paper 002
  Figs. 4-8 and 11-12;
* ``heatmap_server_normalization_difference.png``: with minus without server normalization
  (paper 002 Fig. 12, right) when that parameter was swept;
* ``curves.png``: training loss and test accuracy against rounds for the best y per x value
  (paper 002 Figs. 3, 9, 13), from each run's ``curves.csv``;
* ``table.md`` / ``table.csv``: method, β, γ (and other swept columns), final and best accuracy,
  ε (paper 002 Tables 7 and 10).
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

__all__ = ["load_results", "make_report"]

_RESULT_COLUMNS = {"run", "status", "run_dir", "final_test_accuracy", "best_test_accuracy",
                   "final_train_loss", "epsilon", "rounds", "wall_time_s"}  # fmt: skip


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _key(text: str) -> tuple:
    value = _number(text)
    return (0, value, "") if value is not None else (1, 0.0, str(text))


def load_results(path: str | os.PathLike) -> list[dict[str, str]]:
    """The rows of a ``results.csv`` written by :func:`pl_privfed.sweep.run_sweep`."""
    with Path(path).open(newline="") as f:
        return list(csv.DictReader(f))


def _method(row: dict[str, str]) -> str:
    summary_path = Path(row.get("run_dir") or "") / "summary.json"
    name = "?"
    if summary_path.is_file():
        config = json.loads(summary_path.read_text()).get("config") or {}
        algorithm = (config.get("model") or {}).get("algorithm") or {}
        name = str(algorithm.get("class_path", "?")).rsplit(".", 1)[-1]
        if (algorithm.get("init_args") or {}).get("server_normalization") is True:
            name += " + server norm"
    return name


def _heatmap(ax, grid, xs, ys, title, x, y, limits: tuple[float, float], diff=False):
    """One annotated heatmap (values in %); ``limits`` are shared by the panels of a figure."""
    import numpy as np

    data = np.full((len(ys), len(xs)), np.nan)
    for (xv, yv), value in grid.items():
        if value is not None:
            data[ys.index(yv), xs.index(xv)] = value * 100
    image = ax.imshow(data, cmap="RdBu" if diff else "viridis", origin="lower", aspect="auto",
                      vmin=limits[0], vmax=limits[1])  # fmt: skip
    ax.set_xticks(range(len(xs)), xs)
    ax.set_yticks(range(len(ys)), ys)
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title, fontsize=9)
    for i in range(len(ys)):
        for j in range(len(xs)):
            if np.isfinite(data[i, j]):
                ax.text(j, i, f"{data[i, j]:+.1f}" if diff else f"{data[i, j]:.1f}",
                        ha="center", va="center", fontsize=7, color="w")  # fmt: skip
    return image


def _limits(panels, diff: bool) -> tuple[float, float]:
    values = [100 * v for grid in panels for v in grid.values() if v is not None]
    if not values:
        return (0.0, 1.0)
    if diff:
        bound = max(1e-9, max(abs(v) for v in values))
        return (-bound, bound)
    return (min(values), max(values))


def _read_curves(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    path = Path(run_dir) / "curves.csv"
    curves: dict[str, list[tuple[int, float]]] = defaultdict(list)
    if path.is_file():
        with path.open(newline="") as f:
            for rec in csv.DictReader(f):
                value = _number(rec["value"])
                if value is not None:
                    curves[rec["metric"]].append((int(rec["round"]), value))
    return curves


def make_report(
    results_csv: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    x: str = "beta",
    y: str = "step_size",
    metric: str = "best_test_accuracy",
) -> list[Path]:
    """Write the heatmaps, curves and table of a sweep; return the written paths.

    Args:
        results_csv: a sweep's ``results.csv``.
        out_dir: where to write (default: ``report/`` beside the CSV).
        x: column on the heatmaps' x axis and of the curves' legend (default β).
        y: column on the y axis, the one tuned per x value for the curves (default γ).
        metric: the accuracy column the heatmaps show and the best run is chosen by.
    """
    rows = [r for r in load_results(results_csv) if (r.get("status") or "") == "finished"]
    out = Path(out_dir) if out_dir is not None else Path(results_csv).parent / "report"
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    params = [c for c in (rows[0] if rows else {}) if c not in _RESULT_COLUMNS]
    for axis, name in (("x", x), ("y", y)):
        if rows and name not in params:
            raise ValueError(f"{axis}={name!r} is not a swept column of {results_csv}: {params}")
    others = [c for c in params if c not in (x, y) and len({r[c] for r in rows}) > 1]
    xs = sorted({r[x] for r in rows}, key=_key)
    ys = sorted({r[y] for r in rows}, key=_key)

    # heatmaps of the highest accuracy, one panel per combination of the other swept columns
    facets: dict[tuple, dict[tuple[str, str], float | None]] = defaultdict(dict)
    for r in rows:
        facet = tuple(r[c] for c in others)
        facets[facet][(r[x], r[y])] = _number(r.get(metric))
    if facets:
        keys = sorted(facets, key=lambda f: tuple(_key(v) for v in f))
        limits = _limits(facets.values(), diff=False)
        fig = Figure(figsize=(4.2 * len(keys), 3.6), layout="constrained")
        for i, facet in enumerate(keys):
            ax = fig.add_subplot(1, len(keys), i + 1)
            title = ", ".join(f"{c}={v}" for c, v in zip(others, facet, strict=True)) or metric
            image = _heatmap(ax, facets[facet], xs, ys, f"{title} ({metric}, %)", x, y, limits)
        fig.colorbar(image, ax=fig.axes)
        written.append(out / "heatmap.png")
        fig.savefig(written[-1], dpi=110)

    # with minus without server normalization
    if "server_normalization" in others:
        rest = [c for c in others if c != "server_normalization"]
        pairs: dict[tuple, dict[tuple[str, str], float | None]] = defaultdict(dict)
        by_key = {(tuple(r[c] for c in rest), r[x], r[y], r["server_normalization"]): r
                  for r in rows}  # fmt: skip
        for (facet, xv, yv, sn), r in by_key.items():
            other = by_key.get((facet, xv, yv, "false"))
            if sn == "true" and other is not None:
                a, b = _number(r.get(metric)), _number(other.get(metric))
                pairs[facet][(xv, yv)] = None if a is None or b is None else a - b
        if pairs:
            keys = sorted(pairs, key=lambda f: tuple(_key(v) for v in f))
            limits = _limits(pairs.values(), diff=True)
            fig = Figure(figsize=(4.2 * len(keys), 3.6), layout="constrained")
            for i, facet in enumerate(keys):
                ax = fig.add_subplot(1, len(keys), i + 1)
                label = ", ".join(f"{c}={v}" for c, v in zip(rest, facet, strict=True))
                title = f"with − without server norm. {label} (points)".replace("  ", " ")
                image = _heatmap(ax, pairs[facet], xs, ys, title, x, y, limits, diff=True)
            fig.colorbar(image, ax=fig.axes)
            written.append(out / "heatmap_server_normalization_difference.png")
            fig.savefig(written[-1], dpi=110)

    # curves of the best y per x (and per facet)
    best: dict[tuple, dict[str, str]] = {}
    for r in rows:
        group = (tuple(r[c] for c in others), r[x])
        score = _number(r.get(metric))
        if score is not None and (group not in best or score > _number(best[group][metric])):
            best[group] = r
    if best:
        fig = Figure(figsize=(10, 3.8), layout="constrained")
        loss_ax, acc_ax = fig.add_subplot(1, 2, 1), fig.add_subplot(1, 2, 2)
        for (facet, xv), r in sorted(best.items(), key=lambda t: (t[0][0], _key(t[0][1]))):
            curves = _read_curves(r["run_dir"])
            label = ", ".join([f"{x}={xv}", f"{y}={r[y]}",
                               *(f"{c}={v}" for c, v in zip(others, facet, strict=True))])  # fmt: skip
            for ax, key in ((loss_ax, "train/loss"), (acc_ax, "test/acc")):
                if curves.get(key):
                    steps, values = zip(*curves[key], strict=True)
                    ax.plot(steps, values, label=label)
        for ax, title in ((loss_ax, "training loss"), (acc_ax, "test accuracy")):
            ax.set_title(f"{title} (best {y} per {x})", fontsize=9)
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
        loss_ax.set_yscale("log")
        acc_ax.legend(fontsize=7)
        written.append(out / "curves.png")
        fig.savefig(written[-1], dpi=110)

    # the paper-style table
    columns = ["method", x, y, *others, "final accuracy", "best accuracy", "epsilon"]
    table = []
    for r in rows:
        final, top, eps = (_number(r.get(c)) for c in ("final_test_accuracy", metric, "epsilon"))
        table.append({"method": _method(r), x: r[x], y: r[y], **{c: r[c] for c in others},
                      "final accuracy": "" if final is None else f"{100 * final:.2f}%",
                      "best accuracy": "" if top is None else f"{100 * top:.2f}%",
                      "epsilon": "" if eps is None else f"{eps:.3g}", "_best": top or -1.0})  # fmt: skip
    table.sort(key=lambda t: (t["method"], -t["_best"]))
    with (out / "table.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(table)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(t[c]) for c in columns) + " |" for t in table]
    (out / "table.md").write_text("\n".join(lines) + "\n")
    written += [out / "table.md", out / "table.csv"]
    return written
