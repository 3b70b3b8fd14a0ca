"""``CommunicationCost``: bits sent per round and in total, per channel."""

from __future__ import annotations

from typing import Any

import pytorch_lightning as pl
import torch
from typing_extensions import override

from pl_privfed.callbacks._logging import logs_this_round
from pl_privfed.checks import check_positive_int
from pl_privfed.communication import ENCODING, Messages, message_bits, per_agent_bits

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

    Decentralized algorithms (:mod:`pl_privfed.algorithms.decentralized`) send on the
    ``agent_to_agent`` channel: each agent's compressed vectors, counted once per sending agent
    (a broadcast to its neighbours; a point-to-point network would pay that once per neighbour).

    Logged: ``comm/<channel>_bits`` (this step, all senders), ``comm/<channel>_total_bits``
    (cumulative), and per agent ``comm/<channel>_bits_per_agent`` /
    ``comm/<channel>_total_bits_per_agent`` (each message's bits divided by its rows: what one
    client or agent sends, or for a broadcast ``[d]`` vector what one client receives — the
    x-axis of "accuracy against bits" plots). :meth:`summary_entries` puts the totals, the
    per-agent totals and the encoding (:data:`~pl_privfed.communication.ENCODING`) into
    ``summary.json``.

    Args:
        value_bits: bits per transmitted value (32 for float32).
        workers: workers per step, for modules without ``communication_messages()``.

    Example::

        trainer = pl.Trainer(callbacks=[CommunicationCost(workers=8)])
    """

    def __init__(self, value_bits: int = 32, workers: int = 1) -> None:
        self.value_bits = check_positive_int("value_bits", value_bits)
        self.workers = check_positive_int("workers", workers)
        self.totals: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.totals_per_agent: dict[str, float] = {}
        self.last_per_agent: dict[str, float] = {}

    def step_messages(self, pl_module: pl.LightningModule) -> list[Messages]:
        protocol = getattr(pl_module, "communication_messages", None)
        if callable(protocol):
            return list(protocol())
        dim = sum(p.numel() for p in pl_module.parameters() if p.requires_grad)
        dense = torch.tensor([dim])  # one dense vector of the model's size
        return [
            Messages("client_to_server", dense, dim, copies=self.workers),
            Messages("server_to_client", dense, dim, copies=self.workers),
        ]

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step: dict[str, float] = {}
        per_agent: dict[str, float] = {}
        for msg in self.step_messages(pl_module):
            bits = float(message_bits(msg.nonzeros, msg.dim, self.value_bits).sum()) * msg.copies
            step[msg.channel] = step.get(msg.channel, 0.0) + bits
            agent_bits = per_agent_bits(msg, self.value_bits)
            per_agent[msg.channel] = per_agent.get(msg.channel, 0.0) + agent_bits
        self.last, self.last_per_agent = step, per_agent
        log = logs_this_round(pl_module)
        for channel, bits in step.items():
            self.totals[channel] = self.totals.get(channel, 0.0) + bits
            self.totals_per_agent[channel] = (
                self.totals_per_agent.get(channel, 0.0) + per_agent[channel]
            )
            if not log:  # counted every round, logged when the loggers write
                continue
            pl_module.log(f"comm/{channel}_bits", bits, batch_size=1)
            pl_module.log(f"comm/{channel}_total_bits", self.totals[channel], batch_size=1)
            pl_module.log(f"comm/{channel}_bits_per_agent", per_agent[channel], batch_size=1)
            pl_module.log(
                f"comm/{channel}_total_bits_per_agent", self.totals_per_agent[channel], batch_size=1
            )

    def summary_entries(self) -> dict[str, Any]:
        return {
            "communication_total_bits": dict(self.totals),
            "communication_total_bits_per_agent": dict(self.totals_per_agent),
            "communication_encoding": f"{ENCODING}; value_bits = {self.value_bits}",
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"totals": dict(self.totals), "totals_per_agent": dict(self.totals_per_agent)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.totals = dict(state_dict["totals"])
        self.totals_per_agent = dict(state_dict.get("totals_per_agent", {}))
