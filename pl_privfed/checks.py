"""Argument checks shared by the package: each returns the value or raises a ``ValueError`` that
names the argument and the value (the project's rule for bad configuration)."""

from __future__ import annotations

import math

__all__ = ["check_int", "check_positive", "check_positive_int"]


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
