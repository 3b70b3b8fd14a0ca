"""Resuming a run: what a checkpoint keeps of its run, and the check that a resume continues it.

``fit --ckpt_path`` continues a run only from a checkpoint that the same run wrote. Every
checkpoint keeps a *run record* (:func:`run_record`, under :data:`RECORD_KEY`): plain data saying
what makes the run this run. On resume, :func:`check_resume` compares the checkpoint's record
with the new run's before anything is loaded and refuses, in one line naming each difference,
unless the difference is allowed on purpose (``--resume_allow_changes``). The record is derived,
not listed: every object's constructor arguments (:func:`~pl_privfed.checks.arguments_of`,
nested objects and base classes' arguments included), plus what the run realized (the number of
clients, a fingerprint of the partition, the model's layers and parameter shapes), so a
datamodule or algorithm added later, or a user's, is covered without a list to update. The check
reads only the two records, as plain data, so it does not depend on how a record is built. An
allowed change of the client count that the checkpoint's client state cannot hold (more clients
than it has rows for) is refused too (:func:`check_client_count`).

A checkpoint that has run every round asked for leaves nothing to train
(:func:`finished_rounds`, :func:`no_rounds_left_note`). The algorithms' per-client state goes
into a checkpoint and comes back from it through :func:`save_client_state` and
:func:`load_client_state`; a module rebuilt for evaluation leaves it out
(:func:`drop_client_state`).
"""

from __future__ import annotations

import contextlib
import hashlib
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
from lightning_utilities.core.rank_zero import rank_zero_warn
from torch import nn

from pl_privfed.checks import arguments_of, run_differences
from pl_privfed.engine import SNAPSHOT_DIR_KEY
from pl_privfed.privacy import PrivacyLedger

__all__ = [
    "PARTITION_KEY",
    "RECORD_KEY",
    "check_client_count",
    "check_resume",
    "data_record",
    "drop_client_state",
    "evaluate_finished",
    "finished_rounds",
    "load_client_state",
    "no_rounds_left_note",
    "partition_fingerprint",
    "refuse_older",
    "run_record",
    "save_client_state",
    "summary_entries",
]

#: the checkpoint key of the run record
RECORD_KEY = "run_record"
#: the key of the partition fingerprint in a record's ``data`` (:func:`partition_fingerprint`)
PARTITION_KEY = "partition_fingerprint"


def run_record(
    algorithms: Iterable[tuple[str, Any]],
    datamodule: Any,
    model: nn.Module,
    criterion: nn.Module,
) -> dict[str, Any]:
    """What makes a run this run, kept in its checkpoints and compared on resume.

    Derived from the objects, not listed: each object's constructor arguments
    (:func:`~pl_privfed.checks.arguments_of`, through ``**kwargs`` to its base classes' and
    into nested objects: partitioner, sampler, noise and its placement, operator, ...), so a
    datamodule or an algorithm added later, or a user's, is covered without registering it;
    then what the run realized from them.

    Args:
        algorithms: ``(state_dict prefix, algorithm)`` of every configuration the run trains; each
            is recorded under its prefix (``"algorithm"``): its class and arguments (noise,
            compressor, seeds, ...).
        datamodule: the datamodule, or ``None``: its arguments (client count, partitioner,
            batch size, seeds, ...), the realized ``num_clients`` and ``partition_fingerprint``
            (:func:`partition_fingerprint`, once it is set up).
        model: the model: its class, arguments, layers (``layers``: each submodule's class)
            and parameter shapes.
        criterion: the loss.

    Returns:
        the record, plain data. Not the trainer's settings (more rounds are a continuation) nor
        where data and state live or how fast they are computed (``data_dir``, ``cache``,
        ``eval_batch_size``, ...).
    """
    record: dict[str, Any] = {
        prefix.rstrip("."): arguments_of(algorithm) for prefix, algorithm in algorithms
    }
    record["data"] = data_record(datamodule) if datamodule is not None else None
    record["model"] = {
        **arguments_of(model),
        "layers": {n: type(m).__qualname__ for n, m in model.named_modules() if n},
        "parameters": {n: list(p.shape) for n, p in model.named_parameters()},
    }
    record["criterion"] = arguments_of(criterion)
    return record


def data_record(datamodule: Any) -> dict[str, Any]:
    """A datamodule's part of :func:`run_record`: its arguments, the number of clients it
    realized (its ``num_clients``, which sizes the client state) and its
    :func:`partition_fingerprint` when it has a partition."""
    record = arguments_of(datamodule)
    num_clients = getattr(datamodule, "num_clients", None)
    if isinstance(num_clients, int):
        record["num_clients"] = num_clients
    fingerprint = partition_fingerprint(datamodule)
    if fingerprint is not None:
        record[PARTITION_KEY] = fingerprint
    return record


def partition_fingerprint(datamodule: Any) -> str | None:
    """The first 16 hex digits of the SHA-256 of the partition a datamodule realized: every
    client's training indices in order (``shards``), else its shard sizes
    (``client_sizes``); ``None`` before set-up or without either. It catches a changed
    federation whatever changed it (an argument kept under another name, another data file)."""
    shards = getattr(datamodule, "shards", None)
    if shards is None or len(shards) == 0:
        shards = getattr(datamodule, "client_sizes", None)
        if shards is None or len(shards) == 0:
            return None
        shards = [shards]
    try:  # every checkpoint asks: hash a partition once (a million clients take seconds)
        known, fingerprint = _FINGERPRINTS.get(datamodule, (None, None))
    except TypeError:  # not weakly referenceable
        known = fingerprint = None
    if known is not shards:
        parts = [np.asarray(shard, dtype=np.int64).reshape(-1) for shard in shards]
        digest = hashlib.sha256(np.array([len(p) for p in parts], dtype="<i8").tobytes())
        digest.update(np.concatenate(parts).astype("<i8", copy=False).tobytes())
        fingerprint = digest.hexdigest()[:16]
        with contextlib.suppress(TypeError):
            _FINGERPRINTS[datamodule] = (shards, fingerprint)
    return fingerprint


#: each datamodule's partition (its ``shards`` object) and that partition's fingerprint
_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def check_resume(
    checkpoint: dict[str, Any],
    record: dict[str, Any],
    *,
    allow_changes: Iterable[str] = (),
    private: bool = False,
    ckpt_path: str | None = None,
) -> dict[str, Any] | None:
    """Refuse to resume a checkpoint written by another run, before anything is loaded.

    Args:
        checkpoint: the Lightning checkpoint (its :data:`RECORD_KEY`).
        record: this run's :func:`run_record`.
        allow_changes: record keys (or prefixes, e.g. ``"algorithm.noise"``) that may differ,
            or that the checkpoint's record lacks (written when fewer were recorded).
        private: whether this run is private: a checkpoint whose rounds ran without noise
            cannot be continued (its models were released as they were: no ε covers them).
        ckpt_path: the checkpoint's file, named by the refusals.

    Returns:
        the accepted differences, ``{key: {"checkpoint": value, "this_run": value}}``, or
        ``None`` when there are none.

    Raises:
        ValueError: naming every difference that is not allowed, the non-private rounds, or
            what a checkpoint of an older version lacks (:func:`refuse_older`).
    """
    allowed = tuple(allow_changes)
    _check_allowed_names(allowed, checkpoint.get(RECORD_KEY), record)
    diffs = _differences(checkpoint, record, allowed, ckpt_path, private)
    refused = {k: v for k, v in diffs.items() if not _allowed(k, allowed)}
    if refused:
        listed = "; ".join(
            f"{k}: checkpoint {a!r}, this run {b!r}" for k, (a, b) in refused.items()
        )
        raise ValueError(
            f"ckpt_path was written by a different run ({listed}): resume with the "
            "checkpoint's configuration, or allow an intended change with "
            f"--resume_allow_changes {','.join(refused)}"
        )
    rounds = int(checkpoint.get("global_step", 0))
    if private and rounds > 0 and not PrivacyLedger.in_checkpoint(checkpoint):
        raise ValueError(
            f"ckpt_path holds {rounds} rounds trained without noise (not private): a private "
            "run cannot continue them, since their models were released without noise and "
            "no epsilon covers them; start the private run from scratch"
        )
    return {k: {"checkpoint": a, "this_run": b} for k, (a, b) in diffs.items()} if diffs else None


def _keys(record: Any, key: str = "") -> Iterable[str]:
    """Every dotted key of a run record (objects and their arguments, nested)."""
    if key:
        yield key
    if isinstance(record, dict):
        for name, value in record.items():
            if name != "class":
                yield from _keys(value, f"{key}.{name}" if key else name)


def _check_allowed_names(allowed: tuple[str, ...], saved: Any, record: dict[str, Any]) -> None:
    """Refuse a ``--resume_allow_changes`` name that is no setting of the run: one that is no
    key of either record (nor a key's prefix), e.g. a misspelt one, which before was accepted
    and allowed nothing.

    Raises:
        ValueError: naming the names and the record's top-level settings.
    """
    keys = {*_keys(saved), *_keys(record)}
    unknown = [a for a in allowed if a not in keys]
    if unknown:
        tops = sorted({k.split(".")[0] for k in keys})
        raise ValueError(
            f"--resume_allow_changes {','.join(unknown)}: not a setting of this run (a dotted "
            f"key of its record, under {', '.join(tops)}; e.g. algorithm.step_size)"
        )


def _allowed(key: str, allowed: tuple[str, ...]) -> bool:
    return any(key == a or key.startswith(a + ".") for a in allowed)


def refuse_older(ckpt_path: str | None, lacks: str, allow: list[str] | None = None) -> None:
    """Refuse, in one line naming the file and what to do, a checkpoint written by an older
    version of the package that lacks ``lacks``. With ``allow`` (record keys the older version
    did not record) the way on is ``--resume_allow_changes``; without, a new run (the model's
    weights stay readable from the file)."""
    where = f"ckpt_path {str(ckpt_path)!r}" if ckpt_path else "the checkpoint"
    if allow:
        what = (
            f"resume with --resume_allow_changes {','.join(allow)} if this run's values of "
            "them are the checkpoint's, or start the run again"
        )
    else:
        what = (
            "this version cannot check or continue it: start the run again (its model's "
            "weights stay readable: torch.load(path, weights_only=False)['state_dict'])"
        )
    raise ValueError(f"{where} was written by an older pl-privfed that {lacks}; {what}")


def _differences(
    checkpoint: dict[str, Any],
    record: dict[str, Any],
    allowed: tuple[str, ...],
    ckpt_path: str | None,
    private: bool,
) -> dict[str, tuple]:
    """:func:`~pl_privfed.checks.run_differences` of the checkpoint's record and ``record``;
    a checkpoint of an older version refused (:func:`refuse_older`): one without a record, a
    private one whose ledger lacks a part (:meth:`~pl_privfed.privacy.PrivacyLedger.missing`),
    one whose record lacks keys that are not allowed.

    The partition fingerprint is what the data's arguments realized: its difference is
    implied by (and allowed with) any other difference of ``data``, and is named on its own
    only when no argument differs (a federation changed by something the arguments do not
    show)."""
    saved = checkpoint.get(RECORD_KEY)
    if saved is None:
        refuse_older(ckpt_path, "kept no record of its run")
    missing = PrivacyLedger.missing(checkpoint) if private else []
    if missing:
        refuse_older(ckpt_path, f"kept no {', '.join(missing)} in its privacy ledger")
    unrecorded: list[str] = []
    diffs = run_differences(saved, record, unrecorded)
    fingerprint = f"data.{PARTITION_KEY}"
    if fingerprint in diffs and any(k.startswith("data.") and k != fingerprint for k in diffs):
        del diffs[fingerprint]
    unrecorded = [key for key in unrecorded if not _allowed(key, allowed)]
    if unrecorded:
        refuse_older(ckpt_path, f"did not record {', '.join(unrecorded)}", allow=unrecorded)
    return diffs


def check_client_count(checkpoint: dict[str, Any], algorithms: Iterable[tuple[str, Any]]) -> None:
    """Refuse, before anything is loaded, a run with more clients than the checkpoint's
    per-client state has rows for (a ``data.num_clients`` change allowed with
    ``--resume_allow_changes``): the added clients have no state to continue from. Fewer
    clients resume with the first clients' rows. Every process decides alike (from the
    checkpoint's record), so none is left waiting.

    Raises:
        ValueError: naming both client counts and the tables.
    """
    saved = ((checkpoint.get(RECORD_KEY) or {}).get("data") or {}).get("num_clients")
    if not isinstance(saved, int):
        return  # no client count recorded (no datamodule, or one without num_clients)
    for prefix, algorithm in algorithms:
        state = getattr(algorithm, "state", None)
        names = list(getattr(state, "names", ()))
        clients = getattr(getattr(state, "shard", None), "num_clients", saved)
        if names and clients > saved:
            raise ValueError(
                f"data.num_clients: checkpoint {saved}, this run {clients}, but the checkpoint's "
                f"client state ({', '.join(prefix + n for n in names)}) holds rows for {saved} "
                f"clients only: clients {saved} to {clients - 1} have no state to resume from; "
                f"resume with data.num_clients <= {saved} or start the run from scratch"
            )


def finished_rounds(checkpoint: dict[str, Any], num_rounds: int) -> tuple[int, int] | None:
    """``(checkpoint's rounds, run's rounds)`` when the checkpoint has run all ``num_rounds``
    rounds the run asks for (nothing left to train), else ``None``."""
    saved = int(checkpoint.get("global_step", 0))
    return (saved, num_rounds) if num_rounds and saved >= num_rounds else None


def no_rounds_left_note(saved: int, rounds: int, tested: bool) -> str:
    """The warning (and ``summary.json``'s ``no_rounds_left``) of a resume with no rounds left;
    ``tested``: whether the checkpoint's model is evaluated on the test set."""
    note = (
        f"the checkpoint is at round {saved} and the run has {rounds} rounds: no rounds left "
        "to train (raise trainer.max_steps to train on)"
    )
    return note + ("; its model is evaluated on the test set" if tested else "")


def evaluate_finished(
    evaluate: Callable[..., dict[str, Any] | None],
    saved: int,
    rounds: int,
    validated_round: int | None,
    *,
    validate: bool,
    test: bool,
) -> tuple[str, dict[str, Any] | None, dict[str, Any] | None]:
    """A resume with no rounds left: warn (:func:`no_rounds_left_note`) and evaluate the
    checkpoint's model as an ordinary fit ends, so that ``summary.json`` reports the final
    round's values. A checkpoint saved on the last round before that round's validation (e.g.
    ``every_n_train_steps``) remembers an earlier validation as the last one: the validation
    split is evaluated again then (before, such a resume reported an earlier round's
    validation accuracy as final).

    Args:
        evaluate: ``evaluate(round, split="val"|"test")``: the split's result for the model as
            it is, logged at ``round`` (``{"round", "loss", "accuracy"}`` or ``None``).
        saved: the checkpoint's rounds.
        rounds: the run's rounds.
        validated_round: the round of the checkpoint's last validation.
        validate: whether the validation split is evaluated (when not evaluated at ``saved``).
        test: whether the test set is.

    Returns:
        ``(note, validation result, test result)``; a result is ``None`` when not evaluated.
    """
    note = no_rounds_left_note(saved, rounds, test)
    rank_zero_warn(note)
    val = evaluate(saved, split="val") if validate and validated_round != saved else None
    return note, val, evaluate(saved) if test else None


def summary_entries(
    no_rounds_left: str | None, allow_changes: Iterable[str], changes: dict[str, Any] | None
) -> dict[str, Any]:
    """A resumed run's ``summary.json`` entries: ``no_rounds_left`` (its note, when the
    checkpoint had run every round), ``resume_allow_changes`` and ``resumed_with_changes`` (what
    :func:`check_resume` accepted) when changes were allowed."""
    entries: dict[str, Any] = {}
    if no_rounds_left is not None:
        entries["no_rounds_left"] = no_rounds_left
    if allow_changes:
        entries["resume_allow_changes"] = list(allow_changes)
        entries["resumed_with_changes"] = changes
    return entries


def save_client_state(
    checkpoint: dict[str, Any], algorithms: Iterable[tuple[str, Any]], round_index: int
) -> None:
    """Every algorithm's per-client state into ``checkpoint`` under its ``state_dict`` prefix
    (gathered over processes; disk-backed state as a snapshot of round ``round_index``)."""
    for prefix, algorithm in algorithms:
        algorithm.state.save(checkpoint, prefix, round_index)
    checkpoint.pop(SNAPSHOT_DIR_KEY, None)  # a path of this machine: not the checkpoint's


def load_client_state(
    checkpoint: dict[str, Any], algorithms: Iterable[tuple[str, Any]], ckpt_path: str | None
) -> None:
    """Every algorithm's per-client state from ``checkpoint`` (set-up algorithms: their state
    tables exist); disk snapshots are found beside ``ckpt_path``."""
    algorithms = list(algorithms)
    check_client_count(checkpoint, algorithms)
    base = str(Path(ckpt_path).parent) if ckpt_path else None  # snapshots beside it
    for prefix, algorithm in algorithms:
        algorithm.state.load(checkpoint, prefix, base)


def drop_client_state(
    checkpoint: dict[str, Any], own_keys: Iterable[str], prefixes: Iterable[str]
) -> None:
    """Leave the per-client state tables (keys under ``prefixes`` that the module, whose
    ``state_dict`` keys are ``own_keys``, does not have) out of ``checkpoint["state_dict"]``,
    for a module that is not set up (they are allocated at setup, for the datamodule's
    clients), so that ``FederatedModule.load_from_checkpoint(path)`` loads the model strictly;
    training on from the checkpoint is ``trainer.fit(module, datamodule, ckpt_path=path)``."""
    own, prefixes = set(own_keys), tuple(prefixes)
    state = checkpoint.get("state_dict", {})
    for key in [k for k in state if k not in own and k.startswith(prefixes)]:
        del state[key]
