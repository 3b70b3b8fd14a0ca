"""The round engine: a round is a map over chunks of clients, a reduce, and a server step.

* :mod:`~pl_privfed.engine.round` — :func:`run_round`, the round's pipeline, the protocol it
  sees algorithms through (:class:`RoundAlgorithm`) and the choice of the chunk size;
* :mod:`~pl_privfed.engine.chunk` — :class:`ClientChunk`, what an algorithm's client part sees;
* :mod:`~pl_privfed.engine.message` — the message stage: operator, noise, secure aggregation,
  and its one hook (an audit's canaries);
* :mod:`~pl_privfed.engine.reduce` — :class:`Reduction`, the sums the server needs;
* :mod:`~pl_privfed.engine.state` — where the per-client state rows live, and their checkpoints;
* :mod:`~pl_privfed.engine.rows` — :class:`ClientRows`, how a chunk's client rows are
  represented: rows of ``d`` (:data:`DENSE`) or, in :mod:`~pl_privfed.engine.span`, coordinates
  in the span of each client's data (:class:`SpanRows`, the option ``client_span``);
* :mod:`~pl_privfed.engine.distributed` — clients sharded over processes.

See docs/engine.md.
"""

from pl_privfed.engine.chunk import ChunkOracle, ClientChunk, OracleOutput, RoundContext
from pl_privfed.engine.distributed import ClientShard
from pl_privfed.engine.message import (
    Message,
    MessageHook,
    MessageStage,
    NoisePlacement,
    noise_to_signal,
)
from pl_privfed.engine.reduce import Reduction, expand_together
from pl_privfed.engine.round import (
    CHUNK_ENV,
    FunctionOracle,
    RoundAlgorithm,
    RoundResult,
    choose_chunk_size,
    chunk_ids,
    iter_round,
    run_round,
)
from pl_privfed.engine.rows import DENSE, ClientRows, DenseRows
from pl_privfed.engine.span import SpanRows, choose_client_rows
from pl_privfed.engine.state import (
    SNAPSHOT_DIR_KEY,
    ClientStateError,
    ClientStates,
    Placement,
    choose_placement,
)

__all__ = [
    "CHUNK_ENV",
    "DENSE",
    "SNAPSHOT_DIR_KEY",
    "ChunkOracle",
    "ClientChunk",
    "ClientRows",
    "ClientShard",
    "ClientStateError",
    "ClientStates",
    "DenseRows",
    "FunctionOracle",
    "Message",
    "MessageHook",
    "MessageStage",
    "NoisePlacement",
    "OracleOutput",
    "Placement",
    "Reduction",
    "RoundAlgorithm",
    "RoundContext",
    "RoundResult",
    "SpanRows",
    "choose_chunk_size",
    "choose_client_rows",
    "choose_placement",
    "chunk_ids",
    "expand_together",
    "iter_round",
    "noise_to_signal",
    "run_round",
]
