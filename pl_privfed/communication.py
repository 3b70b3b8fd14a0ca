"""Messages of a round and how many bits they take on the wire."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Messages", "message_bits"]


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


def message_bits(vectors: Tensor, value_bits: int = 32) -> Tensor:
    """Bits of each message (row) under the cheaper of two encodings.

    * dense: ``d`` values of ``value_bits`` bits;
    * sparse: for each non-zero, its value and its index (``ceil(log2 d)`` bits).

    A compressed message (top-k, random-k) is counted as the sparse encoding it needs; a dense or
    noisy vector as dense.

    >>> message_bits(torch.tensor([[0.0, 2.0, 0.0, 0.0], [1.0, 2.0, 3.0, 4.0]]))
    tensor([ 34., 128.])
    """
    rows = vectors.reshape(-1, vectors.shape[-1])
    d = rows.shape[-1]
    index_bits = max(1, math.ceil(math.log2(d))) if d > 1 else 1
    nnz = (rows != 0).sum(-1).to(torch.float64)
    dense = torch.full_like(nnz, float(d * value_bits))
    return torch.minimum(dense, nnz * (value_bits + index_bits))
