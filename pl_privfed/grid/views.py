"""Each seed's data in a grid over the run's seed (``"--seed"``, :mod:`pl_privfed.grid.seeds`).

A configuration whose seed is not the trainer's datamodule's gets a *view*: the datamodule as
its separate run with that seed has it (:meth:`~pl_privfed.datamodules.FederatedDataModule.
reseeded`: its seed and its partitioner's seed replaced, set up again). Its rounds read that
view's minibatch streams, its algorithm is configured with that view's shard sizes (record-level
sampling rates, PORTER's ``m``), and it is validated (and tested) on that view's loaders.
Configurations of the datamodule's own seed read the trainer's data, as before.
"""

from __future__ import annotations

import functools
import itertools
from typing import Any

import torch
from torch import Tensor

from pl_privfed.callbacks import GradientNorm
from pl_privfed.datamodules import FederatedDataModule, RoundBatch
from pl_privfed.evaluation import loader_metrics
from pl_privfed.grads import RoundOracle
from pl_privfed.grid.seeds import RUN_SEED, is_seed_argument, kept_arguments, reseed

__all__ = ["SeedViews"]


class SeedViews:
    """The data of every configuration of a grid: ``None`` (the trainer's datamodule) or its
    seed's view, one view per distinct seed.

    Args:
        seeds: each configuration's run seed, or ``None`` for every configuration (no seeds:
            every configuration reads the trainer's data).
    """

    def __init__(self, seeds: list[int | None]) -> None:
        self.seeds = seeds
        self.views: list[FederatedDataModule | None] = [None] * len(seeds)
        self._built = False

    def build(self, trainer: Any) -> None:
        """Make the views of the seeds that are not the trainer's datamodule's (once)."""
        if self._built or self.seeds[0] is None:
            return
        datamodule = trainer.datamodule
        if not isinstance(datamodule, FederatedDataModule):
            raise ValueError(
                f"grid parameter {RUN_SEED} needs a FederatedDataModule (each seed gets its own "
                f"split, partition and streams), got {type(datamodule).__name__}"
            )
        for callback in trainer.callbacks:
            if isinstance(callback, GradientNorm):
                raise ValueError(
                    f"grid parameter {RUN_SEED}: GradientNorm measures every configuration on "
                    "the first seed's training data; run the seeds separately"
                )
        by_seed: dict[int, FederatedDataModule | None] = {}
        for k, seed in enumerate(self.seeds):
            if seed not in by_seed:
                by_seed[seed] = _view(datamodule, seed)
            self.views[k] = by_seed[seed]
        self._built = True

    def of(self, k: int) -> FederatedDataModule | None:
        """Configuration ``k``'s view (``None``: the trainer's datamodule)."""
        return self.views[k]

    def on_trainer_data(self) -> set[int]:
        """The configurations that read the trainer's datamodule."""
        return {k for k, view in enumerate(self.views) if view is None}

    def batch(self, k: int, batch: Any, local_batches: int) -> tuple[Any, int]:
        """Configuration ``k``'s round data and minibatches per round: the round's batch, or the
        same round of its view."""
        view = self.views[k]
        if view is None:
            return batch, local_batches
        return RoundBatch(view, batch.round_index, batch.device), view.local_batches

    def cohort_class(self, k: int, algorithms: Any) -> tuple[Any, int]:
        """What decides which clients configuration ``k`` asks for, chunk by chunk, and the
        shape of their data: its seed when its algorithm samples a cohort, and its minibatches
        per round. Configurations of one class share a gradient computation."""
        sampled = getattr(algorithms[k], "sampler", None) is not None
        view = self.views[k]
        return (self.seeds[k] if sampled else None, view.local_batches if view else -1)

    def data_of(
        self, oracle: Any, configs: list[int], ids: Tensor, batch: Any, local_batches: int
    ) -> list[tuple[Tensor, Tensor]]:
        """The clients ``ids``' data of the round for every configuration of ``configs``, each
        from its own view, fetched once per view (configurations of one seed share it)."""
        cached: dict[int, tuple[Tensor, Tensor]] = {}
        for k in configs:
            key = id(self.views[k])
            if key not in cached:
                data, steps = self.batch(k, batch, local_batches)
                cached[key] = RoundOracle(oracle, data, steps).data(ids)
        return [cached[id(self.views[k])] for k in configs]

    def data(
        self, oracle: Any, configs: list[int], ids: Tensor, batch: Any, local_batches: int
    ) -> tuple[Tensor, Tensor]:
        """:meth:`data_of` stacked along the client axis (``[len(configs) · c, ...]``)."""
        inputs, targets = zip(*self.data_of(oracle, configs, ids, batch, local_batches))
        return torch.cat(inputs), torch.cat(targets)

    def evaluate(self, module: Any, stage: str) -> None:
        """Evaluate the configurations of every view on that view's ``stage`` split (``val``
        or ``test``) into the module's evaluation sums, as Lightning's loop does for the
        others (with the trainer's batch limits)."""
        trainer = module.trainer
        for view in {id(v): v for v in self.views if v is not None}.values():
            configs = {k for k, v in enumerate(self.views) if v is view}
            loader = getattr(view, f"{stage}_dataloader")()
            if stage == "val":
                loader = _limited(loader, trainer)
            loader_metrics(
                module.model,
                module.criterion,
                loader,
                device=next(module.model.parameters()).device,
                preprocess=view.preprocess,
                classification=module.test_accuracy is not None,
                batch_metrics=functools.partial(module.evaluate_configurations, configs=configs),
            )

    def entries(self, k: int) -> dict[str, Any]:
        """Configuration ``k``'s own ``summary.json`` entries: its view's ``data``."""
        view = self.views[k]
        return {} if view is None else {"data": view.describe()}


def _limited(loader: Any, trainer: Any) -> Any:
    """The validation batches Lightning's loop would read of ``loader``: during the sanity
    check ``num_sanity_val_steps`` of them, else ``limit_val_batches`` (a count or a share)."""
    if getattr(trainer, "sanity_checking", False):
        return itertools.islice(loader, max(int(trainer.num_sanity_val_steps), 0))
    limit = getattr(trainer, "limit_val_batches", 1.0)
    if isinstance(limit, int) and not isinstance(limit, bool):
        return itertools.islice(loader, limit)
    if isinstance(limit, float) and limit < 1.0:
        return itertools.islice(loader, max(1, int(len(loader) * limit)))
    return loader


def _view(datamodule: FederatedDataModule, seed: int) -> FederatedDataModule | None:
    """``datamodule`` as its run with ``--seed seed`` has it, or ``None`` when it is that one
    already. ``ValueError`` for a seed argument it cannot replace (one that shapes how the
    datamodule was built)."""
    for name in kept_arguments(datamodule):
        value = getattr(datamodule, name)
        if name not in ("seed", "partitioner") and is_seed_argument(name, value):
            if value != seed:
                raise ValueError(
                    f"grid parameter {RUN_SEED}: {type(datamodule).__name__}'s {name} is a seed "
                    "that a grid cannot set per configuration; run the seeds separately"
                )
    partitioner, changed = reseed(datamodule.partitioner, seed)
    if datamodule.seed == seed and not changed:
        return None
    return datamodule.reseeded(seed, partitioner if changed else None)
