"""Clients in the span of their data as a row representation: :class:`SpanRows`, and when a
run takes it (:func:`choose_client_rows`, the option ``client_span``).

For a model that is one ``Linear`` layer, client ``i``'s gradients, and every linear combination
of them through norm-based operators, lie in a subspace of dimension ``r·out + out`` spanned by
its examples (:mod:`pl_privfed.layer_rules.span`, :class:`~pl_privfed.layer_rules.ClientSpan`:
the bases, the coordinates of the gradients, their expansion). :class:`SpanRows` is that
subspace as the round's :class:`~pl_privfed.engine.rows.ClientRows`: the chunk's gradients,
state rows and messages are coordinates, their sums are deferred until the round's map is done
and expanded to ``[d]`` in one product (:meth:`~pl_privfed.engine.Reduction.defer`,
:func:`~pl_privfed.engine.expand_together`), and whatever only ``d``-dimensional rows have
(the real clients' per-client noise draws, secure aggregation's masked shares, an audit's
canary records, per-example gradients, local steps) is refused. An audit's canary clients are
clients of the span: each gets a basis of its own, made from its direction as a client's from
its examples (:meth:`SpanRows.canary_directions`); its gradient, state rows and message are
coordinates there, through the chunk's operator call, each message summed by
:meth:`SpanRows.add` and :meth:`SpanRows.expand` (:meth:`~pl_privfed.engine.ClientRows.
contributions`). Everything the package knows of the span beyond its mathematics is here;
docs/scaling.md, "Clients in the span of their data".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from pl_privfed.engine.chunk import OracleOutput
from pl_privfed.engine.rows import DENSE, ClientRows
from pl_privfed.layer_rules import ClientSpan, LayerGradients

__all__ = ["SPAN_WIDEST_BASIS", "SpanRows", "choose_client_rows", "runs_in_span"]

#: ``client_span: auto`` keeps rows of ``d`` where a client's basis is wider than this many
#: minibatches (:func:`choose_client_rows`).
SPAN_WIDEST_BASIS = 2


def runs_in_span(algorithm: Any) -> bool:
    """Whether ``algorithm``'s clients can run in their data span: it declares which of its
    states stay linear combinations of its gradients (``span_states()``, not ``None``) and its
    messages are never formed per client (no per-client noise draws, no secure aggregation, no
    audit canary records; canary clients are clients of the span)."""
    noise, canaries = algorithm.noise, algorithm.canaries
    return (
        algorithm.span_states() is not None
        and algorithm.secure_aggregation is None
        and (canaries is None or getattr(canaries, "level", None) == "client")
        and (noise is None or noise.draws != "per_client")
    )


class SpanRows(ClientRows):
    """Client rows as coordinates in the span of each client's data (module docstring).

    Args:
        span: the clients' bases and the layer's place in the flat parameters.
    """

    computes_gradients = True

    def __init__(self, span: ClientSpan) -> None:
        self.span = span
        #: an audit's canary clients' bases ``[m, r, in]`` (:meth:`canary_directions`)
        self.canary_basis: Tensor | None = None

    @property
    def rank(self) -> int:
        """Coordinates per client: ``r·out + out``."""
        return self.span.rank

    def width(self, dim: int) -> int:
        return self.span.width

    def state_shape(self, shape: tuple[int, ...], linear: bool) -> tuple[int, ...]:
        return (self.span.rank,) if linear else shape

    def admit(self, algorithm: Any) -> None:
        if not runs_in_span(algorithm):
            raise ValueError(f"{type(algorithm).__name__} cannot run in the clients' data span")

    def require_dense(self, what: str) -> None:
        raise ValueError(
            f"client_span: {what} are not in the clients' data span; set model.client_span: off"
        )

    def add(
        self, reduction: Any, name: str, ids: Tensor, rows: Tensor, weights: Tensor | None
    ) -> None:
        if rows.dim() != 2:  # one number per client
            reduction.add_rows(name, rows, weights)
        elif rows.shape[0]:  # expanded once the round's map is done
            rows = rows.clone() if weights is None else rows * weights.unsqueeze(1)
            reduction.defer(name, self, ids, rows)

    def expand(self, ids: Tensor, tables: list[Tensor]) -> list[Tensor]:
        """One product for all the tables: the clients' bases are read once
        (:meth:`~pl_privfed.layer_rules.ClientSpan.expand_many`); an audit's canary client
        ``n + j`` has the basis :meth:`canary_directions` made it."""
        return self.span.expand_many(self._bases(ids), tables)

    def _bases(self, ids: Tensor) -> Tensor:
        """The basis rows ``[c, r, in]`` of the clients ``ids`` (real ones, or canaries)."""
        n = self.span.clients
        if not ids.numel() or int(ids.min()) < n:
            return self.span.rows(ids)
        if self.canary_basis is None:
            raise ValueError(f"client_span: clients {ids.tolist()} have no basis")
        return self.canary_basis.index_select(0, (ids - n).to(self.canary_basis.device))

    def canary_directions(self, directions: Tensor) -> Tensor:
        """Each canary client a basis of its own, made from its direction as a client's from
        its examples (:meth:`~pl_privfed.layer_rules.ClientSpan.fit`: the audit's direction
        itself where a basis holds ``out`` rows, its projection on the span of its first
        ``r`` rows otherwise), and the unit direction it sends there."""
        basis, coords = self.span.fit(directions.to(self.span.basis.device, self.span.basis.dtype))
        self.canary_basis = basis
        return self.span.lift(basis, coords).to(directions.device, directions.dtype)

    def canary_rows(self, index: Tensor, vectors: Tensor) -> Tensor:
        """The coordinates ``[a, rank]`` of the canary clients' vectors in their bases."""
        basis = self._bases(index.to(torch.int64) + self.span.clients)
        return self.span.coordinates(basis, vectors.to(basis.device, basis.dtype))

    def gradients(self, params: Tensor, ids: Tensor, data: Any) -> list[OracleOutput]:
        """The coordinates ``[c, rank]`` and losses ``[c]`` of the clients' gradients at each
        of ``params [K, d]``, from their minibatches' dataset indices and targets
        (``data.examples(ids)``) without gathering their inputs
        (:meth:`~pl_privfed.layer_rules.ClientSpan.gradients`)."""
        coords, losses = self.span.gradients(params.detach(), ids, *data.examples(ids))
        return [OracleOutput(grads=g, losses=loss) for g, loss in zip(coords, losses, strict=True)]

    def describe(self, dim: int) -> str:
        return (
            f"[pl-privfed] clients run in the span of their data (client_span): "
            f"{self.span.rank:,} coordinates per client instead of {dim:,} parameters"
        )

    def __repr__(self) -> str:
        return f"SpanRows(rank={self.span.rank})"


def choose_client_rows(
    requested: str,
    algorithm: Any,
    model: Any,
    datamodule: Any,
    rules: Callable[[], LayerGradients],
    dim: int,
    made: dict[int, SpanRows | None] | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    callbacks: list[Any] | None = None,
) -> ClientRows:
    """The rows ``algorithm``'s clients run in: :class:`SpanRows` of ``datamodule``'s
    clients, or :data:`~pl_privfed.engine.rows.DENSE` (rows of ``d = dim``).

    ``requested`` (the option ``client_span``): ``"off"``; ``"auto"``: the span wherever it is
    exact, saves memory (coordinates per client at most half of ``d``) and costs less (a
    client's basis, as wide as the largest shard, at most :data:`SPAN_WIDEST_BASIS` minibatches:
    the span's two products cost ``2·r·d`` a client and configuration against the
    d-dimensional path's ``2·B·d`` and its passes over ``[c, d]`` rows); ``"on"``: the span, or
    ``ValueError`` saying why not. It is exact when the algorithm's client lines are linear in
    its gradients (:func:`runs_in_span`), the ``model`` is one ``Linear`` layer under the
    cross-entropy without a regularizer (its layer ``rules``), the datamodule serves its
    examples unpreprocessed (:meth:`~pl_privfed.datamodules.FederatedDataModule.
    client_examples`), and no trainer callback reads the clients' d-dimensional rows
    (``needs_client_rows``: an audit's canary records). ``made``: the spans made so far, by
    datamodule; the basis is made on the training ``device`` in its ``dtype``."""
    if requested == "off":
        return DENSE
    reason = _refusal(algorithm, model, datamodule, rules)
    for callback in callbacks or []:
        if reason is None and getattr(callback, "needs_client_rows", False):
            reason = f"{type(callback).__name__} reads the clients' d-dimensional rows"
    rows = None
    if reason is None and requested == "auto" and _costs_more(datamodule, rules):
        return DENSE
    if reason is None:
        made = {} if made is None else made
        if id(datamodule) not in made:
            made[id(datamodule)] = _make(datamodule, rules, dim, device, dtype)
        rows = made[id(datamodule)]
        if rows is None:
            reason = "its coordinates per client would not be fewer than half the parameters"
    if reason is not None and requested == "on":
        raise ValueError(f"client_span='on' but {reason}; set client_span: auto or off")
    return DENSE if rows is None else rows


def _refusal(
    algorithm: Any, model: Any, datamodule: Any, rules: Callable[[], LayerGradients]
) -> str | None:
    """Why the clients cannot run in their data span (:func:`choose_client_rows`), or
    ``None``."""
    if not runs_in_span(algorithm):
        return (
            f"{type(algorithm).__name__}'s client lines are not linear combinations of its "
            "gradients through norm-based operators, or its messages are formed per client"
        )
    if callable(getattr(model, "regularizer", None)):
        return "the model's regularizer is not in the span of the data"
    if not callable(getattr(datamodule, "client_examples", None)):
        return f"{type(datamodule).__name__} does not give its clients' examples"
    try:
        reason = rules().span_refusal()
    except ValueError as error:  # the layer rules do not cover the model
        return str(error)
    return reason


def _basis_rows(datamodule: Any, rules: Callable[[], LayerGradients]) -> int | None:
    """A client's basis rows ``r`` from the datamodule's client sizes (the largest shard, at
    most the inputs' width), before any example is gathered; ``None`` without sizes."""
    sizes = getattr(datamodule, "client_sizes", None)
    if sizes is None or not len(sizes):
        return None
    in_features = int(rules().layers[0].slots["weight"][1][1])
    return min(int(max(sizes)), in_features)


def _costs_more(datamodule: Any, rules: Callable[[], LayerGradients]) -> bool:
    """Whether the clients' basis (:func:`_basis_rows`) is wider than
    :data:`SPAN_WIDEST_BASIS` minibatches of ``B`` examples, where ``client_span: auto`` keeps
    rows of ``d`` (docs/scaling.md: 10,000 clients of 5 examples at ``B = 5`` ran a round
    0.36-0.44x in the span; 1,000 Dirichlet shards of up to 154-188 examples at ``B = 16``:
    its 9-point grid 2.9x slower, CHANGELOG.md)."""
    rows, batch = _basis_rows(datamodule, rules), getattr(datamodule, "batch_size", 0)
    return rows is not None and bool(batch) and rows > SPAN_WIDEST_BASIS * int(batch)


def _make(
    datamodule: Any,
    rules: Callable[[], LayerGradients],
    dim: int,
    device: Any,
    dtype: torch.dtype,
) -> SpanRows | None:
    """The span of ``datamodule``'s clients, or ``None`` when the datamodule preprocesses
    its examples or the coordinates would not be fewer than ``dim / 2``."""
    layer_rules = rules()
    out, in_features = (int(s) for s in layer_rules.layers[0].slots["weight"][1])
    rows = _basis_rows(datamodule, rules)  # before gathering every client's examples
    if rows is not None and 2 * (rows * out + out) > dim:
        return None
    examples = datamodule.client_examples()
    if examples is None:
        return None
    inputs, members = examples
    flat = inputs.reshape(inputs.shape[0], inputs.shape[1], -1).to(torch.float64)
    if flat.shape[-1] != in_features or 2 * (min(flat.shape[1], in_features) * out + out) > dim:
        return None
    return SpanRows(layer_rules.span(flat, members).to(device, dtype))
