"""The points of a grid and the algorithm of each: ``{argument: [values]}`` → configurations.

The configurations of a grid are ``algorithm`` rebuilt with each point's arguments: the class's
other arguments are read back from the algorithm's attributes of the same names, and the
constructor validates the new values (a bad value is a ``ValueError`` naming the argument
before training).
"""

from __future__ import annotations

import copy
import inspect
import itertools
from typing import Any

from pl_privfed.algorithms import FederatedAlgorithm

__all__ = ["GRID_PREFIX", "grid_points", "init_parameters", "rebuild_algorithm"]

#: How the grid's parameter names appear in run ids and results (as a sweep file names them).
GRID_PREFIX = "model.algorithm.init_args."


def init_parameters(cls: type) -> dict[str, inspect.Parameter]:
    """The constructor arguments of ``cls`` that a grid may vary (positional or keyword)."""
    params = inspect.signature(cls.__init__).parameters
    return {k: p for k, p in params.items() if k != "self" and p.kind is p.POSITIONAL_OR_KEYWORD}


def grid_points(algorithm: FederatedAlgorithm, grid: Any) -> list[dict[str, Any]]:
    """All points of ``grid`` (``{parameter: [values]}``), the last parameter varying fastest
    (the order of ``pl-privfed sweep``); ``ValueError`` naming a bad parameter or value list."""
    if not isinstance(grid, dict) or not grid:
        raise ValueError(
            f"grid must be a non-empty mapping parameter -> list of values, got {grid!r}"
        )
    known = init_parameters(type(algorithm))
    for name, values in grid.items():
        if name not in known:
            raise ValueError(
                f"grid parameter {name!r} is not an argument of {type(algorithm).__name__} "
                f"(arguments: {', '.join(known)})"
            )
        if not isinstance(values, list | tuple) or not values:
            raise ValueError(f"grid[{name!r}] must be a non-empty list of values, got {values!r}")
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*grid.values())]


def rebuild_algorithm(
    algorithm: FederatedAlgorithm, overrides: dict[str, Any]
) -> FederatedAlgorithm:
    """A fresh algorithm of ``algorithm``'s class with the same arguments except ``overrides``.

    The arguments are read back from the attributes of the same names (every algorithm of the
    package keeps them); values that are objects (operators, noise settings) are deep-copied, so
    that no state is shared. The constructor validates the new values (``ValueError`` naming
    the parameter).
    """
    kwargs = {}
    for name, param in init_parameters(type(algorithm)).items():
        if name in overrides:
            kwargs[name] = overrides[name]
        elif hasattr(algorithm, name):
            kwargs[name] = copy.deepcopy(getattr(algorithm, name))
        elif param.default is not inspect.Parameter.empty:
            raise ValueError(
                f"{type(algorithm).__name__} keeps no attribute {name!r}: it cannot be rebuilt "
                "for a grid (its argument would silently fall back to the default)"
            )
        else:
            raise ValueError(f"{type(algorithm).__name__} keeps no attribute {name!r}")
    return type(algorithm)(**kwargs)
