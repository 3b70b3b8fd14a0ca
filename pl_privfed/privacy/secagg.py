"""Simulated secure aggregation: pairwise additive masks over fixed-point integers mod 2^b.

In the style of Bonawitz et al. (2017, "Practical secure aggregation for privacy-preserving
machine learning"): every pair of clients ``(i, j)``, ``i < j``, derives a shared mask
``m_ij`` uniform on ``Z_{2^b}`` from a pairwise seed; client ``i`` adds it and client ``j``
subtracts it. The server sees only the masked vectors, each of which is uniformly distributed and
independent of the client's vector; their sum mod ``2^b`` is the exact sum of the clients'
fixed-point encodings, because the masks cancel.

Arithmetic is exact fixed point: a real ``v`` is encoded as ``round(v · 2^f) mod 2^b``. The only
error is the rounding of each client's value, so every coordinate of the decoded sum of ``n``
clients is within ``n · 2^{-f-1}`` of the true sum, provided the true sum stays inside the
representable range ``|Σ_i v_i| < 2^{b-1-f}`` (checked here, since this is a simulation).

What is simulated and what is not: the pairwise seeds stand for the outcome of the protocol's
key agreement (derived here from one master ``seed``, the round and the pair, through NumPy's
``SeedSequence``); dropouts and the secret sharing of seeds are not simulated. The cost is
``O(n² d)``: one mask per pair, fine for initializing the server memory or for tens of clients
per round.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["SecureAggregation"]


class SecureAggregation:
    """Pairwise-masked, fixed-point summation of client vectors.

    Args:
        fraction_bits: ``f``, fixed-point fractional bits (resolution ``2^-f``).
        modulus_bits: ``b``, the ring ``Z_{2^b}`` (at most 62 so sums fit in int64).
        seed: master seed from which the pairwise seeds are derived.
        every_round: used by algorithms: aggregate every round securely (True), or only the
            initialization of the server memory (False).

    >>> agg = SecureAggregation(fraction_bits=16, modulus_bits=40)
    >>> v = torch.tensor([[0.5, -1.25], [2.0, 0.25]])
    >>> agg.sum(v)
    tensor([ 2.5000, -1.0000], dtype=torch.float64)
    """

    def __init__(
        self,
        fraction_bits: int = 24,
        modulus_bits: int = 48,
        seed: int = 0,
        every_round: bool = False,
    ) -> None:
        if not isinstance(modulus_bits, int) or not 2 <= modulus_bits <= 62:
            raise ValueError(f"modulus_bits must be an integer in [2, 62], got {modulus_bits!r}")
        if not isinstance(fraction_bits, int) or not 0 <= fraction_bits < modulus_bits - 1:
            raise ValueError(
                f"fraction_bits must be in [0, modulus_bits - 1), got {fraction_bits!r}"
            )
        self.fraction_bits = fraction_bits
        self.modulus_bits = modulus_bits
        self.seed = seed
        self.every_round = every_round
        self.modulus = 1 << modulus_bits

    def __repr__(self) -> str:
        return (
            f"SecureAggregation(fraction_bits={self.fraction_bits}, "
            f"modulus_bits={self.modulus_bits}, seed={self.seed}, every_round={self.every_round})"
        )

    def error_bound(self, num_clients: int) -> float:
        """Largest rounding error of one coordinate of a decoded sum of ``num_clients`` vectors."""
        return num_clients * 2.0 ** (-self.fraction_bits - 1)

    # ------------------------------------------------------------------ fixed point
    def encode(self, v: Tensor) -> Tensor:
        """``round(v · 2^f) mod 2^b`` as int64."""
        scaled = torch.round(v.double() * (1 << self.fraction_bits)).to(torch.int64)
        return torch.remainder(scaled, self.modulus)

    def decode(self, s: Tensor) -> Tensor:
        """Inverse of :meth:`encode` on ``Z_{2^b}`` (centered representatives), as float64."""
        centered = torch.where(s >= self.modulus // 2, s - self.modulus, s)
        return centered.double() / (1 << self.fraction_bits)

    # ------------------------------------------------------------------ masks
    def pair_mask(self, i: int, j: int, round_index: int, dim: int, device=None) -> Tensor:
        """The mask shared by clients ``i < j`` in a round, uniform on ``Z_{2^b}``."""
        state = np.random.SeedSequence([self.seed, round_index, i, j]).generate_state(2)
        gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
        return torch.randint(0, self.modulus, (dim,), generator=gen, dtype=torch.int64).to(device)

    def mask(
        self,
        encoded: Tensor,
        round_index: int = 0,
        cohort: Tensor | None = None,
        rows: Tensor | None = None,
    ) -> Tensor:
        """What the server receives: each row plus its pairwise masks, mod ``2^b``.

        Args:
            encoded: ``[m, d]`` fixed-point rows of the clients ``rows`` (default: the cohort).
            round_index: the round (masks are fresh every round).
            cohort: the client ids among which masks are formed (default ``0..m-1``).
            rows: the client ids of ``encoded``'s rows, a part of the cohort (default: all of
                it), so that a chunk of clients masks its rows without the others' vectors.
        """
        m, d = encoded.shape
        ids = list(range(m)) if cohort is None else [int(c) for c in cohort]
        mine = ids if rows is None else [int(c) for c in rows]
        if len(set(ids)) != len(ids) or (rows is None and len(ids) != m):
            raise ValueError(f"cohort must list {m} distinct client ids, got {ids!r}")
        if len(mine) != m or not set(mine) <= set(ids):
            raise ValueError(f"rows must list {m} client ids of the cohort, got {mine!r}")
        masked = encoded.clone()
        for a, me in enumerate(mine):
            for other in ids:
                if other == me:
                    continue
                lo, hi = min(me, other), max(me, other)
                pair = self.pair_mask(lo, hi, round_index, d, encoded.device)
                if me == lo:
                    masked[a] += pair
                else:
                    masked[a] -= pair
        return torch.remainder(masked, self.modulus)

    def partial_sum(
        self, v: Tensor, round_index: int, cohort: Tensor, rows: Tensor
    ) -> tuple[Tensor, Tensor]:
        """One chunk's share of a secure sum: the sum mod ``2^b`` of its masked rows (``rows``,
        a part of ``cohort``) and the sum of their absolute values (for the overflow check);
        add the shares of all chunks and decode with :meth:`finish`."""
        masked = self.mask(self.encode(v), round_index, cohort, rows)
        return torch.remainder(masked.sum(0), self.modulus), v.abs().double().sum(0)

    def finish(self, masked_sum: Tensor, abs_sum: Tensor, num_clients: int) -> Tensor:
        """The decoded sum from the chunks' :meth:`partial_sum` shares (checked for overflow)."""
        self._check_range(abs_sum, num_clients)
        return self.unmask_sum(masked_sum.unsqueeze(0))

    def _check_range(self, abs_sum: Tensor, num_clients: int) -> None:
        limit = 2.0 ** (self.modulus_bits - 1 - self.fraction_bits)
        if abs_sum.max().item() >= limit - self.error_bound(num_clients):
            raise ValueError(
                f"secure aggregation overflow: sums must stay below 2^{self.modulus_bits - 1 - self.fraction_bits}"
                f" = {limit:g} in absolute value; raise modulus_bits or lower fraction_bits"
            )

    def unmask_sum(self, masked: Tensor) -> Tensor:
        """The server's sum of the masked rows mod ``2^b`` (the masks cancel), decoded."""
        return self.decode(torch.remainder(masked.sum(0), self.modulus))

    def sum(self, v: Tensor, round_index: int = 0, cohort: Tensor | None = None) -> Tensor:
        """Securely aggregated ``Σ_i v_i`` (float64) of the rows of ``v [m, d]``."""
        self._check_range(v.abs().double().sum(0), v.shape[0])
        return self.unmask_sum(self.mask(self.encode(v), round_index, cohort))
