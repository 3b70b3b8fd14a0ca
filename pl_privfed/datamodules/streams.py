"""``ClientStreams``: each client's minibatches as a pure function of the round number."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["ClientStreams"]


def _generator(*key: int) -> torch.Generator:
    """A CPU generator seeded with 64 bits drawn by NumPy's ``SeedSequence`` from ``key``."""
    state = np.random.SeedSequence(list(key)).generate_state(2)
    return torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))


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
        self._cache: list[dict[int, Tensor]] = [{} for _ in shards]

    def permutation(self, client: int, epoch: int) -> Tensor:
        """Dataset indices of ``client``'s shard in the order of its local ``epoch``.

        Without ``shuffle`` every epoch walks the shard in its stored (sorted) order: the fixed
        order of a cyclic incremental-gradient method.
        """
        if not self.shuffle:
            return self.shards[client]
        cache = self._cache[client]
        if epoch not in cache:
            gen = _generator(self.seed, client, epoch)
            perm = self.shards[client][torch.randperm(self.sizes[client], generator=gen)]
            for old in [e for e in cache if e < epoch - 1]:
                del cache[old]
            cache[epoch] = perm
        return cache[epoch]

    def indices(self, round_index: int, clients: Tensor | None = None) -> Tensor:
        """``[c, batch_size]`` dataset indices of round ``round_index`` for the clients
        ``clients`` (default: every client, in order)."""
        if round_index < 0:
            raise ValueError(f"round_index must be >= 0, got {round_index}")
        batch = self.batch_size
        ids = range(len(self.shards)) if clients is None else clients.tolist()
        out = torch.empty(len(ids), batch, dtype=torch.int64)
        if self.sampling == "without_replacement":
            for row, i in enumerate(ids):
                gen = _generator(self.seed, i, round_index, 0x57)
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
