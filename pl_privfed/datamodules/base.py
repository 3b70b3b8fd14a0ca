"""``FederatedDataModule``: one training batch = one round = one minibatch per client."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, Literal

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from pl_privfed.checks import check_positive_int
from pl_privfed.datamodules.partition import IIDPartitioner, Partitioner

__all__ = ["ClientStreams", "FederatedDataModule"]


def _subset(dataset: Dataset, size: int | None, seed: int) -> Dataset:
    """A seeded random subset of ``size`` examples (kept in dataset order), or the dataset."""
    if size is None or size >= len(dataset):
        return dataset
    rng = np.random.default_rng(np.random.SeedSequence([seed, 0x5B5E7]))
    keep = torch.as_tensor(np.sort(rng.choice(len(dataset), size, replace=False)))
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return TensorDataset(*(t[keep] for t in tensors))
    return Subset(dataset, keep.tolist())


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
            state = np.random.SeedSequence([self.seed, client, epoch]).generate_state(2)
            gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
            perm = self.shards[client][torch.randperm(self.sizes[client], generator=gen)]
            for old in [e for e in cache if e < epoch - 1]:
                del cache[old]
            cache[epoch] = perm
        return cache[epoch]

    def indices(self, round_index: int) -> Tensor:
        """``[num_clients, batch_size]`` dataset indices of round ``round_index``."""
        if round_index < 0:
            raise ValueError(f"round_index must be >= 0, got {round_index}")
        batch = self.batch_size
        out = torch.empty(len(self.shards), batch, dtype=torch.int64)
        if self.sampling == "without_replacement":
            for i, size in enumerate(self.sizes):
                state = np.random.SeedSequence([self.seed, i, round_index, 0x57]).generate_state(2)
                gen = torch.Generator().manual_seed(int(state[0]) << 32 | int(state[1]))
                out[i] = self.shards[i][torch.randperm(size, generator=gen)[:batch]]
            return out
        for i, size in enumerate(self.sizes):
            pos, filled = round_index * batch, 0
            while filled < batch:
                epoch, offset = divmod(pos, size)
                take = min(batch - filled, size - offset)
                out[i, filled : filled + take] = self.permutation(i, epoch)[offset : offset + take]
                filled += take
                pos += take
        return out


class _RoundLoader:
    """The training "dataloader": yields the remaining rounds of the current Lightning epoch.

    It starts at ``trainer.global_step`` (read when iteration starts; Lightning restores it
    before iterating), so a run resumed from a checkpoint continues with the right rounds.
    """

    def __init__(self, datamodule: FederatedDataModule) -> None:
        self.datamodule = datamodule

    def __len__(self) -> int:
        return self.datamodule.rounds_per_epoch

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        trainer = self.datamodule.trainer
        start = int(trainer.global_step) if trainer is not None else 0
        per_epoch = self.datamodule.rounds_per_epoch
        for k in range(start, (start // per_epoch + 1) * per_epoch):
            yield self.datamodule.round_batch(k)


class FederatedDataModule(pl.LightningDataModule):
    """Splits a dataset across clients and serves one stacked minibatch per client per round.

    A training batch is ``(inputs [n, B, *input_shape], targets [n, B, ...])``; with
    ``local_batches: T > 1`` it is ``(inputs [n, T, B, *input_shape], targets [n, T, B, ...])``:
    ``T`` consecutive minibatches of each client's stream, one per local step of an algorithm
    with local minibatch SGD (:class:`~pl_privfed.algorithms.LocalSGD`). Validation and
    test use the global held-out test set. One Lightning epoch is
    ``ceil(N_train / (n · T · B))`` rounds: the federation sees the training set once on average.

    Subclasses implement :meth:`load_datasets` and set ``num_classes`` (``None`` for regression);
    those with natural per-client data override :meth:`client_indices`.

    Args:
        num_clients: ``n``.
        batch_size: ``B``, examples per client per round.
        partitioner: how to split the training set (default ``IIDPartitioner(seed)``).
        seed: seed of the per-client minibatch sampling.
        eval_batch_size: batch size of the validation/test dataloaders.
        max_train_examples: keep only this many training examples (a seeded random subset,
            drawn before partitioning) — for shortened runs on a CPU; ``None`` keeps all.
        max_test_examples: likewise for the test set.
        local_batches: ``T``, minibatches per client per round (default 1: ``[n, B, ...]``).
        local_epochs: instead of ``local_batches``: that many passes over the largest shard per
            round, ``T = local_epochs · ceil(max_i N_i / B)`` (set when the data is loaded).
        shuffle: reshuffle each client's shard every local epoch (default); ``False`` walks it in
            its stored order every time (cyclic incremental gradient, paper 004 App. G).
        batch_sampling: ``"epochs"`` (default): a client's ``T·B`` examples of a round are the
            next positions of its stream of per-epoch permutations (every example once per local
            epoch); ``"without_replacement"``: every round draws them uniformly without
            replacement from the client's shard, independently of the other rounds — what
            PORTER-DP's "sample a minibatch" does (paper 001 Algorithm 1) and what record-level
            privacy amplification by sampling assumes (docs/privacy.md). Needs ``shuffle`` and
            ``T·B`` no more than the smallest shard.
    """

    num_classes: int | None = None

    def __init__(
        self,
        num_clients: int = 10,
        batch_size: int = 32,
        partitioner: Partitioner | None = None,
        seed: int = 0,
        eval_batch_size: int = 1024,
        max_train_examples: int | None = None,
        max_test_examples: int | None = None,
        local_batches: int = 1,
        local_epochs: int | None = None,
        shuffle: bool = True,
        batch_sampling: Literal["epochs", "without_replacement"] = "epochs",
    ) -> None:
        super().__init__()
        self.local_batches = check_positive_int("local_batches", local_batches)
        if local_epochs is not None:
            check_positive_int("local_epochs", local_epochs)
            if local_batches != 1:
                raise ValueError(
                    f"give local_batches or local_epochs, not both: got local_batches="
                    f"{local_batches}, local_epochs={local_epochs}"
                )
        self.local_epochs = local_epochs
        if not isinstance(shuffle, bool):
            raise ValueError(f"shuffle must be true or false, got {shuffle!r}")
        self.shuffle = shuffle
        if batch_sampling not in ("epochs", "without_replacement"):
            raise ValueError(
                f"batch_sampling must be 'epochs' or 'without_replacement', got {batch_sampling!r}"
            )
        if batch_sampling == "without_replacement" and not shuffle:
            raise ValueError(
                "batch_sampling='without_replacement' draws random examples every round; it "
                "needs shuffle: true, got shuffle=False"
            )
        self.batch_sampling = batch_sampling
        for name, value in [
            ("max_train_examples", max_train_examples),
            ("max_test_examples", max_test_examples),
        ]:
            if value is not None:
                check_positive_int(name, value)
        self.max_train_examples = max_train_examples
        self.max_test_examples = max_test_examples
        self.num_clients = check_positive_int("num_clients", num_clients)
        self.batch_size = check_positive_int("batch_size", batch_size)
        self.eval_batch_size = check_positive_int("eval_batch_size", eval_batch_size)
        if partitioner is not None and not isinstance(partitioner, Partitioner):
            raise ValueError(f"partitioner must be a Partitioner, got {partitioner!r}")
        self.partitioner = partitioner if partitioner is not None else IIDPartitioner(seed)
        self.seed = seed
        self.train_dataset: Dataset | None = None
        self.test_dataset: Dataset | None = None
        self.train_inputs: Tensor | None = None
        self.train_targets: Tensor | None = None
        self.shards: list[np.ndarray] = []
        self.client_sizes = np.zeros(0, dtype=np.int64)
        self.input_shape: tuple[int, ...] = ()
        self.streams: ClientStreams | None = None

    # ------------------------------------------------------------------ subclass API
    def load_datasets(self) -> tuple[Dataset, Dataset]:
        """Return ``(train, test)`` map-style datasets of ``(input, target)`` pairs."""
        raise NotImplementedError

    def train_labels(self) -> np.ndarray:
        """Labels of the training set (used by the partitioner)."""
        ds = self.train_dataset
        if self.train_targets is not None:
            return self.train_targets.numpy()
        if hasattr(ds, "targets"):
            return np.asarray(ds.targets)
        return np.asarray([int(ds[i][1]) for i in range(len(ds))])

    def client_indices(self) -> list[np.ndarray]:
        """One index array per client into the training set (default: the partitioner's)."""
        return self.partitioner(self.train_labels(), self.num_clients)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str | None = None) -> None:
        if self.streams is not None:
            return
        train, test = self.load_datasets()
        self.train_dataset = _subset(train, self.max_train_examples, self.seed)
        self.test_dataset = _subset(test, self.max_test_examples, self.seed)
        tensors = getattr(self.train_dataset, "tensors", None)
        if tensors is not None:
            self.train_inputs, self.train_targets = tensors[0], tensors[1]
        self.input_shape = tuple(self.train_dataset[0][0].shape)
        self.shards = self.client_indices()
        if len(self.shards) != self.num_clients:
            raise ValueError(
                f"num_clients={self.num_clients} but the data has {len(self.shards)} clients"
            )
        self.client_sizes = np.array([len(s) for s in self.shards], dtype=np.int64)
        if self.local_epochs is not None:
            largest = int(self.client_sizes.max())
            self.local_batches = self.local_epochs * math.ceil(largest / self.batch_size)
        per_round = self.batch_size * self.local_batches
        if self.batch_sampling == "without_replacement" and per_round > self.client_sizes.min():
            raise ValueError(
                f"batch_sampling='without_replacement' draws {per_round} examples per client and "
                f"round (batch_size × local_batches) but the smallest shard has "
                f"{int(self.client_sizes.min())}: lower batch_size or local_batches"
            )
        self.streams = ClientStreams(
            self.shards, per_round, self.seed, self.shuffle, self.batch_sampling
        )

    @property
    def rounds_per_epoch(self) -> int:
        total = int(self.client_sizes.sum()) if len(self.client_sizes) else 0
        per_round = self.num_clients * self.batch_size * self.local_batches
        return max(1, math.ceil(total / per_round))

    def round_indices(self, round_index: int) -> Tensor:
        """Training-set indices of round ``round_index``: ``[n, B]``, or ``[n, T, B]`` with
        ``local_batches: T > 1`` (stream positions ``[k·T·B, (k+1)·T·B)``, in order)."""
        if self.streams is None:
            self.setup("fit")
        idx = self.streams.indices(round_index)
        if self.local_batches > 1:
            idx = idx.view(idx.shape[0], self.local_batches, self.batch_size)
        return idx

    def round_batch(self, round_index: int) -> tuple[Tensor, Tensor]:
        """The stacked minibatches ``(inputs [n, B, ...], targets [n, B, ...])`` of a round
        (``[n, T, B, ...]`` with ``local_batches: T > 1``)."""
        idx = self.round_indices(round_index)
        if self.train_inputs is not None:
            return self.train_inputs[idx], self.train_targets[idx]
        items = [self.train_dataset[int(j)] for j in idx.flatten()]
        inputs = torch.stack([torch.as_tensor(x) for x, _ in items])
        targets = torch.stack([torch.as_tensor(y) for _, y in items])
        lead = tuple(idx.shape)
        return inputs.view(*lead, *inputs.shape[1:]), targets.view(*lead, *targets.shape[1:])

    def preprocess(self, inputs: Tensor, train: bool, round_index: int) -> Tensor:
        """Per-batch preprocessing on the training device (identity here).

        Called by :meth:`on_after_batch_transfer` for every batch: training batches arrive as
        ``[n · B, ...]`` (the client axis folded in) with ``train=True`` and the round number
        (augmentations draw from a generator seeded by ``(seed, round)``, so a resumed run
        augments exactly as the uninterrupted one); evaluation batches with ``train=False``.
        """
        return inputs

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if type(self).preprocess is FederatedDataModule.preprocess:
            return batch
        inputs, targets = batch
        trainer = self.trainer
        train = trainer is not None and trainer.training
        round_index = int(trainer.global_step) if train else 0
        if train:  # fold the client (and local-step) axes into one batch axis
            lead = inputs.shape[: inputs.dim() - len(self.input_shape)]
            flat = inputs.reshape(-1, *inputs.shape[len(lead) :])
            flat = self.preprocess(flat, True, round_index)
            return flat.reshape(*lead, *flat.shape[1:]), targets
        return self.preprocess(inputs, False, round_index), targets

    def train_dataloader(self) -> _RoundLoader:
        return _RoundLoader(self)

    def _eval_loader(self) -> DataLoader:
        if self.test_dataset is None:
            self.setup("validate")
        return DataLoader(self.test_dataset, batch_size=self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader()

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader()

    def describe(self) -> dict[str, Any]:
        """Sizes and settings of the federation, for logs and summaries."""
        return {
            "num_clients": self.num_clients,
            "batch_size": self.batch_size,
            "local_batches": self.local_batches,
            "shuffle": self.shuffle,
            "batch_sampling": self.batch_sampling,
            "client_sizes": self.client_sizes.tolist(),
            "rounds_per_epoch": self.rounds_per_epoch,
            "num_classes": self.num_classes,
            "partitioner": repr(self.partitioner),
        }
