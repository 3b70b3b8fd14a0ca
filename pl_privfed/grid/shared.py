"""A grid round's shared gradient computations (:class:`GridBatch`) and each configuration's
oracle in it (:class:`GridConfigOracle`), for :class:`~pl_privfed.grid.GridModule`."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from pl_privfed.engine import ChunkOracle, OracleOutput
from pl_privfed.grads import RoundOracle

__all__ = ["GridBatch", "GridConfigOracle"]


class GridBatch:
    """A grid round's shared gradient computations: for a chunk of clients, the gradients of
    the live configurations at their current parameters, from the grid's gradient calls
    (``GridModule.configuration_gradients``: stacked, in pieces of ``grid_chunk`` configurations, or one
    per configuration), each configuration's served once; :meth:`clear` after every
    lockstep pass over the configurations bounds the memory to one chunk.

    A computation is keyed by the exact clients asked for, and made for the configurations not
    yet served in this pass that will ask for the same clients: all of them, except that
    configurations of different seeds with a client sampler draw different cohorts
    (:meth:`~pl_privfed.grid.views.SeedViews.cohort_class`); one that asks for other clients
    than expected gets a computation of its own."""

    def __init__(self, module: Any, batch: Any, live: list[int]) -> None:
        # module: the GridModule (not imported: it imports this file)
        self.module, self.batch, self.live = module, batch, live
        self.served: dict[bytes, dict[int, OracleOutput]] = {}
        self.computed: dict[bytes, set[int]] = {}
        self.taken: set[int] = set()

    def get(self, k: int, ids: Tensor) -> OracleOutput | None:
        if not ids.numel():
            return None
        key = ids.detach().cpu().numpy().tobytes()
        if k not in self.computed.get(key, ()):
            views, algorithms = self.module.seed_views, self.module.grid_algorithms
            same = views.cohort_class(k, algorithms)
            configs = [
                j
                for j in self.live
                if j == k or (j not in self.taken and views.cohort_class(j, algorithms) == same)
            ]
            self.served.setdefault(key, {}).update(self._compute(configs, ids))
            self.computed.setdefault(key, set()).update(configs)
        self.taken.add(k)
        return self.served[key].pop(k, None)

    def _compute(self, configs: list[int], ids: Tensor) -> dict[int, OracleOutput]:
        size = self.module.grid_chunk or len(configs)
        out: dict[int, OracleOutput] = {}
        for lo in range(0, len(configs), size):
            part = configs[lo : lo + size]
            out.update(
                zip(part, self.module.configuration_gradients(part, ids, self.batch), strict=True)
            )
        return out

    def clear(self) -> None:
        self.served, self.computed, self.taken = {}, {}, set()


class GridConfigOracle(ChunkOracle):
    """Configuration ``k``'s oracle in a grid round: its first request for a chunk's gradients
    at its current parameters ``x`` comes from the shared batch, anything else from its own
    :class:`~pl_privfed.grads.RoundOracle` (with its own BatchNorm buffers)."""

    def __init__(self, shared: GridBatch, k: int, x: Tensor, own: RoundOracle) -> None:
        self.shared, self.k, self.x, self.own = shared, k, x, own

    def __call__(
        self, params: Tensor, clients: Tensor, *, per_example: bool = False, step: int | None = None
    ) -> OracleOutput:
        if params is self.x and not per_example and step is None:
            out = self.shared.get(self.k, clients)
            if out is not None:
                return out
        return self.own(params, clients, per_example=per_example, step=step)

    def clipped_mean(self, params, clients, scale, *, step=None) -> OracleOutput:
        return self.own.clipped_mean(params, clients, scale, step=step)
