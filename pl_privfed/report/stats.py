"""The statistics of a report: a metric over the seeds of one configuration as its mean, sample
standard deviation and 95 % Student-t interval of the mean."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy import stats as scipy_stats

from pl_privfed.results import finite_float

__all__ = ["Interval", "interval_table", "mean_interval", "t_band"]

_STATISTICS = ("mean", "std", "low", "high")


@dataclass(frozen=True)
class Interval:
    """A metric over the seeds of one configuration.

    Attributes:
        n: how many seeds have a value.
        mean: their mean.
        std: their sample standard deviation (``nan`` when ``n < 2``).
        low: the lower end of the 95 % Student-t interval of the mean (``nan`` when ``n < 2``).
        high: its upper end (``nan`` when ``n < 2``).
    """

    n: int
    mean: float
    std: float
    low: float
    high: float

    @classmethod
    def of(cls, row: pd.Series, metric: str) -> Interval:
        """The interval of ``metric`` in a row of :func:`~pl_privfed.report.aggregate`'s table."""
        return cls(int(row[f"{metric}:n"]), *(float(row[f"{metric}:{s}"]) for s in _STATISTICS))

    @property
    def half_width(self) -> float:
        """Half the interval's width (``nan`` when ``n < 2``)."""
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        """Whether the two 95 % intervals overlap (true when either is undefined)."""
        if not (math.isfinite(self.low) and math.isfinite(other.low)):
            return True
        return self.low <= other.high and other.low <= self.high


def interval_table(grouped, confidence: float = 0.95) -> pd.DataFrame:
    """``n``, ``mean``, ``std`` (``ddof = 1``) and the Student-t interval ``low``, ``high`` of
    the mean of each group of a pandas ``SeriesGroupBy``, one row per group."""
    table = grouped.agg(["count", "mean", "std"]).rename(columns={"count": "n"})
    n = table["n"].astype(float)
    t = scipy_stats.t.ppf(0.5 + confidence / 2, n.where(n > 1) - 1)
    half = t * table["std"] / np.sqrt(n.where(n > 1))
    return table.assign(low=table["mean"] - half, high=table["mean"] + half)


def mean_interval(values: Iterable[float], confidence: float = 0.95) -> Interval:
    """Mean, sample standard deviation and Student-t interval of the finite ``values``
    (:func:`interval_table`); with equal values the interval is the mean.

    >>> r = mean_interval([0.70, 0.72, 0.74])
    >>> round(r.mean, 4), round(r.std, 4), round(r.low, 4), round(r.high, 4)
    (0.72, 0.02, 0.6703, 0.7697)
    """
    data = pd.Series([finite_float(v) for v in values], dtype=float).dropna()
    if data.empty:
        return Interval(0, math.nan, math.nan, math.nan, math.nan)
    row = interval_table(data.groupby(np.zeros(len(data))), confidence).iloc[0]
    return Interval(int(row["n"]), *(float(row[s]) for s in _STATISTICS))


def t_band(limits: tuple[float, float]):
    """A seaborn ``errorbar`` function: the 95 % Student-t interval of the mean of a vector
    (:func:`mean_interval`), clipped to ``limits`` (the mean where it is undefined)."""

    def band(values: Iterable[float]) -> tuple[float, float]:
        """The clipped interval of one x's values."""
        interval = mean_interval(values)
        low = interval.mean if math.isnan(interval.low) else interval.low
        high = interval.mean if math.isnan(interval.high) else interval.high
        return float(np.clip(low, *limits)), float(np.clip(high, *limits))

    return band
