"""A grid's results, written like a ``pl-privfed sweep``: ``results.csv`` and one
``runs/<id>/`` (``summary.json``, ``curves.csv``) per configuration, so that ``pl-privfed
report`` draws the grid's heatmaps, curves and table."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pl_privfed.grid.configuration import Configuration, json_value
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


def _config(algorithm: Any) -> dict[str, Any]:
    """A configuration's ``config``: its algorithm's class path and arguments."""
    init_args = {
        name: json_value(getattr(algorithm, name))
        for name in init_parameters(type(algorithm))
        if hasattr(algorithm, name)
    }
    return {"model": {"algorithm": {"class_path": _class_path(algorithm), "init_args": init_args}}}


def write_grid_results(
    out_dir: str | Path,
    configurations: Sequence[Configuration],
    rounds: int,
    entries: Sequence[dict[str, Any]] | None = None,
) -> Path:
    """Write the grid's results like a ``pl-privfed sweep``; return the ``results.csv`` path.

    ``<out_dir>/runs/<run id>/summary.json`` (each configuration's run record,
    :meth:`Configuration.record`, with its ``config``) and ``curves.csv`` for every
    configuration, and ``<out_dir>/results.csv`` with one row each (the sweep's columns), so
    that ``pl-privfed report <out_dir>/results.csv`` draws the grid's heatmaps, curves and
    table. ``rounds`` is the run's round count; ``entries[k]`` adds the grid's entries for
    configuration ``k`` (e.g. its seed's ``data``).
    """
    out = Path(out_dir)
    first = configurations[0]
    names = column_names([sweep_name(k, first.algorithm) for k in first.point])
    rows = []
    entries = entries if entries is not None else [{} for _ in configurations]
    for configuration, extra in zip(configurations, entries, strict=True):
        alg = configuration.algorithm
        params = {sweep_name(k, alg): v for k, v in configuration.point.items()}
        run_dir = out / "runs" / run_id(configuration.index, params)
        run_dir.mkdir(parents=True, exist_ok=True)
        own = {"config": _config(alg), **extra}
        summary = configuration.record(rounds, own)
        write_atomically(run_dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        write_atomically(run_dir / "curves.csv", curves_csv(configuration.curves))
        rows.append(result_row(run_dir, summary, params, names))
    return save_results(out, names, rows)
