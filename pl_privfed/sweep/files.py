"""A sweep file and its points: reading a W&B grid sweep file, its points' arguments and run
folders, the sweep's ``results.csv`` from the runs' ``summary.json`` files, and the lock on its
output folder (:mod:`pl_privfed.sweep`)."""

from __future__ import annotations

import contextlib
import csv
import itertools
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pl_privfed.results import (
    column_names,
    non_parameter_columns,
    render_value,
    result_row,
    run_id,
    save_results,
)

__all__ = [
    "Sweep",
    "SweepLockedError",
    "command_of",
    "failed_runs",
    "grid",
    "identity",
    "load_sweep",
    "point_dir",
    "read_summary",
    "run_args",
    "run_name",
    "selected",
    "sweep_lock",
    "write_results",
]

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
        metric: the ``metric`` mapping (``{name: val/acc, goal: maximize}``), possibly empty.
        path: the file it was read from.
        project: the W&B ``project`` (``None`` when the file sets none).
    """

    name: str
    method: str
    parameters: dict[str, list[Any]]
    command: list[str]
    metric: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None
    project: str | None = None

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
    if not path.is_file():
        raise ValueError(f"sweep file {str(path)!r}: no such file")
    try:
        raw = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise ValueError(f"sweep file {str(path)!r} is not valid YAML{where}: {first}") from exc
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
    name = str(metric.get("name", ""))
    if name.startswith("test/"):
        raise ValueError(
            f"{path}: metric.name={name!r} selects on the test set: select on the validation "
            "split (val/acc, val/loss) and read test/* for the selected configuration"
        )
    project = raw.get("project")
    if project is not None and not isinstance(project, str):
        raise ValueError(f"{path}: project must be a W&B project name, got {project!r}")
    return Sweep(
        name=str(raw.get("name") or path.stem),
        method=method,
        parameters=parameters,
        command=[str(c) for c in command],
        metric=dict(metric),
        path=path,
        project=project,
    )


def grid(sweep: Sweep) -> list[dict[str, Any]]:
    """All grid points: parameters in file order, the last parameter varying fastest."""
    keys = list(sweep.parameters)
    combos = itertools.product(*(sweep.parameters[k] for k in keys))
    return [dict(zip(keys, combo, strict=True)) for combo in combos]


def selected(sweep: Sweep, where: Sequence[str]) -> list[int]:
    """The indices (in :func:`grid` order) of the points that satisfy every condition of ``where``.

    Each condition is ``KEY=V1,V2,...``: the points whose parameter ``KEY`` takes one of the
    listed values. ``KEY`` is a parameter's full name or a unique dotted suffix of it
    (``noise.epsilon`` for ``model.algorithm.init_args.noise.epsilon``); each value is read as
    YAML and must be one of the parameter's values in the file. A selected point keeps its
    index, so its run folder is the one the whole sweep gives it: running a subset first and
    the whole sweep later reuses the subset's finished runs.

    Raises:
        ValueError: naming the condition, when it is not ``KEY=VALUES``, its key names no
            parameter (or several), or a value is not one of the parameter's values.
    """
    allowed: dict[str, list[Any]] = {}
    for condition in where:
        key, sep, text = condition.partition("=")
        key = key.strip()
        if not sep or not key or not text.strip():
            raise ValueError(f"--where {condition!r}: expected KEY=V1,V2,... (e.g. seed=0,1)")
        matches = [k for k in sweep.parameters if k == key or k.endswith("." + key)]
        exact = [k for k in matches if k == key]
        if len(matches) != 1 and not exact:
            names = ", ".join(sweep.parameters)
            what = "names no parameter" if not matches else f"is ambiguous ({', '.join(matches)})"
            raise ValueError(f"--where {condition!r}: {key!r} {what} of the sweep ({names})")
        name = (exact or matches)[0]
        values = [yaml.safe_load(v.strip()) for v in text.split(",")]
        for value in values:
            if value not in sweep.parameters[name]:
                raise ValueError(
                    f"--where {condition!r}: {value!r} is not a value of {name} "
                    f"{sweep.parameters[name]!r}"
                )
        allowed[name] = [v for v in allowed.get(name, values) if v in values]
    return [
        index
        for index, point in enumerate(grid(sweep))
        if all(point[name] in values for name, values in allowed.items())
    ]


def command_of(sweep: Sweep) -> list[str]:
    """The sweep's ``command`` after ``pl-privfed`` (or ``-m pl_privfed.cli``), without the
    ``${env}``, ``${interpreter}`` and ``${program}`` macros."""
    command = [c for c in sweep.command if c not in _DROPPED]
    if command[:1] == ["pl-privfed"]:
        command = command[1:]
    elif command[:2] == ["-m", "pl_privfed.cli"]:
        command = command[2:]
    return command


def run_name(params: dict[str, Any], keys: Sequence[str] | None = None) -> str:
    """A run's name from its parameters: ``beta=0.1 step_size=0.01 seed=0`` (the ``keys``,
    default all, by their ``results.csv`` column names); ``run`` without parameters."""
    keys = list(params) if keys is None else list(keys)
    names = column_names(list(params))
    return " ".join(f"{names[k]}={render_value(params[k])}" for k in keys) or "run"


def run_args(
    sweep: Sweep,
    params: dict[str, Any],
    output_dir: str | os.PathLike,
    name: str | None = None,
    group: str | None = None,
) -> list[str]:
    """The arguments of :func:`pl_privfed.cli.main` for one grid point.

    That is the sweep's ``command`` after ``pl-privfed`` (what ``wandb agent`` would run), with
    ``${env}``, ``${interpreter}`` and ``${program}`` dropped and ``${args}`` replaced by
    ``--key=value`` pairs (values as :func:`~pl_privfed.results.render_value` writes them),
    followed by ``--output_dir=<output_dir>`` and ``--trainer.default_root_dir=<output_dir>`` (so
    that the run keeps its ``config.yaml``, checkpoints and logs in its own directory) and, with
    ``name`` and ``group``, ``--run_name=<name>`` and ``--run_group=<group>`` (its W&B run's
    name and group).
    """
    args: list[str] = []
    for item in command_of(sweep):
        if item == _ARGS:
            args += [f"--{k}={render_value(v)}" for k, v in params.items()]
        else:
            args.append(item)
    args += [f"--output_dir={output_dir}", f"--trainer.default_root_dir={output_dir}"]
    args += [f"--run_name={name}"] if name is not None else []
    return args + ([f"--run_group={group}"] if group is not None else [])


def identity(sweep: Sweep, overrides: Sequence[str]) -> list[str]:
    """What, beside the parameters, makes a run of ``sweep``: its command and the overrides."""
    return [c for c in command_of(sweep) if c != _ARGS] + list(overrides)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / "summary.json"
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def point_dir(out_dir: Path, index: int, params: dict[str, Any], args: Sequence[str]) -> Path:
    """The run folder of a sweep's point: ``<out_dir>/runs/<index>-<hash>``
    (:func:`~pl_privfed.results.run_id`), or the folder of that hash under another index where
    one exists: a point's identity is its hash (its parameters, command and overrides), so that
    a sweep file that gains a value (and renumbers its points) reuses the runs it finished."""
    runs = out_dir / "runs"
    name = run_id(index, params, args)
    if (runs / name).exists() or not runs.is_dir():
        return runs / name
    earlier = sorted(runs.glob(f"[0-9][0-9][0-9][0-9]*-{name.rsplit('-', 1)[1]}"))
    return earlier[0] if earlier else runs / name


def _grid_rows(run_dir: Path, summary: dict[str, Any]) -> list[dict[str, str]] | None:
    """The rows of the ``results.csv`` of a run that trained a grid of configurations."""
    grid_info = summary.get("grid")
    path = grid_info.get("results") if isinstance(grid_info, dict) else None
    if not path:
        return None
    candidates = [Path(path), run_dir / "grid" / "results.csv"]
    for candidate in candidates:
        if candidate.is_file():
            with candidate.open(newline="") as f:
                return list(csv.DictReader(f))
    return None


def write_results(sweep: Sweep, out_dir: str | os.PathLike, overrides: Sequence[str] = ()) -> Path:
    """(Re)write ``<out_dir>/results.csv`` from the runs' ``summary.json`` files; return its path.

    One row per grid point whose run directory (for these ``overrides``) holds a
    ``summary.json``, in grid order, with the columns ``run, status, <parameters>,``
    :func:`~pl_privfed.record.result_columns` ``, run_dir`` (missing values empty), written by
    :func:`~pl_privfed.results.save_results`. A run that trained a grid of configurations
    (``FederatedModule(grid=...)``) gives one row per configuration, with the sweep's parameters
    (e.g. its seed) and the configuration's own.
    """
    out_dir = Path(out_dir)
    names = column_names(list(sweep.parameters))
    args = identity(sweep, overrides)
    rows: list[dict[str, Any]] = []
    for index, params in enumerate(grid(sweep)):
        run_dir = point_dir(out_dir, index, params, args)
        summary = read_summary(run_dir)
        if summary is None:
            continue
        expanded = _grid_rows(run_dir, summary) if summary.get("status") == "finished" else None
        if not expanded:
            rows.append(result_row(run_dir, summary, params, names))
            continue
        own = {names[k]: render_value(v) for k, v in params.items()}
        for row in expanded:
            rows.append({**row, **own, "run": f"{run_dir.name}/{row.get('run', '')}"})
    extra = []
    for row in rows:
        extra += [c for c in row if c not in extra and c not in non_parameter_columns()]
    extra = [c for c in extra if c not in names.values()]
    return save_results(out_dir, {**names, **{c: c for c in extra}}, rows)


def failed_runs(results_csv: str | os.PathLike) -> list[str]:
    """The ``run`` column of the rows of a ``results.csv`` whose status is not ``finished``."""
    with Path(results_csv).open(newline="") as f:
        return [r["run"] for r in csv.DictReader(f) if r.get("status") != "finished"]


class SweepLockedError(RuntimeError):
    """Another sweep holds the output folder's lock."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, under another user
        return True
    except OSError:
        return False
    return True


@contextlib.contextmanager
def sweep_lock(out_dir: str | os.PathLike) -> Iterator[Path]:
    """Hold ``<out_dir>/.sweep.lock`` while a sweep runs in ``out_dir``.

    The lock file is created exclusively and holds the process id, the host and the start time.
    If it exists and names a running process (on this host; one on another host cannot be
    checked), :class:`SweepLockedError` says which; if that process no longer runs, the lock is
    stale (a sweep that was killed): it is taken over, with a note. Released (removed) on exit.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / ".sweep.lock"
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                held = json.loads(path.read_text())
                pid, host = int(held["pid"]), str(held.get("host"))
            except (OSError, ValueError, KeyError, TypeError):
                held, pid, host = {}, -1, ""  # unreadable: being written, or corrupt
            if (host == info["host"] and not _alive(pid)) or (not held and _old(path)):
                print(
                    f"[pl-privfed sweep] stale lock {path} (pid {pid} is not running): taken over",
                    flush=True,
                )
                path.unlink(missing_ok=True)
                continue
            raise SweepLockedError(
                f"another sweep (pid {pid} on {host or 'an unknown host'}) is running in "
                f"{out}: wait for it, or give this one another folder (--out); remove {path} "
                "if that process is gone"
            ) from None
        with os.fdopen(fd, "w") as f:
            json.dump(info, f)
        break
    else:
        raise SweepLockedError(f"could not take the lock {path}")
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)


def _old(path: Path, seconds: float = 60.0) -> bool:
    try:
        return time.time() - path.stat().st_mtime > seconds
    except OSError:
        return True
