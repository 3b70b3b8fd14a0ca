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
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.callbacks._wandb import log_artifact
from pl_privfed.checks import check_positive_int, check_trainer
from pl_privfed.grads import (
    Backend,
    GradientOracle,
    ParameterLayout,
    average_client_buffers,
    resolve_backend,
)
from pl_privfed.grid import grid_points, rebuild_algorithm, write_grid_results
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


def _served_first(x, pos, all_gradients, single, losses, buffers):
    """Configuration ``pos``'s oracle in a grid round: the first request for its clients'
    gradients at its current parameters ``x`` is answered from the batch of all configurations
    (its own rows, which the algorithm may then write into), anything else from ``single``."""
    served = []

    def grad_fn(params, per_example=False, step=None, clients=None):
        batchable = params is x and not per_example and step is None and clients is None
        if batchable and not served:
            served.append(True)
            shared = all_gradients()
            losses.append(shared["losses"][pos])
            if "buffers" in shared:
                buffers.append({k: v[pos] for k, v in shared["buffers"].items()})
            return shared["grads"][pos]
        return single(params, per_example, step, clients)

    return grad_fn


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
        grid: train a grid of configurations of ``algorithm`` as one batched federation
            (:mod:`pl_privfed.grid`): ``{argument: [values]}``, e.g. ``{"step_size": [0.01,
            0.1], "beta": [0.1, 1]}`` gives 4 configurations, each with the other arguments of
            ``algorithm``. Each configuration's iterates equal those of its separate run; the
            results are written like a ``pl-privfed sweep`` into ``grid_dir``. Private
            configurations must share their privacy mechanisms (the run reports one ε).
        grid_dir: where the grid's ``results.csv`` and ``runs/<id>/`` go (default
            ``<log dir>/grid``).
        grid_chunk: compute the grid's gradients for at most this many configurations per
            oracle call (default: all in one), to bound the memory of a large grid; the results
            do not depend on it.
    """

    def __init__(
        self,
        model: nn.Module,
        algorithm: FederatedAlgorithm,
        criterion: nn.Module | None = None,
        grad_backend: Backend = "auto",
        epsilon_every: int = 1,
        cuda_graphs: bool = False,
        grid: dict[str, list[Any]] | None = None,
        grid_dir: str | None = None,
        grid_chunk: int | None = None,
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
        self._init_grid(grid, grid_dir, grid_chunk)

    def _init_grid(
        self, grid: dict[str, list[Any]] | None, grid_dir: str | None, grid_chunk: int | None
    ) -> None:
        """The configurations of ``grid`` (see the class docstring), their parameters ``[K, d]``
        and their own copies of the model's buffers ``[K, ...]``."""
        self.grid = grid
        self.grid_dir = grid_dir
        self.grid_chunk = grid_chunk
        if grid_chunk is not None:
            check_positive_int("grid_chunk", grid_chunk)
        self.grid_points: list[dict[str, Any]] = []
        self.grid_algorithms: nn.ModuleList | None = None
        if grid is None:
            return
        self.grid_points = grid_points(self.algorithm, grid)
        self.grid_algorithms = nn.ModuleList(
            rebuild_algorithm(self.algorithm, point) for point in self.grid_points
        )
        k = len(self.grid_points)
        self.register_buffer("grid_params", self.layout.flatten(self.model).repeat(k, 1))
        self._grid_buffer_names = {}
        for name, buf in self.model.named_buffers():
            if buf is None:
                continue
            key = "grid_buffer__" + name.replace(".", "__")
            self._grid_buffer_names[name] = key
            self.register_buffer(key, buf.detach().unsqueeze(0).repeat(k, *([1] * buf.dim())))
        self._grid_status = ["running"] * k
        self._grid_history: list[dict[str, list[tuple[int, float]]]] = [{} for _ in range(k)]
        self._grid_entries: list[dict[str, Any]] = [{} for _ in range(k)]
        self._grid_eval: Tensor | None = None  # per configuration: loss sum, correct, count

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
        check_trainer(self.trainer)  # one process, a positive evaluation interval
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
        algorithms = [self.algorithm, *(self.grid_algorithms or [])]
        for algorithm in algorithms:
            # before setup: sampling rates enter the calibration
            self._configure_data(datamodule, algorithm)
            algorithm.setup(
                num_clients=num_clients,
                dim=self.layout.dim,
                num_rounds=num_rounds,
                device=device,
                dtype=next(self.model.parameters()).dtype,
            )
        if self.grid_algorithms is not None:
            self._check_grid_mechanisms()
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

    def _check_grid_mechanisms(self) -> None:
        """One accountant serves the grid: every configuration must release the same
        mechanisms (noise multiplier and sampling rate) as ``algorithm``."""

        def signature(alg: FederatedAlgorithm) -> list[tuple[float, float]]:
            return [(m.noise_multiplier, m.sample_rate) for m in alg.mechanisms()]

        reference = signature(self.algorithm)
        for point, alg in zip(self.grid_points, self.grid_algorithms):
            own = signature(alg)
            same = len(own) == len(reference) and all(
                math.isclose(a, c, rel_tol=1e-9) and math.isclose(b, e, rel_tol=1e-9)
                for (a, b), (c, e) in zip(own, reference)
            )
            if not same:
                raise ValueError(
                    f"grid point {point} releases the mechanisms (noise multiplier, rate) {own}, "
                    f"the algorithm {reference}: one run reports one ε, so a grid's private "
                    "configurations must share them (run such a grid with `pl-privfed sweep`)"
                )

    def _configure_data(self, datamodule: Any, algorithm: FederatedAlgorithm) -> None:
        """Read the local minibatches per round (``local_epochs`` sets them when the data is
        loaded) and let the algorithm check the rounds the datamodule delivers."""
        configure = getattr(algorithm, "configure_data", None)
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
        if self.grid_algorithms is not None:
            return self._grid_training_step(inputs, targets)
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

    def _round_batch(
        self, inputs: Tensor, targets: Tensor, step: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Every client's local minibatch ``step``, or with ``None`` all its data of the round
        (with ``local_batches: T > 1`` the inputs are ``[n, T, B, ...]``: ``[n, T·B, ...]``)."""
        stacked = self.local_batches > 1
        if step is not None:
            if not 0 <= step < self.local_batches:
                raise ValueError(
                    f"step={step} but the datamodule delivers local_batches="
                    f"{self.local_batches} minibatches per round"
                )
            return (inputs[:, step], targets[:, step]) if stacked else (inputs, targets)
        return (inputs.flatten(1, 2), targets.flatten(1, 2)) if stacked else (inputs, targets)

    def _round_oracle(self, inputs: Tensor, targets: Tensor, losses: list, buffers: list):
        """The round's ``grad_fn(params, per_example=False, step=None, clients=None)``."""

        def grad_fn(
            params: Tensor,
            per_example: bool = False,
            step: int | None = None,
            clients: Tensor | None = None,
        ) -> Tensor:
            x_in, y_in = self._round_batch(inputs, targets, step)
            if clients is not None:
                x_in, y_in = x_in[clients], y_in[clients]
            out = self.oracle(params, x_in, y_in, per_example=per_example)
            losses.append(out.losses.mean(-1) if per_example else out.losses)
            if self.oracle._pending_buffers is not None:
                buffers.append(self.oracle._pending_buffers)
            return out.grads

        return grad_fn

    # ------------------------------------------------------------------ a grid's round
    def _grid_buffers(self) -> dict[str, Tensor]:
        """The configurations' buffers ``{model buffer name: [K, ...]}``."""
        return {name: getattr(self, key) for name, key in self._grid_buffer_names.items()}

    @torch.no_grad()
    def load_grid_configuration(self, k: int, params: bool = True) -> None:
        """Put configuration ``k``'s buffers (and parameters) into the model."""
        if params:
            self.layout.assign(self.model, self.grid_params[k])
        bufs = dict(self.model.named_buffers())
        for name, value in self._grid_buffers().items():
            bufs[name].copy_(value[k])

    def grid_running(self) -> list[int]:
        """Indices of the grid's configurations still training (not failed, not done)."""
        return [k for k, status in enumerate(self._grid_status) if status == "running"]

    def grid_record(self, k: int, metric: str, round_index: int, value: float) -> None:
        """Add a point to configuration ``k``'s curve ``metric`` (its ``curves.csv``)."""
        self._grid_history[k].setdefault(metric, []).append((int(round_index), float(value)))

    def grid_entries(self, k: int) -> dict[str, Any]:
        """Configuration ``k``'s extra ``summary.json`` entries (e.g. ``rounds_to_target``),
        which callbacks may fill; kept in checkpoints."""
        return self._grid_entries[k]

    def grid_finish(self, k: int, reason: str) -> None:
        """Stop training configuration ``k``: its status is ``finished`` and its
        ``summary.json`` says why in ``stopped_reason``, as a single run's does; the run stops
        when no configuration is left training."""
        self._grid_status[k] = "finished"
        self._grid_entries[k]["stopped_reason"] = reason
        if not self.grid_running():
            self.trainer.should_stop = True

    def _grid_training_step(self, inputs: Tensor, targets: Tensor) -> None:
        """One round of every live configuration of the grid (see :mod:`pl_privfed.grid`).

        The first request of each configuration's round for its clients' gradients at its
        current parameters (what every server algorithm asks first) is served from one oracle
        call for all live configurations, ``[K·n, d]``; any other request (local steps,
        per-example gradients, partial participation) goes to the oracle as in a single run.
        """
        round_index = self.global_step
        live = self.grid_running()
        if not live:  # every configuration is done (e.g. reached its target)
            self.trainer.should_stop = True
            return None
        batched: dict[str, Any] = {}

        def all_gradients() -> dict[str, Any]:
            if batched:
                return batched
            x_in, y_in = self._round_batch(inputs, targets)
            size = self.grid_chunk or len(live)
            chunks = [
                self._grid_gradients(live[i : i + size], x_in, y_in)
                for i in range(0, len(live), size)
            ]
            if len(chunks) == 1:
                grads, losses, buffers = chunks[0]
            else:
                grads = torch.cat([c[0] for c in chunks])
                losses = torch.cat([c[1] for c in chunks])
                buffers = {name: torch.cat([c[2][name] for c in chunks]) for name in chunks[0][2]}
            batched.update(grads=grads, losses=losses)
            if buffers:
                batched["buffers"] = buffers
            return batched

        outcomes: dict[int, tuple[Any, Tensor | None, dict[str, Tensor] | None]] = {}
        for pos, k in enumerate(live):
            x = self.grid_params[k]
            if self._grid_buffer_names:
                self.load_grid_configuration(k, params=False)  # for requests outside the batch
            losses: list[Tensor] = []
            buffers: list[Any] = []
            single = self._round_oracle(inputs, targets, losses, buffers)
            grad_fn = _served_first(x, pos, all_gradients, single, losses, buffers)
            result = self.grid_algorithms[k].step(x, grad_fn)
            self.oracle._pending_buffers = None
            outcomes[k] = (
                result,
                losses[0].mean() if losses else None,
                buffers[-1] if buffers else None,
            )
        computed = [k for k in live if outcomes[k][1] is not None]
        values = torch.stack([outcomes[k][1] for k in computed]).tolist() if computed else []
        loss_of = dict(zip(computed, values))
        record = round_index % self.trainer.log_every_n_steps == 0 or (
            self._num_rounds() and round_index + 1 >= self._num_rounds()
        )
        for k in live:
            result, _, new_buffers = outcomes[k]
            loss = loss_of.get(k)
            if loss is not None and not math.isfinite(loss):
                self._grid_status[k] = f"failed: non-finite training loss at round {round_index}"
                continue
            self.grid_params[k] = result.params  # every round has run: x^k is no longer read
            for name, value in (new_buffers or {}).items():
                getattr(self, self._grid_buffer_names[name])[k].copy_(value)
            if loss is not None and record:
                self.grid_record(k, "train/loss", round_index + 1, loss)
        running = self.grid_running()
        if not running and not any(s.startswith("finished") for s in self._grid_status):
            self.write_grid_results()  # every configuration failed: the table still says how
            raise NonFiniteLossError(
                f"every configuration of the grid has a non-finite training loss by round "
                f"{round_index}; stopping (lower the step sizes, or check the data and model)"
            )
        if not running:
            self.trainer.should_stop = True
            return None
        self.optimizers().step()
        self._last_round = outcomes[running[0]][0]  # statistics of the first live configuration
        finite = [loss_of[k] for k in running if k in loss_of]
        if finite:
            self.log("grid/min_train_loss", min(finite), prog_bar=True)
        self.log("grid/live_configurations", float(len(running)))
        self._count_transmissions(self._last_round)
        self._account(round_index)
        return None

    def _grid_gradients(
        self, configs: list[int], inputs: Tensor, targets: Tensor
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One oracle call for the clients of ``configs``: gradients ``[k, n, d]``, losses
        ``[k, n]`` and each configuration's new buffers (``r ←`` the mean over its clients of
        their updated copies, the engine's rule)."""
        n, k = inputs.shape[0], len(configs)
        rows = torch.tensor(configs, device=self.grid_params.device)

        def per_row(t: Tensor) -> Tensor:
            return t[rows].repeat_interleave(n, 0)

        buffers = {name: per_row(v) for name, v in self._grid_buffers().items()}
        out = self.oracle(
            per_row(self.grid_params),
            inputs.repeat(k, *([1] * (inputs.dim() - 1))),
            targets.repeat(k, *([1] * (targets.dim() - 1))),
            buffers=buffers or None,
        )
        per_config = {
            name: v.view(k, n, *v.shape[1:])
            for name, v in (self.oracle.client_buffers or {}).items()
        }
        averaged = average_client_buffers(per_config, dim=1)
        return out.grads.view(k, n, -1), out.losses.view(k, n), averaged

    def _grid_evaluate(self, batch: Any) -> None:
        """Test loss and accuracy of every configuration that has not failed, on this batch."""
        inputs, targets = batch
        if self._grid_eval is None:
            self._grid_eval = torch.zeros(len(self.grid_points), 3, device=inputs.device)
        for k, status in enumerate(self._grid_status):
            if status.startswith("failed"):
                continue
            self.load_grid_configuration(k)
            out, loss = self._model_loss(inputs, targets)
            stats = self._grid_eval[k]
            stats[0] += loss.detach() * len(targets)
            stats[1] += (out.argmax(-1) == targets).sum()
            stats[2] += len(targets)

    def _grid_record_evaluation(self) -> None:
        """Append the evaluation's per-configuration results to the history and write them."""
        if self._grid_eval is None:
            return
        stats, self._grid_eval = self._grid_eval.tolist(), None
        accuracies = []
        for k, (loss_sum, correct, count) in enumerate(stats):
            if count == 0:
                continue
            self.grid_record(k, "test/loss", self.global_step, loss_sum / count)
            if self.test_accuracy is not None:
                accuracies.append(correct / count)
                self.grid_record(k, "test/acc", self.global_step, correct / count)
        if accuracies:
            self.log("grid/best_test_acc", max(accuracies), prog_bar=True)
        self.write_grid_results()

    def _grid_results_dir(self) -> Path:
        """``grid_dir``, by default ``<log dir>/grid``."""
        if self.grid_dir is not None:
            return Path(self.grid_dir)
        return Path(self.trainer.log_dir or self.trainer.default_root_dir) / "grid"

    def write_grid_results(self) -> Any:
        """Write the grid's ``results.csv`` and ``runs/<id>/`` (:func:`write_grid_results`)."""
        if self.grid_algorithms is None or not self.trainer.is_global_zero:
            return None
        extra = {}
        report = self.privacy_report()
        if report is not None:
            extra = {"epsilon": report["epsilon"], "delta": report["delta"]}
        return write_grid_results(
            self._grid_results_dir(),
            list(self.grid_algorithms),
            self.grid_points,
            self._grid_history,
            self._grid_status,
            int(self.global_step),
            [{**extra, **entries} for entries in self._grid_entries],
        )

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
        if self.grid_algorithms is not None:
            entries["grid"] = {
                "configurations": len(self.grid_points),
                "finished": sum(s.startswith("finished") for s in self._grid_status),
                "failed": sum(s.startswith("failed") for s in self._grid_status),
                "results": str(self._grid_results_dir() / "results.csv"),  # written by the module
            }
        if self._output_report is not None:
            entries["output_iterate"] = self._output_report
        return entries

    @override
    def on_train_end(self) -> None:
        if self.grid_algorithms is not None:
            self._grid_status = ["finished" if s == "running" else s for s in self._grid_status]
            results = self.write_grid_results()
            if results is not None:  # on a W&B logger, the table as an artifact
                log_artifact(self.trainer, results, "grid-results")
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
                logits, loss = self._model_loss(inputs, targets)
                total_loss += float(loss) * len(targets)
                if self.test_accuracy is not None:
                    correct += int((logits.argmax(-1) == targets).sum())
                count += len(targets)
        finally:
            self.layout.assign(self.model, x)
            self.model.train(was_training)
        report["test_loss"] = total_loss / max(count, 1)
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
    def _model_loss(self, inputs: Tensor, targets: Tensor) -> tuple[Tensor, Tensor]:
        """The model's outputs on a batch and its loss: the criterion plus the model's
        ``regularizer()`` if it has one (the objective every client's loss also carries)."""
        out = self.model(inputs)
        loss = self.criterion(out, targets)
        regularizer = getattr(self.model, "regularizer", None)
        if callable(regularizer):
            loss = loss + regularizer(dict(self.model.named_parameters()))
        return out, loss

    def _evaluate(self, batch: Any) -> None:
        out, loss = self._model_loss(*batch)
        targets = batch[1]
        self.log("test/loss", loss, on_epoch=True, prog_bar=True)
        if self.test_accuracy is not None:
            self.test_accuracy(out, targets)
            self.log("test/acc", self.test_accuracy, on_epoch=True, prog_bar=True)

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch) if self.grid_algorithms is None else self._grid_evaluate(batch)

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch) if self.grid_algorithms is None else self._grid_evaluate(batch)

    @override
    def on_validation_epoch_end(self) -> None:
        if self.grid_algorithms is not None:
            self._grid_record_evaluation()

    @override
    def on_test_epoch_end(self) -> None:
        if self.grid_algorithms is not None:
            self._grid_record_evaluation()

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
        if self.grid_algorithms is not None:
            checkpoint["grid"] = {
                "status": self._grid_status,
                "history": self._grid_history,
                "entries": self._grid_entries,
            }

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.accountant is not None and "privacy_accountant" in checkpoint:
            self.accountant.load_state_dict(checkpoint["privacy_accountant"])
        self.client_transmissions = int(checkpoint.get("client_transmissions", 0))
        if self.grid_algorithms is not None and "grid" in checkpoint:
            self._grid_status = list(checkpoint["grid"]["status"])
            self._grid_history = [
                {m: [tuple(p) for p in pts] for m, pts in h.items()}
                for h in checkpoint["grid"]["history"]
            ]
            self._grid_entries = [dict(e) for e in checkpoint["grid"].get("entries", [])] or [
                {} for _ in self.grid_points
            ]
