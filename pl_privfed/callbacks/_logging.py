"""When a callback logs: only on the training steps whose metrics reach the loggers."""

from __future__ import annotations

import pytorch_lightning as pl
from pytorch_lightning.loggers import CSVLogger, TensorBoardLogger

__all__ = ["local_log_dir", "logs_this_round"]


def local_log_dir(trainer: pl.Trainer) -> str | None:
    """``trainer.log_dir`` without its broadcast.

    Lightning's ``trainer.log_dir`` broadcasts rank 0's directory, a collective call: reached
    from code that runs on rank 0 only (``@rank_zero_only`` writers, ``on_fit_end`` files) it
    waits for ranks that never join, and under DDP the run fails at its end. This is the same
    directory, read locally (the loggers' directories are the same on every rank once the CLI
    has reserved them on rank 0).
    """
    if trainer.loggers:
        logger = trainer.loggers[0]
        return (
            logger.log_dir if isinstance(logger, TensorBoardLogger | CSVLogger) else logger.save_dir
        )
    return trainer.default_root_dir


def logs_this_round(pl_module: pl.LightningModule) -> bool:
    """Whether metrics logged in the current training step are written: a module with a
    ``logging_round()`` method (:class:`~pl_privfed.FederatedModule`: every
    ``log_every_n_steps`` rounds and the last) says so; any other module logs every step.

    ``pl_module.log`` costs about a millisecond per call on a CPU, and Lightning writes only
    every ``log_every_n_steps`` steps anyway, so skipping the other rounds changes no logged
    value and saves most of a callback's cost in small rounds.
    """
    check = getattr(pl_module, "logging_round", None)
    return bool(check()) if callable(check) else True
