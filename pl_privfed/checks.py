"""Argument checks shared by the package: each returns the value or raises a ``ValueError`` that
names the argument and the value (the project's rule for bad configuration)."""

from __future__ import annotations

import math
from typing import Any

__all__ = [
    "check_evaluation_interval",
    "check_int",
    "check_positive",
    "check_positive_int",
    "check_strategy",
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


def check_strategy(trainer: Any) -> None:
    """Refuse a ``Trainer`` strategy that does not shard clients over processes (FSDP,
    DeepSpeed, model parallelism): ``ValueError`` naming it (one device, and Lightning's DDP
    over CPUs or GPUs and nodes, are supported: :mod:`pl_privfed.engine.distributed`)."""
    from pl_privfed.engine.distributed import check_strategy as check

    check(getattr(trainer, "strategy", None))


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
