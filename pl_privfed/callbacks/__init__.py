"""Callbacks usable in any Lightning project, and :func:`default_callbacks`, the set the
``pl-privfed`` command attaches to every run."""

from __future__ import annotations

from pytorch_lightning import Callback

from pl_privfed.callbacks.audit import PrivacyAudit
from pl_privfed.callbacks.checkpoint import CheckpointError, RoundCheckpoint, check_checkpoint_file
from pl_privfed.callbacks.comm_cost import CommunicationCost
from pl_privfed.callbacks.gradient_norm import GradientNorm
from pl_privfed.callbacks.operator_stats import OperatorStatistics
from pl_privfed.callbacks.plots import TrainingCurves
from pl_privfed.callbacks.privacy_budget import PrivacyBudget
from pl_privfed.callbacks.progress import RoundProgressBar
from pl_privfed.callbacks.summary import RunSummary

__all__ = [
    "CheckpointError",
    "CommunicationCost",
    "GradientNorm",
    "OperatorStatistics",
    "PrivacyAudit",
    "PrivacyBudget",
    "RoundCheckpoint",
    "RoundProgressBar",
    "RunSummary",
    "TrainingCurves",
    "check_checkpoint_file",
    "default_callbacks",
]


def default_callbacks(
    *,
    progress_bar: bool = True,
    checkpoint: bool = True,
    accuracy_key: str | None = None,
    loss_key: str | None = None,
) -> list[Callback]:
    """The callbacks ``pl-privfed fit`` attaches to every run, for a ``pl.Trainer`` of your own.

    :class:`RunSummary` (``summary.json`` and the one-line result), :class:`OperatorStatistics`,
    :class:`CommunicationCost`, :class:`TrainingCurves` (``curves.png``, ``curves.csv``), and,
    unless turned off, :class:`RoundProgressBar` and :class:`RoundCheckpoint`. Pass
    ``progress_bar=False`` / ``checkpoint=False`` when the trainer has
    ``enable_progress_bar=False`` / ``enable_checkpointing=False`` (Lightning refuses such a
    callback then).

    Args:
        progress_bar: include :class:`RoundProgressBar`.
        checkpoint: include :class:`RoundCheckpoint`.
        accuracy_key: the metric :class:`RunSummary` reports as validation accuracy (default:
            the module's ``validation_accuracy_key``, else ``val/acc``).
        loss_key: the metric :class:`RunSummary` reports as training loss (default: the
            module's ``training_loss_key``, else ``train/loss``).

    Example::

        trainer = pl.Trainer(max_steps=300, callbacks=pl_privfed.default_callbacks())
    """
    callbacks: list[Callback] = [
        RunSummary(accuracy_key=accuracy_key, loss_key=loss_key),
        OperatorStatistics(),
        CommunicationCost(),
        TrainingCurves(),
    ]
    if progress_bar:
        callbacks.append(RoundProgressBar())
    if checkpoint:
        callbacks.append(RoundCheckpoint())
    return callbacks
