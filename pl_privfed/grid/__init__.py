"""A grid of hyperparameter configurations trained as one batched federation.

* :mod:`~pl_privfed.grid.module` — :class:`GridModule`, the LightningModule of a grid (a
  :class:`~pl_privfed.FederatedModule` with a configuration axis beside the client axis);
* :mod:`~pl_privfed.grid.points` — the grid's points and each point's algorithm;
* :mod:`~pl_privfed.grid.seeds` — the run's seed as a grid parameter (``"--seed"``): each
  point's algorithm seeds and initial model; :mod:`~pl_privfed.grid.views` — each seed's data;
* :mod:`~pl_privfed.grid.results` — the results, written like a ``pl-privfed sweep``.

:func:`federation` is what ``pl-privfed fit`` builds from a config's ``model:`` section: a
:class:`GridModule` when ``grid:`` is given, else a :class:`~pl_privfed.FederatedModule`.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.grid.module import GridModule
from pl_privfed.grid.points import GRID_PREFIX, grid_points, rebuild_algorithm
from pl_privfed.grid.results import write_grid_results
from pl_privfed.module import FederatedModule

__all__ = [
    "GRID_PREFIX",
    "GridModule",
    "federation",
    "grid_points",
    "rebuild_algorithm",
    "write_grid_results",
]


def federation(
    model: nn.Module,
    algorithm: FederatedAlgorithm,
    grid: dict[str, list[Any]] | list[dict[str, Any]] | None = None,
    grid_dir: str | None = None,
    grid_chunk: int | None = None,
    grid_memory: str | None = None,
    **kwargs: Any,
) -> FederatedModule:
    """A federation from a config's ``model:`` section: :class:`~pl_privfed.FederatedModule`'s
    arguments, and ``grid`` for a grid of configurations of the algorithm (then a
    :class:`GridModule`, see there for ``grid_dir`` and ``grid_chunk``).

    Args:
        model: the global model.
        algorithm: the federated algorithm.
        grid: ``{argument: [values]}`` of the algorithm (every combination), a list of points
            ``[{argument: value}, ...]``, or ``None`` for a single run.
        grid_dir: where a grid's ``results.csv`` and ``runs/<id>/`` go (default
            ``<log dir>/grid``).
        grid_chunk: a grid's gradients for at most this many configurations per oracle call.
        grid_memory: where a grid's configurations go whose client state does not fit in
            memory beside the others' (``"disk"``, the default, or ``"refuse"``; see
            :class:`GridModule`).
    """
    if grid is None:
        if grid_dir is not None or grid_chunk is not None or grid_memory is not None:
            named = (
                ("grid_dir", grid_dir),
                ("grid_chunk", grid_chunk),
                ("grid_memory", grid_memory),
            )
            given = next(n for n, v in named if v is not None)
            raise ValueError(f"{given} is set but grid is not: give model.grid or drop {given}")
        return FederatedModule(model, algorithm, **kwargs)
    return GridModule(
        model,
        algorithm,
        grid=grid,
        grid_dir=grid_dir,
        grid_chunk=grid_chunk,
        grid_memory=grid_memory or "disk",
        **kwargs,
    )
