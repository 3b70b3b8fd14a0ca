"""Run a W&B grid sweep file locally, without a W&B server: ``pl-privfed sweep <sweep.yaml>``.

The sweep files in ``configs/sweeps/`` are ordinary W&B sweep configurations (``wandb sweep``
accepts them). This runner expands their grid, runs every point sequentially as its own
``pl-privfed fit`` process with ``--output_dir <out>/runs/<id>``, skips points whose
``summary.json`` says ``finished`` (so a half-finished grid resumes without redoing finished
runs) and writes ``<out>/results.csv``: one row per run, from each run's ``summary.json``.
"""

from __future__ import annotations

import csv
import hashlib
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = ["Sweep", "grid", "load_sweep", "run_args", "run_sweep", "write_results"]

RESULT_COLUMNS = (
    "final_test_accuracy",
    "best_test_accuracy",
    "final_train_loss",
    "epsilon",
    "rounds",
    "wall_time_s",
)
_DROPPED = {"${env}", "${interpreter}", "${program}"}


@dataclass
class Sweep:
    """A parsed grid sweep file."""

    name: str
    parameters: dict[str, list[Any]]
    command: list[str]
    method: str = "grid"
    metric: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    @property
    def swept(self) -> list[str]:
        """The parameters with more than one value."""
        return [k for k, v in self.parameters.items() if len(v) > 1]


def load_sweep(path: str | os.PathLike) -> Sweep:
    """Read and validate a W&B sweep file for the local grid runner."""
    path = Path(path)
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, dict):
        raise ValueError(f"sweep file {path} must hold a mapping, got {type(raw).__name__}")
    method = raw.get("method")
    if method != "grid":
        raise ValueError(f"method must be 'grid' for the local runner, got {method!r} in {path}")
    params = raw.get("parameters")
    if not isinstance(params, dict) or not params:
        raise ValueError(f"parameters must be a non-empty mapping, got {params!r} in {path}")
    parameters: dict[str, list[Any]] = {}
    for key, spec in params.items():
        if isinstance(spec, dict) and "values" in spec:
            values = spec["values"]
            if not isinstance(values, list) or not values:
                raise ValueError(
                    f"parameters.{key}.values must be a non-empty list, got {values!r}"
                )
            parameters[key] = list(values)
        elif isinstance(spec, dict) and "value" in spec:
            parameters[key] = [spec["value"]]
        else:
            raise ValueError(f"parameters.{key} needs 'value' or 'values', got {spec!r}")
    command = raw.get("command")
    if not isinstance(command, list) or "${args}" not in command:
        raise ValueError(f"command must be a list containing '${{args}}', got {command!r}")
    return Sweep(
        name=str(raw.get("name") or path.stem),
        parameters=parameters,
        command=[str(c) for c in command],
        method=method,
        metric=dict(raw.get("metric") or {}),
        path=path,
    )


def grid(sweep: Sweep) -> list[dict[str, Any]]:
    """All grid points, in file order with the last parameter varying fastest."""
    keys = list(sweep.parameters)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(
        *(sweep.parameters[k] for k in keys))]  # fmt: skip


def _render(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def run_args(sweep: Sweep, params: dict[str, Any], output_dir: str | os.PathLike) -> list[str]:
    """The ``pl-privfed`` arguments of one grid point (what ``wandb agent`` would run, with
    ``${args}`` as ``--key=value`` pairs), plus ``--output_dir``."""
    args: list[str] = []
    command = list(sweep.command)
    if command and command[0] in _DROPPED:
        command = command[1:]
    if command and command[0] in ("pl-privfed", "${program}"):
        command = command[1:]
    for item in command:
        if item in _DROPPED:
            continue
        if item == "${args}":
            args += [f"--{k}={_render(v)}" for k, v in params.items()]
        else:
            args.append(item)
    return [*args, f"--output_dir={output_dir}"]


def run_id(index: int, params: dict[str, Any]) -> str:
    """``<index>-<hash of the parameters>``: stable across invocations."""
    digest = hashlib.sha1(json.dumps(params, sort_keys=True, default=str).encode()).hexdigest()
    return f"{index:04d}-{digest[:8]}"


def _column_names(keys: Sequence[str]) -> dict[str, str]:
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    counts: dict[str, int] = {}
    for name in short.values():
        counts[name] = counts.get(name, 0) + 1
    return {k: (short[k] if counts[short[k]] == 1 else k) for k in keys}


def _read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return None


def write_results(sweep: Sweep, out_dir: str | os.PathLike) -> Path:
    """(Re)write ``<out_dir>/results.csv`` from the runs' ``summary.json`` files."""
    out_dir = Path(out_dir)
    names = _column_names(list(sweep.parameters))
    header = ["run", "status", *names.values(), *RESULT_COLUMNS, "run_dir"]
    rows = []
    for index, params in enumerate(grid(sweep)):
        rid = run_id(index, params)
        run_dir = out_dir / "runs" / rid
        summary = _read_summary(run_dir)
        if summary is None:
            continue
        row = {"run": rid, "status": summary.get("status"), "run_dir": str(run_dir)}
        row.update({names[k]: _render(v) for k, v in params.items()})
        row.update({c: summary.get(c) for c in RESULT_COLUMNS})
        rows.append(row)
    path = out_dir / "results.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=header)
        writer.writeheader()
        writer.writerows(rows)
    return path


def run_sweep(
    path: str | os.PathLike,
    out_dir: str | os.PathLike | None = None,
    *,
    overrides: Sequence[str] = (),
    dry_run: bool = False,
    python: str = sys.executable,
) -> tuple[Path, int]:
    """Run every grid point of a sweep file sequentially; return ``(results.csv, failures)``.

    Each point runs as ``python -m pl_privfed.cli <args> <overrides>`` in the current directory
    with ``WANDB_RUN_GROUP=<sweep name>`` (W&B groups the runs of a sweep) and W&B offline
    unless ``WANDB_MODE`` is set. Finished points are skipped; failed points are re-run.
    """
    sweep = load_sweep(path)
    out = Path(out_dir) if out_dir is not None else Path("sweeps") / sweep.name
    env = dict(os.environ)
    env["WANDB_RUN_GROUP"] = sweep.name
    env.setdefault("WANDB_MODE", "offline")
    points = grid(sweep)
    failures = 0
    for index, params in enumerate(points):
        rid = run_id(index, params)
        run_dir = out / "runs" / rid
        cmd = [python, "-m", "pl_privfed.cli", *run_args(sweep, params, run_dir), *overrides]
        summary = _read_summary(run_dir)
        label = f"[{index + 1}/{len(points)}] {rid}"
        if summary is not None and summary.get("status") == "finished":
            print(f"{label} finished before, skipped", flush=True)
            continue
        if dry_run:
            print(" ".join(cmd), flush=True)
            continue
        print(f"{label} {' '.join(f'{k}={_render(v)}' for k, v in params.items())}", flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        with (run_dir / "output.log").open("w") as log:
            code = subprocess.call(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
        summary = _read_summary(run_dir)
        if summary is None:  # failed before training started (e.g. a configuration error)
            tail = (run_dir / "output.log").read_text(errors="replace").strip().splitlines()[-1:]
            summary = {"status": f"failed: exit code {code}: {' '.join(tail)}"}
            (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if code != 0 or summary.get("status") != "finished":
            failures += 1
            print(f"{label} FAILED (exit {code}); see {run_dir / 'output.log'}", flush=True)
        else:
            acc = summary.get("final_test_accuracy")
            print(f"{label} done: final test accuracy {acc}", flush=True)
        write_results(sweep, out)
    return write_results(sweep, out), failures
