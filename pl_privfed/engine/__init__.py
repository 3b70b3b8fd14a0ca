"""The round engine: a round is a map over chunks of clients, a reduce, and a server step.

* :mod:`~pl_privfed.engine.round` — the loop over chunks and the choice of the chunk size;
* :mod:`~pl_privfed.engine.chunk` — :class:`ClientChunk`, what an algorithm's client part sees;
* :mod:`~pl_privfed.engine.reduce` — :class:`Reduction`, the sums the server needs;
* :mod:`~pl_privfed.engine.state` — where the per-client state rows live.

See docs/engine.md.
"""

from pl_privfed.engine.chunk import ChunkOracle, ClientChunk, OracleOutput, RoundContext
from pl_privfed.engine.distributed import ClientShard
from pl_privfed.engine.reduce import Reduction
from pl_privfed.engine.round import (
    CHUNK_ENV,
    FunctionOracle,
    choose_chunk_size,
    chunk_ids,
    iter_phases,
    make_context,
    run_phases,
)
from pl_privfed.engine.state import ClientStates, Placement, choose_placement

__all__ = [
    "CHUNK_ENV",
    "ChunkOracle",
    "ClientChunk",
    "ClientShard",
    "ClientStates",
    "FunctionOracle",
    "OracleOutput",
    "Placement",
    "Reduction",
    "RoundContext",
    "choose_chunk_size",
    "choose_placement",
    "chunk_ids",
    "iter_phases",
    "make_context",
    "run_phases",
]
