"""Helpers for the W&B logger, used by the callbacks when one is attached (offline works too)."""

from __future__ import annotations

from pathlib import Path

import pytorch_lightning as pl
from pytorch_lightning.loggers import WandbLogger

__all__ = ["log_artifact", "wandb_loggers"]


def wandb_loggers(trainer: pl.Trainer) -> list[WandbLogger]:
    return [lg for lg in trainer.loggers if isinstance(lg, WandbLogger)]


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
