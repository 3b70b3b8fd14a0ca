"""``FederatedDataModule``: one training batch = one round = one minibatch per client.

The pieces it assembles live beside it: the per-client streams (:mod:`.streams`), the
validation split (:mod:`.validation`), the round batches Lightning sees (:mod:`.rounds`) and the
dataset helpers (:mod:`.datasets`); their public names are re-exported here as before.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Literal

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from pl_privfed.checks import check_choice, check_positive_int
from pl_privfed.datamodules.datasets import (
    labels_of,
    majority_fraction,
    random_subset,
    take,
    tensor_datasets,
)
from pl_privfed.datamodules.partition import IIDPartitioner, Partitioner
from pl_privfed.datamodules.rounds import (
    RoundBatch,
    RoundLoader,
    TensorRoundBatch,
    round_description,
)
from pl_privfed.datamodules.streams import ClientStreams
from pl_privfed.datamodules.validation import hold_out_per_client, validation_split

__all__ = [
    "ClientStreams",
    "DatasetDataModule",
    "FederatedDataModule",
    "RoundBatch",
    "TensorRoundBatch",
    "round_description",
    "validation_split",
]


class FederatedDataModule(pl.LightningDataModule):
    """Splits a dataset across clients and serves one stacked minibatch per client per round.

    A training batch is ``(inputs [n, B, *input_shape], targets [n, B, ...])``; with
    ``local_batches: T > 1`` it is ``(inputs [n, T, B, *input_shape], targets [n, T, B, ...])``:
    ``T`` consecutive minibatches of each client's stream, one per local step of an algorithm
    with local minibatch SGD (:class:`~pl_privfed.algorithms.LocalSGD`). One Lightning epoch is
    ``ceil(N_train / (n · T · B))`` rounds: the federation sees its training data once on average.

    **Validation and test.** A seeded ``val_fraction`` of the training set is held out *before*
    it is partitioned across clients (:func:`validation_split`, stratified by label): no client
    trains on it, :meth:`val_dataloader` serves it (logged as ``val/loss``, ``val/acc``), and
    every selection — sweeps' metric, ``pl-privfed report``'s best configuration, early
    stopping — reads it. :meth:`test_dataloader` serves the held-out test set, which the module
    evaluates once, for the final model, at the end of fit (``test/*``). Datamodules with natural
    per-client data (those overriding :meth:`client_indices`) hold out the same fraction of every
    client's shard instead. With ``val_fraction=0`` nothing is held out and the validation set is
    the clients' training data (the union of the shards): ``val/loss`` is then the training
    objective ``f(x)``, the right selection criterion for optimization problems such as
    :class:`~pl_privfed.datamodules.QuadraticDataModule` (whose default it is) and never the
    test set.

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
        val_fraction: share of the training set held out for validation, in ``[0, 1)``
            (default 0.1; the split is seeded by ``seed``; see above for ``0``).
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
        val_fraction: float = 0.1,
        batch_sampling: Literal["epochs", "without_replacement"] = "epochs",
    ) -> None:
        super().__init__()
        if (
            isinstance(val_fraction, bool)
            or not isinstance(val_fraction, int | float)
            or not 0 <= val_fraction < 1
        ):
            raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction!r}")
        self.val_fraction = float(val_fraction)
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
        check_choice("batch_sampling", batch_sampling, ("epochs", "without_replacement"))
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
        self.val_dataset: Dataset | None = None
        self.val_indices = np.zeros(0, dtype=np.int64)
        self._partition_pool: np.ndarray | None = None
        self.train_inputs: Tensor | None = None
        self.train_targets: Tensor | None = None
        self.shards: list[np.ndarray] = []
        self.client_sizes = np.zeros(0, dtype=np.int64)
        self.input_shape: tuple[int, ...] = ()
        self.streams: ClientStreams | None = None
        self._loaded: tuple[Dataset, Dataset] | None = None  # load_datasets(), kept for views

    #: Whether :meth:`load_datasets` reads ``seed`` (generated data): a :meth:`reseeded` copy
    #: then loads its own data instead of sharing the loaded datasets.
    datasets_use_seed = False

    def reseeded(self, seed: int, partitioner: Partitioner | None = None) -> FederatedDataModule:
        """This datamodule as its run with ``seed`` (and ``partitioner``, e.g. the same with its
        seed replaced) would have it, set up: a shallow copy with its own validation split,
        partition, client streams and augmentation seed, sharing the loaded datasets unless
        they depend on the seed (:attr:`datasets_use_seed`). What a grid whose configurations
        differ in the run's seed gives each of them (:mod:`pl_privfed.grid.seeds`)."""
        if self.streams is None:
            self.setup("fit")
        view = copy.copy(self)
        view.seed = seed
        if partitioner is not None:
            view.partitioner = partitioner
        view.streams = view.train_dataset = view.test_dataset = view.val_dataset = None
        view.train_inputs = view.train_targets = view._partition_pool = None
        view._loaded = None if self.datasets_use_seed else getattr(self, "_loaded", None)
        view.setup("fit")
        return view

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
        train, test = tensor_datasets(x_train, y_train, x_test, y_test)
        return cls.from_datasets(train, test, num_classes=num_classes, **kwargs)

    # ------------------------------------------------------------------ subclass API
    def load_datasets(self) -> tuple[Dataset, Dataset]:
        """Return ``(train, test)`` map-style datasets of ``(input, target)`` pairs."""
        raise NotImplementedError

    def trainlabels_of(self) -> np.ndarray:
        """Labels of the training set (used by the partitioner)."""
        ds = self.train_dataset
        if self.train_targets is not None:
            return self.train_targets.numpy()
        if hasattr(ds, "targets"):
            return np.asarray(ds.targets)
        return np.asarray([int(ds[i][1]) for i in range(len(ds))])

    def client_indices(self) -> list[np.ndarray]:
        """One index array per client into the training set (default: the partitioner's split
        of the training examples not held out for validation)."""
        labels = self.trainlabels_of()
        pool = self._partition_pool
        if pool is None:
            return self.partitioner(labels, self.num_clients)
        shards = self.partitioner(labels[pool], self.num_clients)
        return [pool[np.asarray(s, dtype=np.int64)] for s in shards]

    def _natural_clients(self) -> bool:
        return type(self).client_indices is not FederatedDataModule.client_indices

    def _split_clients(self) -> tuple[list[np.ndarray], np.ndarray]:
        """``(shards, validation indices)``: the validation examples are held out of the
        training set before it is partitioned, or, for natural per-client data, out of every
        client's shard (the same seeded fraction of each)."""
        if not self._natural_clients():
            stratify = self.num_classes is not None
            pool, val = validation_split(
                self.trainlabels_of(), self.val_fraction, self.seed, stratify
            )
            self._partition_pool = pool
            return self.client_indices(), val
        shards = [np.asarray(s, dtype=np.int64) for s in self.client_indices()]
        return hold_out_per_client(shards, self.val_fraction, self.seed)

    # ------------------------------------------------------------------ Lightning hooks
    def setup(self, stage: str | None = None) -> None:
        if self.streams is not None:
            return
        if getattr(self, "_loaded", None) is None:  # a view may share its parent's
            self._loaded = self.load_datasets()
        train, test = self._loaded
        self.train_dataset = random_subset(train, self.max_train_examples, self.seed)
        self.test_dataset = random_subset(test, self.max_test_examples, self.seed)
        tensors = getattr(self.train_dataset, "tensors", None)
        if tensors is not None:
            self.train_inputs, self.train_targets = tensors[0], tensors[1]
        self.input_shape = tuple(self.train_dataset[0][0].shape)
        self.shards, self.val_indices = self._split_clients()
        held_out = len(self.val_indices) > 0
        self.val_dataset = take(self.train_dataset, self.val_indices) if held_out else None
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

    def round_indices(self, round_index: int, clients: Tensor | None = None) -> Tensor:
        """Training-set indices of round ``round_index``: ``[n, B]``, or ``[n, T, B]`` with
        ``local_batches: T > 1`` (stream positions ``[k·T·B, (k+1)·T·B)``, in order); only the
        rows of ``clients`` when given."""
        if self.streams is None:
            self.setup("fit")
        idx = self.streams.indices(round_index, clients)
        if self.local_batches > 1:
            idx = idx.view(idx.shape[0], self.local_batches, self.batch_size)
        return idx

    def gather(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The training examples at the indices ``idx`` (any shape), stacked in that shape."""
        if self.train_inputs is not None:
            flat = idx.reshape(-1)
            inputs = self.train_inputs.index_select(0, flat)
            targets = self.train_targets.index_select(0, flat)
        else:
            items = [self.train_dataset[int(j)] for j in idx.flatten()]
            inputs = torch.stack([torch.as_tensor(x) for x, _ in items])
            targets = torch.stack([torch.as_tensor(y) for _, y in items])
        lead = tuple(idx.shape)
        return inputs.view(*lead, *inputs.shape[1:]), targets.view(*lead, *targets.shape[1:])

    def client_examples(self) -> tuple[Tensor, Tensor] | None:
        """Every client's training examples as its rounds serve them, ``[N, m, ...]`` in its
        shard's order, padded with zeros to the largest shard (``m`` examples), and their
        dataset indices ``[N, m]`` (``-1`` where padded; shards may share examples): what
        the clients' data span is made of (:mod:`pl_privfed.layer_rules.span`). ``None`` when
        the rounds preprocess the examples (a subclass's ``preprocess``: augmentation or
        normalization on the device), so that a round's inputs are not these."""
        base = FederatedDataModule
        if type(self).preprocess is not base.preprocess:
            return None
        if type(self).preprocess_clients is not base.preprocess_clients:
            return None
        if self.streams is None:
            self.setup("fit")
        sizes = torch.as_tensor(self.client_sizes, dtype=torch.int64)
        most = int(sizes.max()) if len(sizes) else 0
        slots = torch.arange(most).unsqueeze(0)
        mask = slots < sizes.unsqueeze(1)  # [N, m]: a real example
        idx = torch.zeros(len(sizes), most, dtype=torch.int64)
        flat = torch.from_numpy(np.concatenate(self.shards).astype(np.int64))
        idx[mask] = flat
        inputs, _ = self.gather(idx)
        inputs = inputs.clone()
        inputs[~mask] = 0
        idx[~mask] = -1
        return inputs, idx

    def round_examples(self, round_index: int, clients: Tensor) -> tuple[Tensor, Tensor]:
        """The dataset indices ``[c, B]`` of the clients' minibatches of round ``round_index``
        (local steps folded: ``[c, T·B]``) and their targets, without their inputs (for
        clients in their data span, which know their examples already)."""
        idx = self.round_indices(round_index, clients).flatten(1)
        if self.train_targets is not None:
            return idx, self.train_targets.index_select(0, idx.reshape(-1)).view(idx.shape)
        return idx, self.gather(idx)[1]

    def round_batch(self, round_index: int) -> tuple[Tensor, Tensor]:
        """The stacked minibatches ``(inputs [n, B, ...], targets [n, B, ...])`` of a round
        (``[n, T, B, ...]`` with ``local_batches: T > 1``), before preprocessing. Training
        reads a round by chunks of clients instead (:class:`RoundBatch`)."""
        return self.gather(self.round_indices(round_index))

    def preprocess_clients(self, inputs: Tensor, round_index: int, clients: Tensor) -> Tensor:
        """Preprocess the training minibatches ``[c, ..., *input_shape]`` of the clients
        ``clients`` in round ``round_index`` on the training device.

        The default folds the client (and local-step) axes into one batch axis and calls
        :meth:`preprocess` with ``train=True``; a datamodule with random augmentation overrides
        it to draw each client's randomness from its own stream (``(seed, round, client)``),
        so that the data does not depend on how clients are chunked.
        """
        if type(self).preprocess is FederatedDataModule.preprocess:
            return inputs
        lead = inputs.shape[: inputs.dim() - len(self.input_shape)]
        flat = self.preprocess(inputs.reshape(-1, *inputs.shape[len(lead) :]), True, round_index)
        return flat.reshape(*lead, *flat.shape[1:])

    def preprocess(self, inputs: Tensor, train: bool, round_index: int) -> Tensor:
        """Per-batch preprocessing on the training device (identity here).

        Called for evaluation batches with ``train=False`` (:meth:`on_after_batch_transfer`)
        and, through :meth:`preprocess_clients`, for each chunk of clients' training batches
        folded to ``[c · B, ...]`` with ``train=True`` and the round number.
        """
        return inputs

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, RoundBatch | TensorRoundBatch):
            return batch  # training data is preprocessed chunk by chunk (preprocess_clients)
        if type(self).preprocess is FederatedDataModule.preprocess:
            return batch
        inputs, targets = batch
        return self.preprocess(inputs, False, 0), targets

    def train_dataloader(self) -> RoundLoader:
        return RoundLoader(self)

    def _eval_loader(self, dataset: Dataset) -> DataLoader:
        return DataLoader(dataset, batch_size=self.eval_batch_size, shuffle=False)

    def val_dataloader(self) -> DataLoader:
        """The held-out validation examples (see the class docstring); with ``val_fraction=0``
        the clients' training data."""
        if self.streams is None:
            self.setup("validate")
        if self.val_dataset is not None:
            return self._eval_loader(self.val_dataset)
        union = np.sort(np.concatenate([np.asarray(s, dtype=np.int64) for s in self.shards]))
        return self._eval_loader(take(self.train_dataset, union))

    def test_dataloader(self) -> DataLoader:
        """The held-out test set."""
        if self.test_dataset is None:
            self.setup("test")
        return self._eval_loader(self.test_dataset)

    def describe(self) -> dict[str, Any]:
        """Sizes and settings of the federation, for logs and summaries."""
        return {
            "num_clients": self.num_clients,
            "batch_size": self.batch_size,
            "local_batches": self.local_batches,
            "shuffle": self.shuffle,
            "batch_sampling": self.batch_sampling,
            "client_sizes": self.client_sizes.tolist(),
            "val_fraction": self.val_fraction,
            "val_size": len(self.val_indices),
            "validation": "held-out training examples"
            if len(self.val_indices)
            else "the clients' training data",
            "rounds_per_epoch": self.rounds_per_epoch,
            "num_classes": self.num_classes,
            "partitioner": repr(self.partitioner),
            # what a constant predictor scores on the test set: the frontier's floor line
            "test_majority_class": majority_fraction(getattr(self, "test_dataset", None))
            if self.num_classes
            else None,
        }


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
            labels = labels_of(train)
            if not labels.is_floating_point() and labels.dim() == 1:
                num_classes = int(max(labels.max(), labels_of(test).max())) + 1
        self.num_classes = num_classes
        self._datasets = (train, test)

    def load_datasets(self) -> tuple[Dataset, Dataset]:
        return self._datasets
