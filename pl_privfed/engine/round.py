"""One round: ``begin_round`` → a map over chunks of clients → a reduce → ``server_update``.

:func:`run_round` is the whole pipeline, and the only place it is written::

    participants = algorithm.begin_round(k)           # server decisions: the cohort, or everyone
    for phase in algorithm.client_phases():            # usually one phase; gossip adds more
        for ids in chunks(participants, chunk_size):   # the map, chunk by chunk
            phase(ClientChunk(ids))                    #   the paper's client lines, for these clients
        algorithm.between_phases(p, ctx)               #   (e.g. neighbours' rows across processes)
    reduction.all_reduce()                             # the reduce, across processes too
    result = algorithm.server_update(x, reduction)     # the paper's server lines, on the sums

Each chunk's work depends only on its clients' own state, data and randomness (keyed by
``(seed, round, client)``, :mod:`pl_privfed.rng`) and on the broadcast, so the iterates do not
depend on the chunk size (up to the order of floating-point sums) and memory holds one chunk's
``[c, d]`` tensors, never ``[n, d]`` ones beyond the state the algorithm really keeps. The first
round of an algorithm whose memories start from the clients' data is preceded by the same
pipeline over ``client_init`` / ``server_init`` (round ``-1``).

The engine sees an algorithm only through :class:`RoundAlgorithm`, the protocol declared here,
so it imports no algorithm. How many clients a chunk holds is decided once per run
(:func:`choose_chunk_size`, at the module's setup) and handed to every round: on a GPU all of
them (the vmap backend's batched client axis is where a GPU wins); on a CPU as many as keep a
chunk's ``[c, d]`` working set in cache (about 8 MiB), between 1 and 256 clients.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

from pl_privfed.checks import check_choice, check_positive_int
from pl_privfed.communication import Messages
from pl_privfed.engine.chunk import ChunkOracle, ClientChunk, OracleOutput, RoundContext
from pl_privfed.engine.distributed import ClientShard
from pl_privfed.engine.message import MessageStage
from pl_privfed.engine.reduce import Reduction
from pl_privfed.engine.rows import DENSE, ClientRows
from pl_privfed.engine.state import ClientStates
from pl_privfed.rng import KeyedGenerator

__all__ = [
    "CHUNK_ENV",
    "FunctionOracle",
    "RoundAlgorithm",
    "RoundResult",
    "choose_chunk_size",
    "chunk_ids",
    "iter_round",
    "run_round",
]

#: Environment variable that overrides every run's chunk size (``1``, ``all`` or a number):
#: used to run the whole test suite with chunks of one client and of all clients.
CHUNK_ENV = "PL_PRIVFED_CLIENT_CHUNK"

#: Bytes of a chunk's working set on a CPU (a few ``[c, d]`` tensors). 16 MiB since 2026-11-27:
#: the 10,000-client quickstart's round (d = 7,850) took 0.36 s in chunks of 178 against 0.46 s
#: in chunks of 89 (8 MiB), the per-chunk Python and calls outweighing the cache (docs/engine.md).
CPU_CHUNK_BYTES = 16 * 2**20


@dataclass
class RoundResult:
    """A round's outcome.

    Attributes:
        params: the new parameters ``[d]``.
        metrics: the round's statistics (scalar tensors, not synced).
        messages: what was sent, for communication accounting.
        loss: the mean training loss of the round's computing clients (set by the engine;
            ``None`` when nobody computed or the oracle reports no losses).
        buffers: the model's buffers after the round (BatchNorm running statistics, the
            engine's rule), or ``None``.
        released: whether the round released anything (set by the engine: ``False`` when the
            message stage aborted it, e.g. distributed noise with too few senders; the ledger
            then composes nothing for it). ``metrics["aborted"]`` logs the same.
    """

    params: Tensor
    metrics: dict[str, Tensor] = field(default_factory=dict)
    messages: list[Messages] = field(default_factory=list)
    loss: Tensor | None = None
    buffers: dict[str, Tensor] | None = None
    released: bool = True

    @property
    def client_transmissions(self) -> int:
        """The client-to-server messages the round sent (rows × copies; paper 004 Fig. 2's
        x-axis sums them over the rounds: ``k · p · M``)."""
        return sum(m.rows * m.copies for m in self.messages if m.channel == "client_to_server")


class RoundAlgorithm(Protocol):
    """What the engine needs of an algorithm (:class:`~pl_privfed.algorithms.FederatedAlgorithm`
    implements it): its clients and state, its message stage (with its hook, an audit's
    canaries: :class:`~pl_privfed.engine.MessageHook`), and the paper's two halves."""

    num_clients: int
    dim: int
    shard: ClientShard
    state: ClientStates
    keyed: KeyedGenerator
    initialized: Tensor
    rounds_done: Tensor
    #: how the clients' rows are represented in its rounds (:class:`~pl_privfed.engine.ClientRows`)
    client_rows: ClientRows

    def message_stage(self) -> MessageStage: ...

    def begin_round(self, round_index: int) -> Tensor | None: ...

    def client_phases(self) -> list[Callable[[ClientChunk], None]]: ...

    def between_phases(self, phase: int, ctx: RoundContext) -> None: ...

    def server_update(self, x: Tensor, reduced: Reduction) -> RoundResult: ...

    def initializes_clients(self) -> bool: ...

    def client_init(self, chunk: ClientChunk) -> None: ...

    def server_init(self, x: Tensor, reduced: Reduction) -> None: ...


def choose_chunk_size(
    num_clients: int,
    dim: int,
    device: torch.device,
    requested: int | str | None = None,
    itemsize: int = 4,
) -> int:
    """Clients per chunk, the run's one decision: ``requested`` (a positive int, ``"all"``,
    or ``"auto"``/``None`` for the engine's choice, module docstring), unless the environment
    variable :data:`CHUNK_ENV` overrides it. ``ValueError`` naming ``client_chunk`` for any
    other value."""
    override = os.environ.get(CHUNK_ENV)
    if override:
        requested = _chunk_override(override)
    n = max(1, int(num_clients))
    if isinstance(requested, int) and not isinstance(requested, bool):
        return min(n, check_positive_int("client_chunk", requested))
    if requested is not None and check_choice("client_chunk", requested, ("auto", "all")) == "all":
        return n
    if device.type != "cpu":
        return n
    per_client = 3 * max(1, dim) * itemsize  # gradients, state rows, messages
    return max(1, min(n, 256, CPU_CHUNK_BYTES // per_client))


def _chunk_override(value: str) -> int | str:
    """The value of :data:`CHUNK_ENV`: ``all``, ``auto`` or a positive integer."""
    text = value.strip()
    if text in ("all", "auto"):
        return text
    try:
        size = int(text)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(
            f"{CHUNK_ENV}={value!r} is not a chunk size: give a positive integer (clients per "
            "chunk), 'all' or 'auto', or unset it"
        )
    return size


def chunk_ids(ids: Tensor, size: int) -> list[Tensor]:
    """Consecutive pieces of at most ``size`` of the round's client indices ``ids`` (sorted;
    an audit's canary clients, indices from ``n`` on, sit among them at the places
    :meth:`~pl_privfed.engine.MessageHook.place` drew)."""
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


def run_round(
    algorithm: RoundAlgorithm,
    x: Tensor,
    oracle: ChunkOracle | Callable[..., Tensor],
    *,
    chunk_size: int | str | None = None,
    statistics: bool = True,
) -> RoundResult:
    """Run the algorithm's next round from the global parameters ``x`` ``[d]``.

    Args:
        algorithm: a set-up algorithm (:class:`RoundAlgorithm`); its round counter
            ``rounds_done`` is the round's index and advances by one.
        x: the broadcast parameters.
        oracle: the round's gradients for chunks of clients (:class:`ChunkOracle`), or a plain
            function ``grad_fn(params, per_example=False, step=None, clients=None)``.
        chunk_size: clients per chunk, as decided by :func:`choose_chunk_size` (a run decides
            once, at setup) and used as it is; ``None``, ``"auto"`` or ``"all"`` (no decision
            yet): decided here by :func:`choose_chunk_size` (:data:`CHUNK_ENV` included). The
            iterates do not depend on it.
        statistics: compute the statistics that cost a pass over client rows.

    The chunks' rows are the algorithm's row representation's (its ``client_rows``,
    :class:`~pl_privfed.engine.ClientRows`): in the clients' data span the oracle gives their
    coordinates and the chunks' sums are expanded to ``[d]`` (:meth:`ClientChunk.add`).
    """
    rounds = iter_round(algorithm, x, oracle, chunk_size=chunk_size, statistics=statistics)
    while True:
        try:
            next(rounds)
        except StopIteration as done:
            return done.value


def iter_round(
    algorithm: RoundAlgorithm,
    x: Tensor,
    oracle: ChunkOracle | Callable[..., Tensor],
    *,
    chunk_size: int | str | None = None,
    statistics: bool = True,
) -> Generator[None, None, RoundResult]:
    """:func:`run_round` as a generator that yields after every chunk and returns the round's
    :class:`RoundResult` (a grid advances its configurations' rounds chunk by chunk). When the
    row representation deferred its sums (:meth:`Reduction.defer`: clients in their data
    span) it yields once more, the round's :class:`Reduction`, before expanding them: a grid
    expands those of several configurations in one product
    (:func:`~pl_privfed.engine.reduce.expand_together`). Then the reduce across processes and
    the server's lines."""
    if not isinstance(oracle, ChunkOracle):
        oracle = FunctionOracle(oracle)
    if not isinstance(chunk_size, int) or isinstance(chunk_size, bool):  # not decided yet
        chunk_size = choose_chunk_size(
            algorithm.num_clients, algorithm.dim, x.device, chunk_size, x.element_size()
        )
    check_positive_int("chunk_size", chunk_size)
    if not bool(algorithm.initialized):
        reduced = Reduction(algorithm.dim, device=x.device, dtype=x.dtype)
        if algorithm.initializes_clients():
            init = [algorithm.client_init]
            reduced = yield from _map(algorithm, x, oracle, -1, None, init, chunk_size, statistics)
            reduced.flush()
            algorithm.shard.all_reduce_reduction(reduced)
        algorithm.server_init(x, reduced)
        algorithm.initialized.fill_(True)
    k = int(algorithm.rounds_done)
    participants = algorithm.begin_round(k)
    phases = algorithm.client_phases()
    reduced = yield from _map(algorithm, x, oracle, k, participants, phases, chunk_size, statistics)
    if reduced.pending:  # deferred sums (clients in their data span): not yet expanded
        yield reduced  # (a grid expands several configurations' at once: expand_together)
        reduced.flush()
    algorithm.shard.all_reduce_reduction(reduced)
    result = algorithm.server_update(x, reduced)
    result.loss = reduced.loss()
    result.buffers = reduced.buffers()
    result.released = reduced.released
    algorithm.rounds_done += 1
    return result


def _map(
    algorithm: RoundAlgorithm,
    x: Tensor,
    oracle: ChunkOracle,
    round_index: int,
    participants: Tensor | None,
    phases: list[Callable[[ClientChunk], None]],
    chunk_size: int,
    statistics: bool,
) -> Generator[None, None, Reduction]:
    """The map over this process's participating clients, phase by phase and chunk by chunk
    (the reduce across processes follows in :func:`iter_round`). An audit's canary clients
    (the stage's hook, :meth:`~pl_privfed.engine.MessageHook.place`) are placed among the first
    process's clients, so they go through the same chunks, phases and calls as theirs."""
    if participants is None:
        participants = torch.arange(algorithm.num_clients)
    stage = algorithm.message_stage()  # with its hook (an audit's canaries), if any
    reduction = Reduction(
        algorithm.dim,
        round_index=round_index,
        stage=stage,
        keyed=algorithm.keyed,
        device=x.device,
        dtype=x.dtype,
    )
    ctx = RoundContext(
        x=x,
        oracle=oracle,
        reduction=reduction,
        round_index=round_index,
        dim=algorithm.dim,
        device=x.device,
        dtype=x.dtype,
        keyed=algorithm.keyed,
        statistics=statistics,
        stage=stage,
        participants=participants,
        rows=getattr(algorithm, "client_rows", DENSE),
        clients=algorithm.num_clients,
    )
    owned = algorithm.shard.owned(participants)
    if stage.hook is not None and algorithm.shard.rank == 0:  # an audit's canary clients
        owned = stage.hook.place(round_index, owned, algorithm.num_clients, chunk_size)
    pieces = chunk_ids(owned, chunk_size)
    for p, phase in enumerate(phases):
        for ids in pieces:
            chunk = ClientChunk(ctx, ids, algorithm.state)
            phase(chunk)
            chunk.close()
            yield
        algorithm.between_phases(p, ctx)
    return reduction
