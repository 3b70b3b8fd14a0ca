"""``CommunicationCost``: bits sent per round and in total, per channel."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from typing_extensions import override

from pl_privfed.communication import Messages, message_bits

__all__ = ["CommunicationCost"]


class CommunicationCost(pl.Callback):
    """Counts the bits each step sends, per channel, and their running totals.

    With a module that has a ``communication_messages()`` method (e.g.
    :class:`~pl_privfed.FederatedModule`) it counts the last round's messages: client → server
    (the clients' messages Δ̂_i, noise included) and server → client (the new model, once per
    client). Each message costs the cheaper of a dense encoding (``d`` values of
    ``value_bits``) and a sparse one (value + ``ceil(log2 d)``-bit index per non-zero), so
    compressed messages are counted as the sparse encoding they would need
    (:func:`~pl_privfed.communication.message_bits`).

    With any other module (a data-parallel or parameter-server view) each step counts
    ``workers`` dense gradients up and ``workers`` dense models down.

    Logged: ``comm/<channel>_bits`` (this step) and ``comm/<channel>_total_bits`` (cumulative),
    and the totals go to ``summary.json`` through :meth:`summary_entries`.

    Args:
        value_bits: bits per transmitted value (32 for float32).
        workers: workers per step, for modules without ``communication_messages()``.

    Example::

        trainer = pl.Trainer(callbacks=[CommunicationCost(workers=8)])
    """

    def __init__(self, value_bits: int = 32, workers: int = 1) -> None:
        if not isinstance(value_bits, int) or value_bits < 1:
            raise ValueError(f"value_bits must be a positive integer, got {value_bits!r}")
        if not isinstance(workers, int) or workers < 1:
            raise ValueError(f"workers must be a positive integer, got {workers!r}")
        self.value_bits = value_bits
        self.workers = workers
        self.totals: dict[str, float] = {}
        self.last: dict[str, float] = {}

    def step_messages(self, pl_module: pl.LightningModule) -> list[Messages]:
        protocol = getattr(pl_module, "communication_messages", None)
        if callable(protocol):
            return list(protocol())
        dim = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        dense = torch.ones(dim)  # a dense vector of the model's size
        return [
            Messages("client_to_server", dense, copies=self.workers),
            Messages("server_to_client", dense, copies=self.workers),
        ]

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step: dict[str, float] = {}
        for msg in self.step_messages(pl_module):
            bits = float(message_bits(msg.vectors, self.value_bits).sum()) * msg.copies
            step[msg.channel] = step.get(msg.channel, 0.0) + bits
        self.last = step
        for channel, bits in step.items():
            self.totals[channel] = self.totals.get(channel, 0.0) + bits
            pl_module.log(f"comm/{channel}_bits", bits)
            pl_module.log(f"comm/{channel}_total_bits", self.totals[channel])

    def summary_entries(self) -> dict[str, Any]:
        return {"communication_total_bits": dict(self.totals)}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals = dict(state_dict["totals"])
