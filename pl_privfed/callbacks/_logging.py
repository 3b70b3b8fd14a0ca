"""When a callback logs: only on the training steps whose metrics reach the loggers."""

from __future__ import annotations

import pytorch_lightning as pl

__all__ = ["logs_this_round"]


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
