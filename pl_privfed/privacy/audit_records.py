"""Canary records of the one-run audit (Steinke, Nasr & Jagielski, "Privacy auditing with one (1)
training run", NeurIPS 2023): records of the real per-example path (:mod:`pl_privfed.privacy.audit`,
second bullet of "what the canaries enter").

A canary record ``j`` is a record of its host client ``hosts[j]`` whose gradient is a fixed
direction ``G·u_j``. In every round its record is drawn (the release's record rate ``L/N``,
keyed) it is one of its host's examples of the round's first local minibatch (every local step
for solvers that reuse the round's batch), at a keyed place among the real examples
(:meth:`RecordJoin.slots`: the host's last and first places included), and goes through the
same per-example code as every real record (:meth:`~pl_privfed.engine.ClientChunk.clipped_mean`):

* where the chunk forms every example's gradient, it is a row of the same ``[c, B + A, d]``
  tensor, through the same operator call (:meth:`~pl_privfed.engine.ClientChunk.apply`, its
  ``scales``), the same sum over the examples and the division by ``b``;
* where the oracle forms the clipped mean without the examples' gradients (the layers backend's
  ghost norms), its norm joins, at its place among its host's examples, the very calls the
  oracle makes of the operator's scale, and its scaled gradient joins its host's mean; a
  host whose examples the oracle never put through the scale leaves its canaries unscaled,
  as its own records were.

Then its host's noise draw covers it (:meth:`~pl_privfed.engine.ClientChunk.normal`), as every
record's. So a clip skipped for some records on the per-example path (a chunk, a block of
examples, a range of places) is skipped for the canaries that land there, which the white-box
auditor reads ``overshoot`` times too loud. Where the algorithm clips the whole minibatch
gradient (SoteriaFL) the canary joins that gradient and the algorithm's clip
(:meth:`RecordCanaries.gradients`, :meth:`RecordCanaries.operator_applied`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from pl_privfed.privacy.audit import WhiteBox, canary_participation
from pl_privfed.privacy.audit_bound import CanaryBound
from pl_privfed.rng import AUDIT_HOSTS, AUDIT_RECORD_PLACES, STREAM_AUDIT, keyed_generator

__all__ = ["RecordCanaries", "RecordJoin", "record_hosts"]


def record_hosts(inserted: Tensor, num_clients: int, seed: int) -> Tensor:
    """``[m]`` the client holding each canary record: uniform over the ``n`` clients from
    ``(seed, STREAM_AUDIT, AUDIT_HOSTS)``, the first inserted canary held by the last client
    and the second by the first (the last and the first chunk of a round with every client)."""
    n = max(1, int(num_clients))
    gen = keyed_generator(seed, STREAM_AUDIT, AUDIT_HOSTS)
    hosts = torch.randint(n, (int(inserted.numel()),), generator=gen)
    first = inserted.nonzero().flatten()[:2].tolist()
    for j, host in zip(first, (n - 1, 0)):
        hosts[j] = host
    return hosts


class RecordJoin:
    """The canary records that join one chunk's per-example computation (built by
    :meth:`RecordCanaries.records`).

    Attributes:
        rows: ``[A]`` each canary's host row in the chunk.
        canaries: ``[A]`` their indices ``j``.
        grads: ``[A, d]`` their gradients ``G·u_j``.
        weight: ``1/b``: a record's share of its host's noised average (the declaration's ``b``).
    """

    def __init__(
        self, owner: RecordCanaries, rows: Tensor, canaries: Tensor, grads: Tensor, key: tuple
    ) -> None:
        self.owner, self.rows, self.canaries, self.grads = owner, rows, canaries, grads
        self.weight = 1.0 / owner.release_size
        self.round_index = int(key[3])
        self._key = key
        self._slots: dict[int, tuple[Tensor, int]] = {}
        #: each canary's scale as the oracle's calls of the operator gave it (ghost path)
        self.scales = torch.ones(int(rows.numel()), dtype=torch.float64)

    def slots(self, batch: int) -> tuple[Tensor, int]:
        """``(slot [A], width)``: each canary's place among its host's ``batch`` examples and
        its host's other canaries, in rows of ``width = batch + A_max`` places (``A_max`` the
        most canaries a host of the chunk holds; the places a host with fewer leaves over come
        after its real examples, empty). Keyed ``(seed, STREAM_AUDIT, AUDIT_RECORD_PLACES,
        round, step, host)``: a host's first canary (in keyed order) takes its last place,
        the second its first, the others uniform over the rest."""
        if batch in self._slots:
            return self._slots[batch]
        counts = torch.bincount(self.rows)
        width = batch + int(counts.max())
        slot = torch.empty(self.rows.numel(), dtype=torch.int64)
        for row in self.rows.unique().tolist():
            mine = (self.rows == row).nonzero().flatten()
            host = int(self.owner.hosts[self.canaries[mine[0]]])
            gen = keyed_generator(*self._key, host)
            order = mine[torch.randperm(mine.numel(), generator=gen)]
            fixed = [width - 1, 0][: order.numel()]
            drawn = torch.randperm(width, generator=gen).tolist()
            rest = torch.tensor([p for p in drawn if p not in fixed])
            places = torch.cat([torch.tensor(fixed), rest])[: order.numel()]
            slot[order] = places
        self._slots[batch] = (slot, width)
        return slot, width

    def layout(self, size: int, batch: int, device: Any) -> tuple[Tensor, Tensor, Tensor]:
        """``(real, slot, width)`` for ``size`` host rows: ``real [size, width]`` bool, the
        places of the real examples (a host's first ``batch`` places its canaries leave)."""
        slot, width = self.slots(batch)
        canary = torch.zeros(size, width, dtype=torch.bool)
        canary[self.rows, slot] = True
        free = ~canary
        real = free & (free.cumsum(1) <= batch)
        return real.to(device), slot, width

    def scale_with(self, scale: Callable[[Tensor], Tensor], size: int) -> Callable:
        """The operator's scale ``s(norms)`` as the oracle calls it, with the canaries' norms
        ``G`` joined at their places among their hosts' examples in every call: a call of
        ``[m, B]`` norms (or ``m·B`` flat: the rest of the chunk's hosts) covers the next ``m``
        hosts of the chunk's ``size``; the real examples' scales go back to the oracle, the
        canaries' are kept (:attr:`scales`)."""
        done = [0]

        def joined(norms: Tensor) -> Tensor:
            lo = done[0]
            batch = norms.shape[-1] if norms.dim() == 2 else norms.numel() // max(1, size - lo)
            m = norms.numel() // max(1, batch)
            done[0] = lo + m
            mine = ((self.rows >= lo) & (self.rows < lo + m)).nonzero().flatten()
            if mine.numel() == 0:
                return scale(norms)
            real, slot, width = self.layout(size, batch, norms.device)
            real = real[lo : lo + m]
            rows, places = (self.rows[mine] - lo).to(norms.device), slot[mine].to(norms.device)
            both = norms.new_zeros(m, width)
            both[real] = norms.reshape(-1)
            both[rows, places] = self.owner.norm
            out = scale(both)
            self.scales[mine] = out[rows, places].double().cpu()
            return out[real].reshape(norms.shape)

        return joined

    def finish(self, clipped: Tensor, like: Tensor) -> Tensor:
        """``[c, d]``: each host's ``Σ_j Ψ(G·u_j)/b`` from its canaries' clipped rows
        ``clipped [A, d]``; each canary's white-box shift ``⟨Ψ(G·u_j)/b, u_j⟩`` and its
        norm for the per-canary check (:attr:`RecordCanaries.bound`)."""
        owner = self.owner
        if owner.bound is not None:
            norms = torch.linalg.vector_norm(clipped, dim=-1, dtype=torch.float64) * self.weight
            owner.bound.add(self.round_index, self.canaries, norms)
        u = owner.directions[self.canaries.to(owner.directions.device)]
        shift = (u * clipped.to(u.device, u.dtype)).sum(1).double().cpu().numpy() * self.weight
        if owner._pending is not None:
            owner._pending[2][self.canaries.numpy()] = shift
        out = like.new_zeros(like.shape)
        out.index_add_(0, self.rows.to(like.device), clipped.to(like.dtype) * self.weight)
        return out


class RecordCanaries:
    """Canary records for the engine's gradient oracle (module docstring, second bullet of "what
    the canaries enter").

    :class:`~pl_privfed.engine.ClientChunk` finds them as the message stage's hook
    (:class:`~pl_privfed.engine.MessageHook`, from ``algorithm.canaries``): ``clipped_mean``
    (the clipped per-example mean) takes :meth:`records` among its examples (module
    docstring), ``grad`` (the minibatch gradient) adds :meth:`gradients`; they send no message.

    Args:
        directions: ``[m, d]`` unit directions, on the training device.
        inserted: ``[m]`` bool: the canaries inserted into their host's data.
        hosts: ``[m]`` the client (agent) holding each canary (the callback's:
            :func:`record_hosts`).
        release_size: ``b``, the records one noised average is over (the declaration's).
        norm: ``G``, the norm of a canary record's gradient (large: the clip must act).
        minibatch_norm: the norm of a canary record's gradient where it joins a plain
            minibatch gradient that the algorithm then clips whole (default ``norm``): large
            enough that its part of the average, ``minibatch_norm / b``, outweighs the real
            records' gradient, so the clip points along it (the callback gives ``b`` times
            ``norm``); a record's gradient is unbounded there, which is why the certificate
            counts ``2τ`` for one record.
        rate: the probability that a record is in a round's sample (the declaration's
            ``positions / population``, at most 1).
        seed: the audit's seed (sampling draws).
    """

    level = "record"

    def __init__(
        self,
        directions: Tensor,
        inserted: Tensor,
        hosts: Tensor,
        *,
        release_size: int,
        norm: float,
        rate: float = 1.0,
        seed: int = 0,
        minibatch_norm: float | None = None,
    ) -> None:
        self.directions = directions
        self.inserted = inserted.to("cpu", torch.bool)
        self.hosts = hosts.to("cpu", torch.int64)
        self.release_size = int(release_size)
        self.norm = float(norm)
        self.minibatch_norm = self.norm if minibatch_norm is None else float(minibatch_norm)
        self.rate = min(1.0, float(rate))
        self.seed = int(seed)
        self.uses = torch.zeros(self.count, dtype=torch.int64)
        self.last_received: Tensor | None = None  # record canaries observe no sum
        self._last_round = torch.full((self.count,), -1, dtype=torch.int64)
        self.white = WhiteBox(self.count)
        #: the per-canary check against the declared bound (the callback's; ``None``: none)
        self.bound: CanaryBound | None = None
        #: the last gradients' (round, who would take part, contributions ⟨c_j, u_j⟩), read by
        #: the noise draw that follows them (:meth:`noise_drawn`)
        self._pending: tuple[int, Tensor, np.ndarray] | None = None
        #: canaries joined to a plain minibatch gradient, whose contribution the operator that
        #: follows decides (:meth:`operator_applied`): (round, active canaries, their weight)
        self._awaiting: tuple[int, Tensor, float] | None = None

    @property
    def count(self) -> int:
        return int(self.inserted.numel())

    key = "sent"

    def place(
        self, round_index: int, ids: Tensor, num_clients: int, chunk_size: int | None = None
    ) -> Tensor:
        """The round's clients as they are: record canaries are records, not clients."""
        return ids

    def client_gradients(self, index: Tensor, round_index: int, like: Tensor) -> Tensor:
        raise ValueError("record canaries place no canary client")

    def sent(
        self, round_index: int, key: str, index: Tensor, clean: Tensor, noise: Tensor | None
    ) -> None:
        """Nothing: record canaries send no message of their own."""

    def noise(
        self, round_index: int, key: str, draw: Callable[[int], Tensor | None]
    ) -> Tensor | None:
        """Nothing: record canaries send no message of their own."""
        return None

    def observe(
        self, round_index: int, key: str, received: Tensor, shared_noise: Tensor | None = None
    ) -> None:
        """Nothing to observe: the audit reads the model and the record-level draws."""

    def noise_drawn(self, ids: Tensor, round_index: int, rows: Tensor) -> None:
        """The record-level noise ``rows`` (``[c, d]``) the clients ``ids`` just added to the
        gradients that the canaries last joined (:meth:`gradients`): the white-box statistic
        (:class:`WhiteBox`) of every canary hosted by these clients is the projection of its
        host's draw on ``u_j`` plus, inserted and drawn into this round's sample, its
        contribution ``⟨Ψ(G·u_j)/b, u_j⟩`` (or, joined to a minibatch gradient that the
        algorithm then clips whole, what :meth:`operator_applied` found). Every round the host
        draws noise counts, whether or not the canary was sampled: the record sample is secret
        from the adversary the certificate names (that is what its amplification by sampling
        rests on), so an auditor that kept only the rounds the canary was drawn into would audit
        a mechanism without that amplification and read above a correct certificate. A canary
        joined to a plain minibatch gradient that no norm-based operator followed before the
        noise has no known contribution, and no white-box statistic that round."""
        state, self._pending = self._pending, None
        awaiting, self._awaiting = self._awaiting, None
        if awaiting is not None:  # canaries in a minibatch gradient no clip followed
            self.white.unknown = True
        if state is None or state[0] != round_index or awaiting is not None:
            return
        _, _, shift = state
        ids = ids.to("cpu", torch.int64)
        chosen = torch.isin(self.hosts, ids).nonzero().squeeze(1)
        if chosen.numel() == 0:
            return
        u = self.directions[chosen.to(self.directions.device)]
        drawn = rows[torch.searchsorted(ids, self.hosts[chosen]).to(rows.device)]
        base, picked = np.zeros(self.count), np.zeros(self.count)
        index = chosen.numpy()
        base[index] = (u * drawn.to(u.device, u.dtype)).sum(1).double().cpu().numpy()
        picked[index] = shift[index]
        self.white.add(base, picked)

    def records(self, ids: Tensor, round_index: int, step: int | None) -> RecordJoin | None:
        """The inserted canaries of the clients ``ids`` (a chunk's, sorted) drawn into round
        ``round_index`` as examples of the per-example path (:class:`RecordJoin`; ``None``
        when none is): the round's first local minibatch (``step`` 0) or, for solvers that
        reuse the round's batch (``step`` ``None``), every local step, as the record would.
        Every canary these clients hold reads its host's noise draw that follows
        (:meth:`noise_drawn`), drawn or not."""
        self._pending = self._awaiting = None
        if round_index < 0 or step not in (None, 0):
            return None
        ids = ids.to("cpu", torch.int64)
        takes = torch.isin(self.hosts, ids)
        takes &= canary_participation(self.count, self.rate, self.seed, round_index)
        active = self.inserted & takes
        self._pending = (round_index, takes, np.zeros(self.count))
        if not bool(active.any()):
            return None
        self.uses += (active & (self._last_round != round_index)).to(torch.int64)
        self._last_round[active] = round_index
        chosen = active.nonzero().squeeze(1)
        rows = torch.searchsorted(ids, self.hosts[chosen])
        grads = self.directions[chosen.to(self.directions.device)] * self.norm
        key = (
            self.seed,
            STREAM_AUDIT,
            AUDIT_RECORD_PLACES,
            round_index,
            -1 if step is None else step,
        )
        return RecordJoin(self, rows, chosen, grads, key)

    def gradients(
        self, ids: Tensor, round_index: int, step: int | None, like: Tensor
    ) -> Tensor | None:
        """``[c, d]``: for each client of ``ids``, ``Σ_j G'·u_j/b`` over its inserted canaries
        drawn in round ``round_index`` (``G'`` the ``minibatch_norm``), joined to the plain
        minibatch gradient that the algorithm then clips whole (SoteriaFL, FedAvg's
        ``clip_level: minibatch``), whose clip decides each canary's contribution
        (:meth:`operator_applied`); ``None`` when no canary of these clients is in the round
        (the round's first local minibatch, or every step of a solver that reuses the round's
        batch: :meth:`records`)."""
        join = self.records(ids, round_index, step)
        if join is None:
            return None
        weight = self.minibatch_norm / self.release_size
        self._awaiting = (round_index, join.canaries, weight)
        u = self.directions[join.canaries.to(self.directions.device)]
        out = like.new_zeros(ids.numel(), like.shape[-1])
        return out.index_add_(0, join.rows.to(like.device), (u * weight).to(like.dtype))

    def operator_applied(
        self, ids: Tensor, round_index: int, operator: Any, rows: Tensor, factor: float = 1.0
    ) -> None:
        """The chunk's minibatch gradients ``rows`` (``[c, d]``, the canaries of
        :meth:`gradients` joined) just before the norm-based ``operator`` ``Ψ`` (times
        ``factor``) acts on them: the algorithm clips the whole minibatch gradient (SoteriaFL,
        FedAvg's ``clip_level: minibatch``). The white-box auditor knows every record, so canary
        ``j``'s contribution is ``c_j = β Ψ(v) − β Ψ(v − a_j)`` with ``v`` its host's row and
        ``a_j = G u_j / b`` its record's part of the average (the other canaries' parts stay
        known); ``⟨c_j, u_j⟩`` is its shift for :meth:`noise_drawn`. With ``G/b`` far above
        the clip (the callback's canary norm is ``overshoot`` times the clip times ``b``)
        ``Ψ(v)`` points along the canaries and ``⟨c_j, u_j⟩`` is about the clip ``τ``, so under
        replace-one (counted twice, ``2τ``) the statistic is the mechanism's own at its
        sensitivity ``2τ``. Only the first norm-based operator after the gradients counts."""
        state, self._awaiting = self._awaiting, None
        if state is None or state[0] != round_index or self._pending is None:
            return
        _, chosen, weight = state
        ids = ids.to("cpu", torch.int64)
        u = self.directions[chosen.to(self.directions.device)]
        v = rows[torch.searchsorted(ids, self.hosts[chosen]).to(rows.device)].to(u.dtype)
        without = v - weight * u

        def through(x: Tensor) -> Tensor:
            norms = torch.linalg.vector_norm(x, dim=1).double()
            return x * operator.scale(norms).to(x.dtype).unsqueeze(1) * float(factor)

        contribution = through(v) - through(without)
        self._pending[2][chosen.numpy()] = (contribution * u).sum(1).double().cpu().numpy()
        if self.bound is not None and self.bound.minibatch is not None:
            norms = torch.linalg.vector_norm(contribution, dim=-1, dtype=torch.float64)
            self.bound.add(round_index, chosen, norms, self.bound.minibatch)
