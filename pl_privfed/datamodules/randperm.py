"""``torch.randperm(n, generator=torch.Generator().manual_seed(s))`` for many ``(n, s)`` at
once, bit for bit, in NumPy.

The client streams (:mod:`pl_privfed.datamodules.streams`) draw every client's permutation of
every local epoch from its own freshly seeded generator. One ``manual_seed`` + ``randperm``
per client is the last per-client Python call of a round (about a sixth of the 10,000-client
quickstart's round on this project's CPU, CHANGELOG.md). What torch computes there is
fixed and small:

- ``manual_seed(s)`` seeds a 32-bit Mersenne Twister (MT19937) with ``s mod 2**32``
  (``at::mt19937``: ``state[0] = s``, ``state[i] = 1812433253 · (state[i-1] ^ (state[i-1] >>
  30)) + i``);
- ``randperm(n)`` on the CPU, for small ``n``, is the Fisher–Yates shuffle of ``0..n-1`` that
  swaps position ``i`` with ``i + random() % (n - i)`` for ``i = 0..n-2``, ``random()`` the
  twister's next tempered 32-bit output (``aten/src/ATen/native/TensorFactories.cpp``,
  ``randperm_cpu``).

The first 226 outputs of a freshly seeded twister read only the initial state's words
``0..k+1`` and ``397..397+k`` (one regeneration of the state), so the permutations of shards of
at most 227 examples are computed here for all the clients at once, when there are at least
:data:`MIN_ROWS` of them (the recurrence's ~400 NumPy steps cost about 2 ms whatever the
number of rows: a win from several hundred clients asked at once, e.g. ``client_chunk: all``
or a GPU's chunk, a loss on the CPU's chunks of ~90); fewer rows, larger shards, and any torch
whose ``randperm`` disagrees with this on a probe (:func:`_agrees`, checked once per process),
use torch itself. ``tests/test_streams.py`` holds the two equal.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

__all__ = ["randperms"]

#: the largest shard whose permutation is computed here (227 needs 226 twister outputs)
MAX_SIZE = 227
#: the fewest permutations computed here at once: the seeding recurrence is ~400 NumPy steps
#: whatever the number of rows (about 2 ms), where torch's own call costs 5–10 µs a row
MIN_ROWS = 512

_MULT = np.uint32(1812433253)
_UPPER, _LOWER, _MATRIX = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x9908B0DF)
_TEMPER_B, _TEMPER_C = np.uint32(0x9D2C5680), np.uint32(0xEFC60000)


def randperms(sizes: np.ndarray, seeds: list[int]) -> np.ndarray:
    """``torch.randperm(n, generator=g.manual_seed(s))`` for every ``(n, s)`` of ``sizes``
    and ``seeds`` (64-bit seeds), concatenated (``int64``)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if len(sizes) == 0:
        return np.empty(0, dtype=np.int64)
    small = sizes <= MAX_SIZE
    if int(small.sum()) < MIN_ROWS or not _agrees():
        return _torch_randperms(sizes, seeds)
    if small.all():
        return _twister_randperms(sizes, seeds)
    out = np.empty(int(sizes.sum()), dtype=np.int64)  # each row in its place
    start = np.cumsum(sizes) - sizes
    for rows, compute in ((np.flatnonzero(small), _twister_randperms),
                          (np.flatnonzero(~small), _torch_randperms)):  # fmt: skip
        parts = compute(sizes[rows], [seeds[r] for r in rows])
        _place(out, start[rows], sizes[rows], parts)
    return out


def _place(out: np.ndarray, starts: np.ndarray, sizes: np.ndarray, parts: np.ndarray) -> None:
    """Write the concatenated rows ``parts`` at ``starts`` of ``out``."""
    offset = np.repeat(starts - (np.cumsum(sizes) - sizes), sizes)
    out[np.arange(len(parts)) + offset] = parts


def _torch_randperms(sizes: np.ndarray, seeds: list[int]) -> np.ndarray:
    gen, randperm = torch.Generator(), torch.randperm
    perms = [randperm(n, generator=gen.manual_seed(s)) for n, s in zip(sizes.tolist(), seeds)]
    return torch.cat(perms).numpy() if perms else np.empty(0, dtype=np.int64)


def _outputs(seeds: list[int], count: int) -> np.ndarray:
    """The first ``count`` (≤ 226) tempered outputs of MT19937 seeded with each seed mod
    ``2**32``: ``[count, rows]`` ``uint32``."""
    low = np.fromiter((s & 0xFFFFFFFF for s in seeds), dtype=np.uint32, count=len(seeds))
    need = 397 + count
    head = np.empty((count + 1, len(seeds)), dtype=np.uint32)  # state words 0..count
    tail = np.empty((count, len(seeds)), dtype=np.uint32)  # words 397..396+count
    x, t = low.copy(), np.empty_like(low)
    head[0] = x
    for i in range(1, need):  # the seeding recurrence, every row at once
        np.right_shift(x, 30, out=t)
        np.bitwise_xor(x, t, out=x)
        np.multiply(x, _MULT, out=x)
        np.add(x, np.uint32(i), out=x)
        if i <= count:
            head[i] = x
        if i >= 397:
            tail[i - 397] = x
    y = (head[:count] & _UPPER) | (head[1:] & _LOWER)
    v = tail ^ (y >> np.uint32(1)) ^ np.where((y & np.uint32(1)).astype(bool), _MATRIX, 0)
    v = v.astype(np.uint32)
    v ^= v >> np.uint32(11)
    v ^= (v << np.uint32(7)) & _TEMPER_B
    v ^= (v << np.uint32(15)) & _TEMPER_C
    v ^= v >> np.uint32(18)
    return v


def _twister_randperms(sizes: np.ndarray, seeds: list[int]) -> np.ndarray:
    """:func:`randperms` for shards of at most :data:`MAX_SIZE`, every row at once."""
    largest = int(sizes.max())
    rows = np.arange(len(sizes))
    perm = np.broadcast_to(np.arange(largest), (len(sizes), largest)).copy()
    if largest > 1:
        draws = _outputs(seeds, largest - 1).astype(np.int64)
        for i in range(largest - 1):  # Fisher–Yates step i of every row still shuffling
            live = np.flatnonzero(sizes - 1 > i)
            if not len(live):
                break
            z = i + draws[i, live] % (sizes[live] - i)
            r = rows[live]
            held = perm[r, i].copy()
            perm[r, i] = perm[r, z]
            perm[r, z] = held
    return perm[np.arange(largest)[None, :] < sizes[:, None]]


@functools.cache
def _agrees() -> bool:
    """Whether this torch's ``randperm`` is the algorithm above (probed once per process on
    shards of 1 to 40 examples and a few seeds, including ones above ``2**32``)."""
    seeds = [0, 1, 5489, 2**32 - 1, 2**32 + 7, 2**63 + 12345, 0x9E3779B97F4A7C15, 123456789]
    sizes = np.array([1 + (7 * k) % 40 for k in range(len(seeds) - 2)] + [40, 2])
    return bool(np.array_equal(_twister_randperms(sizes, seeds), _torch_randperms(sizes, seeds)))
