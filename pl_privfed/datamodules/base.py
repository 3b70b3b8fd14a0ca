"""``FederatedDataModule``: one training batch = one round = one minibatch per client."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, Subset, TensorDataset

from pl_privfed.checks import check_positive_int
from pl_privfed.datamodules.partition import IIDPartitioner, Partitioner

__all__ = ["ClientStreams", "DatasetDataModule", "FederatedDataModule"]


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

    Client ``i``'s examples form an infinite stream: the concatenation of per-local-epoch
    permutations of its shard (or, with ``shuffle=False``, of the shard in its stored order), where the permutation of local epoch ``e`` is drawn by a
    ``torch.Generator`` seeded from ``(seed, i, e)`` (through NumPy's ``SeedSequence``). Round
    ``k`` takes stream positions ``[k·B, (k+1)·B)``. A batch may straddle two local epochs; a
    shard smaller than ``B`` yields batches with repeats.
    """

    def __init__(
        self, shards: list[np.ndarray], batch_size: int, seed: int, shuffle: bool = True
    ) -> None:
        self.shards = [torch.as_tensor(np.asarray(s, dtype=np.int64)) for s in shards]
        self.sizes = [len(s) for s in shards]
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
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

    def state_dict(self) -> dict[str, int]:
        """Makes the loader resumable for Lightning (which otherwise warns when a run resumes
        mid-epoch): nothing needs saving, since iteration starts at ``trainer.global_step``;
        the round is recorded for reference."""
        trainer = self.datamodule.trainer
        return {"round": int(trainer.global_step) if trainer is not None else 0}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        """Nothing to restore: the restored ``trainer.global_step`` decides the next round."""

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

    # ------------------------------------------------------------------ from your own data
    @classmethod
    def from_datasets(
        cls,
        train: Dataset,
        test: Dataset,
        *,
        num_classes: int | None = None,
        **kwargs: Any,
    ) -> DatasetDataModule:
        """A federation over your own map-style datasets of ``(input, target)`` pairs.

        The training set is split across clients by the partitioner (labels from a
        ``TensorDataset``'s second tensor, a ``targets`` attribute, or each item); the test set
        evaluates the global model. Inputs of one dataset must share a shape.

        Args:
            train: training examples, ``train[i] = (input, target)``.
            test: held-out examples for validation and test.
            num_classes: number of classes, for accuracy; ``None`` infers it from integer
                labels (``max + 1``) and means regression (no accuracy) for float targets.
            **kwargs: :class:`FederatedDataModule` arguments (``num_clients``, ``batch_size``,
                ``partitioner``, ``seed``, ...).

        Example::

            dm = FederatedDataModule.from_datasets(torchvision_train, torchvision_test,
                                                   num_clients=20, batch_size=32)
        """
        return DatasetDataModule(train, test, num_classes=num_classes, **kwargs)

    @classmethod
    def from_tensors(
        cls,
        x_train: Tensor,
        y_train: Tensor,
        x_test: Tensor,
        y_test: Tensor,
        *,
        num_classes: int | None = None,
        **kwargs: Any,
    ) -> DatasetDataModule:
        """A federation over tensors (or NumPy arrays): ``x_*`` inputs ``[N, ...]``, ``y_*``
        targets ``[N]`` (integer class indices) or real-valued (regression); see
        :meth:`from_datasets`. Inputs and real-valued targets are converted to the default
        dtype (``float32``), class indices to ``int64``.

        Example::

            dm = FederatedDataModule.from_tensors(x_train, y_train, x_test, y_test,
                                                  num_clients=10, batch_size=32,
                                                  partitioner=DirichletPartitioner(0.5))
        """
        dtype = torch.get_default_dtype()
        tensors: dict[str, Tensor] = {}
        for name, value in (("x_train", x_train), ("y_train", y_train),
                            ("x_test", x_test), ("y_test", y_test)):  # fmt: skip
            t = torch.as_tensor(value)
            if name.startswith("x") or t.is_floating_point():
                t = t.to(dtype)  # inputs (and real-valued targets) in the default dtype
            else:
                t = t.long()  # class indices
            tensors[name] = t
        for split in ("train", "test"):
            x, y = tensors[f"x_{split}"], tensors[f"y_{split}"]
            if x.dim() == 0 or y.dim() == 0 or len(x) != len(y) or len(x) == 0:
                raise ValueError(
                    f"x_{split} and y_{split} must hold the same positive number of examples "
                    f"along dimension 0, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
                )
        return cls.from_datasets(
            TensorDataset(tensors["x_train"], tensors["y_train"]),
            TensorDataset(tensors["x_test"], tensors["y_test"]),
            num_classes=num_classes,
            **kwargs,
        )

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
        largest = int(self.client_sizes.max()) if len(self.client_sizes) else 0
        if self.batch_size > largest:
            raise ValueError(
                f"batch_size={self.batch_size} is larger than every client's shard (the largest "
                f"of the {self.num_clients} holds {largest} examples), so every minibatch would "
                f"repeat examples; set batch_size <= {largest} (the shard size gives full-batch "
                "rounds when the shards are equal)"
            )
        if self.local_epochs is not None:
            largest = int(self.client_sizes.max())
            self.local_batches = self.local_epochs * math.ceil(largest / self.batch_size)
        self.streams = ClientStreams(
            self.shards, self.batch_size * self.local_batches, self.seed, self.shuffle
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
            "client_sizes": self.client_sizes.tolist(),
            "rounds_per_epoch": self.rounds_per_epoch,
            "num_classes": self.num_classes,
            "partitioner": repr(self.partitioner),
        }


def _labels(dataset: Dataset) -> Tensor:
    tensors = getattr(dataset, "tensors", None)
    if tensors is not None:
        return tensors[1]
    if hasattr(dataset, "targets"):
        return torch.as_tensor(np.asarray(dataset.targets))
    return torch.as_tensor(np.asarray([np.asarray(dataset[i][1]) for i in range(len(dataset))]))


class DatasetDataModule(FederatedDataModule):
    """A :class:`FederatedDataModule` over given map-style datasets: what
    :meth:`FederatedDataModule.from_datasets` and :meth:`~FederatedDataModule.from_tensors`
    return.

    Args:
        train: training examples ``(input, target)``, split across the clients.
        test: held-out examples ``(input, target)`` for validation and test.
        num_classes: number of classes (accuracy is logged); ``None`` infers it from integer
            labels and means regression for float targets.
        **kwargs: :class:`FederatedDataModule` arguments.
    """

    def __init__(
        self, train: Dataset, test: Dataset, num_classes: int | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        for name, dataset in (("train", train), ("test", test)):
            if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
                raise ValueError(f"{name} must be a map-style dataset, got {dataset!r}")
            if len(dataset) == 0:
                raise ValueError(f"{name} must hold at least one example, got an empty dataset")
        if num_classes is not None:
            check_positive_int("num_classes", num_classes)
        else:
            labels = _labels(train)
            if not labels.is_floating_point() and labels.dim() == 1:
                num_classes = int(max(labels.max(), _labels(test).max())) + 1
        self.num_classes = num_classes
        self._datasets = (train, test)

    def load_datasets(self) -> tuple[Dataset, Dataset]:
        return self._datasets
