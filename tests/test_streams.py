"""The vectorized client streams: the same indices as the per-client definition, whatever the
clients asked, their chunks, their order and the rounds asked before."""

import pickle
from itertools import pairwise

import numpy as np
import pytest
import torch

from pl_privfed.datamodules import ClientStreams, ReferenceClientStreams, randperm
from pl_privfed.datamodules.streams import seed_sequence_seeds


def shards_of(sizes, seed=0):
    """Disjoint shards of the given sizes, each sorted (as the partitioners store them)."""
    perm = np.random.default_rng(seed).permutation(sum(sizes))
    bounds = np.cumsum([0, *sizes])
    return [np.sort(perm[a:b]) for a, b in pairwise(bounds)]


@pytest.mark.parametrize(
    ("sizes", "batch", "sampling", "shuffle"),
    [
        ([5] * 12, 5, "epochs", True),  # the quickstart's shape: a new epoch every round
        ([1, 3, 7, 12, 2, 30, 5, 9], 4, "epochs", True),  # straddles; shards below the batch
        ([1, 2, 3], 7, "epochs", True),  # a round spans three or more epochs of a client
        ([4, 9, 6, 11], 3, "epochs", False),  # the stored order (incremental gradient)
        ([6, 9, 4, 12, 5], 4, "without_replacement", True),
        ([3, 300, 5, 227, 228, 1], 4, "epochs", True),  # shards past the twister's reach
        ([300, 6, 250], 5, "without_replacement", True),
    ],
)
@pytest.mark.parametrize("seed", [0, 7, 2**40 + 3])  # a seed over 32 bits takes two words
def test_indices_equal_the_per_client_definition(
    monkeypatch, sizes, batch, sampling, shuffle, seed
):
    monkeypatch.setattr(randperm, "MIN_ROWS", 1)  # every miss drawn by the twister path
    shards = shards_of(sizes)
    new = ClientStreams(shards, batch, seed, shuffle, sampling)
    old = ReferenceClientStreams(shards, batch, seed, shuffle, sampling)
    gen = np.random.default_rng(1)
    # rounds in order (the cache hits), then jumps forward and back (it misses)
    for k in [*range(8), 40, 3, 41, 0, 97, 96]:
        full = old.indices(k)
        assert torch.equal(new.indices(k), full), k
        ids = torch.as_tensor(gen.choice(len(sizes), gen.integers(0, 2 * len(sizes)), True))
        assert torch.equal(new.indices(k, ids), full[ids]), k  # any subset, order, repeats
    if shuffle:  # another seed, other streams
        other = ClientStreams(shards, batch, seed + 1, shuffle, sampling)
        assert not torch.equal(new.indices(3), other.indices(3))


@pytest.mark.parametrize("chunk", [1, 5])
def test_indices_do_not_depend_on_the_chunking_or_on_earlier_calls(chunk):
    shards = shards_of([3, 8, 5, 1, 13, 6] * 2)
    streams, whole = ClientStreams(shards, 4, 3), ClientStreams(shards, 4, 3)
    for k in range(8):
        ids = torch.arange(len(shards))
        parts = [streams.indices(k, part) for part in reversed(ids.split(chunk))]
        assert torch.equal(torch.cat(parts[::-1]), whole.indices(k))
    # a fresh object (a resumed run) at round 7 reads what the used ones read
    assert torch.equal(ClientStreams(shards, 4, 3).indices(7), whole.indices(7))
    # and so does a pickled copy, cache included (a datamodule sent to another process)
    assert torch.equal(pickle.loads(pickle.dumps(streams)).indices(8), whole.indices(8))


def test_every_example_once_per_local_epoch_and_uniform_permutations():
    clients, size = 4000, 4
    streams = ClientStreams(shards_of([size] * clients), 2, seed=5)
    epoch = torch.cat([streams.indices(0), streams.indices(1)], 1)  # rounds 0-1: epoch 0
    assert torch.equal(epoch.sort(1).values, torch.as_tensor(np.stack(streams.shards)))
    # which of its shard's examples each client draws first: uniform over the 4 positions
    first = (torch.stack(streams.shards) == epoch[:, :1]).int().argmax(1)
    counts = torch.bincount(first, minlength=size).double()
    expected = clients / size
    assert ((counts - expected).abs() < 5 * (clients * 0.25 * 0.75) ** 0.5).all(), counts
    # the next epoch is a fresh permutation, not the same one again
    second = torch.cat([streams.indices(2), streams.indices(3)], 1)
    assert (second != epoch).any(1).float().mean() > 0.9  # 23 of 24 permutations differ


def test_seed_sequence_seeds_are_numpys():
    gen = np.random.default_rng(2)
    clients, epochs = gen.integers(0, 2**32, 50), gen.integers(0, 2**31, 50)
    for seed in (0, 123, 2**32 + 5, 2**70):
        for tag in ((), (0x57,)):
            got = seed_sequence_seeds(seed, clients, epochs, *tag)
            for row, value in enumerate(got):
                key = [seed, int(clients[row]), int(epochs[row]), *tag]
                words = np.random.SeedSequence(key).generate_state(2)
                assert value == int(words[0]) << 32 | int(words[1])
    with pytest.raises(ValueError, match="must be >= 0, got -1"):
        seed_sequence_seeds(-1, clients)
    with pytest.raises(ValueError, match=r"in \[0, 2\*\*32\)"):
        seed_sequence_seeds(0, np.array([2**32]))


@pytest.mark.parametrize("agrees", [True, False])
def test_randperms_are_torchs_bit_for_bit(monkeypatch, agrees):
    """The Mersenne Twister + Fisher–Yates computation of many ``randperm``s equals torch's own
    call per ``(n, seed)``, for every shard size up to its reach and past it (torch's), seeds
    above ``2**32`` included; a torch that disagrees on the probe gets its own calls."""
    monkeypatch.setattr(randperm, "MIN_ROWS", 1)  # the twister path from one row up
    if not agrees:
        monkeypatch.setattr(randperm, "_agrees", lambda: False)
    rng = np.random.default_rng(3)
    seeds = [int(s) for s in rng.integers(0, 2**63, 400, dtype=np.int64)]
    seeds[:4] = [0, 2**32 - 1, 2**32, 2**64 - 1]
    sizes = np.concatenate([np.arange(1, 231), rng.integers(1, 40, 170)])
    gen = torch.Generator()
    expected = torch.cat(
        [torch.randperm(int(n), generator=gen.manual_seed(s)) for n, s in zip(sizes, seeds)]
    ).numpy()
    assert np.array_equal(randperm.randperms(sizes, seeds), expected)
    assert np.array_equal(
        randperm.randperms(sizes[:200], seeds[:200]), expected[: sizes[:200].sum()]
    )
    assert randperm.randperms(np.array([], dtype=np.int64), []).shape == (0,)
    assert randperm._agrees() is agrees  # this torch's randperm is the algorithm written down


def test_a_round_asked_chunk_by_chunk_is_drawn_at_once_and_unchanged(monkeypatch):
    """After a round that asked every client, the next round's first request draws every
    client's permutations in one call (full participation served in chunks); what each chunk
    gets is still the per-client definition's, whatever is asked next (a cohort, a jump)."""
    rng = np.random.default_rng(5)
    sizes = rng.integers(1, 10, 1200).tolist()
    shards = shards_of(sizes)
    new = ClientStreams(shards, 4, 11)
    old = ReferenceClientStreams(shards, 4, 11)
    calls = []
    real = new._randperms
    monkeypatch.setattr(new, "_randperms", lambda n, s: calls.append(len(n)) or real(n, s))
    chunks = torch.arange(len(sizes)).split(89)
    for k in range(4):
        calls.clear()
        for ids in chunks:
            assert torch.equal(new.indices(k, ids), old.indices(k, ids)), k
        if k >= 1:  # the previous round asked everyone: one draw for the whole round
            assert len(calls) == 1 and calls[0] > 500, (k, calls)
        else:
            assert len(calls) == len(chunks)
    cohort = torch.as_tensor(np.sort(rng.choice(len(sizes), 100, replace=False)))
    for k in (4, 9, 10, 2):  # a cohort after full rounds, a jump ahead, back
        assert torch.equal(new.indices(k, cohort), old.indices(k, cohort)), k
