"""Random streams keyed by ``(seed, stream, round, client)``.

Every random draw of a round comes from a ``torch.Generator`` seeded from a key that names what
the draw is for, never from a generator that advances as clients are processed. A client's noise
in round ``k`` is therefore the same whether the client is processed alone, in a chunk of 16, on
another process, or after a resume: the iterates do not depend on the chunk size or the number of
processes, and there is no generator state to checkpoint (the round number is enough).

The key is a 64-bit hash of the seed and the integers after it (SplitMix64's finalizer, chained):
``stream_key(seed, STREAM_NOISE, round, client)``. Keys of different streams, rounds or clients
are unrelated seeds of the Mersenne Twister (CPU) or Philox (CUDA) generator.

>>> stream_key(0, STREAM_NOISE, 3, 7) == stream_key(0, STREAM_NOISE, 3, 7)
True
>>> stream_key(0, STREAM_NOISE, 3, 7) != stream_key(0, STREAM_NOISE, 3, 8)
True
>>> a = client_normal(1, STREAM_NOISE, 0, torch.tensor([2, 5]), 3, std=1.0)
>>> b = client_normal(1, STREAM_NOISE, 0, torch.tensor([5]), 3, std=1.0)
>>> torch.equal(a[1], b[0])
True
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = [
    "AUDIT_COLLUSION",
    "AUDIT_DIRECTION",
    "AUDIT_HOSTS",
    "AUDIT_MEMBERSHIP",
    "AUDIT_NOISE",
    "AUDIT_NOISE_CLIENTS",
    "AUDIT_NOISE_COORDINATES",
    "AUDIT_PARTICIPATION",
    "AUDIT_PLACEMENT",
    "AUDIT_RECORD_PLACES",
    "STREAM_AUDIT",
    "STREAM_AUGMENTATION",
    "STREAM_CENTRAL_NOISE",
    "STREAM_CLIP_COUNT",
    "STREAM_COMPRESSION",
    "STREAM_CORRELATED_NOISE",
    "STREAM_INIT",
    "STREAM_NOISE",
    "STREAM_OUTPUT",
    "STREAM_SAMPLING",
    "STREAM_SERVER_NOISE",
    "KeyedGenerator",
    "client_normal",
    "keyed_generator",
    "stream_key",
]

#: Stream identifiers (the second element of every key).
STREAM_NOISE = 1  # a client's Gaussian DP noise (per client, per round, per local step)
STREAM_COMPRESSION = 2  # a client's random compressor (rand-k)
STREAM_SAMPLING = 3  # the round's cohort
STREAM_OUTPUT = 4  # a decentralized method's sampled output iterate
STREAM_SERVER_NOISE = 5  # the clients' noise drawn once per round as their sum (draws: aggregate)
STREAM_AUGMENTATION = 6  # a client's data augmentation
STREAM_INIT = 7  # randomness of the memory initialization
STREAM_CENTRAL_NOISE = 8  # the trusted aggregator's own Gaussian on the sum (central DP)
STREAM_AUDIT = 9  # a privacy audit's canaries (pl_privfed.privacy.audit), never anyone else's
STREAM_CLIP_COUNT = (
    10  # adaptive clipping's noise on the unclipped count (per round; never the update's)
)
STREAM_CORRELATED_NOISE = 11  # row j of Z of correlated noise (pl_privfed.privacy.correlated)

#: What a draw of :data:`STREAM_AUDIT` is for (the key's third element): a canary's direction
#: ``(audit seed, STREAM_AUDIT, AUDIT_DIRECTION, canary)``, which canaries are inserted
#: ``(audit seed, STREAM_AUDIT, AUDIT_MEMBERSHIP)``, which take part in a round ``(audit seed,
#: STREAM_AUDIT, AUDIT_PARTICIPATION, round)``, where the canary clients sit among the
#: round's clients ``(audit seed, STREAM_AUDIT, AUDIT_PLACEMENT, round)``, the held-out canary
#: clients' own DP noise (the white-box null) ``(noise seed, STREAM_AUDIT, AUDIT_NOISE, round,
#: canary)``, the white-box auditor's split of a
#: distributed sum's noise into the colluders' shares and the honest ones ``(noise seed,
#: STREAM_AUDIT, AUDIT_COLLUSION, round)``, and the coordinates on which the noise test keeps
#: each release's realized noise ``(audit seed, STREAM_AUDIT, AUDIT_NOISE_COORDINATES)``, the
#: clients holding the canary records ``(audit seed, STREAM_AUDIT, AUDIT_HOSTS)`` and a canary
#: record's place among its host's examples ``(audit seed, STREAM_AUDIT, AUDIT_RECORD_PLACES,
#: round, step, host)``, and the order in which the record-level noise test keeps the clients'
#: draws ``(audit seed, STREAM_AUDIT, AUDIT_NOISE_CLIENTS)``. No
#: other stream's key starts like these, so the canaries never change another client's noise,
#: cohort or data.
AUDIT_DIRECTION = 0
AUDIT_MEMBERSHIP = 1
AUDIT_PARTICIPATION = 2
AUDIT_NOISE = 3
AUDIT_COLLUSION = 4
AUDIT_PLACEMENT = 5
AUDIT_NOISE_COORDINATES = 6
AUDIT_HOSTS = 7
AUDIT_RECORD_PLACES = 8
AUDIT_NOISE_CLIENTS = 9

_MASK64 = (1 << 64) - 1


def _mix(z: int) -> int:
    """SplitMix64's finalizer: a bijection of 64-bit integers with good avalanche."""
    z = (z + 0x9E3779B97F4A7C15) & _MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
    return z ^ (z >> 31)


def stream_key(seed: int, *keys: int) -> int:
    """A 63-bit generator seed determined by ``seed`` and the integers ``keys``."""
    h = _mix(int(seed) & _MASK64)
    for key in keys:
        h = _mix(h ^ (int(key) & _MASK64))
    return h >> 1


class KeyedGenerator:
    """One reusable ``torch.Generator`` on ``device``, re-seeded for every key.

    ``gen(seed, *keys)`` returns the generator seeded with :func:`stream_key`; the next draw from
    it is a pure function of the key. :attr:`last_key` (``(seed, *keys)``) and :attr:`last_seed`
    name the key of the last call, which the privacy invariants' check mode reads
    (:mod:`pl_privfed.privacy.invariants`: a noise key is used once in a run).
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self._gen = torch.Generator(device=self.device)
        self.last_key: tuple[int, ...] = ()
        self.last_seed = -1

    def __call__(self, seed: int, *keys: int) -> torch.Generator:
        self.last_key, self.last_seed = (seed, *keys), stream_key(seed, *keys)
        self._gen.manual_seed(self.last_seed)
        return self._gen


def keyed_generator(seed: int, *keys: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A fresh generator seeded with ``stream_key(seed, *keys)``."""
    gen = torch.Generator(device=torch.device(device))
    gen.manual_seed(stream_key(seed, *keys))
    return gen


def client_normal(
    seed: int,
    stream: int,
    round_index: int,
    clients: Tensor,
    dim: int,
    *,
    std: float,
    extra: int = 0,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str = "cpu",
    out: Tensor | None = None,
    generator: KeyedGenerator | None = None,
) -> Tensor:
    """``[len(clients), dim]`` draws of ``N(0, std²)``, row ``i`` from client ``clients[i]``'s
    stream ``(seed, stream, round_index, client, extra)`` (``extra``: e.g. the local step)."""
    ids = clients.tolist()
    rows = out if out is not None else torch.empty(len(ids), dim, dtype=dtype, device=device)
    gen = generator if generator is not None else KeyedGenerator(rows.device)
    for i, client in enumerate(ids):
        rows[i].normal_(0.0, std, generator=gen(seed, stream, round_index, client, extra))
    return rows
