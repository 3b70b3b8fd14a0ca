"""The statistics of a report: a metric over the seeds of one configuration as its mean, sample
standard deviation and 95 % Student-t interval of the mean."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from pl_privfed.results import finite_float

__all__ = ["MIN_SEEDS", "Interval", "interval_table", "mean_interval", "t_band"]

_STATISTICS = ("mean", "std", "low", "high")

#: the fewest seeds a 95 % interval is computed from: with two, Student's t has one degree of
#: freedom (t = 12.7), and the interval says more about t than about the runs (a report showed
#: "±48.5" and "±0.0"); with fewer the seeds' values are shown instead, labelled as such
MIN_SEEDS = 3


@dataclass(frozen=True)
class Interval:
    """A metric over the seeds of one configuration.

    Attributes:
        n: how many seeds have a value.
        mean: their mean.
        std: their sample standard deviation (``nan`` when ``n < 2``).
        low: the lower end of the 95 % Student-t interval of the mean (``nan`` when
            ``n <`` :data:`MIN_SEEDS`).
        high: its upper end (``nan`` when ``n <`` :data:`MIN_SEEDS`).
        values: the seeds' values (empty where not recorded).
    """

    n: int
    mean: float
    std: float
    low: float
    high: float
    values: tuple[float, ...] = ()

    @classmethod
    def of(cls, row: pd.Series, metric: str) -> Interval:
        """The interval of ``metric`` in a row of :func:`~pl_privfed.report.aggregate`'s table."""
        seeds = row.get(f"{metric}:values")
        return cls(
            int(row[f"{metric}:n"]),
            *(float(row[f"{metric}:{s}"]) for s in _STATISTICS),
            tuple(seeds) if isinstance(seeds, tuple | list) else (),
        )

    @property
    def half_width(self) -> float:
        """Half the interval's width (``nan`` when ``n <`` :data:`MIN_SEEDS`)."""
        return (self.high - self.low) / 2

    def overlaps(self, other: Interval) -> bool:
        """Whether the two 95 % intervals overlap (true when either is undefined)."""
        if not (math.isfinite(self.low) and math.isfinite(other.low)):
            return True
        return self.low <= other.high and other.low <= self.high


def interval_table(grouped, confidence: float = 0.95) -> pd.DataFrame:
    """``n``, ``mean``, ``std`` (``ddof = 1``), the Student-t interval ``low``, ``high`` of the
    mean (from :data:`MIN_SEEDS` values on; ``nan`` with fewer) and the ``values`` themselves
    (a tuple) of each group of a pandas ``SeriesGroupBy``, one row per group."""
    table = grouped.agg(["count", "mean", "std"]).rename(columns={"count": "n"})
    n = table["n"].astype(float).where(table["n"] >= MIN_SEEDS)
    from scipy import stats as scipy_stats  # on use: about 1 s of CPU to import

    t = scipy_stats.t.ppf(0.5 + confidence / 2, n - 1)
    half = t * table["std"] / np.sqrt(n)
    seeds = grouped.agg(lambda s: tuple(float(v) for v in s.dropna()))
    return table.assign(low=table["mean"] - half, high=table["mean"] + half, values=seeds)


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
    return Interval(int(row["n"]), *(float(row[s]) for s in _STATISTICS), tuple(data))


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
