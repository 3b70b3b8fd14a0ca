"""``Configuration``: one configuration of a grid, a run of its own inside the grid's federation.

A :class:`~pl_privfed.grid.GridModule` trains ``K`` configurations side by side; each is one
:class:`Configuration` holding what a separate run of it would hold: its point (its values of
the grid's parameters), its algorithm, its run seed, its status, its curves, its own entries
(e.g. ``rounds_to_target``, written by callbacks), its client transmissions and its privacy
ledger. Its record (:meth:`Configuration.record`) is made by the same function as a single
run's (:func:`pl_privfed.record.make_record`), so a grid configuration and a batched sweep point
report what their separate run reports.
"""

from __future__ import annotations

import math
from typing import Any

from pl_privfed.privacy import PrivacyLedger
from pl_privfed.record import make_record, privacy_entries

__all__ = ["Configuration", "json_value"]


class Configuration:
    """One configuration of a grid.

    Attributes:
        index: its position in the grid (``k``).
        point: its values of the grid's parameters (``{"step_size": 0.1, ...}``).
        algorithm: its algorithm (a module of the grid's ``grid_algorithms``).
        seed: its run seed (a ``"--seed"`` point), else ``None``.
        status: ``running``, ``finished`` or ``failed: <why>``.
        curves: ``{metric: [(round, value), ...]}`` (its ``curves.csv``).
        entries: its own ``summary.json`` entries (``stopped_reason``, ``rounds_to_target``,
            ``client_transmissions``, ...), kept in checkpoints.
        ledger: its privacy ledger (``None`` when it adds no noise, or before set-up).
        saved_ledger: a checkpoint's ledger entries, until the ledger is set up.
    """

    def __init__(self, index: int, point: dict[str, Any], algorithm: Any, seed: int | None):
        self.index, self.point, self.algorithm, self.seed = index, point, algorithm, seed
        self.status = "running"
        self.curves: dict[str, list[tuple[int, float]]] = {}
        self.entries: dict[str, Any] = {}
        self.ledger: PrivacyLedger | None = None
        self.saved_ledger: dict[str, Any] | None = None

    @property
    def running(self) -> bool:
        """Whether it still trains (neither failed nor done)."""
        return self.status == "running"

    @property
    def failed(self) -> bool:
        """Whether it failed (a non-finite training loss)."""
        return self.status.startswith("failed")

    def add(self, metric: str, round_index: int, value: float) -> None:
        """Add a point to its curve ``metric``."""
        self.curves.setdefault(metric, []).append((int(round_index), float(value)))

    def finish(self, reason: str | None = None) -> None:
        """It is done: finished (``reason``: why it stopped before the last round, its
        ``stopped_reason``)."""
        self.status = "finished"
        if reason is not None:
            self.entries["stopped_reason"] = reason

    def fail(self, round_index: int) -> None:
        """Its training loss became non-finite at ``round_index``: failed and frozen, as its
        separate run would stop (``rounds``: the rounds it completed)."""
        self.status = f"failed: non-finite training loss at round {round_index}"
        self.entries["rounds"] = round_index

    def sent(self, transmissions: int) -> None:
        """Count a round's client-to-server transmissions (its ``client_transmissions``)."""
        self.entries["client_transmissions"] = self.entries.get("client_transmissions", 0) + int(
            transmissions
        )

    def load_ledger(self) -> None:
        """Restore its ledger from a checkpoint's entries, and the noise its run started with."""
        if self.ledger is None or not self.saved_ledger:
            return
        stds = self.ledger.load(self.saved_ledger)
        if stds:
            self.algorithm.restore_noise_std(stds[0])

    def record(self, rounds: int, entries: dict[str, Any] | None = None) -> dict[str, Any]:
        """Its run record (:func:`~pl_privfed.record.make_record`): its curves, status and
        privacy, ``rounds`` (the run's: a configuration that stopped reports the rounds it
        ran) and ``entries`` (the grid's: e.g. its seed's ``data``)."""
        report = None if self.ledger is None else self.ledger.report()
        own = {
            **privacy_entries(report),
            "algorithm": repr(self.algorithm),
            **(entries or {}),
            **self.entries,
            "grid_index": self.index,
            "grid_point": {k: json_value(v) for k, v in self.point.items()},
        }
        done = own.pop("rounds", None)  # a failed configuration's: the rounds it completed
        if done is None:
            done = rounds if self.running else int(self.algorithm.rounds_done)
        return make_record(status=self.status, rounds=done, curves=self.curves, entries=own)

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps of it."""
        entries: dict[str, Any] | None = None
        if self.ledger is not None:
            entries = {}
            self.ledger.save(entries)
        return {
            "status": self.status,
            "curves": self.curves,
            "entries": self.entries,
            "ledger": entries,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore it from :meth:`state_dict` (the ledger once it is set up)."""
        self.status = str(state["status"])
        self.curves = {
            m: [(int(r), float(v)) for r, v in pts] for m, pts in state["curves"].items()
        }
        self.entries = dict(state.get("entries") or {})
        self.saved_ledger = state.get("ledger")
        self.load_ledger()


def json_value(value: Any) -> Any:
    """``value`` as ``summary.json`` holds it: a plain value, ``None`` for a non-finite number,
    else its ``repr``."""
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    return repr(value)
