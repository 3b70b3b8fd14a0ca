"""Bit counts for known message sizes (dense, sparse, broadcast, per agent)."""

import math

import pytest
import torch

from pl_privfed.communication import (
    ENCODING,
    Messages,
    count_nonzeros,
    message_bits,
    per_agent_bits,
)


def bits(vectors, value_bits=32):
    """Bits of each row of ``vectors`` (its non-zeros counted as the engine does)."""
    return message_bits(count_nonzeros(vectors), vectors.shape[-1], value_bits)


def test_dense_and_sparse_messages():
    d = 1000
    dense = torch.ones(3, d)
    assert bits(dense).tolist() == [32.0 * d] * 3
    sparse = torch.zeros(2, d)
    sparse[0, :50] = 1.0  # 5 %: 50 values + 50 indices of ceil(log2 1000) = 10 bits
    assert bits(sparse).tolist() == [50 * (32 + 10), 0.0]
    assert bits(sparse, value_bits=16).tolist() == [50 * (16 + 10), 0.0]
    # past the break-even density (32/42 of the coordinates) the dense encoding is cheaper
    mostly = torch.ones(1, d)
    mostly[0, :200] = 0.0
    assert bits(mostly).tolist() == [32.0 * d]
    mostly[0, :300] = 0.0  # 700 × 42 = 29,400 < 32,000
    assert bits(mostly).tolist() == [700 * 42.0]


@pytest.mark.parametrize("d", [123, 50890])
def test_paper_001_sparsified_message_sizes(d):
    """k = ⌊d/20⌋ non-zeros (paper 001 §5) cost k·(32 + ceil(log2 d)) bits."""
    k = d // 20
    v = torch.zeros(1, d)
    v[0, torch.randperm(d, generator=torch.Generator().manual_seed(0))[:k]] = 1.0
    assert bits(v).item() == k * (32 + math.ceil(math.log2(d)))


def test_per_agent_bits():
    v = torch.zeros(4, 16)
    v[:, :2] = 1.0  # each agent: 2 × (32 + 4) bits
    assert per_agent_bits(Messages.of("agent_to_agent", v)) == 72.0
    broadcast = Messages.of("server_to_client", torch.ones(16), copies=10)
    assert per_agent_bits(broadcast) == 32 * 16  # what each client receives
    assert "ceil(log2 d)" in ENCODING
