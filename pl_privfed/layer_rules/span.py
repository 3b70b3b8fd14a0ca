"""Client gradients in the span of each client's own data: :class:`ClientSpan`.

For a model whose parameters are one ``Linear`` layer reading the input (multinomial logistic
regression, linear regression: the generalized linear models of papers 001 and 002), client
``i``'s gradient of any loss of its examples ``a_1, …, a_m`` is ``Σ_b g_b a_bᵀ`` for the weight
and ``Σ_b g_b`` for the bias (``g_b`` the gradient of the loss at the layer's output): whatever
the parameters, its weight part lies in ``R^out ⊗ span(a_1, …, a_m)``. With ``Q_i`` an
orthonormal basis of that span (``[in, r]``, ``r <= m``), the map

    ``(C, b) ↦ (weight Cᵀ Q_iᵀ, bias b)``,  ``C ∈ R^{r×out}``, ``b ∈ R^out``

is an isometry from ``R^{r·out + out}`` onto a subspace of the parameter space that holds every
gradient the client can compute, and every linear combination of them. An algorithm whose
client lines are linear combinations of gradients and of such combinations, through operators
of the form ``Ψ(v) = s(||v||) v`` (clipping, smoothed normalization: they commute with an
isometry), computes exactly the same messages and memories on the coordinates ``(C, b)`` as on
the ``d``-dimensional vectors, in real arithmetic; the server needs only their weighted sums,
``Σ_i w_i (C_iᵀ Q_iᵀ, b_i)``, one matrix product per chunk of clients.

So a client's state costs ``r·out + out`` numbers instead of ``d = in·out + out`` (MNIST split
into clients of 5 images: 60 instead of 7,850), and a round never forms a ``[c, d]`` gradient.
Under the softmax cross-entropy a round does not even gather its examples: example ``b`` of
client ``i`` is ``a_b = Σ_j p_bj q_ij`` (``p_b`` its coordinates, computed once), so its logits
are ``p_b · (Q_iᵀ Wᵀ) + bias`` and one product of the clients' basis rows with the weights of
every configuration that shares the data (a grid's) gives them all (:meth:`ClientSpan.gradients`).
The engine runs an algorithm there, as the row representation
:class:`~pl_privfed.engine.SpanRows`, when the algorithm says it can
(:meth:`~pl_privfed.algorithms.FederatedAlgorithm.span_states`), the model and data allow it and
it saves memory (:func:`~pl_privfed.engine.choose_client_rows`; ``client_span: off`` turns it
off); docs/scaling.md, "Clients in the span of their data".
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["ClientSpan"]


class ClientSpan:
    """Every client's orthonormal basis of its examples, and its gradients' coordinates in it
    (module docstring).

    Args:
        basis: ``[N, r, in]``: row ``j`` of client ``i`` is its basis vector ``q_ij``
            (orthonormal rows per client; :meth:`orthonormal` makes them from the examples).
        weight: ``(offset, out)`` of the layer's weight ``[out, in]`` in the flat parameter
            vector.
        bias: ``(offset, out)`` of its bias, or ``None`` (``bias=False``).
        dim: ``d``, the length of the flat parameter vector.
        examples: ``[N, m, r]``: every client's examples' coordinates in its basis (its
            ``m`` examples in its shard's order), for :meth:`gradients`.
        members: ``[N, m]``: the dataset indices of every client's examples (``-1`` pads a
            short shard), for :meth:`gradients`.
    """

    def __init__(
        self,
        basis: Tensor,
        weight: tuple[int, int],
        bias: tuple[int, int] | None,
        dim: int,
        examples: Tensor | None = None,
        members: Tensor | None = None,
    ) -> None:
        if basis.dim() != 3:
            raise ValueError(f"basis must be [clients, r, in], got {tuple(basis.shape)}")
        self.basis = basis
        self.clients, self.r, self.in_features = (int(s) for s in basis.shape)
        self.weight, self.bias, self.dim = weight, bias, int(dim)
        self.out_features = int(weight[1])
        if bias is not None and bias[1] != self.out_features:
            raise ValueError(f"bias has {bias[1]} outputs, the weight {self.out_features}")
        #: coordinates per client: ``r·out`` (weight) then ``out`` (bias)
        self.rank = self.r * self.out_features + (self.out_features if bias is not None else 0)
        self.examples, self.members = examples, members

    def to(self, device: torch.device | str, dtype: torch.dtype) -> ClientSpan:
        """This span on ``device`` with its bases and coordinates in ``dtype``."""
        examples = None if self.examples is None else self.examples.to(device, dtype)
        members = None if self.members is None else self.members.to(device)
        basis = self.basis.to(device, dtype)
        return ClientSpan(basis, self.weight, self.bias, self.dim, examples, members)

    @property
    def width(self) -> int:
        """A client's share of a chunk's working set, in the unit of
        :func:`~pl_privfed.engine.choose_chunk_size` (a third of its numbers): its basis rows
        and as many inputs, and three rows of coordinates."""
        return self.rank + (2 * self.r * self.in_features) // 3

    @staticmethod
    def orthonormal(examples: Tensor) -> Tensor:
        """``[N, r, in]`` orthonormal rows spanning each client's examples ``[N, m, in]``
        (zero rows pad a client with fewer than ``m``), ``r = min(m, in)``: a reduced QR
        factorization in float64 (Householder: orthonormal whatever the examples' rank)."""
        q = torch.linalg.qr(examples.to(torch.float64).transpose(1, 2), mode="reduced").Q
        return q.transpose(1, 2).to(examples.dtype).contiguous()

    def rows(self, ids: Tensor) -> Tensor:
        """The basis rows ``[c, r, in]`` of the clients ``ids`` (sorted; consecutive clients:
        a view, no copy)."""
        if ids.numel() and int(ids[-1]) - int(ids[0]) + 1 == ids.numel():
            return self.basis[int(ids[0]) : int(ids[-1]) + 1]
        return self.basis.index_select(0, ids.to(self.basis.device))

    def gradients(
        self, params: Tensor, ids: Tensor, indices: Tensor, targets: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Under the softmax cross-entropy (mean over each minibatch), the coordinates
        ``[K, c, rank]`` of the gradients of the clients ``ids`` at each of ``K`` parameter
        vectors ``params [K, d]`` (configurations sharing the data), and the mean losses
        ``[K, c]``, from the dataset ``indices [c, B]`` of their minibatches and the
        ``targets [c, B]``: the logits from the examples' coordinates (module docstring), the
        output gradients ``g_b = (softmax − onehot)/B``, then ``C = Pᵀ G`` and ``Σ_b g_b``."""
        k, (c, batch), out, r = params.shape[0], indices.shape, self.out_features, self.r
        basis = self.rows(ids)
        start = self.weight[0]
        weights = params[:, start : start + out * self.in_features].reshape(k * out, -1)
        products = torch.mm(basis.reshape(c * r, -1), weights.T).view(c, r, k * out)
        ids = ids.to(self.examples.device)
        members = self.members.index_select(0, ids)  # [c, m]
        found = members.unsqueeze(1) == indices.to(members.device).unsqueeze(2)  # [c, B, m]
        if not bool(found.any(-1).all()):
            raise ValueError("client_span: a minibatch holds an example outside its client's shard")
        local = found.to(torch.uint8).argmax(-1)  # [c, B]: each example's place in its shard
        rows = self.examples.index_select(0, ids)  # [c, m, r]
        coords = torch.gather(rows, 1, local.unsqueeze(-1).expand(c, batch, r))  # [c, B, r]
        logits = torch.bmm(coords, products).view(c, batch, k, out)
        if self.bias is not None:
            logits = logits + params[:, self.bias[0] : self.bias[0] + out]
        logp = logits.log_softmax(-1)
        index = targets.reshape(c, batch, 1, 1).long().expand(c, batch, k, 1)
        losses = -logp.gather(-1, index).squeeze(-1)  # [c, B, K]
        delta = logp.exp_()
        delta.scatter_add_(-1, index, delta.new_full(index.shape, -1.0)).div_(batch)
        weight = torch.bmm(coords.transpose(1, 2), delta.view(c, batch, k * out))  # [c, r, K·out]
        parts = [weight.view(c, r, k, out).permute(2, 0, 1, 3).reshape(k, c, r * out)]
        if self.bias is not None:
            parts.append(delta.sum(1).transpose(0, 1))
        return torch.cat(parts, dim=2), losses.mean(1).T

    def expand(self, basis: Tensor, rows: Tensor, weights: Tensor | None = None) -> Tensor:
        """``Σ_i w_i x_i`` ``[d]`` of the vectors ``x_i`` whose coordinates are ``rows [c,
        rank]`` (``w = 1`` without ``weights``), the clients' basis rows ``basis [c, r, in]``
        (:meth:`expand_many` of one table)."""
        if weights is not None:
            rows = rows * weights.to(rows.dtype).unsqueeze(1)
        return self.expand_many(basis, [rows])[0]

    def expand_many(self, basis: Tensor, rows: list[Tensor]) -> list[Tensor]:
        """:meth:`expand` (unweighted) of several coordinate tables ``[c, rank]`` of the same
        clients (basis rows ``basis [c, r, in]``), with one product for all their weights: the
        bases are read once."""
        c, out, r = basis.shape[0], self.out_features, self.r
        coeff = torch.cat([t[:, : r * out].reshape(c * r, out) for t in rows], dim=1)
        matrices = torch.mm(coeff.T, basis.reshape(c * r, self.in_features))  # [K·out, in]
        sums = []
        for j, t in enumerate(rows):
            flat = t.new_zeros(self.dim)
            start = self.weight[0]
            flat[start : start + out * self.in_features] = matrices[
                j * out : (j + 1) * out
            ].reshape(-1)
            if self.bias is not None:
                flat[self.bias[0] : self.bias[0] + out] = t[:, r * out :].sum(0)
            sums.append(flat)
        return sums

    def fit(self, vectors: Tensor) -> tuple[Tensor, Tensor]:
        """For each vector ``v = (V, b)`` of ``vectors [m, d]`` (an audit's canary direction),
        a client of its own that can send it: its basis rows ``[m, r, in]``, made by
        :meth:`orthonormal` (every client's code) from its "examples", the first ``r`` rows of
        ``V`` (zero rows past ``out``), and the coordinates ``[m, rank]`` of ``v``'s
        projection on that client's span, scaled to norm 1 (``(B Vᵀ, b)``: ``v`` itself when
        ``r >= out``, the projection on the span of ``V``'s first ``r`` rows otherwise)."""
        m, out, width = vectors.shape[0], self.out_features, self.in_features
        start = self.weight[0]
        weight = vectors[:, start : start + out * width].reshape(m, out, width)
        examples = weight.new_zeros(m, self.r, width)
        examples[:, : min(out, self.r)] = weight[:, : self.r]
        basis = self.orthonormal(examples)
        coords = self.coordinates(basis, vectors)
        return basis, coords / torch.linalg.vector_norm(coords, dim=1, keepdim=True)

    def coordinates(self, basis: Tensor, vectors: Tensor) -> Tensor:
        """The coordinates ``[c, rank]`` of ``vectors [c, d]`` that lie in the spans of the
        basis rows ``basis [c, r, in]`` (their projections on them otherwise)."""
        c, out, width = vectors.shape[0], self.out_features, self.in_features
        start = self.weight[0]
        weight = vectors[:, start : start + out * width].reshape(c, out, width)
        parts = [torch.bmm(basis, weight.transpose(1, 2)).reshape(c, self.r * out)]
        if self.bias is not None:
            parts.append(vectors[:, self.bias[0] : self.bias[0] + out])
        return torch.cat(parts, dim=1)

    def lift(self, basis: Tensor, rows: Tensor) -> Tensor:
        """Every client's vector ``[c, d]`` from its coordinates (checks and tests; the rounds
        only need :meth:`expand`)."""
        return torch.stack(
            [self.expand(basis[i : i + 1], rows[i : i + 1]) for i in range(len(rows))]
        )
