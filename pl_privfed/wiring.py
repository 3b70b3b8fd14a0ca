"""How a :class:`~pl_privfed.FederatedModule` is wired: its arguments checked, its parts built.

The module itself keeps a round, its evaluation steps and its checkpoint hooks; what it is made
of is decided here, once:

* :func:`check_arguments` — the constructor's arguments, one ``ValueError`` naming the first bad
  one;
* :func:`adopt_trainer` — at every ``setup``: the trainer checked (its strategy, its evaluation
  interval), its ``ModelCheckpoint`` file names and its W&B step axis in rounds;
* :func:`set_up` — at the first ``setup``: the algorithms set up on the trainer's data, device, precision
  and processes, the gradient oracle, the chunk size (:func:`~pl_privfed.engine.choose_chunk_size`,
  decided here and handed to every round), the number of rounds, and how each algorithm's
  client rows are represented (:func:`~pl_privfed.engine.choose_client_rows`) (a
  :class:`Setup`);
* :func:`privacy_ledger` — a private run's ledger;
* :class:`RoundOptimizer` — the optimizer Lightning steps once per round (it does nothing but
  show the algorithms' step sizes as its learning rates);
* :func:`name_checkpoints_by_round` — a plain ``ModelCheckpoint`` without a file name counts
  rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn
from torch import nn

from pl_privfed import trainer_rounds
from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.checks import check_choice, check_evaluation_interval
from pl_privfed.compat.lightning import check_namespaces, name_namespace_mismatches
from pl_privfed.datamodules.base import round_description
from pl_privfed.engine import ClientRows, ClientShard, choose_chunk_size, choose_client_rows
from pl_privfed.engine.distributed import adopt_strategy, check_strategy
from pl_privfed.engine.state import GridMemoryRefused, spills_to_disk
from pl_privfed.grads import (
    GradientOracle,
    check_backend,
    resolve_backend,
    resolve_example_backend,
)
from pl_privfed.logdir import round_step_on_wandb
from pl_privfed.privacy import PrivacyLedger, plan

__all__ = [
    "RoundOptimizer",
    "Setup",
    "adopt_trainer",
    "check_arguments",
    "name_checkpoints_by_round",
    "privacy_ledger",
    "restore_ledger",
    "set_up",
]


class RoundOptimizer(torch.optim.Optimizer):
    """Does nothing but run its closure: the algorithm writes the parameters itself.

    Its parameter groups' ``lr`` are the algorithms' step sizes (``step_size``: the server step
    ``γ``/``η``, the gradient step of a decentralized method), kept equal to them at every
    round, so that Lightning's ``LearningRateMonitor`` and anything else that reads an
    optimizer's learning rate sees the federation's step (logged as
    ``lr-RoundOptimizer/step_size``). The first group holds the parameters; a grid's further
    configurations get one empty group each, named after them.

    Args:
        params: the module's parameters.
        algorithms: ``(name, algorithm)`` pairs, one group each; none: one group at ``lr`` 0.
    """

    def __init__(self, params, algorithms: list[tuple[str, FederatedAlgorithm]] = ()) -> None:
        super().__init__(params, defaults={"lr": 0.0})
        self.algorithms = list(algorithms)
        for name, _ in self.algorithms[1:]:
            self.add_param_group({"params": [], "name": name})
        if self.algorithms:
            self.param_groups[0]["name"] = self.algorithms[0][0]
        self.follow_step_sizes()

    def follow_step_sizes(self) -> None:
        """Set every group's ``lr`` to its algorithm's current ``step_size``."""
        for group, (_, algorithm) in zip(self.param_groups, self.algorithms):
            group["lr"] = float(algorithm.step_size)

    @torch.no_grad()
    def step(self, closure=None):  # type: ignore[override]
        self.follow_step_sizes()
        return closure() if closure is not None else None


def name_checkpoints_by_round(trainer: Any) -> None:
    """Give Lightning's own ``ModelCheckpoint`` callbacks that have no ``filename`` the name
    ``round=000050.ckpt`` (rounds, ``trainer.global_step``) in place of Lightning's
    ``epoch=9-step=50.ckpt``, whose epochs mean nothing in a federation; a file name the user
    chose is kept. :class:`~pl_privfed.callbacks.RoundCheckpoint` names files so by default
    and also writes atomically and saves the last round."""
    for callback in trainer.checkpoint_callbacks:  # either Lightning namespace's
        if hasattr(callback, "auto_insert_metric_name") and callback.filename is None:
            callback.filename = "round={step:06d}"
            callback.auto_insert_metric_name = False


@dataclass(frozen=True)
class Setup:
    """What a module's setup decided.

    Attributes:
        oracle: the gradient oracle of the model and loss.
        chunk_size: clients per chunk of every round (the run's one decision).
        num_rounds: the run's rounds (0 when the trainer does not bound them).
        local_batches: minibatches per client and round.
        num_classes: the datamodule's classes (``None``: not a classification).
    """

    oracle: GradientOracle
    chunk_size: int
    num_rounds: int
    local_batches: int
    num_classes: int | None


def adopt_trainer(trainer: Any, stage: str) -> None:
    """What every ``setup`` of a module does with its trainer, set up or not (a module may be
    fitted by a second trainer): refuse callbacks and a datamodule of the other Lightning
    namespace (:func:`~pl_privfed.compat.lightning.check_namespaces`), a strategy that shards the
    model, an evaluation
    interval that is not in rounds and a fit in 16 bits
    (:func:`~pl_privfed.trainer_rounds.check_precision`), name a plain ``ModelCheckpoint``'s files by round (fit), and
    make ``round`` the step axis of its W&B loggers
    (:func:`~pl_privfed.logdir.round_step_on_wandb`)."""
    check_namespaces(trainer)  # callbacks and datamodule of the trainer's namespace
    check_strategy(trainer.strategy)  # one that shards clients, not the model
    check_evaluation_interval(trainer)
    if stage == "fit":
        trainer_rounds.check_precision(trainer)  # 32 or 64 bits: clipping and noise exact
        name_checkpoints_by_round(trainer)
    round_step_on_wandb(trainer)


def set_up(
    trainer: Any, module: Any, stage: str = "fit", saved_ledger: dict[str, Any] | None = None
) -> Setup:
    """Set up every algorithm of ``module`` (``module.algorithms()``) for the trainer's
    datamodule (its clients and rounds), device, precision and processes, and build the rest.

    Args:
        trainer: the Lightning trainer.
        module: the :class:`~pl_privfed.FederatedModule`; its ``algorithm``, ``model``,
            ``criterion``, ``layout`` and arguments (``grad_backend``, ``cuda_graphs``,
            ``client_chunk``, ``client_state``, ``state_dir``) are read; a module with
            ``algorithm_datamodule(prefix)`` (a grid over seeds) gives an algorithm its own
            datamodule, whose rounds and shard sizes it is configured with (``None``: the
            trainer's).
        stage: Lightning's stage; only ``"fit"`` needs the number of rounds of a noise
            calibrated to ε (evaluation draws no noise).
        saved_ledger: a loaded checkpoint's ledger entries: the rounds its noise was calibrated
            for are ``K`` when an evaluation's trainer gives none (the run's calibration).

    Raises:
        ValueError: a datamodule without ``num_clients``; a noise calibrated to ε without a
            number of rounds.
    """
    datamodule = trainer.datamodule
    num_clients = getattr(datamodule, "num_clients", None)
    if num_clients is None:
        given = "no datamodule" if datamodule is None else f"{type(datamodule).__name__}"
        raise ValueError(
            f"FederatedModule needs a federated datamodule (its training data split over "
            f"clients, num_clients), got {given}: wrap your datasets with "
            "FederatedDataModule.from_datasets(train, test, num_clients=...) (or from_tensors), "
            "or take a datamodule of pl_privfed.datamodules"
        )
    device = trainer.strategy.root_device
    num_rounds = trainer_rounds.num_rounds(trainer)
    if not num_rounds and stage != "fit":
        num_rounds = PrivacyLedger.calibrated_rounds(saved_ledger or {}) or 0
    noise = module.algorithm.noise
    if noise is not None and noise.epsilon is not None and noise.rounds is None:
        if not num_rounds and stage == "fit":
            raise ValueError(
                "the paper noise calibration needs the number of rounds K: set "
                "trainer.max_steps, trainer.max_epochs or algorithm noise.rounds"
            )
    adopt_strategy(trainer)
    dtype = trainer_rounds.training_dtype(trainer, module, module.model)
    state_dir = module.state_dir or str(Path(trainer.default_root_dir) / "client_state")
    rounds = round_description(datamodule)
    data_of = getattr(module, "algorithm_datamodule", None)  # a grid's per-seed data
    in_memory = 0  # client state the algorithms set up so far hold in memory (a grid's)
    refuse = getattr(module, "grid_memory", "disk") == "refuse" and module.client_state == "auto"
    algorithms = module.algorithms()
    oracle = _gradient_oracle(module, device)
    made: dict[int, Any] = {}  # one representation per datamodule (a grid's seeds)
    for index, (name, algorithm) in enumerate(algorithms):
        if refuse and index >= 2:  # the run's own algorithm and a configuration are set up
            each = algorithms[index - 1][1].state.nbytes()
            if spills_to_disk(each, device, in_memory):
                fit = max(1, index - 1)
                raise GridMemoryRefused(
                    f"model.grid: the client state of its {len(algorithms) - 1} "
                    f"configurations does not fit in memory together ({each / 1e9:.2f} GB "
                    f"each; a quarter of the machine's memory holds {fit} beside the run's "
                    f"own): at most {fit} configurations at once (or model.grid_memory: disk "
                    "memory-maps the rest)",
                    fit,
                )
        own = data_of(name) if callable(data_of) else None
        own_rounds = rounds if own is None or own is datamodule else round_description(own)
        algorithm.configure_data(**own_rounds)  # before setup: the rates enter the noise
        rows = choose_client_rows(
            getattr(module, "client_span", "off"),
            algorithm,
            module.model,
            own or datamodule,
            oracle.layer_rules,
            module.layout.dim,
            made,
            device,
            dtype,
            trainer.callbacks,
        )
        algorithm.setup(
            num_clients=num_clients,
            dim=module.layout.dim,
            num_rounds=num_rounds,
            device=device,
            dtype=dtype,
            shard=ClientShard.of_trainer(trainer, num_clients),
            client_state=module.client_state,
            state_dir=state_dir,
            **({"state_in_memory": in_memory} if in_memory else {}),  # only a grid's later ones
            client_rows=rows,
        )
        in_memory += algorithm.state.nbytes_in_memory()
    width = module.layout.dim  # a client's row in a chunk's working set
    chosen: dict[int, ClientRows] = {id(a.client_rows): a.client_rows for _, a in algorithms}
    for rows in chosen.values():
        note = rows.describe(module.layout.dim)
        if note is not None:
            rank_zero_info(note)
        width = min(width, rows.width(module.layout.dim))
    # an audit's canary clients are rows of the round's chunks too (PrivacyAudit)
    extra = sum(int(getattr(c, "extra_client_rows", 0)) for c in trainer.callbacks)
    return Setup(
        oracle=oracle,
        chunk_size=choose_chunk_size(
            num_clients + extra, width, device, module.client_chunk, dtype.itemsize
        ),
        num_rounds=num_rounds,
        local_batches=rounds["local_batches"],
        num_classes=getattr(datamodule, "num_classes", None),
    )


def _gradient_oracle(module: Any, device: torch.device) -> GradientOracle:
    """The oracle of ``module``'s model and loss on the backends ``grad_backend`` resolves to."""
    model, criterion = module.model, module.criterion
    return GradientOracle(
        model,
        criterion,
        resolve_backend(module.grad_backend, device, model, criterion),
        cuda_graph=module.cuda_graphs and device.type == "cuda",
        example_backend=resolve_example_backend(module.grad_backend, device, model, criterion),
    )


def restore_ledger(module: Any, checkpoint: dict[str, Any]) -> None:
    """Restore ``module``'s ledger from ``checkpoint`` and keep the noise its run started with
    (:meth:`~pl_privfed.privacy.PrivacyLedger.load`) on every algorithm."""
    stds = module.privacy_ledger.load(checkpoint)
    for (_, algorithm), std in zip(module.algorithms(), stds or []):
        algorithm.restore_noise_std(std)


def privacy_ledger(
    algorithm: FederatedAlgorithm, noise_stds: list[float], num_rounds: int
) -> PrivacyLedger:
    """The run's ledger: ``algorithm``'s declaration at its calibrated noise (``noise_stds``:
    every configuration's noise standard deviation)."""
    noise = algorithm.noise
    return PrivacyLedger(
        algorithm.release(),
        noise,
        noise_stds,
        plan.calibration_rounds(noise, max(1, num_rounds)),
        warn=rank_zero_warn,
    )


def check_arguments(
    model,
    algorithm,
    grad_backend,
    epsilon_every,
    cuda_graphs,
    client_chunk,
    client_state,
    client_span="auto",
) -> None:
    """``ValueError`` naming the first bad argument of :class:`~pl_privfed.FederatedModule`.
    Also makes a fit of the module under the other Lightning namespace's trainer say so in one
    line (:func:`~pl_privfed.compat.lightning.name_namespace_mismatches`)."""
    name_namespace_mismatches()
    if not isinstance(model, nn.Module):
        raise ValueError(f"model must be an nn.Module, got {model!r}")
    if not isinstance(algorithm, FederatedAlgorithm):
        raise ValueError(f"algorithm must be a FederatedAlgorithm, got {algorithm!r}")
    check_backend("grad_backend", grad_backend)
    positive = lambda v: isinstance(v, int) and not isinstance(v, bool) and v > 0  # noqa: E731
    if epsilon_every is not None and not positive(epsilon_every):
        raise ValueError(f"epsilon_every must be a positive integer or null, got {epsilon_every!r}")
    if not isinstance(cuda_graphs, bool):
        raise ValueError(f"cuda_graphs must be true or false, got {cuda_graphs!r}")
    if isinstance(client_chunk, str):
        check_choice("client_chunk", client_chunk, ("auto", "all"))
    elif not positive(client_chunk):
        raise ValueError(
            f"client_chunk must be 'auto', 'all' or a positive integer, got {client_chunk!r}"
        )
    check_choice("client_state", client_state, ("auto", "device", "host", "disk"))
    check_choice("client_span", client_span, ("auto", "on", "off"))
