"""``TrainingCurves``: save the training curves as a PNG at the end of fit (and log it to W&B)."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from matplotlib.figure import Figure
from pytorch_lightning.utilities import rank_zero_only
from torch import Tensor
from typing_extensions import override

from pl_privfed.logdir import local_log_dir, log_artifact, wandb_loggers
from pl_privfed.results import curves_csv, write_atomically

__all__ = ["TrainingCurves"]


DEFAULT_KEYS = ("train/loss", "val/loss", "val/acc", "privacy/epsilon")


class TrainingCurves(pl.Callback):
    """Records logged metrics against the step (round) and plots them when fit ends.

    Works with any LightningModule: it reads ``trainer.callback_metrics`` after every training
    step (training metrics) and after every validation (evaluation metrics), and records a metric
    only at the rounds where it was logged: one logged every ``N`` rounds (e.g. ``privacy/epsilon``
    with ``epsilon_every: N``) gets a point every ``N`` rounds, not a staircase repeating its last
    value in between. At the end of fit it
    saves one panel per metric to ``<log_dir>/<filename>``, the numbers beside it as
    ``<stem>.csv`` (``metric,round,value`` rows), and, when a ``WandbLogger`` is
    attached, logs the figure as a W&B image and as an artifact. The history is kept in
    checkpoints, so a resumed run plots its whole curve.

    Args:
        keys: metric names to plot (those never logged are skipped).
        filename: the PNG's name.
        dirpath: where to save it (default ``trainer.log_dir``).

    Example::

        trainer = pl.Trainer(callbacks=[TrainingCurves(keys=["train_loss", "val_acc"])])
    """

    def __init__(
        self,
        keys: list[str] | None = None,
        filename: str = "curves.png",
        dirpath: str | None = None,
    ) -> None:
        self.keys = list(keys) if keys is not None else list(DEFAULT_KEYS)
        self.filename = filename
        self.dirpath = dirpath
        self.history: dict[str, list[tuple[int, float]]] = {k: [] for k in self.keys}
        self.path: Path | None = None
        self.csv_path: Path | None = None
        self._eval_keys: set[str] = set()
        self._before_eval: dict[str, Any] = {}
        self._seen: dict[str, Any] = {}

    def _logged_since_seen(self, key: str, value: Any) -> bool:
        """Whether ``value`` (``trainer.callback_metrics[key]``) was logged since the last
        training step: Lightning stores a new tensor each time a metric is logged, and hands out
        views of the stored one until then; the previous one is kept here, so its memory cannot
        be reused by the next."""
        if not isinstance(value, Tensor):
            return True
        seen = self._seen.get(key)
        if seen is not None and seen.data_ptr() == value.data_ptr():
            return False
        self._seen[key] = value
        return True

    def _capture(self, trainer: pl.Trainer, keys: list[str], training: bool = False) -> None:
        for key in keys:
            value = trainer.callback_metrics.get(key)
            if value is None or (training and not self._logged_since_seen(key, value)):
                continue
            value = float(value)
            points = self.history.setdefault(key, [])
            if math.isfinite(value) and (not points or points[-1][0] != trainer.global_step):
                points.append((trainer.global_step, value))

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # evaluation metrics stay in callback_metrics between validations: not re-recorded here
        self._capture(trainer, [k for k in self.keys if k not in self._eval_keys], training=True)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._before_eval = dict(trainer.callback_metrics)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        updated = [
            k
            for k in self.keys
            if k in trainer.callback_metrics
            and trainer.callback_metrics[k] is not self._before_eval.get(k)
        ]
        self._eval_keys.update(updated)
        self._capture(trainer, updated)

    def history_csv(self) -> str:
        """The recorded history as CSV text: ``metric,round,value`` rows
        (:func:`~pl_privfed.results.curves_csv`)."""
        return curves_csv(self.history)

    def figure(self) -> Figure:
        """The curves as a matplotlib figure (one panel per recorded metric)."""
        keys = [k for k in self.keys if self.history.get(k)]
        fig = Figure(figsize=(4.5 * max(1, len(keys)), 3.4), layout="constrained")
        for i, key in enumerate(keys):
            ax = fig.add_subplot(1, len(keys), i + 1)
            steps, values = zip(*self.history[key])
            ax.plot(steps, values, marker="." if len(steps) < 30 else None)
            ax.set_title(key)
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
        return fig

    @override
    @rank_zero_only
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        directory = self.dirpath or local_log_dir(trainer)
        if directory is None or not any(self.history.values()):
            return
        os.makedirs(directory, exist_ok=True)
        self.path = Path(directory) / self.filename
        self.figure().savefig(self.path, dpi=110)
        self.csv_path = self.path.with_suffix(".csv")
        write_atomically(self.csv_path, self.history_csv())
        for logger in wandb_loggers(trainer):
            logger.log_image(key="curves", images=[str(self.path)])
        log_artifact(trainer, self.path, "training-curves")

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "history": {k: list(v) for k, v in self.history.items()},
            "eval_keys": sorted(self._eval_keys),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = {k: [tuple(p) for p in v] for k, v in state_dict["history"].items()}
        self._eval_keys = set(state_dict.get("eval_keys", []))
