"""``GradientNorm``: the full-gradient norm ``||∇f(x)||`` of the global model, rounds to a target."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torch.func import vmap
from typing_extensions import override

from pl_privfed.callbacks._logging import warn_once
from pl_privfed.checks import check_choice, check_positive, check_positive_int

__all__ = ["GradientNorm"]


def _no_forward(model: nn.Module) -> bool:
    """Whether ``model`` inherits the unimplemented ``forward`` of ``nn.Module`` or of
    ``LightningModule`` (which passes to ``nn.Module``'s)."""
    forward = type(model).forward
    return forward is pl.LightningModule.forward or forward is nn.Module.forward


def _loader_dataset(trainer: pl.Trainer) -> Any:
    """The dataset of the trainer's training dataloader (a plain project's training data)."""
    loader = getattr(trainer, "train_dataloader", None)
    if isinstance(loader, list | tuple) and len(loader) == 1:
        loader = loader[0]
    return getattr(loader, "dataset", None)


class GradientNorm(pl.Callback):
    """Logs ``||∇f(x)||`` over the union of the clients' training data; rounds to reach a target.

    ``f(x) = (1/M) Σ_i f_i(x)``, ``f_i(x) = (1/N_i) Σ_{j ∈ shard i} ℓ(x; ξ_j)`` (paper 004 eq. (1),
    paper 003 §2), evaluated at the global model the LightningModule holds — the quantity paper
    003 plots and stops on (``||∇f(x_t)|| = 0.18``, Figs. 1–2, line 238). With
    ``weighting="examples"`` each example counts equally (``f`` = the mean over the union), which
    is the same when the shards have equal sizes.

    The evaluation is vectorized over examples: the union is processed in chunks of
    ``chunk_size`` examples, one batched forward and backward per chunk (per-example losses
    from the module's criterion under ``vmap``, weighted and summed), with the model in eval mode
    (BatchNorm uses its running statistics; no buffer changes). The model's ``regularizer()`` is
    added once, as in every ``f_i``.

    What it reads, so any LightningModule over a :class:`~pl_privfed.datamodules.
    FederatedDataModule`-like datamodule works (server or decentralized algorithms):

    * the model: ``pl_module.full_gradient_model()`` if defined (e.g. the average of a
      decentralized method's agents), else ``pl_module.model`` if it is an ``nn.Module``, else
      the LightningModule itself;
    * the loss: ``pl_module.criterion`` (default cross-entropy), a mean over its batch;
    * the data: ``datamodule.shards`` (one index array per client) into
      ``datamodule.train_inputs`` / ``train_targets`` (or ``train_dataset``), passed through
      ``datamodule.preprocess(x, False, 0)`` when the datamodule has it.

    In a plain Lightning project: without ``datamodule.shards`` the training data is one shard
    (every example weighed equally), read from ``datamodule.train_dataset`` or else the dataset
    of the trainer's training dataloader, and without ``pl_module.criterion`` the loss is
    cross-entropy; each is said once in a warning naming the missing attribute. When no
    training data can be read as ``(input, target)`` pairs it warns once and measures nothing.

    Logged as ``train/full_grad_norm`` after round 0 (before training; written to the loggers
    directly) and every ``every_n_rounds`` rounds. ``summary_entries()`` puts the target, the
    first round with ``||∇f|| <= target`` (``rounds_to_target``; ``None`` if never), the final and
    smallest values and the history into ``summary.json``. With ``stop_at_target`` training stops
    at that round (``trainer.should_stop``), with the reason in :attr:`stop_reason`.

    In a grid of configurations (``FederatedModule(grid=...)``) every configuration still
    training is measured at its own parameters: its curve, ``rounds_to_target`` and
    ``final_full_grad_norm`` go into its own results (``results.csv``), and with
    ``stop_at_target`` each configuration stops at its own target round (the run stops when none
    is left); this callback's own history holds the smallest norm over the configurations.

    Args:
        every_n_rounds: evaluate every this many rounds.
        target: the target gradient norm (``None``: no target).
        stop_at_target: stop training when the target is reached (needs ``target``).
        weighting: ``"clients"`` (``(1/M) Σ_i f_i``) or ``"examples"`` (mean over the union).
        chunk_size: examples per forward/backward.
        key: the logged metric name.

    Example::

        trainer = pl.Trainer(callbacks=[GradientNorm(every_n_rounds=5, target=0.18)])
    """

    def __init__(
        self,
        every_n_rounds: int = 1,
        target: float | None = None,
        stop_at_target: bool = False,
        weighting: str = "clients",
        chunk_size: int = 4096,
        key: str = "train/full_grad_norm",
    ) -> None:
        check_positive_int("every_n_rounds", every_n_rounds)
        check_positive_int("chunk_size", chunk_size)
        if target is not None:
            check_positive("target", target)
        if stop_at_target and target is None:
            raise ValueError("stop_at_target=True needs a target, got target=None")
        check_choice("weighting", weighting, ("clients", "examples"))
        self.every_n_rounds = every_n_rounds
        self.target = None if target is None else float(target)
        self.stop_at_target = bool(stop_at_target)
        self.weighting = weighting
        self.chunk_size = chunk_size
        self.key = key
        self.history: list[tuple[int, float]] = []
        self.rounds_to_target: int | None = None
        self.stop_reason: str | None = None
        self._data: tuple[Tensor, Tensor, Tensor] | None = None

    # ------------------------------------------------------------------ data and model
    def _union(self, datamodule: Any, fallback: Any = None) -> tuple[Tensor, Tensor, Tensor] | None:
        """``(inputs, targets, weights)`` of the union of the shards (weights sum to 1), or
        ``None`` (after one warning) when the training data cannot be read.

        The examples: ``datamodule.train_inputs`` / ``train_targets``, else
        ``datamodule.train_dataset``, else, for a datamodule without ``shards`` only,
        ``fallback`` (the dataset of the trainer's training dataloader)."""
        if self._data is not None:
            return self._data
        name = type(datamodule).__name__
        shards = getattr(datamodule, "shards", None)
        shards = [np.asarray(s, dtype=np.int64) for s in ([] if shards is None else shards)]
        inputs = getattr(datamodule, "train_inputs", None)
        targets = getattr(datamodule, "train_targets", None)
        source: Any = None
        if inputs is not None and targets is not None:
            source, where = (inputs, targets), "datamodule.train_inputs"
        elif getattr(datamodule, "train_dataset", None) is not None:
            source, where = datamodule.train_dataset, "datamodule.train_dataset"
        elif not shards and fallback is not None:
            source, where = fallback, "the training dataloader's dataset"
        if source is None:
            lacks = (
                f"datamodule {name} has shards but no train_dataset (or train_inputs and "
                "train_targets) to index with them"
                if shards
                else "the trainer has no datamodule and its training dataloader no dataset"
                if datamodule is None
                else f"datamodule {name} has no train_dataset (or train_inputs and "
                "train_targets) and the training dataloader no dataset"
            )
            warn_once(
                self, "data", f"{lacks}, so the full gradient norm ({self.key}) is not measured"
            )
            return None
        if not shards:
            try:
                size = len(source[1]) if isinstance(source, tuple) else len(source)
            except TypeError:
                warn_once(self, "data", f"{where} has no length, so {self.key} is not measured")
                return None
            shards = [np.arange(size, dtype=np.int64)]
            lacks = (
                "the trainer has no datamodule, so no datamodule.shards"
                if datamodule is None
                else f"datamodule {name} has no shards"
            )
            warn_once(
                self,
                "shards",
                f"{lacks} (one index array per client): {self.key} is measured over {where} "
                f"as one shard (all {size} examples weighed equally)",
            )
        index = torch.as_tensor(np.concatenate(shards))
        if isinstance(source, tuple):
            x, y = source[0][index], source[1][index]
        else:
            try:
                items = [source[int(j)] for j in index]
                x = torch.stack([torch.as_tensor(a) for a, _ in items])
                y = torch.stack([torch.as_tensor(b) for _, b in items])
            except (TypeError, ValueError, IndexError, RuntimeError) as exc:
                warn_once(
                    self,
                    "data",
                    f"the examples of {where} are not (input, target) pairs of tensors ({exc}), "
                    f"so {self.key} is not measured",
                )
                return None
        sizes = torch.tensor([len(s) for s in shards], dtype=torch.float64)
        if self.weighting == "clients":
            per_client = 1.0 / (len(shards) * sizes)
        else:
            per_client = torch.full_like(sizes, 1.0 / float(sizes.sum()))
        weights = torch.repeat_interleave(per_client, sizes.long())
        self._data = (x, y, weights)
        return self._data

    @staticmethod
    def _model(pl_module: pl.LightningModule) -> nn.Module:
        getter = getattr(pl_module, "full_gradient_model", None)
        if callable(getter):
            return getter()
        model = getattr(pl_module, "model", None)
        return model if isinstance(model, nn.Module) else pl_module

    def full_gradient_norm(
        self, pl_module: pl.LightningModule, datamodule: Any, fallback: Any = None
    ) -> float:
        """``||∇f(x)||`` at the module's global model (see the class docstring); ``nan`` when
        the training data cannot be read (warned once)."""
        model = self._model(pl_module)
        if _no_forward(model):
            warn_once(
                self,
                "model",
                f"{type(pl_module).__name__} has no forward() (and no model attribute nor "
                f"full_gradient_model()), so the full gradient norm ({self.key}) is not measured",
            )
            return math.nan
        data = self._union(datamodule, fallback)
        if data is None:
            return math.nan
        x_all, y_all, w_all = data
        criterion = getattr(pl_module, "criterion", None)
        if criterion is None:
            warn_once(
                self,
                "criterion",
                f"{type(pl_module).__name__} has no criterion attribute (the loss, a mean over "
                "its batch), so the full gradient is that of the cross-entropy",
            )
            criterion = nn.CrossEntropyLoss()
        params = [p for p in model.parameters() if p.requires_grad]
        device = params[0].device
        preprocess = getattr(datamodule, "preprocess", None)
        grads = [torch.zeros_like(p) for p in params]

        def example_loss(out: Tensor, target: Tensor) -> Tensor:
            return criterion(out.unsqueeze(0), target.unsqueeze(0))

        was_training = model.training
        model.eval()
        try:
            with torch.enable_grad():
                for start in range(0, len(y_all), self.chunk_size):
                    stop = start + self.chunk_size
                    x = x_all[start:stop].to(device)
                    if callable(preprocess):
                        x = preprocess(x, False, 0)
                    y = y_all[start:stop].to(device)
                    w = w_all[start:stop].to(device=device, dtype=params[0].dtype)
                    losses = vmap(example_loss)(model(x), y)
                    total = (losses * w).sum()
                    for g, piece in zip(grads, torch.autograd.grad(total, params), strict=True):
                        g.add_(piece)
                regularizer = getattr(model, "regularizer", None)
                if callable(regularizer):
                    reg = regularizer(dict(model.named_parameters()))
                    for g, piece in zip(grads, torch.autograd.grad(reg, params), strict=True):
                        g.add_(piece)
        finally:
            model.train(was_training)
        return float(torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])))

    # ------------------------------------------------------------------ hooks
    def _reached(self, value: float, round_index: int) -> str:
        """Why a run (or a grid configuration) stops at the target."""
        return f"full gradient norm {value:.4g} <= target {self.target:g} at round {round_index}"

    def _evaluate_grid(self, trainer: pl.Trainer, pl_module: Any) -> float:
        """Every training configuration of a grid (:mod:`pl_privfed.grid`): its own curve,
        ``rounds_to_target`` and, with ``stop_at_target``, its own stop; returns the smallest
        norm, which is what this callback's own history and log hold for a grid."""
        round_index = int(trainer.global_step)
        smallest = math.inf
        for k in pl_module.grid_running():
            pl_module.load_grid_configuration(k)
            value = self.full_gradient_norm(pl_module, trainer.datamodule)
            pl_module.grid_record(k, self.key, round_index, value)
            smallest = min(smallest, value)
            entries = pl_module.grid_entries(k)
            entries.setdefault("rounds_to_target", None)
            if self.target is None or entries["rounds_to_target"] is not None:
                continue
            if value <= self.target:
                entries["rounds_to_target"] = round_index
                if self.stop_at_target:
                    pl_module.grid_finish(k, self._reached(value, round_index))
        if self.stop_at_target and trainer.should_stop:
            self.stop_reason = "every configuration of the grid reached the target or failed"
        return smallest

    def _evaluate(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> float:
        if getattr(pl_module, "grid_algorithms", None) is not None:
            value = self._evaluate_grid(trainer, pl_module)
            if not math.isfinite(value):  # no configuration left training
                return value
        else:
            value = self.full_gradient_norm(pl_module, trainer.datamodule, _loader_dataset(trainer))
            if not math.isfinite(value):  # the data could not be read (warned once)
                return value
        round_index = int(trainer.global_step)
        if not self.history or self.history[-1][0] != round_index:
            self.history.append((round_index, value))
        if self.target is not None and self.rounds_to_target is None and value <= self.target:
            self.rounds_to_target = round_index
            if self.stop_at_target and getattr(pl_module, "grid_algorithms", None) is None:
                trainer.should_stop = True
                self.stop_reason = self._reached(value, round_index)
        return value

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step != 0 or self.history:
            return  # resumed: round 0 was recorded before
        value = self._evaluate(trainer, pl_module)
        if not math.isfinite(value):
            return
        for logger in trainer.loggers:
            logger.log_metrics({self.key: value}, step=0)

    @override
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step % self.every_n_rounds:
            return
        value = self._evaluate(trainer, pl_module)
        if math.isfinite(value):
            pl_module.log(self.key, value)

    # ------------------------------------------------------------------ summary and state
    def summary_entries(self) -> dict[str, Any]:
        values = [v for _, v in self.history]
        return {
            "rounds_to_target": self.rounds_to_target,
            "final_full_grad_norm": values[-1] if values else None,
            "full_grad_norm": {
                "target": self.target,
                "rounds_to_target": self.rounds_to_target,
                "every_n_rounds": self.every_n_rounds,
                "weighting": self.weighting,
                "final": values[-1] if values else None,
                "min": min(values) if values else None,
                "history": [list(p) for p in self.history],
            },
        }

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "history": [list(p) for p in self.history],
            "rounds_to_target": self.rounds_to_target,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [(int(r), float(v)) for r, v in state_dict.get("history", [])]
        self.rounds_to_target = state_dict.get("rounds_to_target")
