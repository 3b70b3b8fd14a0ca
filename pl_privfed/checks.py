"""Argument checks shared by the package: each returns the value or raises a ``ValueError`` that
names the argument and the value (the project's rule for bad configuration)."""

from __future__ import annotations

import inspect
import math
from typing import Any

from pl_privfed.compat.lightning import saved_hyperparameters

__all__ = [
    "NOT_THE_RUN",
    "arguments_of",
    "check_choice",
    "check_evaluation_interval",
    "check_int",
    "check_positive",
    "check_positive_int",
    "constructor_parameters",
    "run_differences",
]


def check_positive(name: str, value: float) -> float:
    """Return ``value`` as a float, or raise ``ValueError`` naming ``name`` if not > 0 and finite."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_int(name: str, value: object) -> int:
    """Return ``value``, or raise ``ValueError`` naming ``name`` if it is not an integer (a bool
    is not one), e.g. a generator seed."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    return value


def check_positive_int(name: str, value: object) -> int:
    """Return ``value``, or raise ``ValueError`` naming ``name`` if it is not an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_evaluation_interval(trainer: Any) -> None:
    """Refuse ``trainer.val_check_interval`` ≤ 0 (Lightning accepts it and divides by it after
    the first round): ``ValueError`` naming the value and what is allowed."""
    interval = getattr(trainer, "val_check_interval", None)
    if isinstance(interval, bool) or not isinstance(interval, int | float):
        return  # a time-based interval or None: Lightning's own checks apply
    if not interval > 0:
        raise ValueError(
            f"trainer.val_check_interval must be a positive integer k (evaluate every k rounds) "
            f"or a fraction in (0, 1] of an epoch, got {interval!r}"
        )


def check_choice(name: str, value: object, choices: tuple) -> object:
    """Return ``value``, or raise ``ValueError`` naming ``name`` and the allowed ``choices``.

    >>> check_choice("mode", "b", ("a", "b"))
    'b'
    """
    if isinstance(value, bool) or value not in choices:
        *rest, last = choices
        allowed = f"{', '.join(map(repr, rest))} or {last!r}" if rest else repr(last)
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value


#: constructor arguments that say where or how fast a run computes, not what it computes: a run
#: resumed with another value of these is the same run
NOT_THE_RUN = (
    "data_dir",
    "cache",
    "cache_dir",
    "download",
    "verify_md5",
    "eval_batch_size",
    "num_workers",
    "max_test_examples",
)


def arguments_of(obj: Any, depth: int = 4) -> Any:
    """What ``obj`` was built with, as plain data: its class name and every argument of its
    constructor (:func:`constructor_parameters`: its own ``__init__`` and, through ``**kwargs``,
    its base classes'), recursively (the noise, the compressor, the partitioner, ...); lists and
    numbers as they are. The record a checkpoint keeps of its run (:func:`run_differences`).

    An argument's value is the attribute of the same name, else ``_<name>``, else the
    hyperparameter of that name a Lightning object saved (``save_hyperparameters``); an
    argument kept under none of these is not recorded. Derived from the signatures, not
    listed: a class added later, or a user's, is recorded without registering it."""
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if isinstance(obj, list | tuple):
        return [arguments_of(item, depth) for item in obj]
    if isinstance(obj, dict):
        return {str(k): arguments_of(v, depth) for k, v in obj.items()}
    kind = type(obj)
    out: dict[str, Any] = {"class": kind.__qualname__}
    if depth <= 0 or inspect.isfunction(obj) or inspect.isclass(obj):
        return out
    missing = object()
    saved = saved_hyperparameters(obj)
    for name in constructor_parameters(kind):
        if name in NOT_THE_RUN:
            continue
        value = missing
        for attribute in (name, f"_{name}"):
            try:
                value = getattr(obj, attribute)
                break
            except Exception:
                continue
        if value is missing and name in saved:
            value = saved[name]
        if value is not missing and not (inspect.ismethod(value) or inspect.isfunction(value)):
            out[name] = arguments_of(value, depth - 1)
    return out


def constructor_parameters(kind: type) -> list[str]:
    """The named arguments ``kind(...)`` accepts: those of the first ``__init__`` along its MRO
    and, while an ``__init__`` takes ``**kwargs`` (passed on to ``super().__init__``), those of
    the next one up (a subclass of ``FederatedDataModule`` adds ``data_dir``; ``num_clients``,
    ``partitioner``, ... are its base's)."""
    names: dict[str, None] = {}
    for cls in kind.__mro__:
        init = cls.__dict__.get("__init__")
        if init is None:
            continue
        try:
            parameters = inspect.signature(init).parameters
        except (TypeError, ValueError):
            break
        for name, parameter in parameters.items():
            if name != "self" and parameter.kind not in (
                parameter.VAR_POSITIONAL,
                parameter.VAR_KEYWORD,
            ):
                names.setdefault(name)
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            break
    return list(names)


def run_differences(
    saved: dict[str, Any], current: dict[str, Any], unrecorded: list[str] | None = None
) -> dict[str, tuple]:
    """``{dotted key: (saved value, current value)}`` where two run records differ. A whole
    object of another class (or one and ``None``) is one difference, named by its key.

    A key of ``current`` that ``saved`` lacks altogether, in an object of the same class, was
    not recorded when ``saved`` was written (an older version recorded less): it is no
    difference, and its dotted name is appended to ``unrecorded`` when given."""
    diffs: dict[str, tuple] = {}

    def walk(a: Any, b: Any, key: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict) and a.get("class") == b.get("class"):
            for name in [*a, *(k for k in b if k not in a)]:
                dotted = f"{key}.{name}" if key else name
                if name not in a:
                    if unrecorded is not None:
                        unrecorded.append(dotted)
                    continue
                walk(a.get(name), b.get(name), dotted)
        elif isinstance(a, dict) and isinstance(b, dict):
            diffs[key] = (a.get("class"), b.get("class"))
        elif a != b:
            short = lambda v: v.get("class") if isinstance(v, dict) else v  # noqa: E731
            diffs[key] = (short(a), short(b))

    walk(saved, current, "")
    return diffs
