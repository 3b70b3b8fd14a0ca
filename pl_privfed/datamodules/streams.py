"""``ClientStreams``: each client's minibatches as a pure function of the round number.

Client ``i``'s permutation of local epoch ``e`` is ``torch.randperm`` from a generator seeded
from ``(seed, i, e)`` through NumPy's ``SeedSequence``: one generator per client and epoch, so a
client's stream does not depend on which other clients are asked, in which chunks or order.
:class:`ReferenceClientStreams` computes that definition one client at a time in Python (what
the package did up to 2026-11); :class:`ClientStreams` computes the same streams bit for bit
with the per-client work reduced to the one call that cannot be batched (``manual_seed`` then
``randperm``): the ``SeedSequence`` hashes of all the clients asked are computed at once
(:func:`seed_sequence_seeds`), the permutations of the current and the previous local epoch
are cached for every client in one flat tensor, and the round's indices are gathered from it
with advanced indexing. ``tests/test_streams.py`` holds the two equal.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from pl_privfed.datamodules.randperm import MIN_ROWS, randperms

__all__ = ["ClientStreams", "ReferenceClientStreams", "seed_sequence_seeds"]

#: The last key element of the ``without_replacement`` streams (keeps them apart from the
#: epochs' ``(seed, client, epoch)`` keys).
_WITHOUT_REPLACEMENT_TAG = 0x57

# NumPy's SeedSequence constants (numpy/random/bit_generator.pyx; NEP 19 fixes the algorithm)
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_MULT_L, _MIX_MULT_R, _MASK32, _POOL_SIZE = 0xCA01F9DD, 0x4973F715, 0xFFFFFFFF, 4


def _generator(*key: int) -> torch.Generator:
    """A CPU generator seeded with 64 bits drawn by NumPy's ``SeedSequence`` from ``key``."""
    state = np.random.SeedSequence(list(key)).generate_state(2)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


def _words(value: int) -> list[int]:
    """``value``'s 32-bit words, least significant first (how ``SeedSequence`` reads an int)."""
    if value < 0:
        raise ValueError(f"a stream key must be >= 0, got {value}")
    words = [value & _MASK32]
    while value := value >> 32:
        words.append(value & _MASK32)
    return words


def seed_sequence_seeds(*key: int | np.ndarray) -> list[int]:
    """For every row of the key columns, the 64-bit seed that ``_generator(*row)`` uses:
    ``SeedSequence(list(row)).generate_state(2)`` as ``word0 << 32 | word1``, computed for all
    rows at once in NumPy.

    ``key``'s elements are ints (the same in every row) or equal-length integer arrays whose
    values are in ``[0, 2**32)`` (client ids, epochs, rounds); an int may be any size >= 0 (a
    seed). NumPy's unsigned arithmetic wraps modulo ``2**32`` as ``SeedSequence``'s does.
    """
    rows = max((len(k) for k in key if isinstance(k, np.ndarray)), default=1)
    columns: list[np.ndarray] = []
    for k in key:
        if isinstance(k, np.ndarray):
            if len(k) and (k.min() < 0 or k.max() > _MASK32):
                raise ValueError("array stream keys must be in [0, 2**32)")
            columns.append(k.astype(np.uint32))
        else:
            columns.extend(np.full(rows, w, dtype=np.uint32) for w in _words(int(k)))
    const = _INIT_A
    shift = np.uint32(16)

    def hashmix(value: np.ndarray) -> np.ndarray:
        nonlocal const
        value = value ^ np.uint32(const)
        const = (const * _MULT_A) & _MASK32
        value = value * np.uint32(const)
        return value ^ (value >> shift)

    def mix(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        result = np.uint32(_MIX_MULT_L) * x - np.uint32(_MIX_MULT_R) * y
        return result ^ (result >> shift)

    zeros = np.zeros(rows, dtype=np.uint32)
    pool = [hashmix(columns[i] if i < len(columns) else zeros) for i in range(_POOL_SIZE)]
    for src in range(_POOL_SIZE):
        for dst in range(_POOL_SIZE):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL_SIZE, len(columns)):
        for dst in range(_POOL_SIZE):
            pool[dst] = mix(pool[dst], hashmix(columns[src]))
    const, words = _INIT_B, []
    for word in pool[:2]:  # generate_state(2)
        word = word ^ np.uint32(const)
        const = (const * _MULT_B) & _MASK32
        word = word * np.uint32(const)
        words.append((word ^ (word >> shift)).astype(np.uint64))
    return ((words[0] << np.uint64(32)) | words[1]).tolist()


class ClientStreams:
    """Per-client sampling without replacement, as a pure function of the round number.

    ``sampling="epochs"`` (default): client ``i``'s examples form an infinite stream, the
    concatenation of per-local-epoch permutations of its shard (or, with ``shuffle=False``, of the
    shard in its stored order), where the permutation of local epoch ``e`` is drawn by a
    ``torch.Generator`` seeded from ``(seed, i, e)`` (through NumPy's ``SeedSequence``). Round
    ``k`` takes stream positions ``[k·B, (k+1)·B)``: every example once per local epoch. A batch
    may straddle two local epochs; a shard smaller than ``B`` yields batches with repeats.

    ``sampling="without_replacement"``: round ``k`` draws each client's ``B`` examples uniformly
    at random without replacement from its shard, independently of every other round (a
    generator seeded from ``(seed, i, k)``): the fixed-size sampling that record-level privacy
    accounting amplifies by (``SampledWithoutReplacementDpEvent``). Needs ``B`` <= every shard.

    The permutations of each client's last two local epochs are cached (2 × the training set's
    indices in all); the cache changes no draw, only what is recomputed.
    """

    def __init__(
        self,
        shards: list[np.ndarray],
        batch_size: int,
        seed: int,
        shuffle: bool = True,
        sampling: str = "epochs",
    ) -> None:
        self.shards = [torch.as_tensor(np.asarray(s, dtype=np.int64)) for s in shards]
        self.sizes = [len(s) for s in shards]
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.sampling = sampling
        # The index arithmetic is NumPy's: single-threaded, where torch's small ops (e.g.
        # repeat_interleave) go through its thread pool and stall on a loaded machine.
        # Every shard in one flat array: client i's is flat[offset[i] : offset[i] + size[i]].
        empty = np.empty(0, dtype=np.int64)
        self._flat = np.concatenate([np.asarray(s, dtype=np.int64) for s in shards] or [empty])
        self._size = np.array(self.sizes, dtype=np.int64)
        self._offset = np.cumsum(self._size) - self._size
        # the cached permutations (shard positions) of local epoch e in slot e % 2, and which
        # epoch each client's slot holds (-1: none); allocated at the first shuffled round
        self._slots: np.ndarray | None = None
        self._slot_epoch: np.ndarray | None = None
        # clients asked in the current and the previous round (for the round's prefetch)
        self._asked = {"round": -1, "count": 0}

    def permutation(self, client: int, epoch: int) -> Tensor:
        """Dataset indices of ``client``'s shard in the order of its local ``epoch``.

        Without ``shuffle`` every epoch walks the shard in its stored (sorted) order: the fixed
        order of a cyclic incremental-gradient method.
        """
        if not self.shuffle:
            return self.shards[client]
        gen = _generator(self.seed, client, epoch)
        return self.shards[client][torch.randperm(self.sizes[client], generator=gen)]

    def _randperms(self, sizes: np.ndarray, seeds: list[int]) -> np.ndarray:
        """``torch.randperm(n)`` for every ``(n, seed)``, concatenated, computed for all the
        rows at once (:func:`~pl_privfed.datamodules.randperm.randperms`)."""
        return randperms(sizes, seeds)

    def indices(self, round_index: int, clients: Tensor | None = None) -> Tensor:
        """``[c, batch_size]`` dataset indices of round ``round_index`` for the clients
        ``clients`` (default: every client, in order)."""
        if round_index < 0:
            raise ValueError(f"round_index must be >= 0, got {round_index}")
        if clients is None:
            ids = np.arange(len(self.shards))
        else:
            ids = clients.detach().to("cpu", torch.int64).reshape(-1).numpy()
        batch, size, start = self.batch_size, self._size[ids], self._offset[ids]
        if len(ids) == 0:
            return torch.empty(0, batch, dtype=torch.int64)
        if self.sampling == "without_replacement":
            seeds = seed_sequence_seeds(self.seed, ids, round_index, _WITHOUT_REPLACEMENT_TAG)
            perms = self._randperms(size, seeds)
            first = np.cumsum(size) - size  # where each client's permutation starts in perms
            local = perms[first[:, None] + np.arange(batch)]
            return torch.from_numpy(self._flat[start[:, None] + local])
        if self.shuffle and self._prefetches(round_index, len(ids)):
            every = np.arange(len(self.shards))  # the whole round's permutations in one call
            self._shuffled(every, self._size, *self._positions(round_index, self._size, every))
        epoch, offset = self._positions(round_index, size)
        if self.shuffle:
            offset = self._shuffled(ids, size, start, epoch, offset)
        return torch.from_numpy(self._flat[start[:, None] + offset])

    def _positions(
        self, round_index: int, size: np.ndarray, ids: np.ndarray | None = None
    ) -> tuple[np.ndarray, ...]:
        """Each row's local epoch and position within it of round ``round_index``'s ``B``
        stream positions (``[c, B]`` each); with ``ids``, ``(start, epoch, offset)`` of those
        clients for :meth:`_shuffled`."""
        pos = round_index * self.batch_size + np.arange(self.batch_size)  # stream positions
        epoch = pos[None, :] // size[:, None]
        offset = pos[None, :] - epoch * size[:, None]
        return (epoch, offset) if ids is None else (self._offset[ids], epoch, offset)

    def _prefetches(self, round_index: int, count: int) -> bool:
        """Whether to draw every client's permutations of round ``round_index`` at once
        before serving this request: on the round's first request, when the previous round
        asked for at least half the clients and at least :data:`~pl_privfed.datamodules.
        randperm.MIN_ROWS` (full participation served chunk by chunk: one vectorized draw
        instead of one per chunk; it changes no draw, only when it is made)."""
        asked = self._asked
        if round_index == asked["round"]:
            asked["count"] += count
            return False
        previous = asked["count"] if round_index == asked["round"] + 1 else 0
        asked.update(round=round_index, count=count)
        clients = len(self.shards)
        return previous >= max(MIN_ROWS, clients / 2)

    def _shuffled(
        self,
        ids: np.ndarray,
        size: np.ndarray,
        start: np.ndarray,
        epoch: np.ndarray,
        offset: np.ndarray,
    ) -> np.ndarray:
        """Shard positions ``perm(ids[r], epoch[r, j])[offset[r, j]]``, ``[c, B]``: from the
        cache where it holds the epoch, the others drawn (and cached) now."""
        if self._slots is None:
            self._slots = np.zeros((2, len(self._flat)), dtype=np.int64)
            self._slot_epoch = np.full((len(self.shards), 2), -1, dtype=np.int64)
        slots, slot_epoch = self._slots, self._slot_epoch
        # the (row, epoch) pairs the round needs: epochs first..last of every row, in order
        first, last = epoch[:, 0], epoch[:, -1]
        count = last - first + 1
        row = np.repeat(np.arange(len(ids)), count)
        pair_start = np.cumsum(count) - count
        pair_epoch = first[row] + np.arange(len(row)) - pair_start[row]
        client = ids[row]
        # a one-example shard's permutation is the identity whatever the generator draws
        hit = (slot_epoch[client, pair_epoch % 2] == pair_epoch) | (size[row] == 1)
        miss = np.flatnonzero(~hit)
        pair = pair_start[:, None] + epoch - first[:, None]  # [c, B]
        out = slots[epoch % 2, start[:, None] + offset]  # read before this round's writes
        if len(miss):
            miss_size = size[row[miss]]
            fresh = self._randperms(
                miss_size, seed_sequence_seeds(self.seed, client[miss], pair_epoch[miss])
            )
            fresh_start = np.zeros(len(row), dtype=np.int64)
            fresh_start[miss] = np.cumsum(miss_size) - miss_size
            is_fresh = ~hit[pair]
            out[is_fresh] = fresh[fresh_start[pair[is_fresh]] + offset[is_fresh]]
            # keep each row's last two epochs (distinct slots; a client asked twice in one call
            # writes the same values twice)
            keep = miss[pair_epoch[miss] >= last[row[miss]] - 1]
            keep_size = size[row[keep]]
            within = np.arange(keep_size.sum()) - np.repeat(
                np.cumsum(keep_size) - keep_size, keep_size
            )
            src = np.repeat(fresh_start[keep], keep_size) + within
            dst = np.repeat(start[row[keep]], keep_size) + within
            slots[np.repeat(pair_epoch[keep] % 2, keep_size), dst] = fresh[src]
            slot_epoch[client[keep], pair_epoch[keep] % 2] = pair_epoch[keep]
        out[size == 1] = 0
        return out


class ReferenceClientStreams(ClientStreams):
    """The streams of :class:`ClientStreams` computed by their definition, one client at a time
    in Python (the package's implementation up to 2026-11-26: 80–130 µs a client and round on
    this project's shared 2-core CPU, CHANGELOG.md): the specification the vectorized
    path is tested against, and the baseline ``benchmarks/streams.py`` times it against."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._cache: list[dict[int, Tensor]] = [{} for _ in self.shards]

    def permutation(self, client: int, epoch: int) -> Tensor:
        if not self.shuffle:
            return self.shards[client]
        cache = self._cache[client]
        if epoch not in cache:
            for old in [e for e in cache if e < epoch - 1]:
                del cache[old]
            cache[epoch] = super().permutation(client, epoch)
        return cache[epoch]

    def indices(self, round_index: int, clients: Tensor | None = None) -> Tensor:
        if round_index < 0:
            raise ValueError(f"round_index must be >= 0, got {round_index}")
        batch = self.batch_size
        ids = range(len(self.shards)) if clients is None else clients.tolist()
        out = torch.empty(len(ids), batch, dtype=torch.int64)
        if self.sampling == "without_replacement":
            for row, i in enumerate(ids):
                gen = _generator(self.seed, i, round_index, _WITHOUT_REPLACEMENT_TAG)
                out[row] = self.shards[i][torch.randperm(self.sizes[i], generator=gen)[:batch]]
            return out
        for row, i in enumerate(ids):
            size = self.sizes[i]
            pos, filled = round_index * batch, 0
            while filled < batch:
                epoch, offset = divmod(pos, size)
                take = min(batch - filled, size - offset)
                out[row, filled : filled + take] = self.permutation(i, epoch)[
                    offset : offset + take
                ]
                filled += take
                pos += take
        return out
