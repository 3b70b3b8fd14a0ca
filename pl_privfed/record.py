"""The run record: what a run reports, declared once.

Every run of the package ends in one record, whether it trained alone (``pl-privfed fit``), as
a configuration of a grid (:class:`~pl_privfed.grid.GridModule`) or as a point of a batched
sweep (``pl-privfed sweep --batch``). Its fields are :data:`FIELDS`, declared here and nowhere
else; :func:`make_record` is the one function that produces a record, and everything that
writes or reads a run's results derives from the declaration:

* ``summary.json`` is the record followed by the run's other entries (what its callbacks add:
  communication totals, operator averages, the resolved config, ...);
* ``results.csv`` has a column for every field declared ``column=True``
  (:func:`result_columns`);
* a W&B run's summary holds the fields declared ``wandb=True`` (:func:`wandb_summary`);
* a batched point's record is built from its configuration's and its group's by each field's
  ``scope`` (:func:`point_entries`), never by copying whatever the group's summary holds.

A field takes its value from the run's *curves* (``{metric: [(round, value), ...]}``) when it
reads one (``curve`` and ``pick``) and the run has that curve, else from the run's entry of the
same name, else ``None``. Adding a field here puts it in all of the above.

This module is the lowest floor: it imports nothing of ``pl_privfed``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "FIELDS",
    "Field",
    "field_names",
    "make_record",
    "markdown_table",
    "point_entries",
    "privacy_entries",
    "result_columns",
    "wandb_summary",
]

#: how a field reads a curve: its last value (``final``), the round of that value
#: (``final_round``), its largest or smallest value (``max``, ``min``) or the round of its
#: largest (``max_round``, the first such round)
Pick = Literal["final", "final_round", "max", "max_round", "min"]
#: ``run``: each run and each grid configuration has its own value (a batched point takes its
#: configuration's, ``None`` when it has none); ``group``: the same for every configuration of
#: a batched group (a point takes its configuration's where it has one, e.g. another seed's
#: ``data``, else the group's); ``grid``: describes a grid run as a whole (a point has none)
Scope = Literal["run", "group", "grid"]


@dataclass(frozen=True)
class Field:
    """One field of the run record.

    Attributes:
        name: its key in ``summary.json`` (and column of ``results.csv``, W&B summary key).
        doc: what it holds.
        curve: the metric (or metrics, the first the run has) whose curve it reads.
        pick: how it reads the curve (:data:`Pick`).
        column: whether ``results.csv`` has a column for it.
        wandb: whether a W&B run's summary holds it.
        scope: who has it in a batched group (:data:`Scope`).
    """

    name: str
    doc: str
    curve: str | tuple[str, ...] | None = None
    pick: Pick = "final"
    column: bool = False
    wandb: bool = True
    scope: Scope = "run"

    def read(self, curves: Mapping[str, Sequence[tuple[int, float]]]) -> tuple[bool, Any]:
        """``(True, value)`` when the run has the field's curve, else ``(False, None)``."""
        names = (self.curve,) if isinstance(self.curve, str) else self.curve or ()
        points = next((curves[n] for n in names if curves.get(n)), None)
        if not points:
            return False, None
        points = sorted((int(r), float(v)) for r, v in points)
        if self.pick in ("max", "max_round"):
            best = max(points, key=lambda p: p[1])  # the first round of the largest value
            return True, best[1] if self.pick == "max" else best[0]
        if self.pick == "min":
            return True, min(v for _, v in points)
        last = points[-1]
        return True, last[1] if self.pick == "final" else last[0]


#: The run record's fields, in ``summary.json``'s order; those with ``column=True`` are the
#: result columns of ``results.csv`` in this order.
FIELDS: tuple[Field, ...] = (
    Field("status", "finished, failed: <why>, interrupted: <signal> ..., running"),
    Field("final_val_accuracy", "the last validation's accuracy (the final model's)",
          curve="val/acc", column=True),
    Field("best_val_accuracy", "the highest validation accuracy (a best-of value)",
          curve="val/acc", pick="max", column=True),
    Field("best_val_round", "the round of the highest validation accuracy",
          curve="val/acc", pick="max_round", column=True),
    Field("final_test_accuracy", "the final model's test accuracy", curve="test/acc",
          column=True),
    Field("final_val_loss", "the last validation's loss", curve="val/loss", column=True),
    Field("final_train_loss", "the last round's training loss", curve="train/loss",
          column=True),
    Field("epsilon", "the certified ε against the headline adversary", column=True),
    Field("rounds", "the rounds the run completed", column=True),
    Field("wall_time_s", "the fit's wall time (a batched point: its share of its group's)",
          column=True),
    Field("rounds_to_target", "the first round the full gradient norm reached its target",
          column=True),
    Field("final_full_grad_norm", "the last full gradient norm measured",
          curve="train/full_grad_norm", column=True),
    Field("client_transmissions", "client-to-server messages sent in all (k · p · M)",
          column=True),
    Field("final_val_round", "the round of the last validation",
          curve=("val/loss", "val/acc"), pick="final_round"),
    Field("final_test_loss", "the final model's test loss", curve="test/loss"),
    Field("final_test_round", "the round the test set was evaluated at",
          curve=("test/loss", "test/acc"), pick="final_round"),
    Field("private", "whether the run added noise that an ε certifies"),
    Field("epsilon_paper_convention", "ε under the papers' convention, labelled as such"),
    Field("delta", "the δ of the certified ε"),
    Field("privacy", "the privacy report: ε and δ per adversary, unit, mechanism, audit",
          wandb=False),
    Field("error", "a failed run's typed failure: its exception's record() (e.g. "
          "{type: grid_memory_refused, fit: n}), else {type: <exception class>}", wandb=False,
          scope="grid"),
    Field("stopped_by", "the callbacks that stopped the run before its last round"),
    Field("stopped_reason", "why they stopped it"),
    Field("algorithm", "the algorithm with its arguments (its repr)"),
    Field("epochs", "Lightning's epoch counter at the end", scope="group"),
    Field("data", "the federation: clients, shard sizes, split", wandb=False, scope="group"),
    Field("seeds", "every seed the run used, by where it was set", wandb=False,
          scope="group"),
    Field("config", "the resolved configuration", wandb=False, scope="group"),
    Field("grid", "a grid run's configurations and its results.csv", wandb=False,
          scope="grid"),
    Field("val_accuracy_metric", "the logged metric read as the validation accuracy, when "
          "not val/acc", scope="grid"),
    Field("train_loss_metric", "the logged metric read as the training loss, when not "
          "train/loss", scope="grid"),
)  # fmt: skip


def field_names() -> list[str]:
    """The record's field names, in order."""
    return [f.name for f in FIELDS]


def result_columns() -> tuple[str, ...]:
    """The columns of ``results.csv`` that hold a run's results (after its parameters)."""
    return tuple(f.name for f in FIELDS if f.column)


def make_record(
    *,
    status: str,
    rounds: int | None,
    curves: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    entries: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A run's record: every field of :data:`FIELDS` in order (from the run's ``curves``
    where the field reads one the run has, else from ``entries``, else ``None``), followed by
    the run's other ``entries`` in their order.

    >>> r = make_record(status="finished", rounds=3, curves={"val/acc": [(1, 0.5), (3, 0.4)]})
    >>> r["final_val_accuracy"], r["best_val_accuracy"], r["best_val_round"], r["rounds"]
    (0.4, 0.5, 1, 3)
    """
    curves, entries = curves or {}, dict(entries or {})
    entries.update(status=status, rounds=rounds)
    record: dict[str, Any] = {}
    for field in FIELDS:
        found, value = field.read(curves) if field.curve is not None else (False, None)
        record[field.name] = value if found else entries.get(field.name)
    record.update((k, v) for k, v in entries.items() if k not in record)
    return record


def privacy_entries(
    report: Mapping[str, Any] | None, budget: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The record's privacy fields from a privacy ledger's ``report`` (``None``: the run adds
    no noise the ledger accounts) or, without one, a privacy-budget callback's entry
    (``epsilon_spent`` and ``delta``, unless it says ``private: false``)."""
    if report is not None:
        return {
            "private": True,
            "epsilon": report.get("epsilon"),
            "epsilon_paper_convention": report.get("epsilon_paper_convention"),
            "delta": report.get("delta"),
            "privacy": dict(report),
        }
    if isinstance(budget, Mapping) and budget.get("private", True) is not False:
        return {
            "private": True,
            "epsilon": budget.get("epsilon_spent"),
            "delta": budget.get("delta"),
        }
    return {"private": False}


def point_entries(
    group: Mapping[str, Any], own: Mapping[str, Any]
) -> tuple[dict[str, Any], list[str]]:
    """A batched point's entries, from its group's ``summary.json`` (``group``) and its grid
    configuration's (``own``), field by field by :attr:`Field.scope`; and the group's entries
    that no field declares (a callback's, e.g. ``operator_means``: the group's first
    configuration's, not the point's), which the point has as ``None`` and which are returned
    to be named."""
    entries: dict[str, Any] = {}
    for field in FIELDS:
        if field.scope == "run":
            entries[field.name] = own.get(field.name)
        elif field.scope == "group":
            mine = own.get(field.name)
            entries[field.name] = mine if mine is not None else group.get(field.name)
    declared = set(field_names())
    undeclared = [key for key in group if key not in declared]
    entries.update((key, None) for key in undeclared)
    return entries, undeclared


def wandb_summary(record: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``record`` that go into a W&B run's summary: those declared ``wandb``,
    with a value (a non-finite number is left out)."""
    out = {}
    for field in FIELDS:
        value = record.get(field.name)
        if not field.wandb or value is None:
            continue
        if isinstance(value, float) and not math.isfinite(value):
            continue
        out[field.name] = value
    return out


#: how :func:`markdown_table` says where a batched point's field comes from
_POINT_TAKES = {
    "run": "its configuration's",
    "group": "the group's (its configuration's where it has one)",
    "grid": "none (the group's own)",
}


def markdown_table() -> str:
    """The declaration as the table of ``docs/run_record.md``."""
    rows = [
        "| field | what it holds | read from | `results.csv` | W&B summary | in a batched point |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for f in FIELDS:
        names = (f.curve,) if isinstance(f.curve, str) else f.curve or ()
        source = f"curve `{'` or `'.join(names)}` ({f.pick})" if names else "the run"
        column, wandb = "yes" if f.column else "", "yes" if f.wandb else ""
        rows.append(
            f"| `{f.name}` | {f.doc} | {source} | {column} | {wandb} | {_POINT_TAKES[f.scope]} |"
        )
    return "\n".join(rows) + "\n"
