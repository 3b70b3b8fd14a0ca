"""``RoundProgressBar``: Lightning's tqdm progress bar, counting communication rounds."""

from __future__ import annotations

import math
import sys
import time
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import TQDMProgressBar
from pytorch_lightning.callbacks.progress.tqdm_progress import Tqdm
from typing_extensions import override

from pl_privfed.compat.lightning import train_progress_bar_open

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

    When standard output is not a terminal (a file, a pipe, a CI or batch job's log) nothing is
    redrawn (no sanity-check, evaluation or test bar either): the bar prints one plain line
    every tenth of the run (every 10 rounds when the run
    has no bound) and at its last round,
    ``round 30/100 [00:01, 52.1 rounds/s] loss=0.41, ε(server)=5.07, acc=0.83``.

    Args:
        refresh_rate: redraw every this many rounds.
        process_position: Lightning's ``process_position`` (several bars in one terminal).
        metrics: logged metric → short name to show, in order; metrics absent from
            ``trainer.callback_metrics`` are left out (default :data:`DEFAULT_BAR_METRICS`).
        prog_bar_metrics: also show, under their own names and after those, the metrics the
            module logs with ``self.log(..., prog_bar=True)`` (as Lightning's bar does).
        plain: print plain lines instead of a bar; ``None`` (default): when standard output is
            not a terminal.

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
        plain: bool | None = None,
    ) -> None:
        super().__init__(refresh_rate=refresh_rate, process_position=process_position)
        self.metrics = dict(DEFAULT_BAR_METRICS if metrics is None else metrics)
        self.prog_bar_metrics = prog_bar_metrics
        if plain is not None and not isinstance(plain, bool):
            raise ValueError(f"plain must be true, false or null, got {plain!r}")
        self.plain = plain
        self._started = 0.0
        self._pending: int | None = None  # a plain line's round, printed once it is evaluated

    @property
    def is_plain(self) -> bool:
        """Whether this bar prints plain lines (``plain``, else: stdout is not a terminal)."""
        if self.plain is not None:
            return self.plain
        isatty = getattr(sys.stdout, "isatty", None)
        return not (callable(isatty) and isatty())

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
            disable=self.is_disabled or self.is_plain,  # plain lines: a counter, never drawn
            leave=True,
            dynamic_ncols=True,
            file=sys.stdout,
            smoothing=0,
            unit=" rounds",
            bar_format=self.ROUND_FORMAT,
        )

    @override
    def init_validation_tqdm(self) -> Tqdm:
        if self.trainer.state.fn == "fit" or self.is_plain:  # between rounds: no second bar
            return Tqdm(disable=True)
        return super().init_validation_tqdm()

    @override
    def init_sanity_tqdm(self) -> Tqdm:
        """Lightning's sanity-check bar, but none when the output is not a terminal (it was
        drawn with carriage returns into a log: the Python API's one bar not in plain lines)."""
        return Tqdm(disable=True) if self.is_plain else super().init_sanity_tqdm()

    @override
    def init_test_tqdm(self) -> Tqdm:
        """Lightning's test bar, none when the output is not a terminal."""
        return Tqdm(disable=True) if self.is_plain else super().init_test_tqdm()

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_progress_bar = self.init_train_tqdm()
        self.train_progress_bar.reset(total=self.total_rounds(trainer))
        self.train_progress_bar.initial = trainer.global_step  # a resumed run starts there
        self.train_progress_bar.n = trainer.global_step
        self.train_progress_bar.refresh()
        self._started = time.monotonic()

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, *_: Any) -> None:
        """Epochs are not shown: the bar runs over rounds across them."""

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        bar = self.train_progress_bar
        if bar is None or self.is_disabled:
            return
        done = trainer.global_step
        total = bar.total or done
        if bar.disable:  # plain lines: every tenth of the run (10 rounds if unbounded), the last
            bar.n = done
            every = max(1, bar.total // 10) if bar.total else 10
            if done % every == 0 or (bar.total and done >= bar.total):
                self._pending = done  # printed after this round's evaluation, if it has one
            return
        if done % self.refresh_rate == 0 or done >= total:
            bar.n = done
            bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)
            bar.refresh()

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """As Lightning's, but the round's new metrics are drawn with the next round (or when
        the bar closes), not in a second draw of this one."""
        self.val_progress_bar.close()
        self.reset_dataloader_idx_tracker()
        if train_progress_bar_open(self) and trainer.state.fn == "fit":
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)

    @override
    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._print_pending(trainer, pl_module)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._print_pending(trainer, pl_module)
        super().on_train_end(trainer, pl_module)

    def _print_pending(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._pending is not None:
            total = self.train_progress_bar.total
            print(self.plain_line(trainer, pl_module, self._pending, total), flush=True)
            self._pending = None

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not self.train_progress_bar.disable:  # drawn with the next round, not twice
            self.train_progress_bar.set_postfix(self.get_metrics(trainer, pl_module), refresh=False)

    def plain_line(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, done: int, total: int | None
    ) -> str:
        """``round k/K [elapsed, rate] name=value, ...``: one plain progress line."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rounds = done - (self.train_progress_bar.initial or 0)
        minutes, seconds = divmod(int(elapsed), 60)
        shown = ", ".join(
            f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}"
            for name, value in self.get_metrics(trainer, pl_module).items()
        )
        return (
            f"round {done}/{total if total else '?'} [{minutes:02d}:{seconds:02d}, "
            f"{rounds / elapsed:.3g} rounds/s] {shown}".rstrip()
        )

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
