"""``FederatedModule``: the whole federation in one LightningModule; one training step = one round.

Each ``training_step`` receives one minibatch per client stacked along a leading client axis
(``inputs [n, B, ...]``, ``targets [n, B, ...]``), hands the algorithm a gradient oracle over that
batch, and writes the algorithm's new parameters into the global model. Optimization is manual;
a no-op optimizer is stepped once per round so that ``trainer.global_step`` counts rounds (and
``max_steps`` is a number of communication rounds).
"""

from __future__ import annotations

import math
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.grads import Backend, GradientOracle, ParameterLayout, resolve_backend
from pl_privfed.privacy import PrivacyAccountant

__all__ = ["FederatedModule", "NonFiniteLossError"]


class NonFiniteLossError(ValueError, ArithmeticError):
    """Raised when the training loss becomes NaN or infinite; the message names the round."""


class _RoundOptimizer(torch.optim.Optimizer):
    """Does nothing but run its closure: the algorithm writes the parameters itself."""

    def __init__(self, params) -> None:
        super().__init__(params, defaults={"lr": 0.0})

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        return closure() if closure is not None else None


class FederatedModule(pl.LightningModule):
    """Simulates a federation of clients training ``model`` with ``algorithm``.

    Args:
        model: the global model (a plain ``nn.Module``).
        algorithm: the federated algorithm, e.g. :class:`~pl_privfed.algorithms.AlphaNormEC`.
        criterion: per-client loss, a mean over the minibatch (default cross-entropy).
        grad_backend: ``"auto"`` (see :func:`~pl_privfed.grads.resolve_backend`), ``"vmap"`` or
            ``"loop"``.
        epsilon_every: compute and log the accountant's ε every this many rounds (and at the end).
        cuda_graphs: on a CUDA device, replay the per-client gradient computation from a CUDA
            graph (:class:`~pl_privfed.grads.GradientOracle` ``cuda_graph``); ignored on the CPU.
    """

    def __init__(
        self,
        model: nn.Module,
        algorithm: FederatedAlgorithm,
        criterion: nn.Module | None = None,
        grad_backend: Backend = "auto",
        epsilon_every: int = 1,
        cuda_graphs: bool = False,
    ) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be an nn.Module, got {model!r}")
        if not isinstance(algorithm, FederatedAlgorithm):
            raise ValueError(f"algorithm must be a FederatedAlgorithm, got {algorithm!r}")
        if grad_backend not in ("auto", "vmap", "loop"):
            raise ValueError(f"grad_backend must be 'auto', 'vmap' or 'loop', got {grad_backend!r}")
        if not isinstance(epsilon_every, int) or epsilon_every < 1:
            raise ValueError(f"epsilon_every must be a positive integer, got {epsilon_every!r}")
        self.automatic_optimization = False
        self.model = model
        self.algorithm = algorithm
        self.criterion = criterion if criterion is not None else nn.CrossEntropyLoss()
        self.grad_backend = grad_backend
        if not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be true or false, got {cuda_graphs!r}")
        self.cuda_graphs = cuda_graphs
        self.epsilon_every = epsilon_every
        self.layout = ParameterLayout(model)
        self.oracle: GradientOracle | None = None
        self.accountant: PrivacyAccountant | None = None
        self.test_accuracy: MulticlassAccuracy | None = None
        self._epsilon = 0.0
        self._last_round = None

    # ------------------------------------------------------------------ setup
    def _num_rounds(self) -> int:
        trainer = self.trainer
        if trainer.max_steps is not None and trainer.max_steps > 0:
            return int(trainer.max_steps)
        rounds_per_epoch = getattr(trainer.datamodule, "rounds_per_epoch", None)
        if trainer.max_epochs is not None and trainer.max_epochs > 0 and rounds_per_epoch:
            return int(trainer.max_epochs * rounds_per_epoch)
        return 0

    @override
    def setup(self, stage: str) -> None:
        if self.oracle is not None:
            return
        datamodule = self.trainer.datamodule
        num_clients = getattr(datamodule, "num_clients", None)
        if num_clients is None:
            raise ValueError("FederatedModule needs a datamodule with a num_clients attribute")
        device = self.trainer.strategy.root_device
        num_rounds = self._num_rounds()
        noise = self.algorithm.noise
        if (
            noise is not None
            and noise.epsilon is not None
            and noise.rounds is None
            and not num_rounds
        ):
            raise ValueError(
                "the paper noise calibration needs the number of rounds K: set trainer.max_steps, "
                "trainer.max_epochs or algorithm noise.rounds"
            )
        self.algorithm.setup(
            num_clients=num_clients,
            dim=self.layout.dim,
            num_rounds=num_rounds,
            device=device,
            dtype=next(self.model.parameters()).dtype,
        )
        self.oracle = GradientOracle(
            self.model,
            self.criterion,
            resolve_backend(self.grad_backend, device, self.model),
            cuda_graph=self.cuda_graphs and device.type == "cuda",
        )
        if noise is not None:
            self.accountant = PrivacyAccountant(noise.accountant)
        num_classes = getattr(datamodule, "num_classes", None)
        if num_classes:
            self.test_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")

    @override
    def configure_optimizers(self):
        return _RoundOptimizer(self.parameters())

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    # ------------------------------------------------------------------ one round
    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        inputs, targets = batch
        round_index = self.global_step
        losses: list[Tensor] = []

        def grad_fn(params: Tensor, per_example: bool = False) -> Tensor:
            out = self.oracle(params, inputs, targets, per_example=per_example)
            losses.append(out.losses.mean(-1) if per_example else out.losses)
            return out.grads

        x = self.layout.flatten(self.model)
        result = self.algorithm.step(x, grad_fn)
        loss = losses[0].mean()  # mean over clients of the minibatch loss at x^k
        if not math.isfinite(loss.item()):
            raise NonFiniteLossError(
                f"non-finite training loss ({loss.item()}) at round {round_index}; "
                "stopping (lower the step size, or check the data and model)"
            )
        self.oracle.commit_buffers()
        self.layout.assign(self.model, result.params)
        self.optimizers().step()
        self._last_round = result
        self.log("train/loss", loss, prog_bar=True)
        self._account(round_index)
        return loss

    def operator_statistics(self) -> dict[str, Tensor]:
        """The last round's operator statistics (the protocol ``OperatorStatistics`` reads)."""
        return {} if self._last_round is None else self._last_round.metrics

    def communication_messages(self) -> list:
        """The last round's messages (the protocol ``CommunicationCost`` reads)."""
        return [] if self._last_round is None else self._last_round.messages

    def _account(self, round_index: int) -> None:
        if self.accountant is None:
            return
        for mech in self.algorithm.mechanisms():
            self.accountant.step(
                noise_multiplier=mech.noise_multiplier, sample_rate=mech.sample_rate
            )
        last = self._num_rounds() and round_index + 1 >= self._num_rounds()
        if (round_index + 1) % self.epsilon_every == 0 or last:
            self._epsilon = self.accountant.get_epsilon(self.algorithm.noise.delta)
            self.log("privacy/epsilon", self._epsilon, prog_bar=True)

    # ------------------------------------------------------------------ evaluation
    def _evaluate(self, batch: Any) -> None:
        inputs, targets = batch
        out = self.model(inputs)
        loss = self.criterion(out, targets)
        regularizer = getattr(self.model, "regularizer", None)
        if callable(regularizer):
            loss = loss + regularizer(dict(self.model.named_parameters()))
        self.log("test/loss", loss, on_epoch=True, prog_bar=True)
        if self.test_accuracy is not None:
            self.test_accuracy(out, targets)
            self.log("test/acc", self.test_accuracy, on_epoch=True, prog_bar=True)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch)

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch)

    # ------------------------------------------------------------------ privacy report & state
    def privacy_mechanisms(self) -> list:
        """The Gaussian mechanisms one round applies (the protocol ``PrivacyBudget`` reads)."""
        return self.algorithm.mechanisms()

    def privacy_report(self) -> dict[str, Any] | None:
        """What the run spent: ε from the accountant at the configured δ, and how noise was set."""
        noise = self.algorithm.noise
        if noise is None or self.accountant is None:
            return None
        mechs = self.algorithm.mechanisms()
        return {
            "epsilon": self.accountant.get_epsilon(noise.delta),
            "delta": noise.delta,
            "accountant": noise.accountant,
            "target_epsilon": noise.epsilon,
            "calibration": noise.calibration if noise.epsilon is not None else "noise_multiplier",
            "calibration_rounds": noise.rounds or self.algorithm.num_rounds,
            "noise_std": self.algorithm.noise_std,
            "noise_multiplier": mechs[0].noise_multiplier if mechs else None,
            "sample_rate": mechs[0].sample_rate if mechs else None,
            "message_bound": self.algorithm.message_bound(),
            "sensitivity": self.algorithm.accounting_sensitivity(),
            "neighbouring_relation": noise.neighbouring,
            "privacy_unit": self.algorithm.privacy_unit,
            "rounds_accounted": self.accountant.steps,
        }

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.accountant is not None:
            checkpoint["privacy_accountant"] = self.accountant.state_dict()

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.accountant is not None and "privacy_accountant" in checkpoint:
            self.accountant.load_state_dict(checkpoint["privacy_accountant"])
