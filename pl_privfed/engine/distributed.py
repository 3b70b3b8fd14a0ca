"""Clients sharded over processes: which clients a process holds, and the collectives of a round.

With ``--trainer.strategy ddp --trainer.devices N`` (or several nodes) every process runs the
same rounds on a contiguous block of the clients: rank ``r`` of ``W`` holds clients
``[r·⌈n/W⌉, (r+1)·⌈n/W⌉)`` — their per-client state rows, and it computes only their part of
each round's map. The reduce is completed by summing every process's partial sums
(:meth:`ClientShard.all_reduce_reduction`, one ``all_reduce`` per dtype), so every process
runs the same server step on the same sums and holds the same server state and model.

Each client's randomness is keyed by ``(seed, round, client)`` (:mod:`pl_privfed.rng`)
and the cohort by ``(seed, round)``, so the iterates do not depend on the number of processes,
up to the order of floating-point sums.

A single process is a :class:`ClientShard` with ``world_size = 1``, whose collectives do
nothing.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from pl_privfed.compat.lightning import shard_without_ddp_wrapper
from pl_privfed.engine.reduce import Reduction

__all__ = ["ClientShard", "adopt_strategy", "check_strategy", "close_process_group"]


class ClientShard:
    """The clients ``[start, stop)`` of process ``rank`` among ``world_size``.

    Args:
        num_clients: ``n``, the whole federation.
        rank: this process's global rank.
        world_size: the number of processes.
        group: the ``torch.distributed`` process group (default: the world).
    """

    def __init__(self, num_clients: int, rank: int = 0, world_size: int = 1, group=None) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank}")
        self.num_clients, self.rank, self.world_size, self.group = (
            num_clients,
            rank,
            world_size,
            group,
        )
        self.block = math.ceil(num_clients / world_size)
        self.start = min(num_clients, rank * self.block)
        self.stop = min(num_clients, self.start + self.block)

    @classmethod
    def of_trainer(cls, trainer: Any, num_clients: int) -> ClientShard:
        """The shard of this process under ``trainer``'s strategy (one process: everything)."""
        world = int(getattr(trainer, "world_size", 1) or 1)
        rank = int(getattr(trainer, "global_rank", 0) or 0)
        if world > 1 and not dist.is_initialized():
            raise RuntimeError("the trainer has several processes but no process group")
        return cls(num_clients, rank, world)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def size(self) -> int:
        """The number of clients this process holds."""
        return self.stop - self.start

    def owner(self, client: int) -> int:
        """The rank that holds ``client``."""
        return min(self.world_size - 1, int(client) // self.block)

    def bounds(self, rank: int) -> tuple[int, int]:
        start = min(self.num_clients, rank * self.block)
        return start, min(self.num_clients, start + self.block)

    def owned(self, clients: Tensor) -> Tensor:
        """The clients of ``clients`` (sorted global indices) that this process holds."""
        if not self.distributed:
            return clients
        return clients[(clients >= self.start) & (clients < self.stop)]

    def local(self, clients: Tensor) -> Tensor:
        """Rows of this process's state tables of the (held) global ``clients``."""
        return clients - self.start if self.start else clients

    # ------------------------------------------------------------------ collectives
    def all_reduce_(self, tensors: list[Tensor], op=None) -> None:
        """Sum (or ``op``) every tensor over the processes, in place: one collective per
        dtype and device, on one flat buffer."""
        if not self.distributed or not tensors:
            return
        op = dist.ReduceOp.SUM if op is None else op
        groups: dict[tuple, list[Tensor]] = {}
        for t in tensors:
            groups.setdefault((t.dtype, t.device), []).append(t)
        for same in groups.values():
            flat = torch.cat([t.reshape(-1) for t in same])
            dist.all_reduce(flat, op=op, group=self.group)
            offset = 0
            for t in same:
                t.copy_(flat[offset : offset + t.numel()].view_as(t))
                offset += t.numel()

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.distributed:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def all_reduce_reduction(self, reduction: Reduction) -> None:
        """Complete a round's reduce: every process's partial sums, statistics, losses,
        buffers and message counts, summed over the processes (in place)."""
        if not self.distributed:
            return
        keys = {
            "sums": {k: (tuple(v.shape), v.dtype) for k, v in reduction.sums.items()},
            "stats": sorted(reduction.stat_sums),
            "buffers": {k: (tuple(v.shape), v.dtype) for k, v in reduction.buffer_sums.items()},
            "messages": {k: torch.cat(v) for k, v in reduction.nonzeros.items()},
            "counts": (reduction.loss_count, reduction.buffer_count, dict(reduction.stat_counts)),
        }
        every = self.all_gather_object(keys)
        device = next((v.device for v in reduction.sums.values()), torch.device("cpu"))
        for other in every:  # a process whose clients added nothing still takes part
            for name, (shape, dtype) in other["sums"].items():
                if name not in reduction.sums:
                    reduction.sums[name] = torch.zeros(shape, dtype=dtype, device=device)
            for name, (shape, dtype) in other["buffers"].items():
                if name not in reduction.buffer_sums:
                    reduction.buffer_sums[name] = torch.zeros(shape, dtype=dtype, device=device)
        names = sorted(reduction.sums)
        self.all_reduce_([reduction.sums[k] for k in names])
        floats = sorted(k for k, v in reduction.buffer_sums.items() if v.is_floating_point())
        integers = sorted(k for k in reduction.buffer_sums if k not in floats)
        self.all_reduce_([reduction.buffer_sums[k] for k in floats])
        self.all_reduce_([reduction.buffer_sums[k] for k in integers], op=dist.ReduceOp.MAX)
        stat_names = sorted({k for other in every for k in other["stats"]})
        zero = torch.zeros((), dtype=torch.float64)
        totals = [reduction.stat_sums.get(k, zero) for k in stat_names]
        loss = reduction.loss_sum.detach() if reduction.loss_sum is not None else zero
        scalar = torch.stack([t.double().cpu() for t in (*totals, loss)])
        self.all_reduce_([scalar])
        for i, k in enumerate(stat_names):
            reduction.stat_sums[k] = scalar[i]
            reduction.stat_counts[k] = sum(o["counts"][2].get(k, 0) for o in every)
        reduction.loss_count = sum(o["counts"][0] for o in every)
        reduction.loss_sum = scalar[-1].to(device) if reduction.loss_count else None
        reduction.buffer_count = sum(o["counts"][1] for o in every)
        reduction.nonzeros = {}
        for other in every:  # in rank order: the messages of clients 0..n-1
            for key, nnz in other["messages"].items():
                reduction.nonzeros.setdefault(key, []).append(nnz)

    def gather_rows(self, local: Tensor) -> Tensor:
        """The whole federation's rows ``[n, ...]`` of a state table (every process's rows),
        on every process (for checkpoints)."""
        if not self.distributed:
            return local
        padded = local.new_zeros(self.block, *local.shape[1:])
        padded[: local.shape[0]] = local
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        rows = [part[: self.bounds(r)[1] - self.bounds(r)[0]] for r, part in enumerate(parts)]
        return torch.cat(rows)

    def row(self, table: Tensor, client: int) -> Tensor:
        """Client ``client``'s row of a state table, on every process (its owner broadcasts)."""
        owner = self.owner(client)
        if not self.distributed:
            return table[client]
        out = (
            table[client - self.start].clone()
            if owner == self.rank
            else table.new_empty(table.shape[1:])
        )
        dist.broadcast(out, src=owner, group=self.group)
        return out

    def exchange(
        self, table: Tensor, send: dict[int, Tensor], receive: dict[int, Tensor]
    ) -> Tensor:
        """Rows of other processes: this process sends ``table[send[r]]`` (local rows) to each
        rank ``r`` and receives ``len(receive[s])`` rows from each rank ``s``, in the order of
        ``receive[s]``; returns the received rows, stacked in rank order (point to point, so
        only the rows a neighbour needs cross the wire)."""
        if not self.distributed:
            return table.new_empty(0, *table.shape[1:])
        ops, buffers = [], []
        for peer in range(self.world_size):
            if peer != self.rank and peer in send and send[peer].numel():
                rows = table.index_select(0, send[peer].to(table.device)).contiguous()
                ops.append(dist.P2POp(dist.isend, rows, peer, self.group))
                buffers.append(rows)
        received = []
        for peer in range(self.world_size):
            if peer != self.rank and peer in receive and receive[peer].numel():
                buf = table.new_empty(receive[peer].numel(), *table.shape[1:])
                ops.append(dist.P2POp(dist.irecv, buf, peer, self.group))
                received.append(buf)
        if ops:
            for request in dist.batch_isend_irecv(ops):
                request.wait()
        if not received:
            return table.new_empty(0, *table.shape[1:])
        return torch.cat(received)


def adopt_strategy(trainer: Any) -> None:
    """Make the trainer's strategy one that shards clients over its processes, or refuse it.

    A single device: nothing to do. Lightning's ``DDPStrategy`` (``"ddp"``, ``"ddp_spawn"``,
    any of its subclasses, on CPUs with gloo or GPUs with NCCL, one node or several): kept, but
    without wrapping the module in ``DistributedDataParallel``. Anything else (FSDP, DeepSpeed,
    model parallelism, XLA): a ``ValueError`` naming it, before training.
    """
    strategy = trainer.strategy
    check_strategy(strategy)
    _, ddp = _lightning_strategies(strategy)
    if isinstance(strategy, ddp) and not getattr(strategy, "shards_clients", False):
        shard_without_ddp_wrapper(strategy)  # the module sums what the algorithm needs itself


def check_strategy(strategy: Any) -> None:
    """``ValueError`` unless ``strategy`` is a single device or Lightning's DDP (any variant)."""
    if strategy is None or isinstance(strategy, _lightning_strategies(strategy)):
        return
    raise ValueError(
        f"trainer.strategy={type(strategy).__name__} is not supported: pl-privfed shards the "
        "clients over processes with strategy 'ddp' (CPU with gloo, CUDA with NCCL, "
        "--trainer.devices N and --trainer.num_nodes M); sharding the model (FSDP, DeepSpeed, "
        "model parallelism) does not apply to a simulated federation"
    )


#: Lightning's two namespaces (``pl_privfed.lightning``), each the package its strategies are in.
_NAMESPACES = ("pytorch_lightning", "lightning.pytorch")


def _lightning_strategies(strategy: Any) -> tuple[type, type]:
    """``(SingleDeviceStrategy, DDPStrategy)`` of the Lightning namespace ``strategy`` comes from.

    ``pytorch_lightning`` and ``lightning.pytorch`` hold distinct copies of the same classes, and
    this module serves both (it imports neither: :mod:`pl_privfed.mirror` then shares it, with
    the algorithms that import the engine, between ``pl_privfed`` and ``pl_privfed.lightning``).
    The namespace is the one of the first class in the strategy's MRO that belongs to one;
    ``pytorch_lightning`` for an object of neither, which is then refused as not Lightning's.
    """
    namespace = _NAMESPACES[0]
    for cls in type(strategy).__mro__:
        found = [n for n in _NAMESPACES if cls.__module__.startswith(n + ".")]
        if found:
            namespace = found[0]
            break
    strategies = importlib.import_module(f"{namespace}.strategies")
    return strategies.SingleDeviceStrategy, strategies.DDPStrategy


def close_process_group() -> None:
    """Destroy the default process group, if one was started, before the process exits.

    Lightning's DDP strategy starts a process group and leaves it open. A gloo group that is
    still open when the interpreter shuts down can abort the process (``terminate called
    without an active exception``, SIGABRT, seen here in about half of the two-process runs):
    its worker threads outlive the interpreter. Call this once at the end of a script that ran
    ``Trainer(strategy="ddp")``; ``pl-privfed`` does after every command.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
