"""The tables of a sweep's report: ``table.md`` (per method the configuration selected on
validation with its test accuracy, then every configuration) and ``table.csv``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from pl_privfed.report.configs import best
from pl_privfed.report.runs import DEFAULT_METRIC, SERVER_NORM, TEST
from pl_privfed.report.stats import Interval
from pl_privfed.report.symbols import symbol
from pl_privfed.report.text import fmt_ci, fmt_sd, markdown, overlap_notes

__all__ = ["sweep_tables"]


def _columns(swept: list[str], metric: str, names: Sequence[str], with_eps: bool) -> list[str]:
    """The tables' header: method, the swept symbols, seeds, validation and test accuracy, ε."""
    val_name = "val" if metric == DEFAULT_METRIC else metric
    return [
        "method",
        *(symbol(c, names) for c in swept),
        "seeds",
        f"{val_name} accuracy (%)",
        f"{val_name} 95 % CI",
        "test accuracy (%)",
        "test 95 % CI",
        "best val accuracy (%)",
        *(["ε"] if with_eps else []),
    ]


def _cells(row: pd.Series, swept: list[str], metric: str, with_eps: bool) -> list[str]:
    """One configuration's row of the tables."""
    val, test = Interval.of(row, metric), Interval.of(row, TEST)
    eps = Interval.of(row, "epsilon")
    return [
        row["_method"],
        *(row[c] for c in swept),
        str(row["seeds"]),
        fmt_sd(val, 100),
        fmt_ci(val, 100),
        fmt_sd(test, 100),
        fmt_ci(test, 100),
        fmt_sd(Interval.of(row, "best_val_accuracy"), 100),
        *([f"{eps.mean:.3g}" if eps.n else ""] if with_eps else []),
    ]


def sweep_tables(
    configs: pd.DataFrame,
    x: str,
    y: str | None,
    varying: Sequence[str],
    metric: str,
    names: Sequence[str],
) -> tuple[dict[str, str], list[str]]:
    """``table.md`` and ``table.csv`` (file name -> text), and the notes on overlapping test
    intervals of the selected configurations."""
    swept = [c for c in (x, y) if c] + [c for c in varying if c not in (x, y, SERVER_NORM)]
    with_eps = bool(configs["epsilon:n"].sum())
    columns = _columns(swept, metric, names, with_eps)
    score = configs[f"{metric}:mean"]
    ordered = configs.assign(_na=score.isna(), _key=-score.fillna(0.0))
    ordered = ordered.sort_values(["_method", "_na", "_key"], kind="stable")
    selected = best(configs, metric, ["_method"]).sort_values("_method", kind="stable")
    rows = [_cells(r, swept, metric, with_eps) for _, r in ordered.iterrows()]
    table = pd.DataFrame(rows, columns=columns, dtype=str)
    table["selected"] = np.where(ordered.index.isin(selected.index), "yes", "")
    lines = [f"## Selected on validation ({metric}), with their test accuracy", ""]
    lines += markdown(columns, [_cells(r, swept, metric, with_eps) for _, r in selected.iterrows()])
    lines += ["", "## Every configuration", "", *markdown(columns, table[columns].values)]
    notes = overlap_notes({r["_method"]: Interval.of(r, TEST) for _, r in selected.iterrows()})
    return {"table.md": "\n".join(lines) + "\n", "table.csv": table.to_csv(index=False)}, notes
