"""Messages of a round and how many bits they take on the wire."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["ENCODING", "Messages", "message_bits", "per_agent_bits"]


@dataclass
class Messages:
    """Vectors sent over one channel in one round.

    Attributes:
        channel: ``"client_to_server"``, ``"server_to_client"`` or ``"agent_to_agent"``.
        vectors: ``[m, d]`` (one row per message) or ``[d]`` (one message).
        copies: how many times each vector is sent (e.g. a broadcast to ``n`` clients).
    """

    channel: str
    vectors: Tensor
    copies: int = 1


#: How :func:`message_bits` counts, written into ``summary.json`` beside the totals.
ENCODING = (
    "per message (one vector of d values): min(dense, sparse) bits, dense = d * value_bits, "
    "sparse = nnz * (value_bits + ceil(log2 d)) (each non-zero as value + index); a vector sent "
    "to several receivers (copies) is counted once per copy; a broadcast to graph neighbours "
    "(agent_to_agent) is counted once per sending agent"
)


def message_bits(vectors: Tensor, value_bits: int = 32) -> Tensor:
    """Bits of each message (row) under the cheaper of two encodings.

    * dense: ``d`` values of ``value_bits`` bits;
    * sparse: for each non-zero, its value and its index (``ceil(log2 d)`` bits).

    A compressed message (top-k, random-k) is counted as the sparse encoding it needs; a dense or
    noisy vector as dense.

    >>> message_bits(torch.tensor([[0.0, 2.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]))
    tensor([ 34., 128.], dtype=torch.float64)
    """
    rows = vectors.reshape(-1, vectors.shape[-1])
    d = rows.shape[-1]
    index_bits = max(1, math.ceil(math.log2(d))) if d > 1 else 1
    nnz = (rows != 0).sum(-1).to(torch.float64)
    dense = torch.full_like(nnz, float(d * value_bits))
    return torch.minimum(dense, nnz * (value_bits + index_bits))


def per_agent_bits(message: Messages, value_bits: int = 32) -> float:
    """Bits of ``message`` per agent endpoint: its total over (rows × copies).

    For ``[n, d]`` messages (one per client or agent, ``copies = 1``) this is the mean bits each
    sender sends; for a ``[d]`` vector sent to ``n`` clients (``copies = n``) the bits each
    client receives.

    >>> per_agent_bits(Messages("agent_to_agent", torch.tensor([[0.0, 2.0], [1.0, 2.0]])))
    48.5
    """
    bits = message_bits(message.vectors, value_bits)  # one entry per row
    return float(bits.sum()) / bits.numel()
