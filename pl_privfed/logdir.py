"""Where a run writes: its log directory, read without a collective call, reserved atomically,
the W&B loggers that receive its files, and rounds as W&B's step axis.

This module is on the ground floor: it imports nothing of ``pl_privfed`` but
:mod:`pl_privfed.compat` (``wandb`` itself only when a W&B logger is attached).
"""

from __future__ import annotations

import os
import re
import weakref
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger, WandbLogger

from pl_privfed.compat.lightning import logger_version, set_logger_version

__all__ = [
    "check_writable_dir",
    "local_log_dir",
    "log_artifact",
    "logger_run_dir",
    "reserve_log_dir",
    "round_step_on_wandb",
    "wandb_loggers",
]


def local_log_dir(trainer: pl.Trainer) -> str | None:
    """``trainer.log_dir`` without its broadcast.

    Lightning's ``trainer.log_dir`` broadcasts rank 0's directory, a collective call: reached
    from code that runs on rank 0 only (``@rank_zero_only`` writers, ``on_fit_end`` files) it
    waits for ranks that never join, and under DDP the run fails at its end. This is the same
    directory, read locally (the loggers' directories are the same on every rank once the CLI
    has reserved them on rank 0, :func:`reserve_log_dir`).
    """
    if trainer.loggers:
        return logger_run_dir(trainer.loggers[0], trainer.default_root_dir)
    return trainer.default_root_dir


def logger_run_dir(logger: Any, default_root_dir: str) -> str:
    """The run's own folder under a logger: a CSV or TensorBoard logger's ``log_dir``
    (``<save_dir>/<name>/version_<k>``, reserved by :func:`reserve_log_dir`); any other logger
    (``WandbLogger``: ``<save_dir>/<project>/<run id>``) the folder that Lightning's
    ``ModelCheckpoint`` puts ``checkpoints/`` in, ``<save_dir>/<name>/<version>``. Never the
    logger's bare ``save_dir``, which every run of that logger shares: the summary, the config
    and the curves written there by one run were overwritten by the next."""
    if isinstance(logger, TensorBoardLogger | CSVLogger):
        return logger.log_dir
    save_dir = logger.save_dir if logger.save_dir is not None else default_root_dir
    version = logger.version
    version = version if isinstance(version, str) else f"version_{version}"
    return os.path.join(save_dir, str(logger.name), version)


def check_writable_dir(path: str | os.PathLike, what: str) -> None:
    """``ValueError`` naming ``what`` (e.g. ``--output_dir``) unless ``path`` is a folder this
    process can create or write: its nearest existing part must be a writable folder, not a file
    (checked before a run starts, so that a bad folder is refused in one line, not with an
    ``OSError`` at the first file written)."""
    target = Path(path).expanduser()
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        problem = (
            "is a file, not a folder"
            if existing == target
            else f"cannot be created: {str(existing)!r} is a file, not a folder"
        )
        raise ValueError(f"{what} {str(path)!r} {problem}; give a folder path")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(
            f"{what} {str(path)!r} is not writable: {str(existing)!r} is read-only; give a "
            "folder you can write to"
        )


def reserve_log_dir(logger: Any) -> None:
    """Give a ``CSVLogger`` or ``TensorBoardLogger`` without an explicit version the next free
    ``version_<k>`` directory, created here with ``os.mkdir`` (atomic: of two runs started at
    once in the same directory, each gets its own; Lightning's own choice only lists the
    directories, so both picked ``version_0`` and wrote into it)."""
    if not isinstance(logger, CSVLogger | TensorBoardLogger) or logger_version(logger) is not None:
        return
    root = Path(logger.root_dir)
    root.mkdir(parents=True, exist_ok=True)
    taken = [
        int(p.name.split("_", 1)[1])
        for p in root.iterdir()
        if p.is_dir() and re.fullmatch(r"version_\d+", p.name)
    ]
    version = max(taken, default=-1) + 1
    while True:
        try:
            (root / f"version_{version}").mkdir()
        except FileExistsError:
            version += 1
            continue
        set_logger_version(logger, version)
        return


def wandb_loggers(trainer: pl.Trainer) -> list[WandbLogger]:
    """The trainer's W&B loggers (an empty list when it has none)."""
    return [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]


class RoundMetrics:
    """A W&B logger's ``log_metrics`` that adds the round (``trainer.global_step``: the rounds
    done, 10 for the tenth round's training loss and for the evaluation after it) as ``round``
    to every record and drops the ``epoch`` Lightning adds (a federation's epochs are its
    datamodule's ``rounds_per_epoch``, not a quantity to plot)."""

    def __init__(self, log_metrics: Any, trainer: pl.Trainer) -> None:
        self.log_metrics = log_metrics
        self.trainer = weakref.ref(trainer)

    def __call__(self, metrics: Any, step: int | None = None) -> None:
        record = {key: value for key, value in metrics.items() if key != "epoch"}
        trainer = self.trainer()
        if trainer is not None:
            record["round"] = int(trainer.global_step)
        self.log_metrics(record, step=step)


def round_step_on_wandb(trainer: pl.Trainer) -> None:
    """Make ``round`` the x-axis of every series of the trainer's W&B loggers.

    Lightning's ``WandbLogger`` plots every series against ``trainer/global_step``, which reads
    9 for the tenth round (it counts steps before the round's), and logs an ``epoch`` series.
    Here each W&B logger gets ``define_metric("round")`` and ``define_metric("*",
    step_metric="round", step_sync=True)`` (W&B's own way to choose a step metric), and its
    ``log_metrics`` becomes a :class:`RoundMetrics`, which adds ``round`` to every record (the
    module's metrics, ``LearningRateMonitor``'s, the test set's) and drops ``epoch``. Called
    once a trainer is set up; a second call changes nothing.
    """
    for logger in wandb_loggers(trainer):
        if isinstance(logger.log_metrics, RoundMetrics):
            continue
        define = getattr(logger.experiment, "define_metric", None)  # not on other ranks
        if callable(define):
            define("round")
            define("*", step_metric="round", step_sync=True)
        logger.log_metrics = RoundMetrics(logger.log_metrics, trainer)  # type: ignore[method-assign]


def log_artifact(trainer: pl.Trainer, path: Path, kind: str) -> None:
    """Log ``path`` as a W&B artifact of type ``kind`` on every W&B logger of the trainer.

    Without a W&B logger nothing happens and ``wandb`` is not imported (it need not be installed).
    """
    loggers = wandb_loggers(trainer)
    if not loggers:
        return
    import wandb

    for logger in loggers:
        run = logger.experiment
        artifact = wandb.Artifact(name=f"{kind}-{run.id}", type=kind)
        artifact.add_file(str(path))
        run.log_artifact(artifact)
