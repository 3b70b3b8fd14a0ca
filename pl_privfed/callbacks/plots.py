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

from pl_privfed.callbacks._logging import logged_names, warn_once
from pl_privfed.logdir import local_log_dir, log_artifact, wandb_loggers
from pl_privfed.results import curves_csv, write_atomically

__all__ = ["TrainingCurves"]


DEFAULT_KEYS = ("train/loss", "val/loss", "val/acc", "privacy/epsilon")
#: the most panels side by side: more metrics wrap onto further rows
MAX_PER_ROW = 4


class TrainingCurves(pl.Callback):
    """Records logged metrics against the step (round) and plots them when fit ends.

    Works with any LightningModule: it reads ``trainer.callback_metrics`` after every training
    step (training metrics) and after every validation (evaluation metrics), and records a metric
    only at the rounds where it was logged: one logged every ``N`` rounds (e.g. ``privacy/epsilon``
    with ``epsilon_every: N``) gets a point every ``N`` rounds, not a staircase repeating its last
    value in between. At the end of fit it
    saves one panel per metric (at most four in a row) to ``<log_dir>/<filename>``, the numbers beside it as
    ``<stem>.csv`` (``metric,round,value`` rows), and, when a ``WandbLogger`` is
    attached, logs the figure as a W&B image and as an artifact. The history is kept in
    checkpoints, so a resumed run plots its whole curve.

    In a project that logs other names: with the default keys, when none of them is ever
    logged (``train_loss``, ``val_acc``, ...), it plots every metric that was logged instead and
    warns once, naming the default keys and the metrics it plotted; with ``keys`` given, it
    warns once at the end of fit naming the keys that were never logged and the metrics that
    were (and plots the others).

    Args:
        keys: metric names to plot (default :data:`DEFAULT_KEYS`, else whatever is logged).
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
        #: default keys: every logged metric is recorded too, for a project that logs none
        #: of the defaults (plotted only then)
        self.auto = keys is None
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

    def _candidates(self, trainer: pl.Trainer) -> list[str]:
        """The keys recorded: ``keys``, and with the default keys while none of them has been
        logged, every logged metric."""
        if not self.auto or any(self.history.get(k) for k in self.keys):
            return self.keys
        if any(k in trainer.callback_metrics for k in self.keys):
            return self.keys
        return [*self.keys, *(k for k in trainer.callback_metrics if k not in self.keys)]

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        # evaluation metrics stay in callback_metrics between validations: not re-recorded here
        keys = self._candidates(trainer)
        self._capture(trainer, [k for k in keys if k not in self._eval_keys], training=True)

    @override
    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._before_eval = dict(trainer.callback_metrics)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        updated = [
            k
            for k in self._candidates(trainer)
            if k in trainer.callback_metrics
            and trainer.callback_metrics[k] is not self._before_eval.get(k)
        ]
        self._eval_keys.update(updated)
        self._capture(trainer, updated)

    def history_csv(self) -> str:
        """The recorded history as CSV text: ``metric,round,value`` rows
        (:func:`~pl_privfed.results.curves_csv`)."""
        return curves_csv({k: self.history[k] for k in self.plotted_keys()})

    def plotted_keys(self) -> list[str]:
        """The metrics plotted: those of ``keys`` that were recorded, or with the default keys
        none of which was logged, every metric that was."""
        keys = [k for k in self.keys if self.history.get(k)]
        if keys or not self.auto:
            return keys
        return sorted(k for k, points in self.history.items() if points)

    def _warn_missing(self, trainer: pl.Trainer) -> None:
        found = [k for k in self.keys if self.history.get(k)]
        if self.auto:
            if found:
                return  # the package's own keys (an ε of a non-private run may be absent)
            plotted = self.plotted_keys()
            warn_once(
                self,
                "keys",
                f"none of its default keys ({', '.join(self.keys)}) was logged, so it plots "
                f"the metrics that were: {', '.join(plotted) or 'none'}; choose them with "
                "TrainingCurves(keys=[...])",
            )
            return
        missing = [k for k in self.keys if not self.history.get(k)]
        if missing:
            warn_once(
                self,
                "keys",
                f"no metric {', '.join(map(repr, missing))} was logged, so its curves leave "
                f"{'it' if len(missing) == 1 else 'them'} out (logged: {logged_names(trainer)}); "
                "name the right ones with TrainingCurves(keys=[...])",
            )

    def figure(self) -> Figure:
        """The curves as a matplotlib figure: one panel per recorded metric, in rows of at most
        :data:`MAX_PER_ROW`, all on the run's round axis (a metric evaluated once shows its one
        point where it was taken in the run, and says so)."""
        keys = self.plotted_keys()
        ncols = max(1, min(len(keys), MAX_PER_ROW))
        nrows = max(1, math.ceil(len(keys) / ncols))
        fig = Figure(figsize=(4.5 * ncols, 3.4 * nrows), layout="constrained")
        rounds = [step for key in keys for step, _ in self.history[key]]
        first, last = (min(rounds), max(rounds)) if rounds else (0, 1)
        pad = max(1.0, 0.04 * (last - first))
        for i, key in enumerate(keys):
            ax = fig.add_subplot(nrows, ncols, i + 1)
            steps, values = zip(*self.history[key])
            one = len(steps) == 1
            ax.plot(steps, values, marker="o" if one else "." if len(steps) < 30 else None)
            ax.set_xlim(first - pad, last + pad)
            ax.set_title(key)
            ax.set_xlabel("round")
            ax.grid(alpha=0.3)
            if one:
                note = f"one value only (round {steps[0]})"
                ax.text(0.02, 0.98, note, transform=ax.transAxes, fontsize=7, va="top")
        return fig

    @override
    @rank_zero_only
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._warn_missing(trainer)
        directory = self.dirpath or local_log_dir(trainer)
        if directory is None or not self.plotted_keys():
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
