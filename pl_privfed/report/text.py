"""How a report writes its numbers: ``mean ± std``, intervals, Markdown tables, the notes on
overlapping intervals, and what a metric's unit and drawn range are."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from pl_privfed.report.stats import Interval

__all__ = [
    "fmt_ci",
    "fmt_names",
    "fmt_num",
    "fmt_pm",
    "fmt_sd",
    "fmt_seeds",
    "is_accuracy",
    "limits",
    "markdown",
    "overlap_notes",
    "scale",
]


def is_accuracy(metric: str) -> bool:
    """Whether ``metric`` is an accuracy (drawn in percent)."""
    return "accuracy" in metric or metric.endswith("/acc")


def limits(metric: str) -> tuple[float, float]:
    """The range of ``metric`` as drawn: accuracy in percent, losses and norms non-negative."""
    if is_accuracy(metric):
        return 0.0, 100.0
    if any(k in metric for k in ("loss", "norm", "utility")):
        return 0.0, math.inf
    return -math.inf, math.inf


def scale(metric: str, values: Iterable[float] = ()) -> float:
    """100 for an accuracy stored as a fraction (every value ≤ 1), else 1."""
    if not is_accuracy(metric):
        return 1.0
    return 1.0 if any(v > 1 for v in values if math.isfinite(v)) else 100.0


def fmt_sd(interval: Interval, factor: float = 1.0, digits: int = 2) -> str:
    """``mean ± std`` (``mean`` alone with one seed; empty without a value)."""
    if interval.n == 0:
        return ""
    if interval.n == 1:
        return f"{interval.mean * factor:.{digits}f}"
    return f"{interval.mean * factor:.{digits}f} ± {interval.std * factor:.{digits}f}"


def fmt_seeds(interval: Interval, factor: float = 1.0, digits: int = 2) -> str:
    """``seeds: a, b``: the seeds' values, where too few give no interval (empty with one seed,
    or when the values are not recorded)."""
    if interval.n < 2 or not interval.values:
        return ""
    return "seeds: " + ", ".join(f"{v * factor:.{digits}f}" for v in interval.values)


def fmt_ci(interval: Interval, factor: float = 1.0, digits: int = 2) -> str:
    """``[low, high]``; with fewer than :data:`~pl_privfed.report.stats.MIN_SEEDS` seeds no
    interval but the seeds' values (:func:`fmt_seeds`; empty with one)."""
    if not math.isfinite(interval.low):
        return fmt_seeds(interval, factor, digits)
    return f"[{interval.low * factor:.{digits}f}, {interval.high * factor:.{digits}f}]"


def fmt_pm(interval: Interval, factor: float) -> str:
    """``mean ± 95 % half-width``; with fewer than
    :data:`~pl_privfed.report.stats.MIN_SEEDS` seeds the mean and the seeds' values
    (``84.00 (seeds: 83.00, 85.00)``), with one the mean alone."""
    if interval.n == 0:
        return ""
    if not math.isfinite(interval.half_width):
        seeds = fmt_seeds(interval, factor)
        return f"{interval.mean * factor:.2f}" + (f" ({seeds})" if seeds else "")
    return f"{interval.mean * factor:.2f} ± {interval.half_width * factor:.2f}"


def fmt_num(value: float, factor: float = 1.0) -> str:
    """``value`` with 6 significant digits (empty when not finite)."""
    return "" if not math.isfinite(value) else f"{value * factor:.6g}"


def fmt_names(names: Sequence[str], most: int = 8) -> str:
    """The first ``most`` names, comma-separated, and ``...`` when there are more.

    >>> fmt_names(["a", "b", "c"], most=2)
    'a, b, ...'
    """
    return ", ".join(names[:most]) + (", ..." if len(names) > most else "")


def markdown(columns: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """The lines of a Markdown table."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return lines + ["| " + " | ".join(map(str, r)) + " |" for r in rows]


def overlap_notes(intervals: dict[str, Interval], what: str = "test accuracy") -> list[str]:
    """One sentence per pair of labels whose 95 % intervals of ``what`` overlap (the data do
    not separate them), or that cannot be compared (a single seed)."""
    notes = []
    labels = [k for k, v in intervals.items() if v.n]
    for i, a in enumerate(labels):
        for b in labels[i + 1 :]:
            ia, ib = intervals[a], intervals[b]
            if ia.n < 2 or ib.n < 2:
                notes.append(
                    f"{a} and {b}: {what} from {ia.n} and {ib.n} seed(s): no interval, "
                    "the difference is not established"
                )
            elif ia.overlaps(ib):
                notes.append(
                    f"{a} and {b}: the 95 % intervals of {what} overlap "
                    f"({fmt_ci(ia, 100)} and {fmt_ci(ib, 100)} %): the difference is "
                    f"not established at {min(ia.n, ib.n)} seeds"
                )
    return notes
