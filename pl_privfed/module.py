"""``FederatedModule``: the whole federation in one LightningModule; one training step = one round.

Each ``training_step`` receives one minibatch per client stacked along a leading client axis
(``inputs [n, B, ...]``, ``targets [n, B, ...]``; with the datamodule's ``local_batches: T > 1``,
``[n, T, B, ...]``: one minibatch per local step), hands the algorithm a gradient oracle over that
batch, and writes the algorithm's new parameters into the global model. Optimization is manual;
a no-op optimizer is stepped once per round so that ``trainer.global_step`` counts rounds (and
``max_steps`` is a number of communication rounds).

The oracle handed to the algorithm is
``grad_fn(params, per_example=False, step=None, clients=None)``:

* ``params``: shared ``[d]`` or per-client ``[m, d]`` (``m`` = the number of selected clients);
* ``step``: with ``local_batches: T``, the local minibatch ``j < T`` to use; ``None`` uses all
  the round's data of each client (``T·B`` examples);
* ``clients``: indices of the clients to evaluate (partial participation computes only the
  participants' gradients); ``None`` is every client;
* ``per_example``: per-example gradients ``[m, B, d]`` (record-level clipping).
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
        grad_backend: ``"auto"`` (see :func:`~pl_privfed.grads.resolve_backend`), ``"vmap"``,
            ``"loop"`` or ``"analytic"``.
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
        if grad_backend not in ("auto", "vmap", "loop", "analytic"):
            raise ValueError(
                f"grad_backend must be 'auto', 'vmap', 'loop' or 'analytic', got {grad_backend!r}"
            )
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
        self.local_batches = 1
        self.client_transmissions = 0
        self._output_report: dict[str, Any] | None = None

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
        self._configure_data(datamodule)  # before setup: sampling rates enter the calibration
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
            resolve_backend(self.grad_backend, device, self.model, self.criterion),
            cuda_graph=self.cuda_graphs and device.type == "cuda",
        )
        if noise is not None:
            self.accountant = PrivacyAccountant(noise.accountant)
        num_classes = getattr(datamodule, "num_classes", None)
        if num_classes:
            self.test_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def _configure_data(self, datamodule: Any) -> None:
        """Read the local minibatches per round (``local_epochs`` sets them when the data is
        loaded) and let the algorithm check the rounds the datamodule delivers."""
        configure = getattr(self.algorithm, "configure_data", None)
        if hasattr(datamodule, "streams") and datamodule.streams is None:
            datamodule.setup("fit")  # idempotent; shard sizes are needed for the checks
        self.local_batches = int(getattr(datamodule, "local_batches", 1) or 1)
        if not callable(configure):
            return
        sizes = getattr(datamodule, "client_sizes", None)
        configure(
            batch_size=int(getattr(datamodule, "batch_size", 1)),
            local_batches=self.local_batches,
            shuffle=bool(getattr(datamodule, "shuffle", True)),
            client_sizes=[int(v) for v in sizes] if sizes is not None else [],
        )

    @override
    def configure_optimizers(self):
        return _RoundOptimizer(self.parameters())

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    # ------------------------------------------------------------------ one round
    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        inputs, targets = batch
        round_index = self.global_step
        losses: list[Tensor] = []
        buffers: list[Any] = []
        grad_fn = self._round_oracle(inputs, targets, losses, buffers)
        x = self.layout.flatten(self.model)
        result = self.algorithm.step(x, grad_fn)
        # mean over the (computing) clients of the minibatch loss at x^k; None when no client
        # computed this round (e.g. nobody was sampled)
        loss = losses[0].mean() if losses else None
        if loss is not None and not math.isfinite(loss.item()):
            raise NonFiniteLossError(
                f"non-finite training loss ({loss.item()}) at round {round_index}; "
                "stopping (lower the step size, or check the data and model)"
            )
        if buffers and self.oracle._pending_buffers is None:
            # the running statistics of the last shared-parameter call of the round (local steps
            # at per-client parameters produce none)
            self.oracle._pending_buffers = buffers[-1]
        self.oracle.commit_buffers()
        self.layout.assign(self.model, result.params)
        self.optimizers().step()
        self._last_round = result
        if loss is not None:
            self.log("train/loss", loss, prog_bar=True)
        self._count_transmissions(result)
        self._account(round_index)
        return loss

    def _round_oracle(self, inputs: Tensor, targets: Tensor, losses: list, buffers: list):
        """The round's ``grad_fn(params, per_example=False, step=None, clients=None)``."""
        stacked = self.local_batches > 1  # inputs [n, T, B, ...]

        def grad_fn(
            params: Tensor,
            per_example: bool = False,
            step: int | None = None,
            clients: Tensor | None = None,
        ) -> Tensor:
            x_in, y_in = inputs, targets
            if step is not None:
                if not 0 <= step < self.local_batches:
                    raise ValueError(
                        f"step={step} but the datamodule delivers local_batches="
                        f"{self.local_batches} minibatches per round"
                    )
                if stacked:
                    x_in, y_in = x_in[:, step], y_in[:, step]
            elif stacked:  # all the round's data: [n, T·B, ...]
                x_in = x_in.flatten(1, 2)
                y_in = y_in.flatten(1, 2)
            if clients is not None:
                x_in, y_in = x_in[clients], y_in[clients]
            out = self.oracle(params, x_in, y_in, per_example=per_example)
            losses.append(out.losses.mean(-1) if per_example else out.losses)
            if self.oracle._pending_buffers is not None:
                buffers.append(self.oracle._pending_buffers)
            return out.grads

        return grad_fn

    def _count_transmissions(self, result: Any) -> None:
        """Client-to-server messages of the round (paper 004 Fig. 2's x-axis, ``k · p · M``)."""
        sent = 0
        for msg in result.messages:
            if msg.channel == "client_to_server":
                rows = 1 if msg.vectors.dim() == 1 else msg.vectors.shape[0]
                sent += rows * msg.copies
        self.client_transmissions += sent
        self.log("comm/client_transmissions", float(sent))
        self.log("comm/client_transmissions_total", float(self.client_transmissions))

    def summary_entries(self) -> dict[str, Any]:
        """Entries for ``summary.json``: the total client-to-server transmissions, and for an
        algorithm with a sampled output iterate (paper 001 Algorithm 1 line 16) where it came
        from and how it does on the test set (:meth:`evaluate_output_iterate`)."""
        entries: dict[str, Any] = {"client_transmissions": self.client_transmissions}
        if self._output_report is not None:
            entries["output_iterate"] = self._output_report
        return entries

    @override
    def on_train_end(self) -> None:
        if callable(getattr(self.algorithm, "output", None)) and self.algorithm.rounds_done > 0:
            self._output_report = self.evaluate_output_iterate()

    @torch.no_grad()
    def evaluate_output_iterate(self) -> dict[str, Any]:
        """Test loss and accuracy at the algorithm's sampled output ``x_out`` (``output()``).

        The global model (the agents' average ``x̄``, what the training curves show) is swapped
        for ``x_out`` over the datamodule's test set, in eval mode, then restored; buffers such
        as BatchNorm running statistics stay those of the global model.
        """
        out = self.algorithm.output()
        report: dict[str, Any] = {"round": out["round"], "agent": out["agent"]}
        datamodule = self.trainer.datamodule
        loader = getattr(datamodule, "test_dataloader", None)
        if not callable(loader):
            return report
        preprocess = getattr(datamodule, "preprocess", None)
        x = self.layout.flatten(self.model)
        was_training = self.model.training
        self.layout.assign(self.model, out["params"].to(x))
        self.model.eval()
        total_loss, correct, count = 0.0, 0, 0
        try:
            for inputs, targets in loader():
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                if callable(preprocess):
                    inputs = preprocess(inputs, False, 0)
                logits = self.model(inputs)
                total_loss += float(self.criterion(logits, targets)) * len(targets)
                if self.test_accuracy is not None:
                    correct += int((logits.argmax(-1) == targets).sum())
                count += len(targets)
            regularizer = getattr(self.model, "regularizer", None)
            reg = float(regularizer(dict(self.model.named_parameters()))) if regularizer else 0.0
        finally:
            self.layout.assign(self.model, x)
            self.model.train(was_training)
        report["test_loss"] = total_loss / max(count, 1) + reg
        report["test_accuracy"] = correct / max(count, 1) if self.test_accuracy else None
        return report

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
        checkpoint["client_transmissions"] = self.client_transmissions

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.accountant is not None and "privacy_accountant" in checkpoint:
            self.accountant.load_state_dict(checkpoint["privacy_accountant"])
        self.client_transmissions = int(checkpoint.get("client_transmissions", 0))
