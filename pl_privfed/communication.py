"""Messages of a round and how many bits they take on the wire.

A round never holds every client's message at once (the engine processes clients in chunks), so
a :class:`Messages` records what the bit count needs: the number of non-zero values of each
message, counted while its chunk is in memory (:func:`count_nonzeros`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ENCODING", "Messages", "count_nonzeros", "message_bits", "per_agent_bits"]


def count_nonzeros(vectors: Tensor) -> Tensor:
    """Non-zero values of each row of ``vectors`` (``[m, d]``; a ``[d]`` vector is one row)."""
    return torch.count_nonzero(vectors.reshape(-1, vectors.shape[-1]), dim=-1)


@dataclass
class Messages:
    """Vectors of dimension ``dim`` sent over one channel in one round.

    Attributes:
        channel: ``"client_to_server"``, ``"server_to_client"`` or ``"agent_to_agent"``.
        nonzeros: ``[m]``, the non-zero values of each of the ``m`` messages.
        dim: ``d``, the length of every message.
        copies: how many times each message is sent (e.g. a broadcast to ``n`` clients).
    """

    channel: str
    nonzeros: Tensor
    dim: int
    copies: int = 1

    @classmethod
    def of(cls, channel: str, vectors: Tensor, copies: int = 1) -> Messages:
        """The messages ``vectors`` (``[m, d]``, or ``[d]`` for one message), their non-zeros
        counted (for a sparsifier's output)."""
        return cls(channel, count_nonzeros(vectors), int(vectors.shape[-1]), copies)

    @classmethod
    def dense(cls, channel: str, dim: int, count: int = 1, copies: int = 1) -> Messages:
        """``count`` dense messages of ``dim`` values (e.g. the model broadcast)."""
        return cls(channel, torch.full((count,), dim, dtype=torch.int64), dim, copies)

    @property
    def rows(self) -> int:
        return int(self.nonzeros.numel())


#: How :func:`message_bits` counts, written into ``summary.json`` beside the totals.
ENCODING = (
    "per message (one vector of d values): a sparsifier's output (top-k, rand-k) costs "
    "min(dense, sparse) bits, dense = d * value_bits, sparse = nnz * (value_bits + ceil(log2 d)) "
    "(each non-zero as value + index); every other message (gradients, clipped or normalized "
    "vectors, noised vectors, models) is sent dense; a vector sent to several receivers (copies) "
    "is counted once per copy; a broadcast to graph neighbours (agent_to_agent) is counted once "
    "per sending agent"
)


def message_bits(nonzeros: Tensor, dim: int, value_bits: int = 32) -> Tensor:
    """Bits of each message under the cheaper of two encodings.

    * dense: ``d`` values of ``value_bits`` bits;
    * sparse: for each non-zero, its value and its index (``ceil(log2 d)`` bits).

    A compressed message (top-k, random-k) is counted as the sparse encoding it needs; a dense or
    noisy vector as dense.

    >>> message_bits(torch.tensor([1, 4]), 4)
    tensor([ 34., 128.], dtype=torch.float64)
    """
    index_bits = max(1, math.ceil(math.log2(dim))) if dim > 1 else 1
    nnz = nonzeros.to(torch.float64)
    dense = torch.full_like(nnz, float(dim * value_bits))
    return torch.minimum(dense, nnz * (value_bits + index_bits))


def per_agent_bits(message: Messages, value_bits: int = 32) -> float:
    """Bits of ``message`` per agent endpoint: its total over (rows × copies).

    For ``m`` messages (one per client or agent, ``copies = 1``) this is the mean bits each
    sender sends; for one vector sent to ``n`` clients (``copies = n``) the bits each client
    receives.

    >>> per_agent_bits(Messages("agent_to_agent", torch.tensor([1, 2]), 2))
    48.5
    """
    bits = message_bits(message.nonzeros, message.dim, value_bits)
    return float(bits.sum()) / max(bits.numel(), 1)
