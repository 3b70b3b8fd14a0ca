"""Result rows and files: the columns and writers of ``results.csv`` and ``curves.csv``.

A sweep (:mod:`pl_privfed.sweep`), a run that trains a grid of configurations
(:mod:`pl_privfed.grid`) and the report (:mod:`pl_privfed.report`) read and write the same files;
their shape is defined here, once. ``results.csv`` has one row per run: ``run, status,
<parameters>, <results>, run_dir``, the results being the run record's result columns
(:func:`pl_privfed.record.result_columns`), the parameters under the column names
:func:`column_names` gives them and their values as :func:`render_value` writes them.
``curves.csv`` holds a run's curves as ``metric,round,value`` rows (:func:`curves_csv`).

This module is on the ground floor: it imports nothing of ``pl_privfed`` but the run record
(:mod:`pl_privfed.record`), which declares the result columns.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pl_privfed.record import result_columns

__all__ = [
    "SEED_PARAMETERS",
    "column_names",
    "curves_csv",
    "finite_float",
    "non_parameter_columns",
    "render_value",
    "result_columns",
    "result_row",
    "run_id",
    "save_results",
    "write_atomically",
]

#: Parameters that are seeds: ``report`` and ``compare`` aggregate over them.
SEED_PARAMETERS = ("seed", "seed_everything")


def non_parameter_columns() -> frozenset[str]:
    """The columns of ``results.csv`` that are not parameters (a parameter never takes their
    names): ``run``, ``status``, ``run_dir`` and the record's result columns."""
    return frozenset({"run", "status", "run_dir", *result_columns()})


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


def finite_float(value: Any) -> float | None:
    """``float(value)`` if that works and is finite, else ``None`` (tensors, strings, numbers)."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def run_id(index: int, params: dict[str, Any], args: Sequence[str] = ()) -> str:
    """``<index:04d>-<8 hex digits of a hash>``, stable across invocations.

    The hash covers the parameters and ``args``: a sweep passes its command and every extra
    argument, so that a run with other arguments (a smoke run's ``--trainer.max_steps=20``)
    has another identity. Without ``args`` it is a hash of the parameters alone.
    """
    payload: Any = params if not args else {"params": params, "args": list(args)}
    text = json.dumps(payload, sort_keys=True, default=str)
    return f"{index:04d}-{hashlib.sha1(text.encode()).hexdigest()[:8]}"


def column_names(keys: Sequence[str]) -> dict[str, str]:
    """The ``results.csv`` column of each parameter: the last dotted component (``step_size``),
    or the full key where two parameters share it or it collides with a result column."""
    short = {k: k.rsplit(".", 1)[-1] for k in keys}
    counts: dict[str, int] = {}
    for name in short.values():
        counts[name] = counts.get(name, 0) + 1
    return {
        k: s if counts[s] == 1 and s not in non_parameter_columns() else k for k, s in short.items()
    }


def result_row(
    run_dir: Path, summary: dict[str, Any], params: dict[str, Any], names: dict[str, str]
) -> dict[str, Any]:
    """One ``results.csv`` row: the run, its status, its parameters (columns ``names``), the
    result columns of its ``summary`` (:func:`~pl_privfed.record.result_columns`) and its
    directory."""
    row: dict[str, Any] = {"run": run_dir.name, "status": summary.get("status")}
    row.update({names[k]: render_value(v) for k, v in params.items()})
    row.update({c: summary.get(c) for c in result_columns()})
    row["run_dir"] = str(run_dir)
    return row


def write_atomically(path: str | os.PathLike, content: str | bytes) -> Path:
    """Write ``content`` to ``path`` all or nothing: into a temporary file in the same folder,
    flushed to disk, then renamed into place (``os.replace``, atomic on POSIX and Windows). A
    full disk or a killed process leaves the previous file (or none), never a truncated one;
    the temporary file is removed on failure, and an ``OSError`` names ``path``."""
    target = Path(path)
    data = content.encode() if isinstance(content, str) else content
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(target)) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(exc, OSError):  # name the file asked for, not the temporary one
            raise OSError(exc.errno, exc.strerror, str(target)) from exc
        raise
    return target


def save_results(out_dir: Path, names: dict[str, str], rows: list[dict[str, Any]]) -> Path:
    """Write ``<out_dir>/results.csv`` atomically (through a temporary file); return its path."""
    header = ["run", "status", *names.values(), *result_columns(), "run_dir"]
    path = out_dir / "results.csv"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, fieldnames=header, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return write_atomically(path, text.getvalue())


def curves_csv(history: dict[str, list[tuple[int, float]]]) -> str:
    """Curves ``{metric: [(round, value), ...]}`` as the CSV text of a run's ``curves.csv``
    (``metric,round,value`` rows), which ``pl-privfed report`` reads."""
    lines = ["metric,round,value"]
    for key, points in history.items():
        lines.extend(f"{key},{step},{value!r}" for step, value in points)
    return "\n".join(lines) + "\n"
