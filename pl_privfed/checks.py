"""Argument checks shared by the package: each returns the value or raises a ``ValueError`` that
names the argument and the value (the project's rule for bad configuration)."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "check_choice",
    "check_evaluation_interval",
    "check_int",
    "check_positive",
    "check_positive_int",
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
        allowed = ", ".join(repr(c) for c in choices[:-1]) + f" or {choices[-1]!r}"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return value
