"""``RoundCheckpoint``: checkpoints named in rounds, written atomically, one at the end of every
fit; :func:`check_checkpoint_file`: a readable message for a checkpoint that cannot be loaded."""

from __future__ import annotations

import os
import shutil
import zipfile
from pathlib import Path
from typing import Any
from weakref import proxy

import pytorch_lightning as pl
from pytorch_lightning.callbacks import ModelCheckpoint
from typing_extensions import override

from pl_privfed.callbacks.interrupt import (
    stop_if_signalled,
    stop_signal,
    stopped_before_training,
    watch_signals,
)
from pl_privfed.compat.lightning import ModelCheckpointHooks, is_local_path
from pl_privfed.engine import SNAPSHOT_DIR_KEY

__all__ = ["CheckpointError", "RoundCheckpoint", "check_checkpoint_file", "snapshot_dir"]


class CheckpointError(ValueError):
    """A checkpoint file that is missing, truncated or not a PyTorch checkpoint; the message
    names the path."""


def check_checkpoint_file(path: str | os.PathLike) -> Path:
    """Return ``path`` if it is a complete PyTorch checkpoint archive, else raise
    :class:`CheckpointError` naming it and what is wrong.

    ``torch.save`` writes a zip archive (PyTorch ≥ 1.6); a file cut short (an interrupted copy,
    a full disk) has no central directory, and a damaged one fails the members' CRC-32 check,
    both of which :mod:`zipfile` tests without unpickling anything. Without this check the
    same files fail deep inside ``torch.load`` with ``OSError: [Errno 22]``, ``EOFError`` or
    "failed finding central directory", none of which names the file.
    """
    file = Path(path)
    if not file.exists():
        raise CheckpointError(f"ckpt_path {str(file)!r}: no such file")
    if not file.is_file():
        raise CheckpointError(f"ckpt_path {str(file)!r} is not a file")
    if not zipfile.is_zipfile(file):
        raise CheckpointError(
            f"ckpt_path {str(file)!r} ({file.stat().st_size} bytes) is not a complete PyTorch "
            "checkpoint (no zip central directory: truncated, or not written by torch.save)"
        )
    try:
        with zipfile.ZipFile(file) as archive:
            damaged = archive.testzip()
            names = archive.namelist()
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise CheckpointError(f"ckpt_path {str(file)!r} cannot be read: {exc}") from exc
    if damaged is not None:
        raise CheckpointError(
            f"ckpt_path {str(file)!r} is damaged: member {damaged!r} fails its CRC"
        )
    if not any(name.endswith("/data.pkl") or name == "data.pkl" for name in names):
        raise CheckpointError(f"ckpt_path {str(file)!r} is a zip archive but not a checkpoint")
    return file


def snapshot_dir(checkpoint_path: str | os.PathLike) -> str:
    """The folder of a checkpoint's client-state snapshots: ``round=000300.client_state``
    beside ``round=000300.ckpt``."""
    path = str(checkpoint_path)
    stem = path[: -len(".ckpt")] if path.endswith(".ckpt") else path
    return stem + ".client_state"


class RoundCheckpoint(ModelCheckpointHooks, ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` for round-based training.

    * File names count rounds (``trainer.global_step``): ``round=000300.ckpt`` instead of
      ``epoch=59-step=300.ckpt``.
    * Every checkpoint is written to a hidden temporary file in the same directory and renamed
      into place (``os.replace``, atomic on POSIX and Windows), so a run killed while saving
      never leaves a truncated checkpoint under a checkpoint's name. A file-system error while
      saving (a full disk, a read-only folder) names the checkpoint folder and the file, not a
      staging file (Lightning stages through fsspec, in the system's temporary folder).
    * A checkpoint is also saved when fit ends, whenever the last round has not been saved yet
      (e.g. ``max_steps: 20`` with evaluation every 50 rounds, which otherwise writes none).
    * Snapshots of memory-mapped client state (``client_state: disk``) are written beside
      each checkpoint (``round=000300.client_state/``, named relative to the checkpoint) and
      deleted with it, when a newer checkpoint supersedes it.
    * A fit stopped by SIGTERM or Ctrl-C (:mod:`~pl_privfed.callbacks.interrupt`) finishes its
      round and saves it, so that ``fit --ckpt_path`` continues where it stopped; the process
      then exits with status ``128 + signal`` (143, 130).

    Every other argument is ``ModelCheckpoint``'s (by default the newest checkpoint is kept);
    ``pl-privfed`` attaches one by default (:func:`pl_privfed.default_callbacks`).

    Args:
        dirpath: directory (default ``<log dir>/checkpoints``).
        filename: name template (default ``round={step:06d}``).
        auto_insert_metric_name: Lightning's option, off so that ``{step}`` reads as the round.
        **kwargs: further ``ModelCheckpoint`` arguments (``monitor``, ``save_top_k``,
            ``every_n_train_steps``, ``save_last``, ...).
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str = "round={step:06d}",
        auto_insert_metric_name: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            auto_insert_metric_name=auto_insert_metric_name,
            **kwargs,
        )

    @override
    def save_checkpoint_file(self, trainer: pl.Trainer, filepath: str) -> None:
        if not is_local_path(filepath):
            super().save_checkpoint_file(trainer, filepath)
            return
        folder, name = os.path.split(filepath)
        partial = os.path.join(folder, f".{name}.partial")
        snapshots = snapshot_dir(filepath)
        if trainer.is_global_zero and os.path.isdir(snapshots):  # the same name saved again
            shutil.rmtree(snapshots, ignore_errors=True)
        trainer.strategy.barrier("RoundCheckpoint._save_checkpoint.snapshots")
        self._saving_to = filepath
        try:
            trainer.save_checkpoint(partial, self.save_weights_only)
            if trainer.is_global_zero:
                os.replace(partial, filepath)
        except OSError as exc:  # name the user's folder, not a staging file (fsspec's is in /tmp)
            raise OSError(exc.errno, f"{exc.strerror} (saving {name})", folder) from exc
        finally:
            self._saving_to = None
            if trainer.is_global_zero and os.path.exists(partial):
                os.remove(partial)
        trainer.strategy.barrier("RoundCheckpoint._save_checkpoint")
        self.mark_saved(trainer, filepath)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.after_save_checkpoint(proxy(self))

    @override
    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        saving_to = getattr(self, "_saving_to", None)
        if saving_to is not None and is_local_path(saving_to):
            checkpoint[SNAPSHOT_DIR_KEY] = snapshot_dir(saving_to)  # the module's disk state

    @override
    def remove_checkpoint_file(self, trainer: pl.Trainer, filepath: str) -> None:
        super().remove_checkpoint_file(trainer, filepath)
        snapshots = snapshot_dir(filepath)
        if trainer.is_global_zero and is_local_path(filepath) and os.path.isdir(snapshots):
            shutil.rmtree(snapshots, ignore_errors=True)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_start(trainer, pl_module)
        watch_signals(trainer)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        stop_if_signalled(trainer)  # SIGTERM or Ctrl-C: stop (and save, below) after this round
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    @override
    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        super().on_exception(trainer, pl_module, exception)
        if stop_signal(trainer, exception) is not None:
            self.save_on_interrupt(trainer)

    def save_on_interrupt(self, trainer: pl.Trainer) -> str | None:
        """Save the current round (once) after a stop on a signal; the checkpoint's path, or
        ``None`` when no round was run, or the fit was stopped before training (set-up:
        nothing of this fit to save, and a resumed run's state may be half restored).
        :class:`~pl_privfed.callbacks.RunSummary` calls it before writing the summary, so the
        summary names the file."""
        if stopped_before_training(trainer):
            return None
        if trainer.global_step > 0 and self.monitor is None:
            self._save_at_end(trainer)
        elif trainer.global_step > 0 and not self.skips_saving(trainer):
            # a monitored metric ranks the kept files; the stopped round is kept regardless
            path = self.checkpoint_path(self.monitor_candidates(trainer), trainer)
            self.save_checkpoint_file(trainer, path)
        return self.saved_this_step(trainer)

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_end(trainer, pl_module)
        self._save_at_end(trainer)

    def _save_at_end(self, trainer: pl.Trainer) -> None:
        if self.skips_saving(trainer) or self.save_top_k == 0:
            return
        candidates = self.monitor_candidates(trainer)
        if self.monitor is not None and self.monitor not in candidates:
            return  # a monitored metric that was never logged: nothing to rank the file by
        self.save_top_k_and_last(trainer, candidates)
