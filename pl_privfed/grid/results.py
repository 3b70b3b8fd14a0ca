"""A grid's results, written like a ``pl-privfed sweep``: ``results.csv`` and one
``runs/<id>/`` (``summary.json``, ``curves.csv``) per configuration, so that ``pl-privfed
report`` draws the grid's heatmaps, curves and table."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.grid.points import init_parameters, sweep_name
from pl_privfed.results import (
    column_names,
    curves_csv,
    result_row,
    run_id,
    save_results,
    write_atomically,
)

__all__ = ["write_grid_results"]


def _class_path(obj: object) -> str:
    cls = type(obj)
    public = f"pl_privfed.algorithms.{cls.__name__}"
    return (
        public
        if cls.__module__.startswith("pl_privfed.algorithms")
        else (f"{cls.__module__}.{cls.__qualname__}")
    )


def _json_value(value: Any) -> Any:
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return repr(value)


def write_grid_results(
    out_dir: str | Path,
    algorithms: Sequence[FederatedAlgorithm],
    points: Sequence[dict[str, Any]],
    history: Sequence[dict[str, list[tuple[int, float]]]],
    statuses: Sequence[str],
    rounds: int,
    extra: Sequence[dict[str, Any]] | None = None,
) -> Path:
    """Write the grid's results like a ``pl-privfed sweep``; return the ``results.csv`` path.

    ``<out_dir>/runs/<run id>/summary.json`` and ``curves.csv`` for every configuration and
    ``<out_dir>/results.csv`` with one row each (the sweep's columns), so that
    ``pl-privfed report <out_dir>/results.csv`` draws the grid's heatmaps, curves and table.
    ``history[k]`` maps a metric (``train/loss``, ``val/acc``, ``val/loss``, and ``test/acc``,
    ``test/loss`` from the end-of-fit test evaluation) to ``(round, value)`` points (``train/full_grad_norm`` also gives ``final_full_grad_norm``);
    ``extra[k]`` adds entries (e.g. ε, ``rounds_to_target``) to configuration ``k``'s summary.
    ``rounds`` is the run's round count; a configuration that has stopped (failed, or finished
    at its target) reports the rounds it ran.
    """
    out = Path(out_dir)
    keys = [sweep_name(k, algorithms[0]) for k in points[0]]
    names = column_names(keys)
    rows = []
    extra = extra if extra is not None else [{} for _ in points]
    for index, (alg, point, curves, status, entries) in enumerate(
        zip(algorithms, points, history, statuses, extra, strict=True)
    ):
        params = {sweep_name(k, alg): v for k, v in point.items()}
        run_dir = out / "runs" / run_id(index, params)
        run_dir.mkdir(parents=True, exist_ok=True)
        val_acc = sorted(curves.get("val/acc", []))
        val_loss = sorted(curves.get("val/loss", []))
        test_acc = sorted(curves.get("test/acc", []))
        test_loss = sorted(curves.get("test/loss", []))
        best = max(val_acc, key=lambda p: p[1]) if val_acc else None
        losses = [v for _, v in sorted(curves.get("train/loss", []))]
        grad_norms = [v for _, v in sorted(curves.get("train/full_grad_norm", []))]
        init_args = {
            name: _json_value(getattr(alg, name))
            for name in init_parameters(type(alg))
            if hasattr(alg, name)
        }
        summary = {
            "status": status,
            "rounds": int(alg.rounds_done) if status != "running" else rounds,
            "final_val_accuracy": val_acc[-1][1] if val_acc else None,
            "final_val_loss": val_loss[-1][1] if val_loss else None,
            "final_val_round": (val_loss or val_acc)[-1][0] if (val_loss or val_acc) else None,
            "best_val_accuracy": best[1] if best else None,
            "best_val_round": best[0] if best else None,
            "final_test_accuracy": test_acc[-1][1] if test_acc else None,
            "final_test_loss": test_loss[-1][1] if test_loss else None,
            "final_test_round": (test_loss or test_acc)[-1][0] if (test_loss or test_acc) else None,
            "final_train_loss": losses[-1] if losses else None,
            "final_full_grad_norm": grad_norms[-1] if grad_norms else None,
            "grid_index": index,
            "grid_point": {k: _json_value(v) for k, v in point.items()},
            "config": {
                "model": {"algorithm": {"class_path": _class_path(alg), "init_args": init_args}}
            },
            **entries,
        }
        write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        write_atomically(run_dir / "curves.csv", curves_csv(curves))
        rows.append(result_row(run_dir, summary, params, names))
    return save_results(out, names, rows)
