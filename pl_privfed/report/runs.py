"""Reading a sweep's ``results.csv``: its runs as one pandas table with their directories,
summaries, methods and curves."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable, Sequence
from functools import cache
from pathlib import Path

import numpy as np
import pandas as pd

from pl_privfed.report.stats import interval_table
from pl_privfed.results import finite_float, non_parameter_columns, result_columns

__all__ = [
    "DEFAULT_METRIC",
    "KEPT_SUMMARIES",
    "NULL",
    "SERVER_NORM",
    "TEST",
    "check_summaries",
    "get",
    "kept_summaries",
    "load_results",
    "mean_curve",
    "order",
    "params",
    "paths",
    "seed_curves",
    "sorted_values",
    "summary",
    "utility_curve",
    "values",
]

#: the default selection metric: configurations are chosen on validation
DEFAULT_METRIC = "final_val_accuracy"
#: the reported metric
TEST = "final_test_accuracy"
SERVER_NORM = "server_normalization"
#: how a results file writes "no value" (``noise: null``)
NULL = ("null", "None")


def order(text: str) -> tuple:
    """Sort key: numbers numerically, then everything else as text."""
    value = finite_float(text)
    return (0, value, "") if value is not None else (1, 0.0, str(text))


def sorted_values(texts: Iterable[str]) -> list[str]:
    """The distinct ``texts``, numbers numerically first."""
    return sorted(set(texts), key=order)


def paths(results: str | os.PathLike | Sequence[str | os.PathLike]) -> list[Path]:
    """One path or several as a list."""
    return [Path(results)] if isinstance(results, str | os.PathLike) else [Path(p) for p in results]


def values(runs: pd.DataFrame, column: str) -> pd.Series:
    """A column as finite numbers (``nan`` elsewhere; all ``nan`` when there is no such column)."""
    numbers = pd.to_numeric(runs[column], errors="coerce") if column in runs else math.nan
    numbers = pd.Series(numbers, index=runs.index, dtype=float)
    return numbers.where(np.isfinite(numbers))


def _read(path: Path) -> pd.DataFrame:
    """One ``results.csv`` (or its folder) as text, with ``_csv``; a bad file is a ValueError."""
    if path.is_dir():
        if not (path / "results.csv").is_file():
            raise ValueError(f"{path}: a folder without results.csv (run `pl-privfed sweep`)")
        path = path / "results.csv"
    if not path.is_file():
        raise ValueError(f"{path}: no such results file (run `pl-privfed sweep` first)")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except ValueError as exc:  # pandas' parser errors, a binary file, an empty file
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"{path}: not a results.csv ({reason})") from None
    missing = [c for c in ("run", "status") if c not in frame.columns]
    if missing:
        raise ValueError(
            f"{path}: not a results.csv written by `pl-privfed sweep` (no "
            f"{' or '.join(missing)} column)"
        )
    if frame.empty:
        raise ValueError(f"{path}: an empty results file (no runs): nothing to report")
    return frame.assign(_csv=str(path))


def _finished(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs; none is a ValueError naming the files and what their runs did."""
    done = runs["status"] == "finished"
    if not done.any():
        counts = runs["status"].str.slice(0, 60).value_counts()
        seen = "; ".join(f"{n} {s or 'without status'}" for s, n in counts.head(3).items())
        names = ", ".join(sorted(set(runs["_csv"])))
        raise ValueError(
            f"{names}: no finished run among its {len(runs)} run(s) ({seen}): nothing to report"
        )
    return runs[done].reset_index(drop=True)


def load_results(
    results: str | os.PathLike | Sequence[str | os.PathLike], *, finished: bool = True
) -> pd.DataFrame:
    """The runs of one or more ``results.csv`` (:func:`pl_privfed.sweep.run_sweep`), read as one.

    Parameter columns stay text (as written, ``0.1`` and ``true``); the
    :func:`~pl_privfed.record.result_columns` are numbers (``nan`` where missing or not
    finite; a value written but not as a finite number, e.g. ``nan`` or ``abc``, is kept as
    written in ``_unreadable``, ``{column: text}``, which
    :func:`~pl_privfed.report.configs.warn_missing` names). Added columns: ``_csv`` (the file), ``_dir`` (the run directory: as recorded, else
    ``runs/<run>`` beside the file), ``_summary`` (its ``summary.json``), ``_algorithm`` (the
    algorithm's class name) and ``_method`` (``DP-`` in front when the run is private,
    ``+ server norm`` behind when it normalizes the server step). A folder stands for its
    ``results.csv``.

    Args:
        results: the file(s) or folder(s).
        finished: keep the finished runs only, and refuse a file set without one.

    Returns:
        One row per run.

    Raises:
        ValueError: naming the file, when it is missing, not a ``results.csv``, empty, or (with
            ``finished``) holds no finished run.
    """
    summary.cache_clear()  # a run may have gone on since the last report of this process
    kept_summaries.cache_clear()
    _curve_file.cache_clear()
    frames = [_read(path) for path in paths(results)]
    if not frames:
        raise ValueError("no results.csv given")
    runs = pd.concat(frames, ignore_index=True).fillna("")
    runs["_unreadable"] = _unreadable(runs)
    for column in result_columns():
        runs[column] = values(runs, column)
    if finished:
        runs = _finished(runs)
    runs["_dir"] = [str(run_dir_of(r, r["_csv"])) for r in runs.to_dict("records")]
    runs["_summary"] = [summary(d) for d in runs["_dir"]]
    named = [_method(r) for r in runs.to_dict("records")]
    runs["_algorithm"] = [a for a, _ in named]
    runs["_method"] = [m for _, m in named]
    return runs


def _unreadable(runs: pd.DataFrame) -> list[dict[str, str]]:
    """Per run, its result columns written but not as a finite number (``nan``, ``inf``,
    ``abc``): ``{column: text}``; an empty cell or :data:`NULL` is no value, not unreadable."""
    out: list[dict[str, str]] = [{} for _ in range(len(runs))]
    for column in (c for c in result_columns() if c in runs):
        text = runs[column].astype(str).str.strip()
        bad = values(runs, column).isna() & (text != "") & ~text.isin(NULL)
        for i in np.flatnonzero(bad.to_numpy()):
            out[i][column] = text.iloc[i]
    return out


def params(runs: pd.DataFrame) -> list[str]:
    """The parameter columns of the results (seeds included)."""
    return [c for c in runs.columns if c not in non_parameter_columns() and not c.startswith("_")]


def run_dir_of(row: dict, results: str | os.PathLike) -> Path:
    """A run's directory: as recorded, else ``runs/<run>`` beside its results file ``results``
    (where ``compare --frontier --keep-runs`` keeps a copy of its summary)."""
    recorded = Path(row.get("run_dir") or "")
    if row.get("run_dir") and recorded.is_dir():
        return recorded
    return Path(results).parent / "runs" / (row.get("run") or "")


#: a kept record's summaries (:mod:`pl_privfed.report.frontier_record`): one JSON line per run,
#: ``{"run": ..., "summary": {...}}``, beside the sweep's ``results.csv``
KEPT_SUMMARIES = "summaries.jsonl"


@cache
def kept_summaries(path: str) -> dict[str, dict]:
    """The summaries of a kept record's ``summaries.jsonl`` by run (empty when there is none;
    a line that is not a run's summary is skipped)."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return {}
    kept = {}
    for line in lines:
        try:
            item = json.loads(line)
        except ValueError:
            continue
        if isinstance(item, dict) and isinstance(item.get("summary"), dict):
            kept[str(item.get("run"))] = item["summary"]
    return kept


@cache
def summary(run_dir: str) -> dict:
    """A run's ``summary.json`` (empty when it has none); for a run of a kept record, whose
    folder ``<sweep>/runs/<run>`` does not exist, its line of ``<sweep>/summaries.jsonl``."""
    folder = Path(run_dir)
    try:
        data = json.loads((folder / "summary.json").read_text())
    except OSError:
        return kept_summaries(str(folder.parent.parent / KEPT_SUMMARIES)).get(folder.name, {})
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def check_summaries(runs: pd.DataFrame) -> None:
    """Refuse runs whose ``summary.json`` cannot be read, naming the file: a report that needs
    the runs' summaries (their privacy accounting, their method) would otherwise leave cells
    empty without saying why. A run of a kept record is read from its ``summaries.jsonl``.

    Raises:
        ValueError: naming the run, its results file and the summary missing or unreadable.
    """
    for row in runs.to_dict("records"):
        if row["_summary"]:
            continue
        file = Path(row["_dir"]) / "summary.json"
        if not file.is_file():
            kept = Path(row["_dir"]).parent.parent / KEPT_SUMMARIES
            where = f" nor in {kept}" if kept.is_file() else ""
            problem = f"has no summary: {file} is missing{where}"
        else:
            problem = f"has an unreadable summary: {file} is empty or not a JSON object"
        raise ValueError(
            f"{row['_csv']}: run {row.get('run') or row['_dir']} {problem} (the report reads "
            "each run's summary; rerun the point, or leave the run out of the results file)"
        )


def get(data: object, *keys: str) -> object:
    """``data[k1][k2]...``, ``None`` where a level is missing or not a dict."""
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _method(row: dict) -> tuple[str, str]:
    """The algorithm's class name and the method's label of a run (from its summary)."""
    data = row["_summary"]
    name, server_norm = "?", row.get(SERVER_NORM) == "true"
    algorithm = get(data, "config", "model", "algorithm")
    init_args: dict = {}
    if isinstance(algorithm, dict) and algorithm.get("class_path"):
        name = str(algorithm["class_path"]).rsplit(".", 1)[-1]
        init_args = algorithm.get("init_args") or {}
        if SERVER_NORM in init_args:
            server_norm = init_args[SERVER_NORM] is True
    elif data.get("algorithm"):
        name = str(data["algorithm"]).split("(", 1)[0]
    private = data.get("private")
    if private is None:
        private = init_args.get("noise") is not None or finite_float(row.get("epsilon")) is not None
    label = f"DP-{name}" if private and "DP" not in name else name
    return name, label + (" + server norm" if server_norm else "")


@cache
def _curve_file(run_dir: str) -> pd.DataFrame:
    """A run's ``curves.csv`` (metric, round, finite value), empty when it has none."""
    try:
        curves = pd.read_csv(Path(run_dir) / "curves.csv")[["metric", "round", "value"]]
    except (OSError, ValueError, KeyError):
        return pd.DataFrame()
    curves["value"] = pd.to_numeric(curves["value"], errors="coerce")
    return curves[np.isfinite(curves["value"])]


def _common_rounds(data: pd.DataFrame) -> pd.DataFrame | None:
    """The rows of ``data`` (``_dir``, ``round``, ``value``) at the rounds every run logged."""
    counts = data.groupby("round")["_dir"].nunique()
    common = counts.index[counts == data["_dir"].nunique()]
    data = data[data["round"].isin(common)]
    return data.reset_index(drop=True) if len(data) else None


def seed_curves(run_dirs: Sequence[str], metric: str) -> pd.DataFrame | None:
    """A curve of each run (``_dir``, ``round``, ``value``) at the rounds every one of them
    logged (``None`` without such a round)."""
    frames = [_curve_file(d).assign(_dir=d) for d in run_dirs if len(_curve_file(d))]
    if not frames:
        return None
    curves = pd.concat(frames, ignore_index=True)
    curves = curves[curves["metric"] == metric].drop_duplicates(["_dir", "round"], keep="last")
    return _common_rounds(curves[["_dir", "round", "value"]])


def mean_curve(run_dirs: Sequence[str], metric: str) -> pd.DataFrame | None:
    """:func:`~pl_privfed.report.interval_table` of :func:`seed_curves` at each round."""
    curves = seed_curves(run_dirs, metric)
    return None if curves is None else interval_table(curves.groupby("round")["value"])


def utility_curve(run_dirs: Sequence[str]) -> pd.DataFrame | None:
    """``||∇f(x̄)||²`` of each run (``_dir``, ``round``, ``value``; their GradientNorm
    histories) at the rounds every one of them has."""
    frames = []
    for d in run_dirs:
        history = get(summary(d), "full_grad_norm", "history") or []
        if history:
            frames.append(pd.DataFrame(history, columns=["round", "value"]).assign(_dir=d))
    if not frames:
        return None
    data = pd.concat(frames, ignore_index=True)
    return _common_rounds(data.assign(value=data["value"].astype(float) ** 2))
