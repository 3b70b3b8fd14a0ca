"""What a federation reads of Lightning's ``Trainer``: its rounds, which of them log, its
precision, and running its validation loop between rounds.

In :class:`~pl_privfed.FederatedModule` one training step is one communication round; these are
the few places where that meets the Trainer's own counting. Plain functions of a trainer (and a
module), so the module keeps only its round.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from pl_privfed.compat.lightning import logging_state_kept

__all__ = [
    "PRECISIONS",
    "check_precision",
    "is_last_round",
    "logs_round",
    "num_rounds",
    "training_dtype",
    "validate_now",
]

#: a trainer's true precision → the dtype training runs in
TRUE_PRECISION = {"64-true": torch.float64}
#: the trainer precisions a federation runs under (:func:`check_precision`)
PRECISIONS = ("32-true", "64-true")


def check_precision(trainer: Any) -> None:
    """Refuse, in one line, a trainer precision other than 32 or 64 bits.

    Under ``16-mixed``/``bf16-mixed`` Lightning runs ``training_step`` in autocast, so the
    clients' gradients would come out of 16-bit matrix products and be clipped, normalized,
    compressed and noised in 16 bits; under ``16-true``/``bf16-true`` everything is 16-bit.
    A clipped norm rounded up in 16 bits may exceed the clipping bound the privacy accounting
    assumes, and the noise's scale is rounded too: no precision but 32 or 64 bits keeps the
    guarantee exact, so none is accepted (before, ``bf16-mixed`` ran without a word).

    Raises:
        ValueError: naming ``trainer.precision`` and what to give.
    """
    precision = str(trainer.precision)
    if precision not in PRECISIONS:
        raise ValueError(
            f"trainer.precision={precision!r} is not supported: a federation's clipping, "
            "normalization, compression and noise need 32 or 64 bits (in 16 bits a clipped "
            "norm may round above its bound and the noise's scale is rounded); give "
            "precision='32-true' (the default) or '64-true'"
        )


def num_rounds(trainer: Any) -> int:
    """The run's number of rounds: ``max_steps``, else ``max_epochs`` × the datamodule's
    ``rounds_per_epoch``; 0 when neither bounds the run."""
    if trainer.max_steps is not None and trainer.max_steps > 0:
        return int(trainer.max_steps)
    rounds_per_epoch = getattr(trainer.datamodule, "rounds_per_epoch", None)
    if trainer.max_epochs is not None and trainer.max_epochs > 0 and rounds_per_epoch:
        return int(trainer.max_epochs * rounds_per_epoch)
    return 0


def is_last_round(trainer: Any, round_index: int) -> bool:
    """Whether round ``round_index`` (0-based) is the run's last."""
    rounds = num_rounds(trainer)
    return bool(rounds) and round_index + 1 >= rounds


def logs_round(trainer: Any, round_index: int) -> bool:
    """Whether round ``round_index``'s metrics reach the loggers: Lightning writes a training
    step's metrics every ``log_every_n_steps`` steps (step ``k`` when ``(k + 1)`` is a
    multiple), and the last round's. Only then are the round's statistics that cost a pass over
    client rows computed, and only then does anything call ``self.log`` (each call costs about a
    millisecond on a CPU: at a 10-client round, more than the round)."""
    every = max(1, int(trainer.log_every_n_steps or 1))
    return (round_index + 1) % every == 0 or is_last_round(trainer, round_index)


def training_dtype(trainer: Any, module: nn.Module, model: nn.Module) -> torch.dtype:
    """The dtype training runs in: the trainer's true precision (``"64-true"`` → float64;
    16-bit precisions are refused, :func:`check_precision`), else the model's. ``module`` is
    converted to it here, before an algorithm allocates its state and noise in it (Lightning
    converts the module only after ``setup``, which would leave the algorithm's dtype behind)."""
    dtype = TRUE_PRECISION.get(str(trainer.precision))
    if dtype is None:
        return next(model.parameters()).dtype
    if next(model.parameters()).dtype != dtype:
        module.to(dtype=dtype)
    return dtype


def validate_now(trainer: Any) -> None:
    """Run the fit's validation loop now (callbacks and loggers see it as the evaluation of the
    current round), as the training loop itself runs it: a resumed run evaluates the round it
    resumes at before training on, over the whole validation set.

    A loop restored from a checkpoint is *restarting* until the first training batch clears it:
    its run would continue the batch counters of the checkpoint's last (finished) evaluation,
    count those batches as already fetched and stop after one batch, so the logged ``val/*``
    would be the first batch's. The training loop clears the flag before it validates; so does
    this evaluation, which starts a new one."""
    if not trainer.enable_validation:
        return
    val_loop = trainer.fit_loop.epoch_loop.val_loop
    val_loop.restarting = False
    with logging_state_kept(trainer):
        trainer.validating = True
        val_loop.run()
        trainer.training = True
