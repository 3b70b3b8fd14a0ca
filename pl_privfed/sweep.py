"""Run a W&B grid sweep file locally, without a W&B server: ``pl-privfed sweep <sweep.yaml>``.

The sweep files in ``configs/sweeps/`` are ordinary W&B sweep configurations (``wandb sweep``
accepts them). This runner expands their grid and runs every point sequentially as its own
``pl-privfed fit`` process with ``--output_dir <out>/runs/<index>-<hash>``. A point whose
``summary.json`` says ``finished`` is skipped, so running a half-finished grid again resumes it
without redoing finished runs (failed runs are re-run). After each run ``<out>/results.csv`` is
rewritten: one row per run, from each run's ``summary.json``; ``pl-privfed report`` draws it.

A run directory is identified by the grid index and the parameters only: extra arguments
(``overrides``, e.g. a shorter ``--trainer.max_steps`` for a smoke test) do not change it, so
give such runs their own output directory.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "RESULT_COLUMNS",
    "Sweep",
    "column_names",
    "failed_runs",
    "grid",
    "load_sweep",
    "render_value",
    "result_row",
    "run_args",
    "run_id",
    "run_sweep",
    "save_results",
    "write_results",
]

#: Columns of ``results.csv`` taken from each run's ``summary.json``.
RESULT_COLUMNS = (
    "final_test_accuracy",
    "best_test_accuracy",
    "final_train_loss",
    "epsilon",
    "rounds",
    "wall_time_s",
    "rounds_to_target",
    "final_full_grad_norm",
    "client_transmissions",
)
_RESERVED = {"run", "status", "run_dir", *RESULT_COLUMNS}
_DROPPED = {"${env}", "${interpreter}", "${program}"}
_ARGS = "${args}"


@dataclass
class Sweep:
    """A parsed W&B grid sweep file.

    Attributes:
        name: the sweep's ``name`` (the file's stem when absent).
        method: the search method (``grid``).
        parameters: every parameter's list of values, in file order (``value: v`` gives ``[v]``).
        command: the ``command`` list, macros (``${env}``, ``${args}``, ...) included.
        metric: the ``metric`` mapping (``{name: test/acc, goal: maximize}``), possibly empty.
        path: the file it was read from.
    """

    name: str
    method: str
    parameters: dict[str, list[Any]]
    command: list[str]
    metric: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def swept(self) -> list[str]:
        """The parameters with more than one value."""
        return [k for k, v in self.parameters.items() if len(v) > 1]


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read a W&B sweep file and check that the local grid runner can run it.

    Raises:
        ValueError: naming the offending key and value when ``method`` is not ``grid``, a
            parameter has neither ``value`` nor ``values`` (or an empty ``values`` list), or
            ``command`` is not a list containing ``${args}``.
    """
    path = Path(path)
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a sweep file holds a mapping, got {type(raw).__name__}")
    method = raw.get("method")
    if method != "grid":
        raise ValueError(f"{path}: method must be 'grid' for the local runner, got {method!r}")
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ValueError(f"{path}: parameters must be a non-empty mapping, got {params!r}")
    parameters: dict[str, list[Any]] = {}
    for key, spec in params.items():
        if isinstance(spec, dict) and "values" in spec:
            values = spec["values"]
            if not isinstance(values, list) or not values:
                raise ValueError(
                    f"{path}: parameters.{key}.values must be a non-empty list, got {values!r}"
                )
            parameters[str(key)] = list(values)
        elif isinstance(spec, dict) and "value" in spec:
            parameters[str(key)] = [spec["value"]]
        else:
            raise ValueError(
                f"{path}: parameters.{key} needs 'value' or 'values' for a grid, got {spec!r}"
            )
    command = raw.get("command")
    if not isinstance(command, list) or _ARGS not in command:
        raise ValueError(f"{path}: command must be a list containing '{_ARGS}', got {command!r}")
    metric = raw.get("metric") or {}
    if not isinstance(metric, dict):
        raise ValueError(f"{path}: metric must be a mapping, got {metric!r}")
    return Sweep(
        name=str(raw.get("name") or path.stem),
        method=method,
        parameters=parameters,
        command=[str(c) for c in command],
        metric=dict(metric),
        path=path,
    )


def grid(sweep: Sweep) -> list[dict[str, Any]]:
    """All grid points: parameters in file order, the last parameter varying fastest."""
    keys = list(sweep.parameters)
    combos = itertools.product(*(sweep.parameters[k] for k in keys))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def render_value(value: Any) -> str:
    """A parameter value as LightningCLI (jsonargparse) parses it: ``true``/``false``, ``null``,
    numbers and strings as written, lists and mappings as JSON."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple | dict):
        return json.dumps(value)
    return str(value)


def run_args(sweep: Sweep, params: dict[str, Any], output_dir: str | os.PathLike) -> list[str]:
    """The arguments of :func:`pl_privfed.cli.main` for one grid point.

    That is the sweep's ``command`` after ``pl-privfed`` (what ``wandb agent`` would run), with
    ``${env}``, ``${interpreter}`` and ``${program}`` dropped and ``${args}`` replaced by
    ``--key=value`` pairs (values as :func:`render_value` writes them), followed by
    ``--output_dir=<output_dir>`` and ``--trainer.default_root_dir=<output_dir>`` (so that a run
    without a logger keeps its ``config.yaml`` and checkpoints in its own directory).
    """
    command = [c for c in sweep.command if c not in _DROPPED]
    if command[:1] == ["pl-privfed"]:
        command = command[1:]
    elif command[:2] == ["-m", "pl_privfed.cli"]:
        command = command[2:]
    args: list[str] = []
    for item in command:
        if item == _ARGS:
            args += [f"--{k}={render_value(v)}" for k, v in params.items()]
        else:
            args.append(item)
    return [*args, f"--output_dir={output_dir}", f"--trainer.default_root_dir={output_dir}"]


def run_id(index: int, params: dict[str, Any]) -> str:
    """``<index:04d>-<8 hex digits of a hash of the parameters>``, stable across invocations."""
    text = json.dumps(params, sort_keys=True, default=str)
    return f"{index:04d}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def column_names(keys: Sequence[str]) -> dict[str, str]:
    """The ``results.csv`` column of each parameter: the last dotted component (``step_size``),
    or the full key where two parameters share it or it collides with a result column."""
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    counts: dict[str, int] = {}
    for name in short.values():
        counts[name] = counts.get(name, 0) + 1
    return {k: s if counts[s] == 1 and s not in _RESERVED else k for k, s in short.items()}


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _run_dir(out_dir: Path, index: int, params: dict[str, Any]) -> Path:
    return out_dir / "runs" / run_id(index, params)


def write_results(sweep: Sweep, out_dir: str | os.PathLike) -> Path:
    """(Re)write ``<out_dir>/results.csv`` from the runs' ``summary.json`` files; return its path.

    One row per grid point whose run directory holds a ``summary.json``, in grid order, with
    the columns ``run, status, <parameters>, final_test_accuracy, best_test_accuracy,
    final_train_loss, epsilon, rounds, wall_time_s, rounds_to_target, final_full_grad_norm,
    client_transmissions, run_dir`` (missing values empty; the last three come from
    :class:`~pl_privfed.callbacks.GradientNorm` and the module's transmission count).
    """
    out_dir = Path(out_dir)
    names = column_names(list(sweep.parameters))
    rows = []
    for index, params in enumerate(grid(sweep)):
        run_dir = _run_dir(out_dir, index, params)
        summary = _read_summary(run_dir)
        if summary is not None:
            rows.append(result_row(run_dir, summary, params, names))
    return save_results(out_dir, names, rows)


def result_row(
    run_dir: Path, summary: dict[str, Any], params: dict[str, Any], names: dict[str, str]
) -> dict[str, Any]:
    """One ``results.csv`` row: the run, its status, its parameters (columns ``names``), the
    :data:`RESULT_COLUMNS` of its ``summary`` and its directory."""
    row: dict[str, Any] = {"run": run_dir.name, "status": summary.get("status")}
    row.update({names[k]: render_value(v) for k, v in params.items()})
    row.update({c: summary.get(c) for c in RESULT_COLUMNS})
    row["run_dir"] = str(run_dir)
    return row


def save_results(out_dir: Path, names: dict[str, str], rows: list[dict[str, Any]]) -> Path:
    """Write ``<out_dir>/results.csv`` atomically (through a temporary file); return its path."""
    header = ["run", "status", *names.values(), *RESULT_COLUMNS, "run_dir"]
    path = out_dir / "results.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)
    return path


def failed_runs(results_csv: str | os.PathLike) -> list[str]:
    """The ``run`` column of the rows of a ``results.csv`` whose status is not ``finished``."""
    with Path(results_csv).open(newline="") as f:
        return [r["run"] for r in csv.DictReader(f) if r.get("status") != "finished"]


def _describe(params: dict[str, Any], names: dict[str, str], keys: Sequence[str]) -> str:
    return " ".join(f"{names[k]}={render_value(params[k])}" for k in keys)


def run_sweep(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    overrides: Sequence[str] = (),
    dry_run: bool = False,
    python: str = sys.executable,
) -> Path:
    """Run every point of a grid sweep file sequentially; return the path of ``results.csv``.

    Each point runs as ``[python, "-m", "pl_privfed.cli", *run_args(...), *overrides]`` in the
    current directory, with ``WANDB_RUN_GROUP=<sweep name>`` (W&B groups the runs of a sweep)
    and ``WANDB_MODE=offline`` unless ``WANDB_MODE`` is set; its output goes to
    ``<run dir>/output.log``. Points whose ``summary.json`` says ``finished`` are skipped; failed
    ones are run again. A failing run does not stop the grid: its ``summary.json`` records the
    failure (see :func:`failed_runs`). One progress line is printed per point.

    Args:
        path: the sweep YAML.
        out_dir: output directory (default ``sweeps/<sweep name>``); runs go to ``runs/``.
        overrides: extra arguments appended to every run (``--trainer.max_steps=4``).
        dry_run: print the commands of the points that would run, run nothing, write nothing.
        python: the interpreter that runs the points.
    """
    sweep = load_sweep(path)
    out = Path(out_dir) if out_dir is not None else Path("sweeps") / sweep.name
    env = dict(os.environ)
    env["WANDB_RUN_GROUP"] = sweep.name
    env.setdefault("WANDB_MODE", "offline")
    names = column_names(list(sweep.parameters))
    shown = sweep.swept or list(sweep.parameters)
    points = grid(sweep)
    width = len(str(len(points)))
    for index, params in enumerate(points):
        run_dir = _run_dir(out, index, params)
        cmd = [python, "-m", "pl_privfed.cli", *run_args(sweep, params, run_dir), *overrides]
        label = f"[{index + 1:>{width}}/{len(points)}] {run_dir.name}"
        label += f" {_describe(params, names, shown)}"
        summary = _read_summary(run_dir)
        if summary is not None and summary.get("status") == "finished":
            print(f"{label}: finished before, skipped", flush=True)
            continue
        if dry_run:
            print(shlex.join(cmd), flush=True)
            continue
        print(f"{label}: ", end="", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "summary.json").unlink(missing_ok=True)  # a stale failure must not linger
        (run_dir / "command.txt").write_text(shlex.join(cmd) + "\n")
        start = time.perf_counter()
        with (run_dir / "output.log").open("w") as log:
            code = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        seconds = time.perf_counter() - start
        summary = _read_summary(run_dir)
        if summary is None:  # it failed before training started (e.g. a configuration error)
            lines = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()
            summary = {"status": f"failed: exit code {code}: {lines[-1] if lines else ''}"}
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        elif code != 0 and summary.get("status") == "finished":
            summary["status"] = f"failed: exit code {code} after the fit finished"
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if summary.get("status") == "finished":
            acc = summary.get("final_test_accuracy")
            acc_text = f"{acc:.4f}" if isinstance(acc, int | float) else "n/a"
            print(f"finished in {seconds:.1f} s, final test accuracy {acc_text}", flush=True)
        else:
            status = str(summary.get("status")).strip().splitlines() or ["failed"]
            print(f"{status[0]} (see {run_dir / 'output.log'})", flush=True)
        write_results(sweep, out)
    if dry_run:
        return out / "results.csv"
    return write_results(sweep, out)
