"""A frontier's runs kept for the record (``pl-privfed compare --frontier ... --keep-runs DIR``).

A sweep's ``results.csv`` names its runs' folders, and the frontier reads each run's
``summary.json`` there (its adversary and its accounting, which the selection's cost composes).
Those folders live where the sweep ran; this copies each results file into ``DIR/<sweep
folder>/`` with its runs' summaries in one file beside it, ``summaries.jsonl`` (one line per
run, ``{"run": ..., "summary": {...}}``), which :func:`~pl_privfed.report.runs.summary` reads
when a recorded ``run_dir`` is absent, so that ``compare --frontier DIR/*/results.csv`` draws the
same frontier on any machine: one file per sweep, not a folder per run. Each kept summary is the
run's, with its long lists of numbers (a 10,000-client partition's ``client_sizes``) reduced to
their length, minimum, maximum and sum: a few kilobytes a run rather than a hundred. A folder
that holds an earlier record of the same sweep is merged with it run by run (a run recorded
again replaces its row and its summary), so that slices of a sweep run at different times
(``pl-privfed sweep --where``) make one record; an earlier record in the folder-per-run form
(``runs/<run>/summary.json``) is read and rewritten in the compact form.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pl_privfed.report.runs import KEPT_SUMMARIES, kept_summaries, paths, run_dir_of
from pl_privfed.results import non_parameter_columns, save_results, write_atomically

__all__ = ["keep_runs"]

#: lists of numbers longer than this are kept as their length, minimum, maximum and sum
LONG_LIST = 64


def _slim(value: Any) -> Any:
    """``value`` with every list of more than :data:`LONG_LIST` numbers reduced to
    ``{"length", "min", "max", "sum"}``."""
    if isinstance(value, dict):
        return {k: _slim(v) for k, v in value.items()}
    if isinstance(value, list):
        numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
        if numbers and len(value) > LONG_LIST:
            return {"length": len(value), "min": min(value), "max": max(value), "sum": sum(value)}
        return [_slim(v) for v in value]
    return value


def _rows(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    """A results file's header and rows (none for a missing file)."""
    if not path.is_file():
        return [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def _earlier_summaries(target: Path) -> dict[str, dict]:
    """The summaries of an earlier record in ``target``: its ``summaries.jsonl`` and, in the
    folder-per-run form, its ``runs/<run>/summary.json``."""
    kept = dict(kept_summaries(str(target / KEPT_SUMMARIES)))
    for path in sorted(target.glob("runs/*/summary.json")):
        try:
            kept[path.parent.name] = json.loads(path.read_text())
        except ValueError:
            raise ValueError(f"--keep-runs: {path}: not JSON") from None
    return kept


def _summary_of(row: dict[str, str], results: Path) -> dict:
    """The summary of one run of ``results``: its ``summary.json``, or its line of a kept
    record's ``summaries.jsonl``."""
    path = run_dir_of(row, results) / "summary.json"
    if not path.is_file():
        kept = kept_summaries(str(results.parent / KEPT_SUMMARIES)).get(row["run"])
        if kept is None:
            raise ValueError(
                f"--keep-runs: {results}: run {row['run']} has no summary.json at {path}"
            )
        return kept
    try:  # a corrupt summary is named here, not copied
        return json.loads(path.read_text())
    except ValueError:
        raise ValueError(f"--keep-runs: {path}: not JSON") from None


def _keep_one(results: Path, dest: Path) -> Path:
    """Copy one results file and its runs' summaries into ``dest/<its folder>/``."""
    target = dest / results.parent.name
    if target.resolve() == results.parent.resolve():
        raise ValueError(f"--keep-runs: {dest} holds the sweep {results.parent} itself")
    header, rows = _rows(results)
    if not rows or "run" not in header:
        raise ValueError(f"--keep-runs: {results}: no runs to keep (not a sweep's results.csv?)")
    kept_summaries.cache_clear()
    old_header, old_rows = _rows(target / "results.csv")
    merged = {row["run"]: row for row in old_rows}
    summaries = _earlier_summaries(target)
    for row in rows:
        summaries[row["run"]] = _slim(_summary_of(row, results))
        merged[row["run"]] = {**row, "run_dir": ""}  # the copy beside the file, on any machine
    target.mkdir(parents=True, exist_ok=True)
    runs = [run for run in sorted(merged) if run in summaries]
    lines = [json.dumps({"run": r, "summary": summaries[r]}, separators=(",", ":")) for r in runs]
    write_atomically(target / KEPT_SUMMARIES, "\n".join(lines) + "\n")
    kept_summaries.cache_clear()
    for path in target.glob("runs/*/summary.json"):  # the folder-per-run form, now compact
        path.unlink()
        if not any(path.parent.iterdir()):
            path.parent.rmdir()
    if (target / "runs").is_dir() and not any((target / "runs").iterdir()):
        (target / "runs").rmdir()
    columns = old_header + [c for c in header if c not in old_header]
    names = {c: c for c in columns if c not in non_parameter_columns()}  # the parameters
    return save_results(target, names, [merged[run] for run in sorted(merged)])


def keep_runs(results_paths: Sequence[str | os.PathLike], dest: str | os.PathLike) -> list[Path]:
    """Copy every sweep's ``results.csv`` and its runs' summaries into ``dest`` (one folder per
    sweep, named as the sweep's, holding ``results.csv`` and ``summaries.jsonl``; merged with an
    earlier record there); return the written results files, which ``compare --frontier`` reads
    as it reads the originals.

    Raises:
        ValueError: naming the file, when a results file is missing or empty, or a run's
            ``summary.json`` is missing or not JSON; two sweeps with the same folder name.
    """
    files = [p / "results.csv" if p.is_dir() else p for p in paths(results_paths)]
    for f in files:
        if not f.is_file():
            raise ValueError(f"--keep-runs: {f}: no such results file")
    names = [f.parent.name for f in files]
    if len(set(names)) != len(names):
        raise ValueError(f"--keep-runs: two results files in folders of the same name: {names}")
    return [_keep_one(f, Path(dest)) for f in files]
