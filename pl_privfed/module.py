"""``FederatedModule``: the whole federation in one LightningModule; one training step = one round.

Each ``training_step`` receives the round's data (a :class:`~pl_privfed.datamodules.RoundBatch`,
which serves each client's minibatches on demand, or stacked tensors ``(inputs [n, B, ...],
targets [n, B, ...])``; with the datamodule's ``local_batches: T > 1``, ``[n, T, B, ...]``) and
runs the algorithm's round through the engine (:mod:`pl_privfed.engine`): the clients' part
chunk by chunk over a :class:`~pl_privfed.grads.RoundOracle`, then the server's part. It writes
the new parameters (and BatchNorm statistics) into the global model. Optimization is manual; a
no-op optimizer is stepped once per round so that ``trainer.global_step`` counts rounds (and
``max_steps`` is a number of communication rounds).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from pytorch_lightning.utilities import rank_zero_warn
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.callbacks._logging import local_log_dir
from pl_privfed.callbacks._wandb import log_artifact
from pl_privfed.checks import check_positive_int, check_trainer
from pl_privfed.datamodules.base import TensorRoundBatch
from pl_privfed.engine import ChunkOracle, ClientShard, OracleOutput, Placement, choose_chunk_size
from pl_privfed.engine.distributed import adopt_strategy
from pl_privfed.grads import (
    Backend,
    GradientOracle,
    ParameterLayout,
    RoundOracle,
    resolve_backend,
    sum_client_buffers,
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


class _GridBatch:
    """A grid round's shared gradient computations: for a chunk of clients, the gradients of
    every live configuration at its current parameters, from one oracle call (in pieces of
    ``grid_chunk`` configurations), each configuration's served once; :meth:`clear` after every
    lockstep pass over the configurations bounds the memory to one chunk."""

    def __init__(self, module: FederatedModule, batch: Any, live: list[int]) -> None:
        self.module, self.batch, self.live = module, batch, live
        self.served: dict[tuple[int, int, int], dict[int, OracleOutput]] = {}

    def get(self, k: int, ids: Tensor) -> OracleOutput | None:
        if not ids.numel():
            return None
        key = (int(ids[0]), int(ids[-1]), int(ids.numel()))
        entry = self.served.get(key)
        if entry is None:
            entry = self.served[key] = self._compute(ids)
        return entry.pop(k, None)

    def _compute(self, ids: Tensor) -> dict[int, OracleOutput]:
        size = self.module.grid_chunk or len(self.live)
        out: dict[int, OracleOutput] = {}
        for lo in range(0, len(self.live), size):
            configs = self.live[lo : lo + size]
            grads, losses, buffers = self.module._grid_gradients(configs, ids, self.batch)
            for pos, k in enumerate(configs):
                sums = {name: v[pos] for name, v in buffers.items()} or None
                out[k] = OracleOutput(grads=grads[pos], losses=losses[pos], buffer_sums=sums)
        return out

    def clear(self) -> None:
        self.served = {}


class _GridConfigOracle(ChunkOracle):
    """Configuration ``k``'s oracle in a grid round: its first request for a chunk's gradients
    at its current parameters ``x`` comes from the shared batch, anything else from its own
    :class:`~pl_privfed.grads.RoundOracle` (with its own BatchNorm buffers)."""

    def __init__(self, shared: _GridBatch, k: int, x: Tensor, own: RoundOracle) -> None:
        self.shared, self.k, self.x, self.own = shared, k, x, own

    def __call__(
        self, params: Tensor, clients: Tensor, *, per_example: bool = False, step: int | None = None
    ) -> OracleOutput:
        if params is self.x and not per_example and step is None:
            out = self.shared.get(self.k, clients)
            if out is not None:
                return out
        return self.own(params, clients, per_example=per_example, step=step)

    def clipped_mean(self, params, clients, scale, *, step=None) -> OracleOutput:
        return self.own.clipped_mean(params, clients, scale, step=step)


class FederatedModule(pl.LightningModule):
    """Simulates a federation of clients training ``model`` with ``algorithm``.

    Evaluation: Lightning's validation loop logs ``val/loss`` and ``val/acc`` on the
    datamodule's validation split (held out of the training data) every ``val_check_interval``
    rounds and always after the last round; a run resumed at round ``k`` evaluates round ``k``
    first unless its checkpoint was written right after that evaluation. The test set is
    evaluated once, for the final model, at the end of fit (:meth:`evaluate_test_set`), and by
    ``trainer.test``. Selection reads ``val/*`` only.

    Args:
        model: the global model (a plain ``nn.Module``).
        algorithm: the federated algorithm, e.g. :class:`~pl_privfed.algorithms.AlphaNormEC`.
        criterion: per-client loss, a mean over the minibatch (default cross-entropy).
        grad_backend: ``"auto"`` (see :func:`~pl_privfed.grads.resolve_backend`), ``"vmap"``,
            ``"loop"`` or ``"analytic"``.
        epsilon_every: compute and log the accountant's ε every this many rounds (and at the end);
            default: on the rounds whose metrics reach the loggers (:meth:`logging_round`).
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
        client_chunk: clients per chunk of the round's client map (:mod:`pl_privfed.engine`):
            ``"auto"`` (default: every client on a GPU; on a CPU as many as keep a chunk's
            ``[c, d]`` tensors in cache), ``"all"``, or a number. The iterates do not depend on
            it (up to the order of floating-point sums).
        client_state: where the algorithm's per-client state tables live (``"auto"``,
            ``"device"``, ``"host"`` or ``"disk"``, :mod:`pl_privfed.engine.state`): ``auto``
            keeps them on the training device while they fit in a quarter of its memory, then
            in host memory (GPU runs), then memory-mapped on disk.
        state_dir: directory of memory-mapped state (default ``<default_root_dir>/client_state``).

    Several processes (``Trainer(strategy="ddp", devices=N)``, CPU with gloo or CUDA with NCCL,
    several nodes through Lightning's cluster environments) shard the clients: each process
    holds a block of them (their state, their part of every round) and the round's sums are
    added over the processes (:mod:`pl_privfed.engine.distributed`); the model is not wrapped
    in ``DistributedDataParallel`` (the module sums what the algorithm needs itself). Other
    multi-device strategies (FSDP, DeepSpeed, model parallelism) are refused.
    """

    def __init__(
        self,
        model: nn.Module,
        algorithm: FederatedAlgorithm,
        criterion: nn.Module | None = None,
        grad_backend: Backend = "auto",
        epsilon_every: int | None = None,
        cuda_graphs: bool = False,
        grid: dict[str, list[Any]] | None = None,
        grid_dir: str | None = None,
        grid_chunk: int | None = None,
        client_chunk: int | str = "auto",
        client_state: Placement = "auto",
        state_dir: str | None = None,
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
        if epsilon_every is not None and (
            not isinstance(epsilon_every, int)
            or isinstance(epsilon_every, bool)
            or epsilon_every < 1
        ):
            raise ValueError(
                f"epsilon_every must be a positive integer or null, got {epsilon_every!r}"
            )
        self.automatic_optimization = False
        self.model = model
        self.algorithm = algorithm
        self.criterion = criterion if criterion is not None else nn.CrossEntropyLoss()
        self.grad_backend = grad_backend
        if not isinstance(cuda_graphs, bool):
            raise ValueError(f"cuda_graphs must be true or false, got {cuda_graphs!r}")
        self.cuda_graphs = cuda_graphs
        self.epsilon_every = epsilon_every
        if not (
            client_chunk in ("auto", "all")
            or (
                isinstance(client_chunk, int)
                and not isinstance(client_chunk, bool)
                and client_chunk > 0
            )
        ):
            raise ValueError(
                f"client_chunk must be 'auto', 'all' or a positive integer, got {client_chunk!r}"
            )
        self.client_chunk = client_chunk
        if client_state not in ("auto", "device", "host", "disk"):
            raise ValueError(
                f"client_state must be 'auto', 'device', 'host' or 'disk', got {client_state!r}"
            )
        self.client_state = client_state
        self.state_dir = state_dir
        self.layout = ParameterLayout(model)
        self.oracle: GradientOracle | None = None
        self.accountant: PrivacyAccountant | None = None  # the defensible ε
        self.paper_accountant: PrivacyAccountant | None = None  # the papers' convention
        self._calibration: dict[str, Any] | None = None  # what σ was calibrated for
        self._epsilon_paper = 0.0
        self._rounds_accounted = 0
        self.test_accuracy: MulticlassAccuracy | None = None
        self.val_accuracy: MulticlassAccuracy | None = None
        self._validated_round: int | None = None  # the round of the last validation
        self._final_test: dict[str, Any] | None = None  # the end-of-fit test evaluation
        self._epsilon = 0.0
        self._last_round = None
        self.local_batches = 1
        self._logging_round = True
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
        check_trainer(self.trainer)  # a supported strategy, a positive evaluation interval
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
        adopt_strategy(self.trainer)
        dtype = self._training_dtype()
        algorithms = [self.algorithm, *(self.grid_algorithms or [])]
        state_dir = self.state_dir or str(Path(self.trainer.default_root_dir) / "client_state")
        for algorithm in algorithms:
            # before setup: sampling rates enter the calibration
            self._configure_data(datamodule, algorithm)
            algorithm.setup(
                num_clients=num_clients,
                dim=self.layout.dim,
                num_rounds=num_rounds,
                device=device,
                dtype=dtype,
                shard=ClientShard.of_trainer(self.trainer, num_clients),
                client_state=self.client_state,
                state_dir=state_dir,
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
            self.paper_accountant = PrivacyAccountant(noise.accountant)
            self._calibration = self.calibration_record()
        num_classes = getattr(datamodule, "num_classes", None)
        if num_classes:
            self.test_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")
            self.val_accuracy = MulticlassAccuracy(num_classes=num_classes, average="micro")

    def _training_dtype(self) -> torch.dtype:
        """The dtype training runs in: the trainer's true precision (``"64-true"`` → float64,
        ``"16-true"`` / ``"bf16-true"`` → float16 / bfloat16), else the model's. The module is
        converted to it here, before the algorithm allocates its state and noise in it (Lightning
        would convert the module only after ``setup``, leaving the algorithm's dtype behind)."""
        true_precision = {
            "64-true": torch.float64,
            "16-true": torch.float16,
            "bf16-true": torch.bfloat16,
        }
        dtype = true_precision.get(str(self.trainer.precision))
        if dtype is None:
            return next(self.model.parameters()).dtype
        if next(self.model.parameters()).dtype != dtype:
            self.to(dtype=dtype)
        return dtype

    def _check_grid_mechanisms(self) -> None:
        """One accountant serves the grid: every configuration must release the same
        mechanisms (noise multiplier and sampling rate) as ``algorithm``."""

        def signature(alg: FederatedAlgorithm) -> list[tuple]:
            mechs = [*alg.mechanisms(0), *alg.paper_mechanisms()]
            return [(m.noise_multiplier, m.sample_rate, m.sampling, m.population) for m in mechs]

        reference = signature(self.algorithm)
        for point, alg in zip(self.grid_points, self.grid_algorithms):
            own = signature(alg)
            same = len(own) == len(reference) and all(
                math.isclose(a[0], c[0], rel_tol=1e-9)
                and math.isclose(a[1], c[1], rel_tol=1e-9)
                and a[2:] == c[2:]
                for a, c in zip(own, reference)
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
            batch_sampling=getattr(datamodule, "batch_sampling", "epochs"),
        )

    @override
    def configure_optimizers(self):
        return _RoundOptimizer(self.parameters())

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    # ------------------------------------------------------------------ one round
    def chunk_size(self) -> int:
        """Clients per chunk of this run's rounds (:func:`~pl_privfed.engine.choose_chunk_size`)."""
        dtype = next(self.model.parameters()).dtype
        return choose_chunk_size(self.algorithm.num_clients, self.layout.dim, self.device,
                                 self.client_chunk, dtype.itemsize)  # fmt: skip

    def _statistics_round(self, round_index: int) -> bool:
        """Whether round ``round_index``'s metrics reach the loggers: Lightning writes a training
        step's metrics every ``log_every_n_steps`` steps (step ``k`` when ``(k + 1)`` is a
        multiple), and the last round's. Only then are the round's statistics that cost a pass
        over client rows computed, and only then does anything call ``self.log`` (each call
        costs about a millisecond on a CPU: at a 10-client round, more than the round)."""
        every = max(1, int(self.trainer.log_every_n_steps or 1))
        last = self._num_rounds() and round_index + 1 >= self._num_rounds()
        return (round_index + 1) % every == 0 or bool(last)

    def logging_round(self) -> bool:
        """Whether the current round's metrics are logged (for callbacks: the protocol
        :func:`pl_privfed.callbacks.logs_this_round` reads)."""
        return self._logging_round

    @staticmethod
    def _round_data(batch: Any) -> Any:
        """The round's data as a served-by-client batch (stacked tensors are wrapped)."""
        if isinstance(batch, tuple | list):
            return TensorRoundBatch(*batch)
        return batch

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        batch = self._round_data(batch)
        if self.grid_algorithms is not None:
            return self._grid_training_step(batch)
        round_index = self.global_step
        self._logging_round = self._statistics_round(round_index)
        oracle = RoundOracle(self.oracle, batch, self.local_batches)
        x = self.layout.flatten(self.model)
        result = self.algorithm.step(
            x, oracle, client_chunk=self.chunk_size(), statistics=self._logging_round
        )
        # mean over the (computing) clients of the minibatch loss at x^k; None when no client
        # computed this round (e.g. nobody was sampled)
        loss = result.loss
        if loss is not None and not math.isfinite(loss.item()):
            raise NonFiniteLossError(
                f"non-finite training loss ({loss.item()}) at round {round_index}; "
                "stopping (lower the step size, or check the data and model)"
            )
        if result.buffers:
            # the running statistics of the clients' last shared-parameter evaluation (local
            # steps at per-client parameters produce none)
            self._assign_buffers(result.buffers)
        self.layout.assign(self.model, result.params)
        self.optimizers().step()
        self._last_round = result
        if loss is not None and self._logging_round:
            self.log("train/loss", loss, prog_bar=True, batch_size=1)
        self._count_transmissions(result)
        self._account(round_index)
        return loss

    @torch.no_grad()
    def _assign_buffers(self, values: dict[str, Tensor]) -> None:
        bufs = dict(self.model.named_buffers())
        for name, value in values.items():
            bufs[name].copy_(value)

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

    def _grid_training_step(self, batch: Any) -> None:
        """One round of every live configuration of the grid (see :mod:`pl_privfed.grid`).

        The configurations' rounds advance in lockstep, chunk by chunk of clients; the first
        request of each configuration for a chunk's gradients at its current parameters (what
        every server algorithm asks first) is served from one oracle call for every live
        configuration whose chunk holds the same clients (``[K·c, d]``, per-configuration
        BatchNorm buffers); any other request (local steps, per-example gradients) goes to the
        oracle as in a single run.
        """
        round_index = self.global_step
        self._logging_round = self._statistics_round(round_index)
        live = self.grid_running()
        if not live:  # every configuration is done (e.g. reached its target)
            self.trainer.should_stop = True
            return None
        shared = _GridBatch(self, batch, live)
        size = self.chunk_size()
        statistics = self._logging_round
        steps = {}
        for k in live:
            buffers = {name: v[k] for name, v in self._grid_buffers().items()} or None
            own = RoundOracle(self.oracle, batch, self.local_batches, buffers)
            x = self.grid_params[k]
            steps[k] = self.grid_algorithms[k].step_iter(
                x, _GridConfigOracle(shared, k, x, own), client_chunk=size, statistics=statistics
            )
        outcomes = {}
        pending = list(live)
        while pending:  # one chunk of every configuration per pass
            for k in list(pending):
                try:
                    next(steps[k])
                except StopIteration as done:
                    outcomes[k] = done.value
                    pending.remove(k)
            shared.clear()
        computed = [k for k in live if outcomes[k].loss is not None]
        values = torch.stack([outcomes[k].loss for k in computed]).tolist() if computed else []
        loss_of = dict(zip(computed, values))
        record = round_index % self.trainer.log_every_n_steps == 0 or (
            self._num_rounds() and round_index + 1 >= self._num_rounds()
        )
        for k in live:
            result = outcomes[k]
            loss = loss_of.get(k)
            if loss is not None and not math.isfinite(loss):
                self._grid_status[k] = f"failed: non-finite training loss at round {round_index}"
                continue
            self.grid_params[k] = result.params  # every round has run: x^k is no longer read
            for name, value in (result.buffers or {}).items():
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
        self._last_round = outcomes[running[0]]  # statistics of the first live configuration
        finite = [loss_of[k] for k in running if k in loss_of]
        if finite and self._logging_round:
            self.log("grid/min_train_loss", min(finite), prog_bar=True, batch_size=1)
        if self._logging_round:
            self.log("grid/live_configurations", float(len(running)), batch_size=1)
        self._count_transmissions(self._last_round)
        self._account(round_index)
        return None

    def _grid_gradients(
        self, configs: list[int], ids: Tensor, batch: Any
    ) -> tuple[Tensor, Tensor, dict[str, Tensor]]:
        """One oracle call for the clients ``ids`` of the configurations ``configs`` at their
        parameters: gradients ``[k, c, d]``, losses ``[k, c]`` and each configuration's sums
        over those clients of their updated buffers."""
        oracle = RoundOracle(self.oracle, batch, self.local_batches)
        inputs, targets = oracle.data(ids)
        c, k = inputs.shape[0], len(configs)
        rows = torch.tensor(configs, device=self.grid_params.device)

        def per_row(t: Tensor) -> Tensor:
            return t[rows].repeat_interleave(c, 0)

        buffers = {name: per_row(v) for name, v in self._grid_buffers().items()}
        out = self.oracle(
            per_row(self.grid_params),
            inputs.repeat(k, *([1] * (inputs.dim() - 1))),
            targets.repeat(k, *([1] * (targets.dim() - 1))),
            buffers=buffers or None,
        )
        per_config = {
            name: v.view(k, c, *v.shape[1:])
            for name, v in (self.oracle.client_buffers or {}).items()
        }
        summed = sum_client_buffers(per_config, dim=1)
        return out.grads.view(k, c, -1), out.losses.view(k, c), summed

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

    def _grid_record_evaluation(self, stage: str, log: bool = True) -> None:
        """Append the evaluation's per-configuration results (``<stage>/loss``,
        ``<stage>/acc``, ``stage`` = ``val`` or ``test``) to the history and write them; with
        ``log`` (inside Lightning's evaluation loops) also log the best accuracy."""
        if self._grid_eval is None:
            return
        stats, self._grid_eval = self._grid_eval.tolist(), None
        accuracies = []
        for k, (loss_sum, correct, count) in enumerate(stats):
            if count == 0:
                continue
            self.grid_record(k, f"{stage}/loss", self.global_step, loss_sum / count)
            if self.test_accuracy is not None:
                accuracies.append(correct / count)
                self.grid_record(k, f"{stage}/acc", self.global_step, correct / count)
        if accuracies and log:
            self.log(f"grid/best_{stage}_acc", max(accuracies), prog_bar=True)
        self.write_grid_results()

    def _grid_results_dir(self) -> Path:
        """``grid_dir``, by default ``<log dir>/grid``."""
        if self.grid_dir is not None:
            return Path(self.grid_dir)
        return Path(local_log_dir(self.trainer) or self.trainer.default_root_dir) / "grid"

    def write_grid_results(self) -> Any:
        """Write the grid's ``results.csv`` and ``runs/<id>/`` (:func:`write_grid_results`)."""
        if self.grid_algorithms is None or not self.trainer.is_global_zero:
            return None
        extra = {}
        report = self.privacy_report()
        if report is not None:
            extra = {
                "epsilon": report["epsilon"],
                "epsilon_paper_convention": report["epsilon_paper_convention"],
                "delta": report["delta"],
            }
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
                sent += msg.rows * msg.copies
        self.client_transmissions += sent
        if self._logging_round:
            self.log("comm/client_transmissions", float(sent), batch_size=1)
            self.log("comm/client_transmissions_total", float(self.client_transmissions),
                     batch_size=1)  # fmt: skip

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
        if self._final_test is not None and self.grid_algorithms is None:
            entries["final_test_accuracy"] = self._final_test["accuracy"]
            entries["final_test_loss"] = self._final_test["loss"]
            entries["final_test_round"] = self._final_test["round"]
        return entries

    @override
    def on_train_end(self) -> None:
        self._final_test = self.evaluate_test_set()  # before a grid's results are written
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
        loader = getattr(self.trainer.datamodule, "test_dataloader", None)
        if not callable(loader):
            return report
        x = self.layout.flatten(self.model)
        self.layout.assign(self.model, out["params"].to(x))
        try:
            report["test_loss"], report["test_accuracy"] = self._loader_metrics(loader())
        finally:
            self.layout.assign(self.model, x)
        return report

    def operator_statistics(self) -> dict[str, Tensor]:
        """The last round's operator statistics (the protocol ``OperatorStatistics`` reads)."""
        return {} if self._last_round is None else self._last_round.metrics

    def communication_messages(self) -> list:
        """The last round's messages (the protocol ``CommunicationCost`` reads)."""
        return [] if self._last_round is None else self._last_round.messages

    def _account(self, round_index: int) -> None:
        """Record round ``round_index``'s releases with both accountants (the defensible one and
        the papers' convention) and log both ε every ``epsilon_every`` rounds."""
        if self.accountant is None:
            return
        self._account_releases(round_index)
        last = self._num_rounds() and round_index + 1 >= self._num_rounds()
        due = (
            self._logging_round
            if self.epsilon_every is None
            else (round_index + 1) % self.epsilon_every == 0
        )
        if due or last:
            self._log_epsilon()

    def _log_epsilon(self) -> None:
        delta = self.algorithm.noise.delta
        self._epsilon = self.accountant.get_epsilon(delta)
        self._epsilon_paper = self.paper_accountant.get_epsilon(delta)
        self.log("privacy/epsilon", self._epsilon, prog_bar=True, batch_size=1)
        self.log("privacy/epsilon_paper_convention", self._epsilon_paper, batch_size=1)

    def _account_releases(self, round_index: int) -> None:
        for mech in self.algorithm.mechanisms(round_index):
            self.accountant.step_mechanism(mech)
        for mech in self.algorithm.paper_mechanisms():
            self.paper_accountant.step_mechanism(mech)
        self._rounds_accounted += 1

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

    def _evaluate(self, batch: Any, stage: str) -> None:
        """Log ``<stage>/loss`` and ``<stage>/acc`` (``stage``: ``val`` or ``test``)."""
        out, loss = self._model_loss(*batch)
        targets = batch[1]
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True)
        accuracy = self.val_accuracy if stage == "val" else self.test_accuracy
        if accuracy is not None:
            accuracy(out, targets)
            self.log(f"{stage}/acc", accuracy, on_epoch=True, prog_bar=True)

    @torch.no_grad()
    def _loader_metrics(self, loader: Any) -> tuple[float, float | None]:
        """Mean loss and accuracy (``None`` for regression) of the model over ``loader``, in
        eval mode (restored afterwards), batches through the datamodule's ``preprocess``."""
        preprocess = getattr(self.trainer.datamodule, "preprocess", None)
        was_training = self.model.training
        self.model.eval()
        total_loss, correct, count = 0.0, 0, 0
        try:
            dtype = next(self.model.parameters()).dtype
            for inputs, targets in loader:
                inputs, targets = inputs.to(self.device), targets.to(self.device)
                if callable(preprocess):
                    inputs = preprocess(inputs, False, 0)
                if inputs.is_floating_point():  # the model's precision (e.g. "64-true")
                    inputs = inputs.to(dtype)
                logits, loss = self._model_loss(inputs, targets)
                total_loss += float(loss) * len(targets)
                if self.test_accuracy is not None:
                    correct += int((logits.argmax(-1) == targets).sum())
                count += len(targets)
        finally:
            self.model.train(was_training)
        accuracy = correct / max(count, 1) if self.test_accuracy is not None else None
        return total_loss / max(count, 1), accuracy

    @torch.no_grad()
    def evaluate_test_set(self) -> dict[str, Any] | None:
        """The held-out test set, once, for the final model: called at the end of fit.

        Selection (sweeps, reports, early stopping) reads the validation split; the test set is
        measured here, after the last round, for the model that training produced, and for
        every configuration of a grid that has not failed (its ``test/*`` point and
        ``final_test_accuracy``). The values go to the loggers as ``test/loss`` and ``test/acc``
        at the last round and into ``summary.json`` (``final_test_accuracy``,
        ``final_test_loss``, ``final_test_round``). Returns ``None`` when the datamodule has no
        test set.
        """
        loader = getattr(self.trainer.datamodule, "test_dataloader", None)
        if not callable(loader) or self.oracle is None:
            return None
        round_index = int(self.global_step)
        if self.grid_algorithms is not None:
            preprocess = getattr(self.trainer.datamodule, "preprocess", None)
            was_training = self.model.training
            self.model.eval()
            self._grid_eval = None
            try:
                for inputs, targets in loader():
                    inputs, targets = inputs.to(self.device), targets.to(self.device)
                    if callable(preprocess):
                        inputs = preprocess(inputs, False, 0)
                    self._grid_evaluate((inputs, targets))
            finally:
                self.model.train(was_training)
            self._grid_record_evaluation("test", log=False)
            return {"round": round_index}
        loss, accuracy = self._loader_metrics(loader())
        metrics = {"test/loss": loss}
        if accuracy is not None:
            metrics["test/acc"] = accuracy
        if self.trainer.is_global_zero:  # at the step Lightning gave the last round's metrics
            for logger in self.trainer.loggers:
                logger.log_metrics(metrics, step=max(round_index - 1, 0))
        return {"round": round_index, "loss": loss, "accuracy": accuracy}

    def _validate_now(self) -> None:
        """Run Lightning's validation loop of the fit now (callbacks and loggers see it as the
        evaluation of the current round), as the training loop itself runs it."""
        trainer = self.trainer
        if not trainer.enable_validation:
            return
        connector = trainer._logger_connector
        first_loop_iter = connector._first_loop_iter
        trainer.validating = True
        trainer.fit_loop.epoch_loop.val_loop.run()
        trainer.training = True
        connector._first_loop_iter = first_loop_iter

    @override
    def on_train_start(self) -> None:
        # a run resumed at round k evaluates round k, unless the checkpoint was written after
        # that evaluation (then its point is in the restored curves already)
        if self.global_step > 0 and self._validated_round != self.global_step:
            self._validate_now()

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # the last round is always evaluated: Lightning validates when a run is told to stop
        rounds = self._num_rounds()
        if rounds and self.global_step >= rounds:
            self.trainer.should_stop = True
        if self.trainer.should_stop and not self._logging_round:
            self._log_stopping_round()

    def _log_stopping_round(self) -> None:
        """A run stopped by a callback (a privacy budget, early stopping) on a round that logs
        nothing still ends with its last round's training loss and ε logged: the summary, the
        curves and the progress bar show where it stopped."""
        self._logging_round = True
        result = self._last_round
        loss = getattr(result, "loss", None)
        if loss is not None and self.grid_algorithms is None:
            self.log("train/loss", loss, prog_bar=True, batch_size=1)
        if self.accountant is not None and self._rounds_accounted:
            self._log_epsilon()

    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        if self.grid_algorithms is None:
            self._evaluate(batch, "val")
        else:
            self._grid_evaluate(batch)

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        if self.grid_algorithms is None:
            self._evaluate(batch, "test")
        else:
            self._grid_evaluate(batch)

    @override
    def on_validation_epoch_end(self) -> None:
        if self.grid_algorithms is not None:
            self._grid_record_evaluation("val")
        if not self.trainer.sanity_checking:
            self._validated_round = int(self.global_step)

    @override
    def on_test_epoch_end(self) -> None:
        if self.grid_algorithms is not None:
            self._grid_record_evaluation("test")

    # ------------------------------------------------------------------ privacy report & state
    def privacy_mechanisms(self) -> list:
        """The Gaussian mechanisms of the round last run under the defensible accounting (the
        protocol ``PrivacyBudget`` reads)."""
        return self.algorithm.mechanisms(max(0, self._rounds_accounted - 1))

    def next_privacy_mechanisms(self) -> list:
        """The Gaussian mechanisms the next round will apply (``PrivacyBudget`` stops before a
        round that would exceed its budget; they differ from round to round when a record's
        uses are counted)."""
        return self.algorithm.mechanisms(self._rounds_accounted)

    def calibration_record(self) -> dict[str, Any]:
        """What the noise std ``σ`` was set for, fixed when the run starts and kept in its
        checkpoints (resuming compares against it; :meth:`on_load_checkpoint`)."""
        alg, noise = self.algorithm, self.algorithm.noise
        return {
            "noise_std": alg.noise_std,
            "grid_noise_std": [a.noise_std for a in (self.grid_algorithms or [])],
            "calibration": noise.calibration if noise.epsilon is not None else "noise_multiplier",
            "target_epsilon": noise.epsilon,
            "noise_multiplier": noise.noise_multiplier,
            "delta": noise.delta,
            "constant": noise.constant,
            "rounds": alg.calibration_rounds(),
            "neighbouring_relation": alg.neighbouring(),
            "sensitivity": alg.accounting_sensitivity(),
            "message_bound": alg.message_bound(),
            "sample_rate": alg.sample_rate,
            "accountant": noise.accountant,
        }

    def privacy_report(self) -> dict[str, Any] | None:
        """What the run spent, under two accountings (docs/privacy.md).

        ``epsilon`` is the defensible value: the algorithm's privacy unit, the neighbouring
        relation of its privacy model (replace-one for local DP), amplification only by sampling
        hidden from the adversary and only as what it is. ``epsilon_paper_convention`` is the
        papers' (add/remove, Poisson amplification at the nominal rate). ``accounting`` and
        ``paper_convention`` state what each assumes; ``calibration`` what σ was set for.
        """
        noise = self.algorithm.noise
        if noise is None or self.accountant is None:
            return None
        alg = self.algorithm
        mechs, paper = alg.mechanisms(0), alg.paper_mechanisms()  # round 0 always releases
        calibration = dict(self._calibration or self.calibration_record())
        return {
            "epsilon": self.accountant.get_epsilon(noise.delta),
            "epsilon_paper_convention": self.paper_accountant.get_epsilon(noise.delta),
            "delta": noise.delta,
            "privacy_unit": alg.privacy_unit,
            "neighbouring_relation": alg.neighbouring(),
            "sensitivity": alg.accounting_sensitivity(),
            "message_bound": alg.message_bound(),
            "accounting": {
                **alg.accounting_basis().as_dict(),
                "accountant": self.accountant.library,
                "noise_multiplier": mechs[0].noise_multiplier if mechs else None,
                "sample_rate": mechs[0].sample_rate if mechs else None,
                "sampling": mechs[0].sampling if mechs else None,
                "releases": self.accountant.steps,
            },
            "paper_convention": {
                **alg.paper_accounting_basis().as_dict(),
                "accountant": self.paper_accountant.library,
                "noise_multiplier": paper[0].noise_multiplier if paper else None,
                "sample_rate": paper[0].sample_rate if paper else None,
                "releases": self.paper_accountant.steps,
            },
            "accountant": noise.accountant,
            "target_epsilon": noise.epsilon,
            "calibration": calibration.pop("calibration"),
            "calibration_rounds": calibration["rounds"],
            "calibrated_for": calibration,
            "noise_std": alg.noise_std,
            "noise_multiplier": mechs[0].noise_multiplier if mechs else None,
            "sample_rate": mechs[0].sample_rate if mechs else None,
            "rounds_accounted": self._rounds_accounted,
        }

    def _client_states(self) -> list[tuple[str, FederatedAlgorithm]]:
        """Every algorithm's ``state_dict`` prefix and the algorithm."""
        out = [("algorithm.", self.algorithm)]
        for k, alg in enumerate(self.grid_algorithms or []):
            out.append((f"grid_algorithms.{k}.", alg))
        return out

    def _save_client_state(self, checkpoint: dict[str, Any]) -> None:
        """The whole federation's per-client state in the checkpoint, whichever process holds
        which clients: device and host tables as full ``[n, ...]`` tensors (gathered over the
        processes), memory-mapped tables as a snapshot of each process's file, named in the
        checkpoint (the tables can be larger than memory)."""
        extra: dict[str, Any] = {}
        for prefix, alg in self._client_states():
            shard, store = alg.shard, alg.state
            for name in store.names:
                key = prefix + name
                if store.placement == "disk":
                    snapshot = store.snapshot(name, int(self.global_step))
                    extra[key] = {"files": shard.all_gather_object(str(snapshot)),
                                  "block": shard.block}  # fmt: skip
                    continue
                full = shard.gather_rows(store.table(name).to(self.device))
                if store.placement == "device":
                    checkpoint["state_dict"][key] = full
                else:
                    extra[key] = {"rows": full.cpu()}
        if extra:
            checkpoint["client_state"] = extra

    def _load_client_state(self, checkpoint: dict[str, Any]) -> None:
        """This process's rows of every table from a checkpoint written with any number of
        processes."""
        extra = checkpoint.get("client_state", {})
        for prefix, alg in self._client_states():
            shard, store = alg.shard, alg.state
            for name in store.names:
                key = prefix + name
                if key in extra:
                    rows = _rows_of(extra[key], shard.start, shard.stop)
                else:
                    full = checkpoint["state_dict"].get(key)
                    if full is None:
                        continue
                    rows = full[shard.start : shard.stop]
                if store.placement == "device":
                    checkpoint["state_dict"][key] = rows
                else:
                    store.table(name).copy_(rows)
                    checkpoint["state_dict"].pop(key, None)

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self._save_client_state(checkpoint)
        if self.accountant is not None:
            checkpoint["privacy_accountant"] = self.accountant.state_dict()
            checkpoint["privacy_accountant_paper"] = self.paper_accountant.state_dict()
            checkpoint["privacy_calibration"] = self._calibration
            checkpoint["privacy_rounds_accounted"] = self._rounds_accounted
        checkpoint["client_transmissions"] = self.client_transmissions
        checkpoint["validated_round"] = self._validated_round
        if self.grid_algorithms is not None:
            checkpoint["grid"] = {
                "status": self._grid_status,
                "history": self._grid_history,
                "entries": self._grid_entries,
            }

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.oracle is not None:  # set up: the state tables exist
            self._load_client_state(checkpoint)
        if self.accountant is not None and "privacy_accountant" in checkpoint:
            self._restore_calibration(checkpoint.get("privacy_calibration"))
            if "privacy_accountant_paper" in checkpoint:
                self.accountant.load_state_dict(checkpoint["privacy_accountant"])
                self.paper_accountant.load_state_dict(checkpoint["privacy_accountant_paper"])
                self._rounds_accounted = int(checkpoint["privacy_rounds_accounted"])
            else:  # an older checkpoint: one accountant, under the papers' convention
                rounds = int(checkpoint.get("global_step", 0))
                rank_zero_warn(
                    "the checkpoint predates the defensible accounting: replaying its "
                    f"{rounds} rounds under both accountings"
                )
                for k in range(rounds):
                    self._account_releases(k)
        self.client_transmissions = int(checkpoint.get("client_transmissions", 0))
        self._validated_round = checkpoint.get("validated_round")
        if self.grid_algorithms is not None and "grid" in checkpoint:
            self._grid_status = list(checkpoint["grid"]["status"])
            self._grid_history = [
                {m: [tuple(p) for p in pts] for m, pts in h.items()}
                for h in checkpoint["grid"]["history"]
            ]
            self._grid_entries = [dict(e) for e in checkpoint["grid"].get("entries", [])] or [
                {} for _ in self.grid_points
            ]

    def _restore_calibration(self, saved: dict[str, Any] | None) -> None:
        """Keep the noise the run started with (never recalibrate silently on resume).

        ``setup`` has calibrated σ for *this* configuration; the checkpoint says what the run
        used. If only the number of rounds differs (e.g. a larger ``trainer.max_steps``), the
        saved σ is kept, the accountant goes on composing the rounds actually run, and a warning
        says so (``privacy_report()["calibrated_for"]`` keeps the original K). Any other change
        that would change σ (ε, δ, the calibration rule, the relation, ...) is refused before
        training: one run cannot honestly report one noise level for two.
        """
        if saved is None:
            rank_zero_warn(
                "the checkpoint has no record of its noise calibration (saved by an older "
                f"version); continuing with this configuration's noise std {self.algorithm.noise_std:.6g}"
            )
            return
        current = self.calibration_record()
        if math.isclose(saved["noise_std"], current["noise_std"], rel_tol=1e-9):
            self._calibration = dict(saved)
            return
        differs = {
            k: (saved.get(k), v)
            for k, v in current.items()
            if k not in ("noise_std", "grid_noise_std", "rounds", "resumed") and saved.get(k) != v
        }
        if differs:
            changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in differs.items())
            raise ValueError(
                f"the checkpoint's noise std {saved['noise_std']:.6g} was calibrated for "
                f"{saved['rounds']} rounds with other privacy settings than this run's "
                f"({changes}), which give {current['noise_std']:.6g}: resume with the "
                "checkpoint's noise settings, or start a new run for the new ones"
            )
        rank_zero_warn(
            f"resuming a run whose noise was calibrated for {saved['rounds']} rounds "
            f"(noise std {saved['noise_std']:.6g}) with {current['rounds']} rounds: keeping "
            f"noise std {saved['noise_std']:.6g} (not {current['noise_std']:.6g}); epsilon "
            f"accounts the rounds actually run and will exceed what the calibration targeted "
            f"after round {saved['rounds']}. To calibrate for {current['rounds']} rounds, start a "
            f"new run (or set noise.rounds: {current['rounds']} from the start)"
        )
        self.algorithm.noise_std = float(saved["noise_std"])
        for alg, std in zip(self.grid_algorithms or [], saved.get("grid_noise_std", [])):
            alg.noise_std = float(std)
        resumed = {"rounds": current["rounds"], "noise_std_not_used": current["noise_std"]}
        self._calibration = {**saved, "resumed": resumed}  # summary.json shows both


def _rows_of(saved: dict[str, Any], start: int, stop: int) -> Tensor:
    """Rows ``[start, stop)`` of a saved table: gathered ``rows``, or memory-mapped ``files``
    written by processes holding blocks of ``block`` clients each."""
    if "rows" in saved:
        return saved["rows"][start:stop]
    parts, block = [], int(saved["block"])
    for rank, path in enumerate(saved["files"]):
        lo = rank * block
        table = np.load(path, mmap_mode="r")
        hi = lo + table.shape[0]
        a, b = max(start, lo), min(stop, hi)
        if a < b:
            parts.append(torch.from_numpy(np.array(table[a - lo : b - lo])))
    return torch.cat(parts)
