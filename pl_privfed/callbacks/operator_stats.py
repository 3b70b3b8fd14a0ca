"""``OperatorStatistics``: log what clipping / normalization / compression / noise did."""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl
import torch
from typing_extensions import override

from pl_privfed.callbacks._logging import logs_this_round

__all__ = ["OperatorStatistics"]


class OperatorStatistics(pl.Callback):
    """Logs per-step operator statistics as ``operators/<name>`` and keeps run averages.

    With a module that has an ``operator_statistics()`` method (e.g.
    :class:`~pl_privfed.FederatedModule`) it logs what that returns for the last step: for the
    package's algorithms ``clip_fraction`` (share of clients whose vector the operator
    shortened), ``norm_before`` / ``update_norm`` (mean norm before / after the operator),
    ``ef_gap`` (``||ĝ − mean_i g_i||``, error-feedback methods), ``noise_to_signal``
    (``||Σ noise|| / ||Σ messages||`` of the aggregate, private runs) and ``aggregate_norm``.
    The module computes the statistics that cost a pass over the clients' rows (``ef_gap``, a
    plain operator's norms) only on the rounds whose metrics reach the loggers, and this
    callback logs on those rounds only (:func:`logs_this_round`); the run averages in
    ``summary.json`` are over the rounds that reported each statistic.

    With any other module it measures the gradient before the optimizer step (and before
    Lightning's own gradient clipping): ``grad_norm``, and with ``clip_threshold`` τ,
    ``clip_fraction`` (share of steps with ``||g|| > τ``) and ``norm_after`` (``min(||g||, τ)``).

    Args:
        clip_threshold: τ for the gradient statistics of plain modules.
        prefix: logging prefix.

    Example::

        trainer = pl.Trainer(gradient_clip_val=1.0, callbacks=[OperatorStatistics(clip_threshold=1.0)])
    """

    def __init__(self, clip_threshold: float | None = None, prefix: str = "operators/") -> None:
        if clip_threshold is not None and not clip_threshold > 0:
            raise ValueError(f"clip_threshold must be positive, got {clip_threshold!r}")
        self.clip_threshold = clip_threshold
        self.prefix = prefix
        self.sums: dict[str, float] = {}
        self.counts: dict[str, int] = {}
        self._pending: dict[str, torch.Tensor] = {}

    def _record(self, pl_module: pl.LightningModule, stats: dict[str, Any]) -> None:
        log = logs_this_round(pl_module)
        for name, value in stats.items():
            value = float(value)
            if log:
                pl_module.log(self.prefix + name, value, batch_size=1)
            if math.isfinite(value):
                self.sums[name] = self.sums.get(name, 0.0) + value
                self.counts[name] = self.counts.get(name, 0) + 1

    @override
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if callable(getattr(pl_module, "operator_statistics", None)):
            return
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if not grads:
            return
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
        self._pending = {"grad_norm": norm}
        if self.clip_threshold is not None:
            self._pending["clip_fraction"] = (norm > self.clip_threshold).float()
            self._pending["norm_after"] = norm.clamp(max=self.clip_threshold)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        protocol = getattr(pl_module, "operator_statistics", None)
        stats = protocol() if callable(protocol) else self._pending
        self._record(pl_module, stats)
        self._pending = {}

    def summary_entries(self) -> dict[str, Any]:
        """Run averages of every statistic, for ``summary.json``."""
        return {"operator_means": {k: self.sums[k] / self.counts[k] for k in self.sums}}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {"sums": dict(self.sums), "counts": dict(self.counts)}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.sums = dict(state_dict["sums"])
        self.counts = dict(state_dict["counts"])
