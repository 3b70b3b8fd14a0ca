"""Evaluation as plain functions over a model and a loader.

A federation is evaluated like any model: its global parameters on a held-out loader. The loss
is the training objective (the criterion plus the model's ``regularizer()``, if it has one),
accuracy the share of correct arg-max predictions (classification only). Lightning's
validation and test loops use :func:`model_loss` with torchmetrics' accuracy;
:func:`loader_metrics` runs a whole loader outside those loops (the test set at the end of fit,
:func:`test_set_result`; a decentralized method's sampled output iterate,
:func:`output_iterate_report`; a grid's configurations).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor, nn

__all__ = [
    "evaluated_at",
    "loader_metrics",
    "log_at_last_round",
    "model_loss",
    "output_iterate_report",
    "test_set_metrics",
    "test_set_result",
]


def model_loss(
    model: nn.Module, criterion: nn.Module, inputs: Tensor, targets: Tensor
) -> tuple[Tensor, Tensor]:
    """The model's outputs on a batch and its loss: the criterion plus the model's
    ``regularizer()`` if it has one (the objective every client's loss also carries)."""
    out = model(inputs)
    loss = criterion(out, targets)
    regularizer = getattr(model, "regularizer", None)
    if callable(regularizer):
        loss = loss + regularizer(dict(model.named_parameters()))
    return out, loss


@torch.no_grad()
def loader_metrics(
    model: nn.Module,
    criterion: nn.Module,
    loader: Iterable[Any],
    *,
    device: torch.device,
    preprocess: Callable[[Tensor, bool, int], Tensor] | None = None,
    classification: bool = True,
    batch_metrics: Callable[[Tensor, Tensor], None] | None = None,
) -> tuple[float, float | None]:
    """Mean loss and accuracy (``None`` without ``classification``) of ``model`` over
    ``loader``, in eval mode (restored afterwards).

    Args:
        model: the model, evaluated as it is.
        criterion: the loss, a mean over its batch.
        loader: ``(inputs, targets)`` batches.
        device: where the batches go.
        preprocess: the datamodule's ``preprocess(inputs, training, round)``, if any.
        classification: whether accuracy is defined.
        batch_metrics: called with every preprocessed batch instead of evaluating ``model`` on
            it (the grid evaluates its configurations); the return values are then zeros.
    """
    was_training = model.training
    model.eval()
    total_loss, correct, count = 0.0, 0, 0
    try:
        dtype = next(model.parameters()).dtype
        for inputs, targets in loader:
            inputs, targets = inputs.to(device), targets.to(device)
            if callable(preprocess):
                inputs = preprocess(inputs, False, 0)
            if inputs.is_floating_point():  # the model's precision (e.g. "64-true")
                inputs = inputs.to(dtype)
            if batch_metrics is not None:
                batch_metrics(inputs, targets)
                continue
            logits, loss = model_loss(model, criterion, inputs, targets)
            total_loss += float(loss) * len(targets)
            if classification:
                correct += int((logits.argmax(-1) == targets).sum())
            count += len(targets)
    finally:
        model.train(was_training)
    accuracy = correct / max(count, 1) if classification else None
    return total_loss / max(count, 1), accuracy


@torch.no_grad()
def evaluated_at(model: nn.Module, layout: Any, params: Tensor, evaluate: Callable[[], Any]) -> Any:
    """``evaluate()`` with the model's parameters swapped for ``params`` (flat, ``[d]``, in
    ``layout``), restored afterwards; buffers (BatchNorm statistics) stay the model's."""
    x = layout.flatten(model)
    layout.assign(model, params.to(x))
    try:
        return evaluate()
    finally:
        layout.assign(model, x)


def test_set_metrics(
    trainer: Any,
    model: nn.Module,
    criterion: nn.Module,
    *,
    classification: bool,
    split: str = "test",
    **kwargs: Any,
) -> tuple[float, float | None] | None:
    """:func:`loader_metrics` of ``model`` on the trainer's datamodule's test set (``split``
    ``"val"``: its validation split) through its ``preprocess``, or ``None`` when the
    datamodule has no such set."""
    datamodule = trainer.datamodule
    loader = getattr(datamodule, f"{split}_dataloader", None)
    if not callable(loader):
        return None
    device = next(model.parameters()).device
    preprocess = getattr(datamodule, "preprocess", None)
    options = {"device": device, "preprocess": preprocess, "classification": classification}
    return loader_metrics(model, criterion, loader(), **options, **kwargs)


def log_at_last_round(trainer: Any, metrics: dict[str, float], round_index: int) -> None:
    """Log ``metrics`` on rank 0 at the step Lightning gave the last round's metrics (rounds
    ``1..k`` are logged at steps ``0..k-1``)."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=max(round_index - 1, 0))


def test_set_result(
    trainer: Any,
    metrics: tuple[float, float | None] | None,
    round_index: int,
    split: str = "test",
) -> dict[str, Any] | None:
    """A test-set (``split``: or validation-split) evaluation's result: ``metrics``
    (``(loss, accuracy)`` of :func:`test_set_metrics`) logged as ``<split>/loss`` and
    ``<split>/acc`` at round ``round_index`` (:func:`log_at_last_round`).

    Returns:
        ``{"round": round_index, "loss": ..., "accuracy": ...}`` (accuracy ``None`` when not a
        classification), or ``None`` when ``metrics`` is ``None`` (no such set).
    """
    if metrics is None:
        return None
    loss, accuracy = metrics
    logged = {f"{split}/loss": loss}
    if accuracy is not None:
        logged[f"{split}/acc"] = accuracy
    log_at_last_round(trainer, logged, round_index)
    return {"round": round_index, "loss": loss, "accuracy": accuracy}


def output_iterate_report(
    output: dict[str, Any], model: nn.Module, layout: Any, evaluate: Callable[[], Any]
) -> dict[str, Any]:
    """Where an algorithm's sampled output iterate came from and its test loss and accuracy.

    Args:
        output: the algorithm's ``output()``: ``{"round", "agent", "params"}``.
        model: the global model; its parameters are swapped for ``params`` meanwhile
            (:func:`evaluated_at`).
        layout: the model's parameter layout.
        evaluate: the test set's ``(loss, accuracy)`` of the model as it is, or ``None``.

    Returns:
        ``{"round", "agent"}``, with ``test_loss`` and ``test_accuracy`` where ``evaluate``
        gives them.
    """
    report: dict[str, Any] = {"round": output["round"], "agent": output["agent"]}
    metrics = evaluated_at(model, layout, output["params"], evaluate)
    if metrics is not None:
        report["test_loss"], report["test_accuracy"] = metrics
    return report
