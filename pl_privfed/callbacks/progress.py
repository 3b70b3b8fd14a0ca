"""``RoundProgressBar``: Lightning's tqdm progress bar, counting communication rounds."""

from __future__ import annotations

import math
import sys
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar
from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
from typing_extensions import override

__all__ = ["DEFAULT_BAR_METRICS", "RoundProgressBar"]

#: logged metric → the short name the bar shows it under
DEFAULT_BAR_METRICS: dict[str, str] = {
    "train/loss": "loss",
    "privacy/epsilon": "ε",
    "val/acc": "acc",
    "grid/min_train_loss": "min loss",
    "grid/best_val_acc": "best acc",
    "grid/live_configurations": "live",
}


class RoundProgressBar(TQDMProgressBar):
    """One bar for the whole run in communication rounds: ``round k/K``, rounds per second and
    the latest loss, ε (named by its adversary: ``ε(server)``, ``ε(models)``) and validation
    accuracy.

    In :class:`~pl_privfed.FederatedModule` one training step is one round, and a Lightning
    "epoch" is only ``ceil(N / (n·B))`` rounds (the federation sees the training set once), so
    Lightning's default bar (``Epoch 59: 5/5``) says little about a 300-round run. This bar counts
    ``trainer.global_step`` against the run's number of rounds (``max_steps``, or
    ``trainer.estimated_stepping_batches`` when the run is set in epochs), starts at the restored
    round when a run resumes, and keeps the evaluation bar out of the way during training.
    ``pl-privfed`` attaches it by default (:func:`pl_privfed.default_callbacks`).

    Works with any LightningModule that takes one optimizer step per training batch, and shows
    the metrics it logs with ``prog_bar=True`` (after the ones named in ``metrics``).

    Args:
        refresh_rate: redraw every this many rounds.
        process_position: Lightning's ``process_position`` (several bars in one terminal).
        metrics: logged metric → short name to show, in order; metrics absent from
            ``trainer.callback_metrics`` are left out (default :data:`DEFAULT_BAR_METRICS`).
        prog_bar_metrics: also show, under their own names and after those, the metrics the
            module logs with ``self.log(..., prog_bar=True)`` (as Lightning's bar does).

    Example::

        trainer = pl.Trainer(max_steps=300, callbacks=[RoundProgressBar()])
        # round 120/300 |█████████▋              | [00:02<00:03, 52.1 rounds/s, loss=0.41, ε(server)=5.07]
    """

    #: the training bar (Lightning's ``BAR_FORMAT`` stays for the evaluation bars)
    ROUND_FORMAT = (
        "round {n_fmt}/{total_fmt} |{bar:24}| [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
    )

    def __init__(
        self,
        refresh_rate: int = 1,
        process_position: int = 0,
        metrics: dict[str, str] | None = None,
        prog_bar_metrics: bool = True,
    ) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position)
        self.metrics = dict(DEFAULT_BAR_METRICS if metrics is None else metrics)
        self.prog_bar_metrics = prog_bar_metrics

    @staticmethod
    def total_rounds(trainer: pl.Trainer) -> int | None:
        """The run's number of rounds: ``max_steps``, else Lightning's estimate from the epochs
        (``None`` when unbounded)."""
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return int(trainer.max_steps)
        estimate = trainer.estimated_stepping_batches
        return int(estimate) if math.isfinite(estimate) else None

    @override
    def init_train_tqdm(self) -> Tqdm:
        return Tqdm(
            position=2 * self.process_position,
            disable=self.is_disabled,
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            unit=" rounds",
            bar_format=self.ROUND_FORMAT,
        )

    @override
    def init_validation_tqdm(self) -> Tqdm:
        if self.trainer.state.fn == "fit":  # evaluations between rounds: no second bar
            return Tqdm(disable=True)
        return super().init_validation_tqdm()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(total=self.total_rounds(trainer))
        self.train_progress_bar.initial = trainer.global_step  # a resumed run starts there
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.refresh()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        """Epochs are not shown: the bar runs over rounds across them."""

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        if bar is None or bar.disable:
            return
        done = trainer.global_step
        total = bar.total or done
        if done % self.refresh_rate == 0 or done >= total:
            bar.n = done
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module))

    @override
    def get_metrics(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> dict[str, Any]:
        """The chosen metrics under their short names, then the module's other ``prog_bar``
        metrics under their own (Lightning's ``v_num`` is left out)."""
        logged = trainer.callback_metrics
        ledger = getattr(pl_module, "privacy_ledger", None)
        against = getattr(ledger, "headline", None)  # the ε shown names its adversary
        shown: dict[str, Any] = {}
        for key, name in self.metrics.items():
            value = logged.get(key)
            if value is not None:
                if key == "privacy/epsilon" and against:
                    name = f"{name}({against})"
                shown[name] = float(value)
        if self.prog_bar_metrics:
            for key, value in trainer.progress_bar_metrics.items():
                if key not in self.metrics and key not in shown:
                    shown[key] = value
        return shown
