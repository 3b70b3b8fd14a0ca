"""A grid of hyperparameter configurations trained as one batched federation.

The configurations of a grid share the data, the architecture and the initial model, and differ
only in the algorithm's hyperparameters (paper 002's grid over γ, β, α and server
normalization). ``FederatedModule(grid={...})`` trains them side by side: a *configuration axis*
beside the client axis. Every round, the gradients of all ``K`` configurations' ``n`` clients on
the round's minibatches (the same minibatches a separate run with the same seed would draw) come
from **one** call of the gradient oracle with per-client parameters ``[K·n, d]`` (and per-client
BatchNorm buffers), which is where a GPU spends its time; each configuration's algorithm then
runs its own round (a loop over configurations, never over clients) on its slice ``[n, d]``.

Each configuration's iterates are those of a separate run of the same configuration (tested:
equal to the last bit in float64). A configuration whose training loss becomes non-finite is
marked failed at that round and frozen, as a separate run would stop; the others go on.

This module holds the pieces that do not need the LightningModule: the grid's points,
rebuilding an algorithm with other hyperparameters, and the sweep-style output (one
``summary.json`` and ``curves.csv`` per configuration and a ``results.csv`` that
``pl-privfed report`` reads).
"""

from __future__ import annotations

import copy
import inspect
import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.callbacks.plots import curves_csv
from pl_privfed.sweep import column_names, result_row, run_id, save_results

__all__ = ["GRID_PREFIX", "grid_points", "rebuild_algorithm", "write_grid_results"]

#: How the grid's parameter names appear in run ids and results (as a sweep file names them).
GRID_PREFIX = "model.algorithm.init_args."


def _init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    params = inspect.signature(cls.__init__).parameters
    return {k: p for k, p in params.items() if k != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}


def grid_points(algorithm: FederatedAlgorithm, grid: Any) -> list[dict[str, Any]]:
    """All points of ``grid`` (``{parameter: [values]}``), the last parameter varying fastest
    (the order of ``pl-privfed sweep``); ``ValueError`` naming a bad parameter or value list."""
    if not isinstance(grid, dict) or not grid:
        raise ValueError(
            f"grid must be a non-empty mapping parameter -> list of values, got {grid!r}"
        )
    known = _init_parameters(type(algorithm))
    for name, values in grid.items():
        if name not in known:
            raise ValueError(
                f"grid parameter {name!r} is not an argument of {type(algorithm).__name__} "
                f"(arguments: {', '.join(known)})"
            )
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(f"grid[{name!r}] must be a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def rebuild_algorithm(
    algorithm: FederatedAlgorithm, overrides: dict[str, Any]
) -> FederatedAlgorithm:
    """A fresh algorithm of ``algorithm``'s class with the same arguments except ``overrides``.

    The arguments are read back from the attributes of the same names (every algorithm of the
    package keeps them); values that are objects (operators, noise settings) are deep-copied, so
    that no state is shared. The constructor validates the new values (``ValueError`` naming
    the parameter).
    """
    kwargs = {}
    for name, param in _init_parameters(type(algorithm)).items():
        if name in overrides:
            kwargs[name] = overrides[name]
        elif hasattr(algorithm, name):
            kwargs[name] = copy.deepcopy(getattr(algorithm, name))
        elif param.default is not inspect.Parameter.empty:
            raise ValueError(
                f"{type(algorithm).__name__} keeps no attribute {name!r}: it cannot be rebuilt "
                "for a grid (its argument would silently fall back to the default)"
            )
        else:
            raise ValueError(f"{type(algorithm).__name__} keeps no attribute {name!r}")
    return type(algorithm)(**kwargs)


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
    keys = [GRID_PREFIX + k for k in points[0]]
    names = column_names(keys)
    rows = []
    extra = extra if extra is not None else [{} for _ in points]
    for index, (alg, point, curves, status, entries) in enumerate(
        zip(algorithms, points, history, statuses, extra, strict=True)
    ):
        params = {GRID_PREFIX + k: v for k, v in point.items()}
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
            for name in _init_parameters(type(alg))
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
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        (run_dir / "curves.csv").write_text(curves_csv(curves))
        rows.append(result_row(run_dir, summary, params, names))
    return save_results(out, names, rows)
