"""One round as a map over chunks of clients, a reduce, and a server step.

::

    participants = algorithm.begin_round(k)           # the round's clients (a cohort, or all)
    for phase in algorithm.client_phases():            # usually one phase
        for ids in chunks(participants, chunk_size):   # the map, chunk by chunk
            phase(ClientChunk(ids))                    #   client lines, for these clients only
    result = algorithm.server_update(x, reduction)     # server lines, on the reduced sums

Each chunk's work depends only on its clients' own state, data and randomness (keyed by
``(seed, round, client)``, :mod:`pl_privfed.rng`) and on the broadcast, so the iterates
do not depend on the chunk size (up to the order of floating-point sums) and memory holds one
chunk's ``[c, d]`` tensors, never ``[n, d]`` ones beyond the state the algorithm really keeps.
Decentralized methods have two phases: the local one, then the gossip, which reads the
neighbours' rows of the state the first phase wrote.

How many clients a chunk holds (:func:`choose_chunk_size`): on a GPU all of them (the vmap
backend's batched client axis is where a GPU wins); on a CPU as many as keep a chunk's
``[c, d]`` working set in cache (about 8 MiB), between 1 and 256 clients.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from pl_privfed.engine.chunk import ChunkOracle, ClientChunk, OracleOutput, RoundContext
from pl_privfed.engine.reduce import Reduction
from pl_privfed.rng import KeyedGenerator

__all__ = [
    "CHUNK_ENV",
    "FunctionOracle",
    "choose_chunk_size",
    "chunk_ids",
    "iter_phases",
    "make_context",
    "run_phases",
]

#: Environment variable that overrides every run's chunk size (``1``, ``all`` or a number):
#: used to run the whole test suite with chunks of one client and of all clients.
CHUNK_ENV = "PL_PRIVFED_CLIENT_CHUNK"

#: Bytes of a chunk's working set on a CPU (a few ``[c, d]`` tensors): about an L3 slice.
CPU_CHUNK_BYTES = 8 * 2**20


def choose_chunk_size(
    num_clients: int,
    dim: int,
    device: torch.device,
    requested: int | str | None = None,
    itemsize: int = 4,
) -> int:
    """Clients per chunk: ``requested`` (an int, or ``"all"``), the environment variable
    :data:`CHUNK_ENV`, or the engine's choice (module docstring)."""
    override = os.environ.get(CHUNK_ENV)
    if override:
        requested = override
    n = max(1, int(num_clients))
    if requested in ("all", "n"):
        return n
    if requested is not None and requested != "auto":
        return max(1, min(n, int(requested)))
    if device.type != "cpu":
        return n
    per_client = 3 * max(1, dim) * itemsize  # gradients, state rows, messages
    return max(1, min(n, 256, CPU_CHUNK_BYTES // per_client))


def chunk_ids(ids: Tensor, size: int) -> list[Tensor]:
    """Consecutive pieces of at most ``size`` of the sorted client indices ``ids``."""
    return list(torch.split(ids, size)) if ids.numel() else []


class FunctionOracle(ChunkOracle):
    """A chunk oracle over a plain gradient function
    ``grad_fn(params, per_example=False, step=None, clients=None) -> Tensor`` (the clients'
    gradients), e.g. quadratic clients in tests; it reports no losses."""

    def __init__(self, grad_fn: Callable[..., Tensor]) -> None:
        self.grad_fn = grad_fn

    def __call__(
        self, params: Tensor, clients: Tensor, *, per_example: bool = False, step: int | None = None
    ) -> OracleOutput:
        kwargs: dict[str, Any] = {"clients": clients}
        if per_example:
            kwargs["per_example"] = True
        if step is not None:
            kwargs["step"] = step
        return OracleOutput(grads=self.grad_fn(params, **kwargs))


def iter_phases(
    phases: list[Callable[[ClientChunk], None]],
    ctx: RoundContext,
    participants: Tensor,
    chunk_size: int,
    store: Any,
    between: Callable[[int, RoundContext], None] | None = None,
) -> Iterator[None]:
    """Run every phase of the client map over ``participants`` in chunks of ``chunk_size``,
    yielding after each chunk (so that a grid can run several configurations' rounds in
    lockstep, chunk by chunk); ``between(p, ctx)`` runs after phase ``p``, e.g. the exchange of
    gossiped rows between processes."""
    pieces = chunk_ids(participants, chunk_size)
    for p, phase in enumerate(phases):
        for ids in pieces:
            chunk = ClientChunk(ctx, ids, store)
            phase(chunk)
            chunk.close()
            yield
        if between is not None:
            between(p, ctx)


def run_phases(*args: Any, **kwargs: Any) -> None:
    """:func:`iter_phases` run to the end."""
    for _ in iter_phases(*args, **kwargs):
        pass


def make_context(
    x: Tensor,
    oracle: Any,
    round_index: int,
    dim: int,
    keyed: KeyedGenerator | None = None,
    statistics: bool = True,
) -> RoundContext:
    """The context of one round (or of the memory initialization, ``round_index = -1``)."""
    reduction = Reduction(dim)
    reduction.round_index = round_index
    return RoundContext(
        x=x,
        oracle=oracle,
        reduction=reduction,
        round_index=round_index,
        dim=dim,
        device=x.device,
        dtype=x.dtype,
        keyed=keyed if keyed is not None else KeyedGenerator(x.device),
        statistics=statistics,
    )
