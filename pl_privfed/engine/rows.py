"""How a round's client rows are represented: :class:`ClientRows`.

A client's rows in a round (its gradients, its rows of the algorithm's per-client state, its
messages) are vectors of the parameter space, ``[c, d]`` for a chunk of ``c`` clients
(:data:`DENSE`, the default), or their coordinates in a smaller representation that only the
server's sums expand back to ``[d]`` (:class:`~pl_privfed.engine.span.SpanRows`: clients in the
span of their data, the option ``client_span``). An algorithm holds one such object
(``algorithm.client_rows``, chosen by the wiring at setup); the engine's chunks, its reduce, the
round's gradient oracle and a grid ask it instead of testing which representation runs, so a
representation's own code stays in its module.
"""

from __future__ import annotations

import abc
from typing import Any, ClassVar

import torch
from torch import Tensor

from pl_privfed.engine.reduce import Reduction

__all__ = ["DENSE", "ClientRows", "DenseRows"]


class ClientRows(abc.ABC):
    """How a chunk's client rows are represented (module docstring)."""

    #: whether the clients' gradients come from :meth:`gradients` rather than from the model's
    #: gradient oracle on the gathered minibatches
    computes_gradients: ClassVar[bool] = False

    @abc.abstractmethod
    def width(self, dim: int) -> int:
        """A client's share of a chunk's working set in the unit of
        :func:`~pl_privfed.engine.choose_chunk_size` (``dim``: a row of ``d``)."""

    @abc.abstractmethod
    def state_shape(self, shape: tuple[int, ...], linear: bool) -> tuple[int, ...]:
        """The row shape of a per-client state declared with ``shape`` (``d``-dimensional
        rows); ``linear``: the algorithm declares the state a linear combination of the
        client's gradients."""

    @abc.abstractmethod
    def admit(self, algorithm: Any) -> None:
        """``ValueError`` when ``algorithm``'s clients cannot run in this representation."""

    @abc.abstractmethod
    def require_dense(self, what: str) -> None:
        """``ValueError`` when ``what`` (something only ``d``-dimensional rows have: the real
        clients' per-client noise draws, masked shares, an audit's canary records) is asked of
        this representation."""

    @abc.abstractmethod
    def add(
        self, reduction: Any, name: str, ids: Tensor, rows: Tensor, weights: Tensor | None
    ) -> None:
        """Add ``Σ_i w_i rows_i`` over the rows ``rows`` of the clients ``ids`` to the
        reduction's sum ``name`` (``w = 1`` without ``weights``); rows of one number per client
        are sums of their own."""

    @abc.abstractmethod
    def expand(self, ids: Tensor, tables: list[Tensor]) -> list[Tensor]:
        """The ``[d]`` sums ``Σ_i x_i`` of the rows ``tables`` (each ``[c, ·]``, the clients
        ``ids``) that :meth:`add` deferred (:meth:`~pl_privfed.engine.Reduction.defer`), one
        per table."""

    def canary_directions(self, directions: Tensor) -> Tensor:
        """The unit directions ``[m, d]`` an audit's canary clients ``n + j`` send, from the
        audit's ``directions`` (rows of ``d``: themselves)."""
        return directions

    def canary_rows(self, index: Tensor, vectors: Tensor) -> Tensor:
        """The rows of this representation of the canary clients ``n + index`` whose vectors
        of the parameter space are ``vectors [a, d]`` (their gradients; rows of ``d``:
        themselves)."""
        return vectors

    def contributions(self, ids: Tensor, rows: Tensor, weights: Tensor | None, dim: int) -> Tensor:
        """``[c, d]`` (``d = dim``): each client's ``w_i rows_i`` as the server's sum adds
        it, by :meth:`add` and :meth:`expand`, one client a call (an audit's canary clients'
        messages, summed by the code that sums the real clients')."""
        out = []
        for i in range(ids.numel()):
            one = Reduction(dim, device=rows.device, dtype=rows.dtype)
            weight = None if weights is None else weights[i : i + 1]
            self.add(one, "row", ids[i : i + 1], rows[i : i + 1], weight)
            one.flush()
            out.append(one.sums["row"])
        return torch.stack(out)

    def gradients(self, params: Tensor, ids: Tensor, data: Any) -> list[Any]:
        """Where :attr:`computes_gradients`: the gradients (:class:`~pl_privfed.engine.
        OracleOutput`, rows of this representation) of the clients ``ids`` at each of the
        parameter vectors ``params [K, d]`` that share their round's data ``data``."""
        raise NotImplementedError(f"{type(self).__name__} leaves the gradients to the oracle")

    def describe(self, dim: int) -> str | None:
        """A line for the run's log about the representation (``None``: nothing to say)."""
        return None


class DenseRows(ClientRows):
    """Client rows of ``d``: every gradient, state row and message is a vector of the
    parameter space, added to the server's sums as it comes."""

    def width(self, dim: int) -> int:
        return dim

    def state_shape(self, shape: tuple[int, ...], linear: bool) -> tuple[int, ...]:
        return shape

    def admit(self, algorithm: Any) -> None:
        return None

    def require_dense(self, what: str) -> None:
        return None

    def add(
        self, reduction: Any, name: str, ids: Tensor, rows: Tensor, weights: Tensor | None
    ) -> None:
        reduction.add_rows(name, rows, weights)

    def expand(self, ids: Tensor, tables: list[Tensor]) -> list[Tensor]:
        return [t.sum(0) for t in tables]

    def __repr__(self) -> str:
        return "DenseRows()"


#: the default representation: client rows of ``d``
DENSE = DenseRows()
