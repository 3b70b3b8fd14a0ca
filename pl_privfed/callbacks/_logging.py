"""When a callback logs (only on the training steps whose metrics reach the loggers), and how
it says once that a module or datamodule lacks what it reads."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.utilities import rank_zero_warn

__all__ = ["logged_names", "logs_this_round", "warn_once"]


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


def warn_once(callback: Any, what: str, message: str) -> None:
    """A rank-zero ``UserWarning`` ``"<Callback>: <message>"``, given once per ``what`` per
    callback object: a callback used in a project that lacks a key or an attribute it reads
    says so once and does without that part, instead of failing or staying silent."""
    warned: set[str] = callback.__dict__.setdefault("_warned_once", set())
    if what in warned:
        return
    warned.add(what)
    rank_zero_warn(f"{type(callback).__name__}: {message}", category=UserWarning)


def logged_names(trainer: pl.Trainer) -> str:
    """The metrics logged so far, for a warning: ``"a, b, c"`` or ``"none"``."""
    return ", ".join(sorted(trainer.callback_metrics)) or "none"
