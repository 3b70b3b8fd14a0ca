"""The points of a grid and the algorithm of each: ``{argument: [values]}`` → configurations.

The configurations of a grid are ``algorithm`` rebuilt with each point's arguments: the class's
other arguments are read back from the algorithm's attributes of the same names, and the
constructor validates the new values (a bad value is a ``ValueError`` naming the argument
before training).

A grid is ``{argument: [values]}`` (every combination) or a list of points
``[{argument: value}, ...]`` (exactly those: what a batched ``pl-privfed sweep`` passes for the
points of a group it has not finished yet). An argument may name a field of an argument that is a
dataclass, ``noise.epsilon``: the configuration's ``noise`` is the algorithm's with that field
replaced (``dataclasses.replace``, which validates it), so points may differ in their target ε.
``"--seed"`` is the run's seed (:mod:`pl_privfed.grid.seeds`): a point with ``"--seed": s`` is
the configuration its separate run with ``pl-privfed fit --seed s`` trains (its algorithm's seed
arguments here; its initial model and data in :class:`~pl_privfed.grid.GridModule`).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import itertools
from typing import Any

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.grid.seeds import RUN_SEED, seed_overrides

__all__ = [
    "GRID_PREFIX",
    "grid_points",
    "init_parameters",
    "rebuild_algorithm",
    "rebuilt",
    "sweep_name",
]

#: How the grid's parameter names appear in run ids and results (as a sweep file names them).
GRID_PREFIX = "model.algorithm.init_args."


def sweep_name(parameter: str, algorithm: Any = None) -> str:
    """A grid parameter as a sweep file names it: ``model.algorithm.init_args.step_size``,
    ``seed`` for the run's seed (``"--seed"``), ``...init_args.noise.epsilon`` for a field of
    settings (a dataclass) and ``...init_args.operator.init_args.threshold`` for an argument of
    an object the config builds from ``class_path`` / ``init_args`` (``algorithm``'s value of
    the parameter's first part says which)."""
    if parameter == RUN_SEED:
        return "seed"
    name, _, field = parameter.partition(".")
    base = getattr(algorithm, name, None)
    if field and base is not None and not dataclasses.is_dataclass(base):
        return f"{GRID_PREFIX}{name}.init_args.{field}"
    return GRID_PREFIX + parameter


def init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The constructor arguments of ``cls`` that a grid may vary (positional or keyword)."""
    params = inspect.signature(cls.__init__).parameters
    return {k: p for k, p in params.items() if k != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}


def grid_points(algorithm: FederatedAlgorithm, grid: Any) -> list[dict[str, Any]]:
    """All points of ``grid``: of ``{parameter: [values]}`` every combination, the last
    parameter varying fastest (the order of ``pl-privfed sweep``); of a list of points
    ``[{parameter: value}, ...]`` (all with the same parameters) those points, in order.
    ``ValueError`` naming a bad parameter or value list."""
    if isinstance(grid, list | tuple):
        if not grid or not all(isinstance(p, dict) and p for p in grid):
            raise ValueError(
                f"a grid given as points must be a non-empty list of non-empty mappings "
                f"parameter -> value, got {grid!r}"
            )
        keys = list(grid[0])
        for point in grid:
            if sorted(point) != sorted(keys):
                raise ValueError(
                    f"grid point {point!r} has other parameters than the first point's {keys}: "
                    "every point of a grid sets the same parameters"
                )
            _check_names(algorithm, point)
        return [{k: point[k] for k in keys} for point in grid]
    if not isinstance(grid, dict) or not grid:
        raise ValueError(
            f"grid must be a non-empty mapping parameter -> list of values, got {grid!r}"
        )
    _check_names(algorithm, grid)
    for name, values in grid.items():
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(f"grid[{name!r}] must be a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def _check_names(algorithm: FederatedAlgorithm, names: Any) -> None:
    """``ValueError`` naming a grid parameter that is not an argument of the algorithm's class
    (``noise.epsilon``: its first part)."""
    known = init_parameters(type(algorithm))
    for name in names:
        if name == RUN_SEED:
            continue
        if not isinstance(name, str) or name.split(".", 1)[0] not in known:
            raise ValueError(
                f"grid parameter {name!r} is not an argument of {type(algorithm).__name__} "
                f"(arguments: {', '.join(known)})"
            )


def _nested(algorithm: FederatedAlgorithm, overrides: dict[str, Any]) -> dict[str, Any]:
    """``overrides`` with ``argument.field`` entries folded into their argument: the
    algorithm's (or the point's own) value with those fields replaced: a dataclass
    (``noise.epsilon``) by ``dataclasses.replace``, an object (``operator.threshold``) rebuilt
    by its class from its other arguments read back from its attributes (:func:`rebuilt`)."""
    plain = {k: v for k, v in overrides.items() if "." not in k}
    fields: dict[str, dict[str, Any]] = {}
    for key, value in overrides.items():
        if "." in key:
            name, field = key.split(".", 1)
            fields.setdefault(name, {})[field] = value
    for name, changes in fields.items():
        base = plain.get(name, getattr(algorithm, name, None))
        if base is None or isinstance(base, type | bool | int | float | str | list | tuple | dict):
            raise ValueError(
                f"grid parameters {sorted(f'{name}.{f}' for f in changes)}: "
                f"{type(algorithm).__name__}'s {name} is {base!r}, not settings or an object "
                f"with arguments (give {name} itself, or give the algorithm a {name})"
            )
        if not dataclasses.is_dataclass(base):
            plain[name] = rebuilt(base, changes, name)
            continue
        known = {f.name for f in dataclasses.fields(base)}
        for field in changes:
            if field not in known:
                raise ValueError(
                    f"grid parameter {name}.{field!r}: {type(base).__name__} has no field "
                    f"{field!r} (fields: {', '.join(sorted(known))})"
                )
        plain[name] = dataclasses.replace(copy.deepcopy(base), **changes)
    return plain


def rebuilt(obj: Any, changes: dict[str, Any], what: str) -> Any:
    """A fresh ``type(obj)`` with the same constructor arguments except ``changes``: the
    others read back from the attributes of the same names (deep-copied, so no state is
    shared); the constructor validates the new values. ``ValueError`` naming ``what`` for an
    argument the class does not have or an attribute it does not keep (its argument would
    silently fall back to the default)."""
    params = init_parameters(type(obj))
    for field in changes:
        if field not in params:
            raise ValueError(
                f"grid parameter {what}.{field!r}: {type(obj).__name__} has no argument "
                f"{field!r} (arguments: {', '.join(params) or 'none'})"
            )
    kwargs = _arguments(obj, changes, f"the grid parameter {what}.{next(iter(changes))}")
    return type(obj)(**kwargs)


def _arguments(obj: Any, changes: dict[str, Any], purpose: str) -> dict[str, Any]:
    """``type(obj)``'s constructor arguments: ``changes``, and the others read back from the
    attributes of the same names, deep-copied (no state shared). ``ValueError`` for an
    argument ``obj`` keeps no attribute for (it would silently fall back to its default)."""
    kwargs = {}
    for name, param in init_parameters(type(obj)).items():
        if name in changes:
            kwargs[name] = changes[name]
        elif hasattr(obj, name):
            kwargs[name] = copy.deepcopy(getattr(obj, name))
        else:
            fallback = param.default is not inspect.Parameter.empty
            why = " (its argument would silently fall back to the default)" if fallback else ""
            raise ValueError(
                f"{type(obj).__name__} keeps no attribute {name!r}: it cannot be rebuilt for "
                f"{purpose}{why}"
            )
    return kwargs


def rebuild_algorithm(
    algorithm: FederatedAlgorithm, overrides: dict[str, Any]
) -> FederatedAlgorithm:
    """A fresh algorithm of ``algorithm``'s class with the same arguments except ``overrides``.

    The arguments are read back from the attributes of the same names (every algorithm of the
    package keeps them); values that are objects (operators, noise settings) are deep-copied, so
    that no state is shared. The constructor validates the new values (``ValueError`` naming
    the parameter). ``noise.epsilon`` replaces one field of the algorithm's ``noise``;
    ``"--seed"`` sets every seed argument of the algorithm and of its objects
    (:func:`~pl_privfed.grid.seeds.seed_overrides`), what ``pl-privfed fit --seed`` sets.
    """
    overrides = dict(overrides)
    if RUN_SEED in overrides:
        overrides = {**seed_overrides(algorithm, overrides.pop(RUN_SEED)), **overrides}
    overrides = _nested(algorithm, overrides)
    kwargs = _arguments(algorithm, overrides, "a grid")
    return type(algorithm)(**kwargs)
