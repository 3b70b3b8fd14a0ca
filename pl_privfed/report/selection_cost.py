"""The frontier's selection cost: what choosing a point's configuration among its candidates
costs the clients' training data, from the candidates' recorded privacy histories
(:mod:`pl_privfed.privacy.selection` does the accounting; this module reads the runs)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from pl_privfed.report.runs import get
from pl_privfed.results import finite_float

__all__ = ["SelectionCost", "selection_cost", "warn_note"]

#: how far a history composed alone may be from the ε its run reported before it is not trusted
#: to describe the run (the accountants' own tolerances are far smaller)
_REPRODUCE_RTOL = 0.01


@dataclass(frozen=True)
class SelectionCost:
    """What selecting one frontier point among its candidates costs.

    Attributes:
        runs: the candidate runs the selection read (configurations × seeds).
        composed: ε of every candidate run composed on the same data (NaN where unknown).
        random_search: Papernot & Steinke's ε of random search over the configurations, with
            the mean number of candidates = the configurations compared (NaN unless asked).
        note: why a value is missing (``""`` when none is).
    """

    runs: int = 0
    composed: float = math.nan
    random_search: float = math.nan
    note: str = ""


def _history(summary: dict) -> tuple[list[dict] | None, str]:
    """A run's recorded releases (its headline accountant's history), rebuilt from the
    accounting entry's mechanism for a ``summary.json`` written before histories were kept
    (unless its releases were sampled without replacement: the population is not recorded)."""
    accounting = get(summary, "privacy", "accounting")
    if not isinstance(accounting, dict):
        return None, "no privacy accounting in the run's summary.json"
    if isinstance(accounting.get("history"), list):
        return accounting["history"], ""
    sigma, rate = accounting.get("noise_multiplier"), accounting.get("sample_rate")
    releases, sampling = accounting.get("releases"), accounting.get("sampling") or "poisson"
    if sigma is None or rate is None or releases is None or sampling == "without_replacement":
        return None, "the run's summary.json records no history of its releases"
    record = {"noise_multiplier": sigma, "sample_rate": rate, "sampling": sampling}
    return [{**record, "population": None, "releases": releases}], ""


def _key(history: list[dict]) -> frozenset:
    """A history as a comparable value: its releases counted by their key
    (:func:`~pl_privfed.privacy.selection.merged_releases`)."""
    from pl_privfed.privacy.selection import merged_releases  # accounting: torch (Opacus)

    return frozenset(merged_releases([history]).items())


def _accountant(summary: dict) -> str:
    """The accountant that computed a run's ε: the one it named, except that ``auto`` was
    Opacus's RDP for releases without sampling or Poisson-sampled before 2026-11-26 (PLD since),
    which the summary's ``privacy.accounting.accountant`` (the library) says."""
    name = get(summary, "privacy", "accountant") or "auto"
    library = str(get(summary, "privacy", "accounting", "accountant") or "")
    return "rdp" if name == "auto" and "RDP" in library else name


def _one(values: pd.Series, what: str) -> tuple[object, str]:
    """The one value of ``values``, else a note naming ``what`` differs."""
    distinct = {str(v) for v in values}
    if len(distinct) != 1:
        return None, f"the candidates' {what} differ ({', '.join(sorted(distinct))})"
    return values.iloc[0], ""


def selection_cost(
    members: pd.DataFrame, configs: Sequence[Sequence[str]], random_search: str | None = None
) -> SelectionCost:
    """The cost of selecting among ``members`` (one method's finished runs at one target ε,
    with their ``_summary`` and ``_dir``), grouped into ``configs`` (each configuration's run
    directories).

    ``composed``: every member's history composed by the accountant the runs named, at their
    δ (:func:`~pl_privfed.privacy.selection.composed_epsilon`). ``random_search`` (with a
    distribution, :func:`~pl_privfed.privacy.selection.repetition_shape`): one candidate is a
    configuration with all its seeds (their histories composed), the mean number of candidates
    the number of configurations (:func:`~pl_privfed.privacy.selection.random_search_epsilon`);
    it needs every configuration's history to be the same. A history that, composed alone, does
    not give back its run's reported ε (within 1 %) is not used.
    """
    # the accounting loads torch (through Opacus): only when a frontier is drawn
    from pl_privfed.privacy.selection import composed_epsilon, random_search_epsilon

    runs = len(members)
    histories: dict[str, list[dict]] = {}
    for directory, summary in zip(members["_dir"], members["_summary"], strict=True):
        history, note = _history(summary)
        if history is None:
            return SelectionCost(runs, note=note)
        histories[directory] = history
    delta, note = _one(members["_summary"].map(lambda s: get(s, "privacy", "delta")), "δ")
    accountant, note2 = _one(members["_summary"].map(_accountant), "accountants")
    if note or note2:
        return SelectionCost(runs, note=note or note2)
    checked: set[frozenset] = set()
    for directory, summary in zip(members["_dir"], members["_summary"], strict=True):
        key = _key(histories[directory])
        if key in checked:
            continue
        alone = composed_epsilon([histories[directory]], float(delta), accountant)  # type: ignore[arg-type]
        reported = finite_float(get(summary, "privacy", "epsilon"))
        if reported is None or not math.isclose(alone, reported, rel_tol=_REPRODUCE_RTOL):
            return SelectionCost(
                runs,
                note=f"the history in {directory} gives ε = {alone:.4g}, not the reported "
                f"{reported}: it does not describe the run",
            )
        checked.add(key)
    composed = composed_epsilon(histories.values(), float(delta), accountant)  # type: ignore[arg-type]
    if random_search is None:
        return SelectionCost(runs, composed)
    candidates = [[r for d in dirs for r in histories[d]] for dirs in configs]
    if len({_key(c) for c in candidates}) != 1:
        return SelectionCost(
            runs, composed, note="the configurations' histories differ: no random-search bound"
        )
    bound = random_search_epsilon(candidates[0], float(delta), len(configs), random_search)
    return SelectionCost(runs, composed, bound)


def warn_note(method: str, target: str, cost: SelectionCost) -> None:
    """Name a missing selection cost in a warning."""
    if cost.note:
        warnings.warn(
            f"{method} at ε = {target}: no ε with selection: {cost.note}", UserWarning, stacklevel=3
        )
