"""The reduce of a round: what the server needs from the clients' map, summed over chunks.

The client part of every server-based algorithm only ever hands the server *sums* over clients
(messages, memories' increments, statistics); a :class:`Reduction` accumulates them chunk by
chunk (and, with several processes, rank by rank: :meth:`ClientShard.all_reduce_reduction`), so no
``[n, d]`` tensor of the round is ever held.

Three kinds of entries:

* vector sums (:meth:`Reduction.add`): e.g. ``Σ_i Δ̂_i``;
* statistics (:meth:`Reduction.stat`): per-client values whose sum and count are kept, e.g.
  every client's norm before the operator (the run's ``norm_before`` is their mean);
* messages (:meth:`Reduction.send`): the number of non-zero values of every message of a
  channel, from which :mod:`pl_privfed.communication` counts bits.

The server reads the clients' messages back through :meth:`Reduction.received`, the server side
of the message stage (:mod:`pl_privfed.engine.message`): the sum as the server receives it
(noise added, masks removed) and the round's message statistics.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pl_privfed.communication import Messages
from pl_privfed.engine.message import CANARIES, MessageStage, noise_to_signal
from pl_privfed.rng import KeyedGenerator

__all__ = ["Reduction", "expand_together"]


class Reduction:
    """Running sums of a round's client map (see the module docstring).

    Args:
        dim: ``d``.
        round_index: the round (``-1``: the memory initialization).
        stage: the round's message stage.
        keyed: the round's keyed generator (the server's draws).
        device: where the server's vectors live.
        dtype: their dtype.

    Attributes:
        released: ``False`` once :meth:`received` aborted a sum (the stage's placement refused
            to release the round: distributed noise with too few senders).
    """

    def __init__(
        self,
        dim: int = 0,
        *,
        round_index: int = -1,
        stage: MessageStage | None = None,
        keyed: KeyedGenerator | None = None,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        self.dim = dim
        self.round_index = round_index
        self.stage = stage if stage is not None else MessageStage()
        self.keyed = keyed if keyed is not None else KeyedGenerator(device)
        self.device, self.dtype = torch.device(device), dtype
        self.sums: dict[str, Tensor] = {}
        self.stat_sums: dict[str, Tensor] = {}
        self.stat_counts: dict[str, int] = {}
        self.nonzeros: dict[str, list[Tensor]] = {}
        self.loss_sum: Tensor | None = None
        self.loss_count = 0
        self.buffer_sums: dict[str, Tensor] = {}
        self.buffer_count = 0
        self.released = True
        #: sums a row representation deferred (:meth:`defer`), per name: the chunks' ``(ids,
        #: rows)``, expanded into :attr:`sums` by :meth:`flush` (or :func:`expand_together`)
        self.pending: dict[str, list[tuple[Tensor, Tensor]]] = {}
        #: the representation of the deferred rows (:class:`~pl_privfed.engine.ClientRows`)
        self.deferred_rows = None

    # ------------------------------------------------------------------ accumulate
    def add(self, name: str, value: Tensor) -> None:
        """``sums[name] += value`` (the first value is copied)."""
        current = self.sums.get(name)
        if current is None:
            self.sums[name] = value.detach().clone()
        else:
            current.add_(value)

    def add_rows(self, name: str, rows: Tensor, weights: Tensor | None = None) -> None:
        """``sums[name] += Σ_i w_i rows_i`` over the rows of ``rows [c, d]`` (``w = 1``)."""
        if rows.shape[0] == 0:
            return
        current = self.sums.get(name)
        if current is None:
            current = self.sums[name] = rows.new_zeros(rows.shape[1:])
        if weights is None and rows.shape[0] == 1:
            current.add_(rows[0])
        elif rows.dim() == 1:  # one number per client
            current.add_(rows.sum() if weights is None else rows @ weights.to(rows.dtype))
        else:  # Σ_i w_i rows_i as one matrix-vector product: one pass, no [d] temporary
            weights = rows.new_ones(rows.shape[0]) if weights is None else weights.to(rows.dtype)
            current.view(-1).addmv_(rows.reshape(rows.shape[0], -1).T, weights)

    def defer(self, name: str, representation, ids: Tensor, rows: Tensor) -> None:
        """Rows ``rows`` of the clients ``ids`` in a ``representation`` that expands them
        (:meth:`~pl_privfed.engine.ClientRows.expand`: coordinates in the clients' data span),
        to be added to ``sums[name]`` by :meth:`flush`: one expansion per sum over the round's
        clients, or one for several configurations' sums (:func:`expand_together`), instead
        of one per chunk."""
        self.deferred_rows = representation
        self.pending.setdefault(name, []).append((ids, rows))

    def _pending_rows(self) -> tuple[Tensor, list[tuple[str, Tensor]]]:
        """The pending sums' clients and, per name, their rows over those clients."""
        ids = None
        out = []
        for name, parts in self.pending.items():
            got = torch.cat([i for i, _ in parts])
            if ids is not None and not torch.equal(got, ids):
                raise ValueError(f"pending sum {name!r} has other clients than the round's")
            ids = got
            out.append((name, torch.cat([r for _, r in parts])))
        return ids, out

    def flush(self) -> None:
        """Expand the deferred sums (:meth:`defer`) into :attr:`sums`."""
        if self.pending:
            expand_together([self])

    def stat(self, name: str, values: Tensor) -> None:
        """Add every element of ``values`` (one per client) to statistic ``name``."""
        values = values.detach()
        total = values.sum().to(torch.float64)
        if name in self.stat_sums:
            self.stat_sums[name] = self.stat_sums[name] + total
            self.stat_counts[name] += values.numel()
        else:
            self.stat_sums[name] = total
            self.stat_counts[name] = values.numel()

    def send(self, channel: str, nonzeros: Tensor) -> None:
        """Record messages on ``channel``: the non-zero count of each (``[rows]``)."""
        self.nonzeros.setdefault(channel, []).append(nonzeros.detach().to("cpu", torch.int64))

    def add_losses(self, losses: Tensor) -> None:
        """The clients' training losses of the round (their mean is ``train/loss``)."""
        total = losses.detach().sum()
        self.loss_sum = total if self.loss_sum is None else self.loss_sum + total
        self.loss_count += losses.numel()

    def add_buffers(self, sums: dict[str, Tensor], count: int) -> None:
        """Sums over ``count`` clients of their updated model buffers (BatchNorm statistics);
        integer buffers (``num_batches_tracked``) are the same for every client and kept as is."""
        for name, value in sums.items():
            if not value.is_floating_point():
                self.buffer_sums[name] = value
            elif name in self.buffer_sums:
                self.buffer_sums[name] = self.buffer_sums[name] + value
            else:
                self.buffer_sums[name] = value
        self.buffer_count += count

    # ------------------------------------------------------------------ read
    def get(self, name: str, like: Tensor | None = None) -> Tensor:
        """``sums[name]``, or zeros shaped like ``like`` when no client added to it."""
        value = self.sums.get(name)
        if value is not None:
            return value
        if like is None:
            raise KeyError(f"no client contributed to {name!r}")
        return torch.zeros_like(like)

    def received(self, key: str = "sent") -> tuple[Tensor, dict[str, Tensor]]:
        """What the server receives of the messages the clients sent with
        :meth:`~pl_privfed.engine.ClientChunk.transmit` under ``key``, and the round's message
        statistics: ``(Σ_i Δ̂_i, metrics)``.

        The sum is unmasked when securely aggregated and carries the round's DP noise (every
        client's own, or drawn here as the sum of the senders' noises, or the server's central
        draw); ``metrics`` holds the operator's statistics (``clip_fraction``, ``norm_before``,
        ``update_norm``) and, when noised and someone sent, ``noise_to_signal``. A round the
        stage aborts (distributed noise with fewer than ``t`` senders) receives zeros, sets
        :attr:`released` to ``False`` and reports ``metrics["aborted"] = 1``: nothing was
        released. The canary clients' messages (``key:canaries``, noised as the chunks' senders
        are) are added last (:meth:`_with_hook`); the metrics and the abort rule are the real
        clients'.
        """
        stage, k = self.stage, self.round_index
        metrics = self.operator_metrics()
        senders = self.count(key + ":senders")
        if stage.aborts(senders, k):
            self.released = False
            metrics["aborted"] = torch.tensor(1.0)
            return torch.zeros(self.dim, device=self.device, dtype=self.dtype), metrics
        if stage.secure(k) and key in self.sums:
            agg = stage.secure_aggregation
            total = agg.finish(self.sums[key], self.get(key + ":abs"), senders)
            total = total.to(self.device, self.dtype)
        else:
            total = self.get(key, like=torch.zeros(self.dim, device=self.device, dtype=self.dtype))
        clean = total
        if stage.noised and k >= 0:
            if stage.draws_per_client(k):
                clean = self.get(key + ":clean", like=total)
            else:
                clean = total.clone()
                total = total + stage.noise_of_sum(senders, k, self.keyed, total)
            if senders:
                metrics["noise_to_signal"] = noise_to_signal(total, clean)
            if stage.monitor is not None:  # an audit's noise test: the noise as released
                stage.monitor.observe(k, key, total.double() - clean.double(), senders)
        return self._with_hook(key, total, clean, senders), metrics

    def _with_hook(self, key: str, total: Tensor, clean: Tensor, senders: int) -> Tensor:
        """``total`` (the real clients' sum as received, ``clean`` before its noise) plus the
        canary clients' messages of this round (``key:canaries``: what the chunks'
        :meth:`~pl_privfed.engine.ClientChunk.transmit` formed for them, through the round's
        operator call and with their per-client noise where clients noise); they are not
        senders of the abort rule, and every other draw of the round is the same with or
        without them. The held-out canaries draw their white-box null
        (:meth:`~pl_privfed.engine.MessageStage.canary_noise`, adding nothing). The hook
        then observes the received sum and, where the placement's
        guarantee rests on the sum's noise (central, distributed), the part of the real
        clients' noise ``total − clean`` that the certificate's adversary cannot subtract
        (:meth:`~pl_privfed.engine.MessageStage.unknown_noise`: the aggregator's draw, or the
        ``t`` honest senders' shares), which is what the white-box auditor tests."""
        hook, k, stage = self.stage.hook, self.round_index, self.stage
        if hook is None:
            return total
        shared = None
        if stage.noised and k >= 0 and stage.placement.noises_sum:
            shared = stage.unknown_noise(total - clean, senders, k, self.keyed)
        part = self.sums.get(key + CANARIES)
        if part is not None:
            total = total + part.to(total.device, total.dtype)
        hook.noise(k, key, lambda j: stage.canary_noise(j, k, self.keyed, total))
        hook.observe(k, key, total, shared_noise=shared)
        return total

    def mean(self, name: str) -> Tensor:
        """The mean of statistic ``name`` over the clients that reported it (NaN if none)."""
        count = self.stat_counts.get(name, 0)
        if not count:
            return torch.tensor(float("nan"))
        return (self.stat_sums[name] / count).float()

    def count(self, name: str) -> int:
        return self.stat_counts.get(name, 0)

    def loss(self) -> Tensor | None:
        """Mean training loss of the round's computing clients (``None`` if none computed)."""
        if self.loss_sum is None or not self.loss_count:
            return None
        return self.loss_sum / self.loss_count

    def buffers(self) -> dict[str, Tensor] | None:
        """The engine's rule for the buffers after a round: the mean over the clients of their
        updated copies (integer buffers: their common value); ``None`` when none were updated."""
        if not self.buffer_count:
            return None
        return {
            k: v / self.buffer_count if v.is_floating_point() else v
            for k, v in self.buffer_sums.items()
        }

    def messages(self, key: str, copies: int = 1, channel: str | None = None) -> Messages:
        """The messages recorded under ``key`` (empty if none), on ``channel`` (default: the
        key itself; two kinds of message on one channel are recorded under two keys)."""
        parts = self.nonzeros.get(key, [])
        nnz = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
        return Messages(channel or key, nnz, self.dim, copies=copies)

    def operator_metrics(self) -> dict[str, Tensor]:
        """``clip_fraction``, ``norm_before`` and ``update_norm`` from the statistics that
        :meth:`pl_privfed.engine.ClientChunk.apply` records."""
        out = {}
        for key in ("clip_fraction", "norm_before", "update_norm"):
            if self.count(key):
                out[key] = self.mean(key)
        return out


def expand_together(reductions: list[Reduction]) -> None:
    """Expand the deferred sums (:meth:`Reduction.defer`) of several reductions, e.g. the
    configurations of a grid that share a seed's data: those with the same representation and
    clients in one call of its :meth:`~pl_privfed.engine.ClientRows.expand` (in the clients'
    data span one product, which reads the clients' bases once for all of them)."""
    groups: dict[tuple[int, bytes], list[tuple[Reduction, Tensor, list]]] = {}
    for reduction in reductions:
        if not reduction.pending:
            continue
        ids, rows = reduction._pending_rows()
        key = (id(reduction.deferred_rows), ids.cpu().numpy().tobytes())
        groups.setdefault(key, []).append((reduction, ids, rows))
    for members in groups.values():
        representation, ids = members[0][0].deferred_rows, members[0][1]
        every = [rows for _, _, named in members for _, rows in named]
        sums = iter(representation.expand(ids, every))
        for reduction, _, named in members:
            for name, _ in named:
                reduction.add(name, next(sums))
            reduction.pending = {}
