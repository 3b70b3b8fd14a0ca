"""``FederatedModule``: the whole federation in one LightningModule; one training step = one round.

Each ``training_step`` runs the round through :func:`~pl_privfed.engine.run_round` on the
round's data (a :class:`~pl_privfed.datamodules.RoundBatch`, which serves each client's
minibatches on demand, or stacked tensors ``[n, B, ...]`` / ``[n, T, B, ...]``) and
writes the new parameters (and BatchNorm statistics) into the global model. Optimization is
manual; a no-op optimizer is stepped once per round: ``global_step`` counts communication rounds.

The module holds a round and delegates the rest: its arguments and parts to
:mod:`pl_privfed.wiring`, evaluation to :mod:`pl_privfed.evaluation`, the privacy accounting to
a :class:`~pl_privfed.privacy.PrivacyLedger`, what a checkpoint keeps of the run and the check
on resume to :mod:`pl_privfed.resume`, a grid to :class:`~pl_privfed.grid.GridModule`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import pytorch_lightning as pl
import torch
from torch import Tensor, nn
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

import pl_privfed.compat.lightning as compat
from pl_privfed import evaluation, resume, trainer_rounds, wiring
from pl_privfed.algorithms import FederatedAlgorithm
from pl_privfed.datamodules.base import TensorRoundBatch
from pl_privfed.engine import Placement, RoundResult, run_round
from pl_privfed.grads import Backend, GradientOracle, ParameterLayout, RoundOracle
from pl_privfed.privacy import Mechanism, PrivacyLedger, invariants

__all__ = ["FederatedModule", "NonFiniteLossError"]


class NonFiniteLossError(ValueError, ArithmeticError):
    """Raised when the training loss becomes NaN or infinite; the message names the round."""


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
        grad_backend: ``"auto"`` (per-client gradients: see
            :func:`~pl_privfed.grads.resolve_backend`; per-example gradients and clipped means:
            :func:`~pl_privfed.grads.resolve_example_backend`), ``"vmap"``, ``"loop"`` or
            ``"layers"`` for both (:func:`~pl_privfed.grads.check_backend`).
        epsilon_every: compute and log the accountant's ε every this many rounds (and at the end);
            default: on the rounds whose metrics reach the loggers (:meth:`logging_round`).
        cuda_graphs: on a CUDA device, replay the per-client gradient computation from a CUDA
            graph (:class:`~pl_privfed.grads.GradientOracle` ``cuda_graph``); ignored on the CPU.
        client_chunk: clients per chunk of the round's client map (:mod:`pl_privfed.engine`):
            ``"auto"`` (default: every client on a GPU; on a CPU as many as keep a chunk's
            ``[c, d]`` tensors in cache), ``"all"``, or a number; chosen once, at setup. The
            iterates do not depend on it (up to the order of floating-point sums).
        client_state: where the algorithm's per-client state tables live (``"auto"``,
            ``"device"``, ``"host"`` or ``"disk"``, :mod:`pl_privfed.engine.state`): ``auto``
            keeps them on the training device while they fit in a quarter of its memory, then
            in host memory (GPU runs), then memory-mapped on disk.
        state_dir: directory of memory-mapped state (default ``<default_root_dir>/client_state``).
        client_span: clients in their data's span (:func:`~pl_privfed.engine.choose_client_rows`).

    Several processes (``Trainer(strategy="ddp", devices=N)``, CPU with gloo or CUDA with NCCL,
    several nodes through Lightning's cluster environments) shard the clients: each process
    holds a block of them (their state, their part of every round) and the round's sums are
    added over the processes (:mod:`pl_privfed.engine.distributed`); the model is not wrapped
    in ``DistributedDataParallel`` (the module sums what the algorithm needs itself). Other
    multi-device strategies (FSDP, DeepSpeed, model parallelism) are refused.
    """

    #: whether the round's training loss is logged as ``train/loss`` (a grid logs its own)
    logs_train_loss = True
    #: keys of :meth:`run_record` (or their prefixes, e.g. ``"algorithm.noise"``) a resumed run
    #: may change on purpose (``pl-privfed fit --resume_allow_changes``); the changes made are
    #: reported in ``summary.json`` (``resumed_with_changes``)
    resume_allow_changes: tuple[str, ...] = ()
    #: true while a resumed run evaluates the round it resumes at (not a scheduled evaluation)
    resume_evaluation = False
    #: whether ``fit --ckpt_path`` from a checkpoint with no rounds left tests its model as a
    #: finished fit does (a grid does not: it tests its configurations in its training loop)
    tests_finished_checkpoint = True
    #: whether a run resumed between evaluations evaluates its first round (a grid does not)
    evaluates_on_resume = True
    _no_rounds_left: tuple[int, int] | None = None  # (checkpoint round, run's rounds)
    _no_rounds_left_note: str | None = None
    _final_val: dict[str, Any] | None = None  # a finished checkpoint's last validation
    _resumed_with_changes: dict[str, Any] | None = None

    def __init__(
        self,
        model: nn.Module,
        algorithm: FederatedAlgorithm,
        criterion: nn.Module | None = None,
        grad_backend: Backend = "auto",
        epsilon_every: int | None = None,
        cuda_graphs: bool = False,
        client_chunk: int | str = "auto",
        client_state: Placement = "auto",
        state_dir: str | None = None,
        client_span: Literal["auto", "on", "off"] = "auto",
    ) -> None:
        super().__init__()
        wiring.check_arguments(model, algorithm, grad_backend, epsilon_every, cuda_graphs,
                               client_chunk, client_state, client_span)  # fmt: skip
        # Hyperparameters: under LightningCLI, the config's model section (the model's and the
        # algorithm's class_path and init_args, which Lightning hands over while it builds the
        # module), so that ``load_from_checkpoint(path)`` rebuilds both; in Python the arguments
        # that are not modules (pass model=..., algorithm=... to load_from_checkpoint then)
        from_cli = compat.hyperparameters_from_cli(self)
        modules = {"model": model, "algorithm": algorithm, "criterion": criterion}
        self.save_hyperparameters(
            ignore=[] if from_cli else [k for k, v in modules.items() if isinstance(v, nn.Module)],
            logger=False,
        )
        self.automatic_optimization = False
        self.model = model
        self.algorithm = algorithm
        self.criterion = criterion if criterion is not None else nn.CrossEntropyLoss()
        self.grad_backend, self.cuda_graphs = grad_backend, cuda_graphs
        self.epsilon_every = epsilon_every
        self.client_chunk, self.client_state, self.state_dir = client_chunk, client_state, state_dir
        self.client_span = client_span
        self.layout = ParameterLayout(model)
        self.oracle: GradientOracle | None = None
        self.privacy_ledger: PrivacyLedger | None = None
        self.test_accuracy: MulticlassAccuracy | None = None
        self.val_accuracy: MulticlassAccuracy | None = None
        self._chunk_size = 1
        self._validated_round: int | None = None  # the round of the last validation
        self._final_test: dict[str, Any] | None = None  # the end-of-fit test evaluation
        self._last_round: RoundResult | None = None
        self.local_batches = 1
        self._logging_round = True
        self.client_transmissions = 0
        self._output_report: dict[str, Any] | None = None
        self._saved_ledger: dict[str, Any] = {}  # a loaded checkpoint's, until setup

    def algorithms(self) -> list[tuple[str, FederatedAlgorithm]]:
        """The algorithms this run trains, with their ``state_dict`` prefixes (a grid adds one
        per configuration)."""
        return [("algorithm.", self.algorithm)]

    # ------------------------------------------------------------------ setup
    @override
    def setup(self, stage: str) -> None:
        wiring.adopt_trainer(self.trainer, stage)  # checks it; its checkpoints and W&B in rounds
        if self.oracle is not None:
            return
        setup = wiring.set_up(self.trainer, self, stage, self._saved_ledger)
        self.oracle, self._chunk_size = setup.oracle, setup.chunk_size
        self.local_batches = setup.local_batches
        if self.algorithm.noise is not None:
            self.privacy_ledger = self._privacy_ledger(setup.num_rounds)
            if self._saved_ledger:  # load_from_checkpoint: the run's noise and ε so far
                wiring.restore_ledger(self, self._saved_ledger)
        if setup.num_classes:
            self.test_accuracy = MulticlassAccuracy(num_classes=setup.num_classes, average="micro")
            self.val_accuracy = MulticlassAccuracy(num_classes=setup.num_classes, average="micro")

    def _privacy_ledger(self, num_rounds: int) -> PrivacyLedger:
        """The run's ledger (:func:`~pl_privfed.wiring.privacy_ledger`)."""
        stds = [alg.noise_std for _, alg in self.algorithms()]
        return wiring.privacy_ledger(self.algorithm, stds, num_rounds)

    @override
    def configure_optimizers(self):
        return wiring.RoundOptimizer(self.parameters(), [("step_size", self.algorithm)])

    @override
    def forward(self, x: Tensor) -> Tensor:
        return self.model(x)

    # ------------------------------------------------------------------ one round
    def chunk_size(self) -> int:
        """Clients per chunk of this run's rounds, chosen at setup
        (:func:`~pl_privfed.engine.choose_chunk_size`)."""
        return self._chunk_size

    def logging_round(self) -> bool:
        """Whether the current round's metrics are logged (for callbacks: the protocol
        ``callbacks._logging.logs_this_round`` reads)."""
        return self._logging_round

    @override
    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:
        if isinstance(batch, tuple | list):  # stacked tensors: served by client
            batch = TensorRoundBatch(*batch)
        round_index = self.global_step
        self._logging_round = trainer_rounds.logs_round(self.trainer, round_index)
        return self.run_round(batch, round_index)

    def run_round(self, batch: Any, round_index: int) -> Tensor | None:
        """Round ``round_index`` on the round's data: the engine's round from the global
        model, then the new parameters (and buffers) written into it."""
        rows = self.algorithm.client_rows
        oracle = RoundOracle(self.oracle, batch, self.local_batches, rows=rows)
        x, logs = self.layout.flatten(self.model), self._logging_round
        result = run_round(self.algorithm, x, oracle, chunk_size=self._chunk_size, statistics=logs)
        # mean over the (computing) clients of the minibatch loss at x^k; None when no client
        # computed this round (e.g. nobody was sampled)
        loss = result.loss
        if loss is not None and not math.isfinite(loss.item()):
            raise NonFiniteLossError(
                f"non-finite training loss ({loss.item()}) at round {round_index}; "
                "stopping (lower the step size, or check the data and model)"
            )
        with torch.no_grad():  # the running statistics of the clients' last shared-parameter
            for name, value in (result.buffers or {}).items():  # evaluation (local steps: none)
                self.model.get_buffer(name).copy_(value)
        self.layout.assign(self.model, result.params)
        if loss is not None and self._logging_round:
            self.log("train/loss", loss, prog_bar=True, batch_size=1)
        self._end_round(result, round_index)
        return loss

    def _end_round(self, result: RoundResult, round_index: int) -> None:
        """What every round ends with: the round counted, its messages and privacy accounted."""
        self.optimizers().step()
        self._last_round = result
        sent = result.client_transmissions
        self.client_transmissions += sent  # paper 004 Fig. 2's x-axis, k · p · M
        if self._logging_round:
            total = float(self.client_transmissions)
            self.log("comm/client_transmissions", float(sent), batch_size=1)
            self.log("comm/client_transmissions_total", total, batch_size=1)
        if self.privacy_ledger is not None:
            self.privacy_ledger.account(round_index, released=result.released)
            invariants.charged(self.algorithm, round_index, result.released)  # the check mode
            last = trainer_rounds.is_last_round(self.trainer, round_index)
            every = self.epsilon_every
            due = self._logging_round if every is None else (round_index + 1) % every == 0
            if due or last:
                self._log_epsilon(exact=last)

    def _log_epsilon(self, exact: bool = True) -> None:
        """ε against the headline adversary (the progress bar names it), every adversary's
        (``privacy/epsilon_<adversary>``) and the papers' convention; before the last round
        the accountant's cheaper upper bound (the PLD at a coarse discretization, within about
        1 % of the exact ε at a tenth of the cost), on the last round the exact ε."""
        ledger, upper = self.privacy_ledger, not exact
        self.log("privacy/epsilon", ledger.epsilon(upper=upper), prog_bar=True, batch_size=1)
        for adversary in ledger.adversaries:
            epsilon = ledger.epsilon(adversary=adversary, upper=upper)
            self.log(f"privacy/epsilon_{adversary}", epsilon, batch_size=1)
        paper = ledger.epsilon_paper(upper=upper)
        self.log("privacy/epsilon_paper_convention", paper, batch_size=1)

    @override
    def on_fit_start(self) -> None:
        # fit --ckpt_path from a checkpoint that has run all the rounds asked for: Lightning
        # trains nothing (and runs no on_train_* hook): say so, and evaluate the model as an
        # ordinary fit ends, so that summary.json reports the final round's values
        if self._no_rounds_left is not None:
            tests, validates = self.tests_finished_checkpoint, self.trainer.enable_validation
            self._no_rounds_left_note, self._final_val, test = resume.evaluate_finished(
                self._test_set_result, *self._no_rounds_left, self._validated_round,
                validate=tests and validates, test=tests)  # fmt: skip
            self._final_test = test or self._final_test

    @override
    def on_train_start(self) -> None:
        # resumed at round k, not saved right after k's evaluation: evaluate k; best-of values
        # (RunSummary) ignore it (resume_evaluation), as the uninterrupted run never made it
        if self.evaluates_on_resume and 0 < self.global_step != self._validated_round:
            self.resume_evaluation = True
            try:
                trainer_rounds.validate_now(self.trainer)
            finally:
                self.resume_evaluation = False

    @override
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # the last round is always evaluated: Lightning validates when a run is told to stop
        rounds = trainer_rounds.num_rounds(self.trainer)
        if rounds and self.global_step >= rounds:
            self.trainer.should_stop = True
        if self.trainer.should_stop and not self._logging_round:
            self._log_stopping_round()

    def _log_stopping_round(self) -> None:
        """A run stopped by a callback (a privacy budget, early stopping) on a round that logs
        nothing still ends with its last round's training loss and ε logged: the summary, the
        curves and the progress bar show where it stopped."""
        self._logging_round = True
        loss = getattr(self._last_round, "loss", None)
        if loss is not None and self.logs_train_loss:
            self.log("train/loss", loss, prog_bar=True, batch_size=1)
        if self.privacy_ledger is not None and self.privacy_ledger.rounds_accounted:
            self._log_epsilon()

    # ------------------------------------------------------------------ what callbacks read
    def operator_statistics(self) -> dict[str, Tensor]:
        """The last round's operator statistics (the protocol ``OperatorStatistics`` reads)."""
        return {} if self._last_round is None else self._last_round.metrics

    def communication_messages(self) -> list:
        """The last round's messages (the protocol ``CommunicationCost`` reads)."""
        return [] if self._last_round is None else self._last_round.messages

    def privacy_mechanisms(self) -> list[Mechanism]:
        """The Gaussian mechanisms of the round last run (the ledger's; ``PrivacyBudget``)."""
        return [] if self.privacy_ledger is None else self.privacy_ledger.last_mechanisms()

    def next_privacy_mechanisms(self) -> list[Mechanism]:
        """The Gaussian mechanisms the next round will apply."""
        return [] if self.privacy_ledger is None else self.privacy_ledger.next_mechanisms()

    def privacy_report(self) -> dict[str, Any] | None:
        """What the run spent, under two accountings (:meth:`PrivacyLedger.report`)."""
        return None if self.privacy_ledger is None else self.privacy_ledger.report()

    def summary_entries(self) -> dict[str, Any]:
        """Entries for ``summary.json``: the total client-to-server transmissions, the test set's
        metrics at the end of fit and, for an algorithm with a sampled output iterate (paper
        001 Algorithm 1 line 16), where it came from and how it does on the test set."""
        entries: dict[str, Any] = {"client_transmissions": self.client_transmissions}
        if self.oracle is not None:  # what grad_backend (e.g. auto) resolved to
            per_client, per_example = self.oracle.backend, self.oracle.example_backend
            entries["grad_backend"] = {"per_client": per_client, "per_example": per_example}
        note, changes = self._no_rounds_left_note, self._resumed_with_changes
        entries.update(resume.summary_entries(note, self.resume_allow_changes, changes))
        if self._output_report is not None:
            entries["output_iterate"] = self._output_report
        for split, final in (("val", self._final_val), ("test", self._final_test)):
            for key in ("accuracy", "loss", "round") if final and "loss" in final else ():
                entries[f"final_{split}_{key}"] = final[key]  # val: replaces RunSummary's
        return entries

    # ------------------------------------------------------------------ evaluation
    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "val")

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: Any, stage: str) -> None:
        """Log ``<stage>/loss`` and ``<stage>/acc`` (``stage``: ``val`` or ``test``)."""
        inputs, targets = batch
        out, loss = evaluation.model_loss(self.model, self.criterion, inputs, targets)
        self.log(f"{stage}/loss", loss, on_epoch=True, prog_bar=True)
        accuracy = self.val_accuracy if stage == "val" else self.test_accuracy
        if accuracy is not None:
            accuracy(out, targets)
            self.log(f"{stage}/acc", accuracy, on_epoch=True, prog_bar=True)

    @override
    def on_validation_epoch_end(self) -> None:
        if not self.trainer.sanity_checking:
            self._validated_round = int(self.global_step)

    def _test_metrics(self, **kwargs: Any) -> tuple[float, float | None] | None:
        """The test set's loss and accuracy for the model as it is (``None`` without one)."""
        classification = self.test_accuracy is not None
        return evaluation.test_set_metrics(
            self.trainer, self.model, self.criterion, classification=classification, **kwargs
        )

    @torch.no_grad()
    def evaluate_test_set(self) -> dict[str, Any] | None:
        """The held-out test set, once, for the final model: called at the end of fit.

        Selection (sweeps, reports, early stopping) reads the validation split; the test set is
        measured here, after the last round, for the model that training produced: logged as
        ``test/loss`` and ``test/acc`` at the last round and written to ``summary.json``
        (``final_test_accuracy``, ``final_test_loss``, ``final_test_round``). ``None`` when the
        datamodule has no test set.
        """
        return self._test_set_result(int(self.global_step)) if self.oracle is not None else None

    def _test_set_result(self, round_index: int, split: str = "test") -> dict[str, Any] | None:
        """The test set's (``split``'s) result for the model as it is, logged at a round."""
        metrics = self._test_metrics(split=split)
        return evaluation.test_set_result(self.trainer, metrics, round_index, split)

    @torch.no_grad()
    def evaluate_output_iterate(self) -> dict[str, Any]:
        """Test loss and accuracy at the algorithm's sampled output ``x_out`` (``output()``), in
        place of the global model (the agents' average ``x̄``, what the curves show)."""
        return evaluation.output_iterate_report(
            self.algorithm.output(), self.model, self.layout, self._test_metrics
        )

    @override
    def on_train_end(self) -> None:
        self._final_test = self.evaluate_test_set()
        if callable(getattr(self.algorithm, "output", None)) and self.algorithm.rounds_done > 0:
            self._output_report = self.evaluate_output_iterate()

    # ------------------------------------------------------------------ checkpoints
    def run_record(self) -> dict[str, Any]:
        """What makes this run this run, kept in its checkpoints and compared on resume
        (:func:`~pl_privfed.resume.run_record`): every configuration's algorithm, the
        datamodule, the model and the loss."""
        datamodule = getattr(compat.attached_trainer(self), "datamodule", None)
        return resume.run_record(self.algorithms(), datamodule, self.model, self.criterion)

    def check_resumed_run(self, checkpoint: dict[str, Any]) -> None:
        """Refuse to resume a checkpoint written by another run (:meth:`run_record`), naming
        what differs, before anything is loaded; differences listed in
        :attr:`resume_allow_changes` are accepted and reported
        (:func:`~pl_privfed.resume.check_resume`)."""
        allowed, private = self.resume_allow_changes, self.privacy_ledger is not None
        path = self.trainer.ckpt_path
        self._resumed_with_changes = resume.check_resume(
            checkpoint, self.run_record(), allow_changes=allowed, private=private, ckpt_path=path
        )

    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint[resume.RECORD_KEY] = self.run_record()
        resume.save_client_state(checkpoint, self.algorithms(), int(self.global_step))
        if self.privacy_ledger is not None:
            self.privacy_ledger.save(checkpoint)
        checkpoint["client_transmissions"] = self.client_transmissions
        checkpoint["validated_round"] = self._validated_round

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if compat.attached_trainer(self) is not None and self.trainer.state.fn == "fit":
            self.check_resumed_run(checkpoint)  # fit --ckpt_path: the same run?
            rounds = trainer_rounds.num_rounds(self.trainer)
            self._no_rounds_left = resume.finished_rounds(checkpoint, rounds)
        if self.oracle is not None:  # set up: the state tables exist
            ckpt_path = getattr(compat.attached_trainer(self), "ckpt_path", None)
            resume.load_client_state(checkpoint, self.algorithms(), ckpt_path)
        else:  # load_from_checkpoint: the model and the algorithm's fixed buffers, for evaluation
            prefixes = [prefix for prefix, _ in self.algorithms()]
            resume.drop_client_state(checkpoint, self.state_dict(), prefixes)
            self._saved_ledger = PrivacyLedger.entries(checkpoint)
        saved = checkpoint.get("hyper_parameters") or {}
        if "_instantiator" in saved and "_instantiator" not in self.hparams:
            self.hparams.update(saved)  # rebuilt from a command's config: keep it for a re-save
            compat.reset_initial_hyperparameters(self)
        if self.privacy_ledger is not None:
            wiring.restore_ledger(self, checkpoint)  # the noise the run started with
        self.client_transmissions = int(checkpoint.get("client_transmissions", 0))
        self._validated_round = checkpoint.get("validated_round")
