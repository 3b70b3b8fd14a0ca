"""A chunk of clients: the view an algorithm's client part has of the round.

An algorithm's client part (``client_update(chunk)``) is written for the clients of one chunk,
``chunk.ids`` (global client indices), as if they were the whole federation: it asks for their
gradients, reads and updates their rows of its per-client state, draws their noise and adds what
the server needs to the round's :class:`~pl_privfed.engine.reduce.Reduction`. The engine
(:func:`~pl_privfed.engine.round.run_round`) calls it for every chunk of the round's clients,
so the algorithm's code does not know the chunk size; nothing it does may depend on another
client of the round (a map). What a client sends the server goes through
:meth:`ClientChunk.transmit`, the client side of the message stage
(:mod:`pl_privfed.engine.message`).

An audit's canary clients (indices from ``n`` on, placed among the round's clients by the
stage's hook, :meth:`~pl_privfed.engine.MessageHook.place`) are rows of the chunks they land in,
like any client: the algorithm's lines run on them, their gradient is their fixed direction
(:meth:`~pl_privfed.engine.MessageHook.client_gradients`, where the oracle's would be; in the
clients' data span, coordinates in a basis of their own: ``ClientRows.canary_rows``), their
state rows start from zeros every round and are never kept, and :meth:`transmit` puts them
through the same operator call and the placement's same per-client noise draw
(:meth:`normal`) as the chunk's real clients. Only the message stage's sum (the hook's ``key``)
receives them, as ``key:canaries``; every other sum, statistic and message count is the real
clients'.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from pl_privfed.communication import count_nonzeros
from pl_privfed.engine.message import CANARIES, Message, MessageStage
from pl_privfed.engine.reduce import Reduction
from pl_privfed.engine.rows import DENSE, ClientRows
from pl_privfed.operators.adaptive import UNCLIPPED, AdaptiveClip
from pl_privfed.rng import STREAM_COMPRESSION, STREAM_NOISE, KeyedGenerator

if TYPE_CHECKING:
    from pl_privfed.operators import Operator

__all__ = ["ChunkOracle", "ClientChunk", "OracleOutput", "RoundContext"]


@dataclass
class OracleOutput:
    """Gradients of the clients of a chunk.

    Attributes:
        grads: ``[c, d]`` (``[c, B, d]`` per example).
        losses: ``[c]`` mean minibatch losses (``[c, B]`` per example), or ``None`` when the
            oracle has no losses (a plain gradient function).
        buffer_sums: with shared parameters and a model with buffers (BatchNorm), the sum over
            the chunk's clients of their updated buffers (integer buffers: their common value).
        norms: for :meth:`~pl_privfed.grads.GradientOracle.clipped_mean`, every example's
            gradient norm ``[c, B]``.
    """

    grads: Tensor
    losses: Tensor | None = None
    buffer_sums: dict[str, Tensor] | None = None
    norms: Tensor | None = None


class ChunkOracle:
    """Gradients of the clients of a chunk, on the round's data.

    ``oracle(params, clients, per_example=False, step=None) -> OracleOutput``: ``params`` shared
    ``[d]`` or per client ``[c, d]``; ``clients`` the chunk's global indices; ``step`` the local
    minibatch (``None``: all the round's data of each client). An oracle may also offer
    ``clipped_mean(params, clients, scale, step=None) -> OracleOutput`` (see
    :meth:`ClientChunk.clipped_mean`).
    """

    def __call__(
        self, params: Tensor, clients: Tensor, *, per_example: bool = False, step: int | None = None
    ) -> OracleOutput:
        raise NotImplementedError


@dataclass
class RoundContext:
    """What all chunks of one round share (built by the engine)."""

    x: Tensor
    oracle: Any
    reduction: Reduction
    round_index: int
    dim: int
    device: torch.device
    dtype: torch.dtype
    keyed: KeyedGenerator
    statistics: bool = True
    stage: MessageStage = field(default_factory=MessageStage)
    participants: Tensor | None = None
    state: dict[str, Any] = field(default_factory=dict)
    #: how the clients' rows (gradients, state, messages) are represented
    #: (:class:`~pl_privfed.engine.rows.ClientRows`; default: ``[c, d]``)
    rows: ClientRows = DENSE
    #: ``n``, the federation's clients: indices from ``n`` on are an audit's canary clients
    clients: int | None = None


class ClientChunk:
    """The clients ``ids`` of one chunk of a round (see the module docstring).

    Attributes:
        ids: ``[c]`` global indices of the chunk's clients (sorted).
        x: the broadcast ``x^k`` (``[d]``).
        round_index: ``k``, the round (0-based; the memory initialization runs as round ``-1``).
        reduction: the round's running sums.
    """

    def __init__(self, ctx: RoundContext, ids: Tensor, store: Any) -> None:
        self.ctx = ctx
        self.ids = ids
        self.size = int(ids.numel())
        self.x = ctx.x
        self.round_index = ctx.round_index
        self.reduction = ctx.reduction
        self._store = store
        self._rows: dict[str, Tensor] = {}
        self._losses_recorded = False
        self._buffer_sums: dict[str, Tensor] | None = None
        #: examples per client of the last per-example computation (record-level checks)
        self.examples_per_client: int | None = None
        #: ``[c]`` bool on the CPU, the rows that are an audit's canary clients (``None``: none)
        self.canary: Tensor | None = None
        if ctx.clients is not None and ids.numel() and int(ids.max()) >= ctx.clients:
            self.canary = ids.cpu() >= ctx.clients

    @property
    def real_ids(self) -> Tensor:
        """The chunk's clients that are not canaries (all of :attr:`ids` in a run unaudited)."""
        return self.ids if self.canary is None else self.ids[~self.canary]

    def _real(self, values: Tensor) -> Tensor:
        """``values`` (one row per client of the chunk) without the canary clients' rows."""
        if self.canary is None or values.shape[0] != self.size:
            return values
        return values[(~self.canary).to(values.device)]

    def _canary_rows(self, real: Tensor, fill: Tensor) -> Tensor:
        """Rows of every client of the chunk: ``real`` for the real clients, ``fill`` for the
        canary clients (each in its place)."""
        out = real.new_empty((self.size, *real.shape[1:]))
        out[(~self.canary).to(out.device)] = real
        out[self.canary.to(out.device)] = fill.to(out.device, out.dtype)
        return out

    def _canary_gradients(self, like: Tensor) -> Tensor:
        """The canary clients' gradients: each its fixed direction (the hook's), as rows of
        the round's representation (:meth:`~pl_privfed.engine.ClientRows.canary_rows`)."""
        index = self.ids[self.canary] - self.ctx.clients
        grads = self.ctx.stage.hook.client_gradients(index, self.round_index, like)
        return self.ctx.rows.canary_rows(index, grads).to(like.device, like.dtype)

    @property
    def statistics(self) -> bool:
        """Whether this round's statistics are wanted (those that cost a pass over rows)."""
        return self.ctx.statistics

    # ------------------------------------------------------------------ gradients
    def _record(self, out: OracleOutput, shared: bool) -> None:
        if not self._losses_recorded and out.losses is not None:
            losses = out.losses.mean(-1) if out.losses.dim() > 1 else out.losses
            self.reduction.add_losses(losses)
            self._losses_recorded = True
        if shared and out.buffer_sums is not None:
            self._buffer_sums = out.buffer_sums  # the chunk's last shared-parameter call

    def grad(self, params: Tensor, step: int | None = None) -> Tensor:
        """The chunk's clients' gradients ``[c, d]`` of their minibatch losses at ``params``
        (shared ``[d]`` or per client ``[c, d]``); ``step``: the local minibatch (local SGD)."""
        if self.canary is not None:  # the real clients' from the oracle, the canaries' fixed
            if not bool((~self.canary).any()):  # a chunk of canaries only
                return self._canary_gradients(self.x.new_empty(0, self.ctx.dim))
            real = params if params.dim() == 1 else self._real(params)
            out = self.ctx.oracle(real, self.real_ids, step=step)
            self._record(out, params.dim() == 1)
            return self._canary_rows(out.grads, self._canary_gradients(out.grads))
        out = self.ctx.oracle(params, self.ids, step=step)
        self._record(out, params.dim() == 1)
        return self._with_hook(out.grads, step)

    def _with_hook(self, grads: Tensor, step: int | None) -> Tensor:
        """``grads`` (``[c, d]``, each client's minibatch gradient) with an audit's canary
        records of these clients joined to the average (:meth:`RecordCanaries.gradients
        <pl_privfed.privacy.audit_records.RecordCanaries.gradients>`: ``G·u_j/b`` each, which
        the algorithm's clip of the whole gradient then bounds); the real records' part is
        untouched."""
        hook = self.ctx.stage.hook
        extra = None if hook is None else hook.gradients(self.ids, self.round_index, step, grads)
        if extra is None:  # none (client canaries: clients of their own)
            return grads
        self.ctx.rows.require_dense("an audit's canary records")
        return grads + extra

    def example_grads(self, params: Tensor, step: int | None = None) -> Tensor:
        """Every example's gradient ``[c, B, d]`` (record-level clipping); a canary client's
        examples all have its fixed direction."""
        if self.canary is not None and not bool((~self.canary).any()):  # canaries only
            return self._canary_gradients(self.x.new_empty(0, self.ctx.dim)).unsqueeze(1)
        real = params if params.dim() == 1 else self._real(params)
        out = self.ctx.oracle(real, self.real_ids, per_example=True, step=step)
        self._record(out, False)
        self.examples_per_client = int(out.grads.shape[1])
        if self.canary is None:
            return out.grads
        fill = self._canary_gradients(out.grads[:, 0]).unsqueeze(1)
        return self._canary_rows(out.grads, fill.expand(-1, out.grads.shape[1], -1))

    def clipped_mean(
        self,
        params: Tensor,
        operator: Operator,
        step: int | None = None,
        statistics: bool = True,
    ) -> Tensor:
        """``(1/B) Σ_b Ψ(∇ℓ(params; z_b))`` for every client of the chunk, ``[c, d]``: each
        example's gradient through the operator (clipping), then the minibatch mean.

        For norm-based operators (clipping, smooth clipping, normalization) the oracle computes
        it without holding every example's gradient where the model allows (the layers
        backend: per-example norms from the layers' factors, then one weighted backward
        product, the ghost-clipping identity); otherwise from the per-example gradients of the
        chunk. Records the per-example operator statistics."""
        hook, join = self.ctx.stage.hook, None
        if hook is not None:  # an audit's canary records: examples of these clients' minibatches
            self.ctx.rows.require_dense("an audit's canaries")
            join = hook.records(self.ids, self.round_index, step)
        clipped = getattr(self.ctx.oracle, "clipped_mean", None)
        if callable(clipped) and operator.norm_based and self.canary is None:
            scale = operator.scale if join is None else join.scale_with(operator.scale, self.size)
            out = clipped(params, self.ids, scale, step=step)
            self._record(out, False)
            self.examples_per_client = int(out.norms.shape[-1])
            if statistics:
                norms = out.norms
                self._operator_stats(norms, norms * operator.scale(norms).abs())
            if self._record_checks() is not None:  # the scales the oracle applied
                self._check_bound(out.norms * operator.scale(out.norms).abs(), operator.bound)
                self._check_bound(torch.linalg.vector_norm(out.grads, dim=-1), operator.bound)
            if join is None:
                return out.grads
            scales = join.scales.to(join.grads.device, join.grads.dtype).unsqueeze(1)
            return out.grads + join.finish(join.grads * scales, out.grads)
        per_example = self.example_grads(params, step)
        if join is not None:
            return self._joined_mean(operator, per_example, join, statistics)
        out = self.apply(operator, per_example, statistics=statistics, inplace=True)
        mean = out.mean(1)
        if self._record_checks() is not None:
            self._check_bound(torch.linalg.vector_norm(mean, dim=-1), operator.bound)
        return mean

    def _joined_mean(self, operator: Operator, examples: Tensor, join: Any, stats: bool) -> Tensor:
        """:meth:`clipped_mean` with an audit's canary records among the examples: one
        ``[c, B + A, d]`` tensor, each canary at its place among its host's examples
        (:meth:`~pl_privfed.privacy.audit_records.RecordJoin.slots`), through the same
        operator call; the real examples' clipped mean plus each host's canaries' ``Ψ(G·u_j)/b``.
        The statistics and the check mode's bound are the real examples' (a host's empty
        places are zero rows, dropped)."""
        c, batch, d = examples.shape
        real, slot, width = join.layout(c, batch, examples.device)
        rows, slot = join.rows.to(examples.device), slot.to(examples.device)
        both = examples.new_zeros(c, width, d)
        both[real] = examples.reshape(-1, d)
        both[rows, slot] = join.grads.to(examples.dtype)
        before = torch.linalg.vector_norm(both, dim=-1) if stats else None
        out = self.apply(operator, both, statistics=False, inplace=True)
        if before is not None:
            after = torch.linalg.vector_norm(out, dim=-1)
            self._operator_stats(before[real].view(c, batch), after[real].view(c, batch))
        mean = out.masked_fill(~real.unsqueeze(-1), 0.0).sum(1).div_(batch)
        if self._record_checks() is not None:
            self._check_bound(torch.linalg.vector_norm(mean, dim=-1), operator.bound)
        return mean + join.finish(out[rows, slot], mean)

    # ------------------------------------------------------------------ the check mode
    def _record_checks(self) -> Any:
        """The run's privacy invariants when its release is record-level (else ``None``)."""
        checks = self.ctx.stage.checks
        return checks if checks is not None and checks.record_level else None

    def _check_bound(
        self,
        norms: Tensor,
        bound: float | None = None,
        ids: Tensor | None = None,
        release: str = "clipped examples",
    ) -> None:
        """(a) of the check mode (:mod:`pl_privfed.privacy.invariants`): the clients' released
        contributions ``norms`` (``[c]``, or ``[c, B]`` per example) within ``bound``
        (default: the run's declared message bound of the round)."""
        ids = self.ids if ids is None else ids
        self.ctx.stage.checks.bounded(self.round_index, ids, norms.detach(), release, bound)

    # ------------------------------------------------------------------ state rows
    def rows(self, name: str) -> Tensor:
        """The chunk's rows ``[c, ...]`` of the algorithm's per-client state ``name``; changes
        made in place are kept (written back when the chunk closes)."""
        rows = self._rows.get(name)
        if rows is None and self.canary is not None:  # a canary client's start from zeros
            real = self._store.read(name, self.real_ids)
            rows = self._rows[name] = self._canary_rows(real, real.new_zeros(()))
        elif rows is None:
            rows = self._rows[name] = self._store.read(name, self.ids)
        return rows

    # ------------------------------------------------------------------ randomness
    def normal(self, seed: int, std: float, extra: int = 0, select: Tensor | None = None) -> Tensor:
        """``[c, d]``: client ``i``'s ``N(0, std² I)`` draw from its stream
        ``(seed, noise, round, i, extra)`` (``extra``: e.g. the local step); with ``select`` (a
        boolean mask over the chunk) only the selected clients' rows."""
        ids = self.ids if select is None else self.ids[select.cpu()]
        if self.ctx.clients is None or bool((ids < self.ctx.clients).any()):  # not canaries'
            self.ctx.rows.require_dense("per-client noise draws")
        out = torch.empty(ids.numel(), self.ctx.dim, device=self.ctx.device, dtype=self.ctx.dtype)
        checks, keyed = self.ctx.stage.checks, self.ctx.keyed
        for row, client in zip(out, ids.tolist()):
            gen = keyed(seed, STREAM_NOISE, self.round_index, client, extra)
            row.normal_(0.0, std, generator=gen)
            if checks is not None:  # the check mode: the key used once, the declared std
                checks.drew(self.round_index, "client", keyed, std, client=client)
        hook = self.ctx.stage.hook
        if hook is not None:  # an audit's record canaries: the white-box auditor reads the draw
            hook.noise_drawn(ids, self.round_index, out)
        return out

    def noised(self, clean: Tensor, seed: int, std: float, extra: int = 0) -> Tensor:
        """``clean + z_i`` for every client ``i`` of the chunk: its record-level noise
        (:meth:`normal`: ``N(0, std² I)`` from its stream ``(seed, noise, round, i, extra)``,
        ``extra`` the local step) added to its clean clipped gradient ``clean`` (``[c, d]``).

        With an audit's record-level noise monitor on the stage
        (:class:`~pl_privfed.privacy.audit_noise.RecordNoise`), it is handed the real clients'
        rows of ``clean`` and of the result, whose difference is the noise that ran (taken from
        the two tensors, not from the draw; its declared std is the monitor's, from the ledger,
        not ``std``); an audit's canary clients' rows are not."""
        out = clean + self.normal(seed, std, extra)
        observe = getattr(self.ctx.stage.monitor, "observe_draws", None)
        if observe is not None and self.round_index >= 0 and self.real_ids.numel():
            observe(self.round_index, extra, self.real_ids, self._real(out), self._real(clean))
        return out

    def generators(self, seed: int, stream: int = STREAM_COMPRESSION, extra: int = 0):
        """Each client's generator of ``(seed, stream, round, client, extra)``, in chunk order
        (each is valid until the next one is drawn)."""
        for client in self.ids.tolist():
            yield self.ctx.keyed(seed, stream, self.round_index, client, extra)

    # ------------------------------------------------------------------ operators
    def _operator_stats(self, before: Tensor, after: Tensor) -> None:
        before, after = self._real(before), self._real(after)
        self.reduction.stat("clip_fraction", (after < before * (1 - 1e-6)).float())
        self.reduction.stat("norm_before", before)
        self.reduction.stat("update_norm", after)

    def scales(
        self, operator: Operator, v: Tensor, *, factor: float = 1.0, statistics: bool = True
    ) -> Tensor | None:
        """For a norm-based ``Ψ`` (``Ψ(g) = s(||g||) g``): each row's factor
        ``factor · s(||v_i||)`` (``[c]``, or ``[c, B]`` per example), so that
        ``factor · Ψ(v_i) = scales_i · v_i`` can be used without forming it (a weighted sum, an
        ``addcmul_`` into a memory): one pass over ``v`` for the norms. ``None`` for other
        operators. Records the operator's statistics as :meth:`apply` does."""
        if not operator.norm_based:
            return None
        if operator.is_identity:
            scale = torch.full(v.shape[:-1], float(factor), dtype=v.dtype, device=v.device)
            if statistics and self.statistics:
                norms = torch.linalg.vector_norm(v, dim=-1)
                self._operator_stats(norms, norms * abs(factor))
            return scale
        norms = torch.linalg.vector_norm(v, dim=-1)
        scale = operator.scale(norms)
        if isinstance(operator, AdaptiveClip):  # each sender's bit b_i, whatever the statistics
            self.reduction.stat(UNCLIPPED, self._real(operator.unclipped(norms)))
        if factor != 1.0:
            scale = scale * factor
        if statistics:
            self._operator_stats(norms, norms * scale.abs())
        return scale

    def apply(
        self,
        operator: Operator,
        v: Tensor,
        *,
        seed: int = 0,
        extra: int = 0,
        factor: float = 1.0,
        statistics: bool = True,
        inplace: bool = False,
    ) -> Tensor:
        """``factor · Ψ(v_i)`` for every row ``v_i`` of ``v`` (``[c, d]``, or ``[c, B, d]``
        per example).

        A random operator (rand-k) draws client ``i``'s randomness from its stream
        ``(seed, compression, round, i, extra)``. With ``statistics``, records the operator's
        ``clip_fraction`` (share of rows it shortened), ``norm_before`` and ``update_norm``
        (mean norm of the rows before and after, ``factor`` included). With ``inplace`` a
        norm-based operator scales ``v`` itself.
        """
        if operator.is_identity and factor == 1.0:
            self.scales(operator, v, statistics=statistics)
            return v
        scale = self.scales(operator, v, factor=factor, statistics=statistics)
        if scale is not None:
            hook = self.ctx.stage.hook
            if hook is not None and v.dim() == 2:  # record canaries in a clipped minibatch
                hook.operator_applied(self.ids, self.round_index, operator, v, factor)
            out = v.mul_(scale.unsqueeze(-1)) if inplace else v * scale.unsqueeze(-1)
            if self._record_checks() is not None and operator.bound is not None:
                bound = operator.bound * abs(factor)
                self._check_bound(torch.linalg.vector_norm(out, dim=-1), bound)
            return out
        if operator.random:
            out = torch.empty_like(v)
            for i, gen in enumerate(self.generators(seed, STREAM_COMPRESSION, extra)):
                out[i] = operator(v[i : i + 1], gen)[0]
        else:
            out = operator(v)
        if factor != 1.0:
            out = out.mul_(factor) if out is not v else out * factor
        if statistics and self.statistics:
            self._operator_stats(
                torch.linalg.vector_norm(v, dim=-1), torch.linalg.vector_norm(out, dim=-1)
            )
        return out

    # ------------------------------------------------------------------ the message stage
    def transmit(
        self,
        v: Tensor,
        operator: Operator | None = None,
        *,
        factor: float = 1.0,
        seed: int = 0,
        select: Tensor | None = None,
        key: str = "sent",
        channel: str = "client_to_server",
    ) -> Message:
        """Every (selected) client of the chunk sends ``Δ̂_i = factor · Ψ(v_i)`` (+ its DP noise)
        to the server, which receives their sum (:meth:`Reduction.received`).

        The message stage of the round (:mod:`pl_privfed.engine.message`) decides the rest:
        whether the messages are formed (per-client noise, secure aggregation) or, for a
        norm-based ``Ψ``, kept as ``v`` and scales; the noise; the masks; the message counts on
        ``channel``; the operator's statistics (the metrics the server reads back).

        Args:
            v: ``[c, d]`` the operator's input (overwritten with the message where it is
                formed).
            operator: ``Ψ`` (``None``: the rows are the messages, e.g. initial memories).
            factor: ``β`` multiplying ``Ψ``'s output.
            seed: seed of a random operator's per-client streams (rand-k).
            select: a boolean mask over the chunk's clients: only these send (the others'
                ``Δ_i`` are still returned, e.g. for their memories).
            key: the name of the server's sum.
            channel: the message channel counted for communication.

        Returns:
            the clean ``Δ_i`` of every client of the chunk (noise excluded), for the clients'
            own memory updates.
        """
        stage, k = self.ctx.stage, self.round_index
        canaries = None
        if self.canary is not None:  # the canary clients that send, and the real ones
            joins = torch.ones(self.size, dtype=torch.bool) if select is None else select.cpu()
            canaries, select = joins & self.canary, joins & ~self.canary
        if select is not None and bool(select.all()):
            select = None
        mask = None if select is None else select.to(v.device)
        scale = None
        if operator is not None and not stage.forms_rows(k):
            scale = self.scales(operator, v, factor=factor)
        checks = stage.checks if stage.noised and k >= 0 else None
        if checks is not None and checks.record_level:
            checks = None  # a record-level release is bounded by its clip (clipped_mean, apply)
        if scale is not None:  # Ψ(v_i) = s_i v_i: the sum Σ_i s_i v_i, nothing formed
            senders = v if mask is None else v[mask]
            if checks is not None:  # (a) of the check mode: ||s_i v_i|| within the bound
                norms = torch.linalg.vector_norm(senders, dim=-1)
                sent_scale = scale if mask is None else scale[mask]
                self._check_bound(
                    norms * sent_scale.abs(), ids=self._sender_ids(select), release=key
                )
            if senders.shape[0]:
                weights = scale if mask is None else scale * mask.to(scale.dtype)
                self.add(key, v, weights=weights)
                self._sent(key, channel, senders, compressed=False)
            self._send_canaries(key, canaries, v, scale)
            return Message(v, scale)
        if operator is not None:
            v = self.apply(operator, v, seed=seed, factor=factor, inplace=True)
        self._send_canaries(key, canaries, v)
        sent = v if mask is None else v[mask]
        if sent.shape[0] == 0:
            return Message(v)
        if checks is not None:  # (a) of the check mode: the formed messages before their noise
            norms = torch.linalg.vector_norm(sent, dim=-1)
            self._check_bound(norms, ids=self._sender_ids(select), release=key)
        if stage.draws_per_client(k):  # Δ̂_i = Δ_i + z_i, each client's own draw
            self.add(key + ":clean", sent)
            sent = sent + self.normal(stage.noise_seed, stage.client_noise_std, select=select)
        if stage.secure(k):
            self._secure_share(key, sent, self.ids if select is None else self.ids[select.cpu()])
        else:
            self.add(key, sent)
        sparse = operator is not None and operator.sparsifying and not stage.clients_noise(k)
        self._sent(key, channel, sent, compressed=sparse)
        return Message(v)

    def _send_canaries(
        self, key: str, canaries: Tensor | None, v: Tensor, scale: Tensor | None = None
    ) -> None:
        """The canary clients ``canaries`` (a mask over the chunk) send their rows of the
        message ``v`` (times ``scale``: the same operator call as the real clients'), each
        summed by the representation's own code (:meth:`~pl_privfed.engine.ClientRows.
        contributions`), to the sum ``key:canaries`` that :meth:`Reduction.received` adds to
        ``key``, with the noise the placement gives a sender (:meth:`normal`, keyed by the
        canary's index as a client's is by its own) where clients noise; the hook reads both
        (the white-box auditor). Only the hook's sum receives canaries; they are never counted
        as senders or messages."""
        hook, stage, k = self.ctx.stage.hook, self.ctx.stage, self.round_index
        if canaries is None or not bool(canaries.any()) or key != getattr(hook, "key", key):
            return
        weights = None if scale is None else scale[canaries.to(scale.device)]
        rows, ids = self.ctx.rows, self.ids[canaries]  # summed as the real clients' are
        clean = rows.contributions(ids, v[canaries.to(v.device)], weights, self.ctx.dim)
        noise = None
        if stage.clients_noise(k):
            noise = self.normal(stage.noise_seed, stage.client_noise_std, select=canaries)
        self.reduction.add_rows(key + CANARIES, clean if noise is None else clean + noise)
        hook.sent(k, key, ids - self.ctx.clients, clean, noise)

    def _sender_ids(self, select: Tensor | None) -> Tensor:
        """The chunk's clients that send (``select``: a boolean mask over the chunk)."""
        return self.ids if select is None else self.ids[select.cpu()]

    def _sent(self, key: str, channel: str, rows: Tensor, compressed: bool) -> None:
        """Count the messages ``rows`` on ``channel`` and their senders for the sum ``key``."""
        self.send(channel, rows, compressed=compressed)
        self.reduction.stat(key + ":senders", torch.ones(rows.shape[0]))

    def _secure_share(self, key: str, rows: Tensor, ids: Tensor) -> None:
        """The share of the clients ``ids`` (rows ``rows``) of a secure sum over the round's
        participants (masks of round ``k + 1``: the initialization's are round 0)."""
        self.ctx.rows.require_dense("secure aggregation's masked shares")
        agg = self.ctx.stage.secure_aggregation
        masked, absolute = agg.partial_sum(rows, self.round_index + 1, self.ctx.participants, ids)
        self.reduction.add(key + ":abs", absolute)
        self.reduction.add(key, masked)
        self.reduction.sums[key].remainder_(agg.modulus)

    # ------------------------------------------------------------------ the reduce
    def add(self, name: str, rows: Tensor, weights: Tensor | None = None) -> None:
        """Add ``Σ_i w_i rows_i`` over the chunk's rows to the round's sum ``name``, as the
        round's row representation adds them (:meth:`~pl_privfed.engine.rows.ClientRows.add`:
        rows of ``d`` at once, coordinates deferred and expanded to ``[d]``); the canary
        clients' rows are left out (they reach only the message stage's sum)."""
        ids = self.ids
        if self.canary is not None and rows.shape[0] == self.size:
            ids, rows = self.real_ids, self._real(rows)
            weights = None if weights is None else self._real(weights)
        self.ctx.rows.add(self.reduction, name, ids, rows, weights)

    def stat(self, name: str, values: Tensor) -> None:
        """Per-client values of statistic ``name`` (its mean over clients is logged)."""
        self.reduction.stat(name, self._real(values))

    def send(self, channel: str, rows: Tensor | None = None, *, compressed: bool = False) -> None:
        """Record the messages ``rows`` (one per client; without ``rows`` one per client of the
        chunk) on ``channel``. Only a sparsifier's output (``compressed``: top-k, rand-k) is
        counted by its non-zeros, which the encoding may then send sparse; any other message (a
        gradient, a clipped or normalized vector, a noised vector, a model) is dense, as a
        deployed system sends it (:data:`~pl_privfed.communication.ENCODING`)."""
        rows = None if rows is None else self._real(rows)
        count = int(self.real_ids.numel()) if rows is None else rows.shape[0]
        if compressed and rows is not None:
            nnz = count_nonzeros(rows)
        else:
            nnz = torch.full((count,), self.ctx.dim, dtype=torch.int64)
        self.reduction.send(channel, nnz)

    # ------------------------------------------------------------------ engine
    def close(self) -> None:
        """Write the state rows back and hand the chunk's buffers to the reduce."""
        for name, rows in self._rows.items():
            self._store.write(name, self.real_ids, self._real(rows))
        self._rows = {}
        if self._buffer_sums is not None:
            self.reduction.add_buffers(self._buffer_sums, int(self.real_ids.numel()))
            self._buffer_sums = None
