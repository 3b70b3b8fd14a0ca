"""A round's training data as Lightning sees it: the lazy per-client batch, the round "loader",
and what a datamodule's rounds are (:func:`round_description`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["RoundBatch", "RoundLoader", "RoundSource", "TensorRoundBatch", "round_description"]


class RoundSource(Protocol):
    """What :class:`RoundBatch` and :class:`RoundLoader` read of their datamodule (a
    :class:`~pl_privfed.datamodules.FederatedDataModule`)."""

    num_clients: int
    trainer: Any

    @property
    def rounds_per_epoch(self) -> int: ...

    def round_indices(self, round_index: int, clients: Tensor | None = None) -> Tensor: ...

    def gather(self, idx: Tensor) -> tuple[Tensor, Tensor]: ...

    def round_examples(self, round_index: int, clients: Tensor) -> tuple[Tensor, Tensor]: ...

    def preprocess_clients(self, inputs: Tensor, round_index: int, clients: Tensor) -> Tensor: ...


class RoundBatch:
    """One round's training data, served by client (a lazy batch: no ``[n, B, ...]`` tensor).

    :meth:`clients` gathers the minibatches of a chunk of clients, ``(inputs [c, B, ...],
    targets [c, B, ...])`` (``[c, T, B, ...]`` with ``local_batches: T > 1``), moves them to
    the training device and preprocesses them there
    (:meth:`~pl_privfed.datamodules.FederatedDataModule.preprocess_clients`). Lightning moves
    the batch by calling :meth:`to`, which only records the device.
    """

    def __init__(
        self, datamodule: RoundSource, round_index: int, device: torch.device | None = None
    ) -> None:
        self.datamodule = datamodule
        self.round_index = int(round_index)
        self.device = device
        self._dense: tuple[Tensor, Tensor] | None = None

    def to(self, device: torch.device | str, *args: Any, **kwargs: Any) -> RoundBatch:
        return RoundBatch(self.datamodule, self.round_index, torch.device(device))

    @property
    def num_clients(self) -> int:
        return self.datamodule.num_clients

    def clients(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """The minibatches of the clients ``ids`` on the training device, preprocessed."""
        dm = self.datamodule
        inputs, targets = dm.gather(dm.round_indices(self.round_index, ids))
        if self.device is not None:
            inputs, targets = inputs.to(self.device), targets.to(self.device)
        return dm.preprocess_clients(inputs, self.round_index, ids), targets

    def examples(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        """The dataset indices ``[c, B]`` of the clients' minibatches and their targets (on
        the training device), without their inputs (clients in their data span)."""
        idx, targets = self.datamodule.round_examples(self.round_index, ids)
        if self.device is not None:
            idx, targets = idx.to(self.device), targets.to(self.device)
        return idx, targets

    def dense(self) -> tuple[Tensor, Tensor]:
        """Every client's minibatches at once (``[n, B, ...]``), preprocessed: what a module
        other than :class:`~pl_privfed.FederatedModule` reads (``inputs, targets = batch``)."""
        if self._dense is None:
            self._dense = self.clients(torch.arange(self.num_clients))
        return self._dense

    def __getitem__(self, index: int) -> Tensor:
        """``batch[0]``, ``batch[1]`` and ``inputs, targets = batch`` read :meth:`dense` (it is
        deliberately not an ``Iterable``, so that Lightning never materializes it by itself)."""
        return self.dense()[index]


class TensorRoundBatch:
    """A round's data given as stacked tensors ``(inputs [n, ...], targets [n, ...])``, served
    by client like a :class:`RoundBatch` (for modules driven without a datamodule's loader)."""

    def __init__(self, inputs: Tensor, targets: Tensor) -> None:
        self.inputs, self.targets = inputs, targets

    def to(self, device: torch.device | str, *args: Any, **kwargs: Any) -> TensorRoundBatch:
        return TensorRoundBatch(self.inputs.to(device), self.targets.to(device))

    @property
    def num_clients(self) -> int:
        return int(self.inputs.shape[0])

    def clients(self, ids: Tensor) -> tuple[Tensor, Tensor]:
        if ids.numel() == self.num_clients:
            return self.inputs, self.targets
        index = ids.to(self.inputs.device)
        return self.inputs.index_select(0, index), self.targets.index_select(0, index)

    def dense(self) -> tuple[Tensor, Tensor]:
        return self.inputs, self.targets


class RoundLoader:
    """The training "dataloader": yields the remaining rounds of the current Lightning epoch.

    It starts at ``trainer.global_step`` (read when iteration starts; Lightning restores it
    before iterating), so a run resumed from a checkpoint continues with the right rounds.
    """

    def __init__(self, datamodule: RoundSource) -> None:
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

    def __iter__(self) -> Iterator[RoundBatch]:
        trainer = self.datamodule.trainer
        start = int(trainer.global_step) if trainer is not None else 0
        per_epoch = self.datamodule.rounds_per_epoch
        for k in range(start, (start // per_epoch + 1) * per_epoch):
            yield RoundBatch(self.datamodule, k)


def round_description(datamodule: Any) -> dict[str, Any]:
    """What a datamodule's rounds are, for an algorithm's ``configure_data`` (which checks them
    against its local solver or record sampling): ``batch_size``, ``local_batches`` (the
    minibatches per client and round; ``local_epochs`` sets them when the data is loaded, so a
    :class:`~pl_privfed.datamodules.FederatedDataModule` not yet set up is set up here),
    ``shuffle``, ``client_sizes`` and ``batch_sampling``; defaults for a datamodule that does
    not say."""
    if hasattr(datamodule, "streams") and datamodule.streams is None:
        datamodule.setup("fit")  # idempotent
    sizes = getattr(datamodule, "client_sizes", None)
    return {
        "batch_size": int(getattr(datamodule, "batch_size", 1)),
        "local_batches": int(getattr(datamodule, "local_batches", 1) or 1),
        "shuffle": bool(getattr(datamodule, "shuffle", True)),
        "client_sizes": [int(v) for v in sizes] if sizes is not None else [],
        "batch_sampling": getattr(datamodule, "batch_sampling", "epochs"),
    }
