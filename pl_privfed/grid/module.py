"""``GridModule``: a grid of configurations of one algorithm trained as one federation.

The configurations of a grid share the data, the architecture and the initial model, and differ
only in the algorithm's hyperparameters (paper 002's grid over γ, β, α and server
normalization). They train side by side: a *configuration axis* beside the client axis. Every
round, the gradients of all ``K`` configurations' clients at their current parameters on the
round's minibatches (the same minibatches a separate run with the same seed would draw) come
from **one** call of the gradient oracle with per-client parameters ``[K·c, d]`` (and per-client
BatchNorm buffers), which is where a GPU spends its time, or, on the CPU where that call's
parameter copy would exceed :data:`STACKED_PARAMETER_BYTES`, from one call per
configuration at its own parameters, as its separate run makes it; each configuration's
algorithm then runs its own round through the engine, the configurations in lockstep chunk by
chunk.

Each configuration's iterates are those of a separate run of the same configuration (tested:
equal to the last bit in float64). A configuration whose training loss becomes non-finite is
marked failed at that round and frozen, as a separate run would stop; the others go on.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from typing_extensions import override

from pl_privfed import trainer_rounds, wiring
from pl_privfed.checks import check_choice, check_positive_int
from pl_privfed.engine import (
    ClientRows,
    OracleOutput,
    Reduction,
    RoundResult,
    expand_together,
    iter_round,
)
from pl_privfed.evaluation import model_loss
from pl_privfed.grads import RoundOracle, call_from_buffers, sum_client_buffers
from pl_privfed.grid.configuration import Configuration
from pl_privfed.grid.points import grid_points, rebuild_algorithm
from pl_privfed.grid.results import write_grid_results
from pl_privfed.grid.seeds import RUN_SEED, check_initialization, initial_parameters
from pl_privfed.grid.shared import GridBatch, GridConfigOracle
from pl_privfed.grid.views import SeedViews
from pl_privfed.logdir import local_log_dir, log_artifact
from pl_privfed.module import FederatedModule, NonFiniteLossError
from pl_privfed.privacy import PrivacyLedger, invariants

__all__ = ["STACKED_PARAMETER_BYTES", "GridModule"]

#: on the CPU, the largest per-client parameter copy ``[K·c, d]`` (bytes) a grid's stacked
#: gradient call makes; larger calls are made one configuration at a time
#: (:meth:`GridModule._stacks`; measured: ``benchmarks/grid_paths.py``, CHANGELOG.md)
STACKED_PARAMETER_BYTES = 8 * 2**20


class GridModule(FederatedModule):
    """``K`` configurations of ``algorithm`` trained as one batched federation.

    Takes :class:`~pl_privfed.FederatedModule`'s arguments and:

    Args:
        grid: ``{argument: [values]}``, e.g. ``{"step_size": [0.01, 0.1], "beta": [0.1, 1]}``
            gives 4 configurations, each with the other arguments of ``algorithm``. Each
            configuration's iterates equal those of its separate run; the results are written
            like a ``pl-privfed sweep`` into ``grid_dir``. Or a list of points
            ``[{argument: value}, ...]``; ``noise.epsilon`` sets one field of the noise. Each
            private configuration has its own privacy ledger (its σ calibrated to its own ε, its
            ε in its ``summary.json``); the run logs ``algorithm``'s. ``"--seed"`` is the run's
            seed (:mod:`pl_privfed.grid.seeds`): each configuration its separate run with
            ``pl-privfed fit --seed s``, with its own initial model, data (validation split,
            partition, minibatches), cohorts and noise; the model must be the first point's
            seed's initialization.
        grid_dir: where the grid's ``results.csv`` and ``runs/<id>/`` go (default
            ``<log dir>/grid``).
        grid_chunk: compute the grid's gradients for at most this many configurations per
            oracle call (default: all in one), to bound the memory of a large grid; the results
            do not depend on it.
        grid_memory: with ``client_state: auto``, the configurations whose client state would
            not fit in memory beside the earlier ones' (a quarter of the machine's, as for one
            run) are memory-mapped on disk (``"disk"``), or the run is refused before training
            with a ``ValueError`` naming how many configurations fit (``"refuse"``: what a
            batched sweep asks, to split its group instead,
            :class:`pl_privfed.engine.state.GridMemoryRefused`).

    Evaluation measures every configuration that has not failed (``val/*`` every
    ``val_check_interval`` rounds, ``test/*`` at the end), into each configuration's history
    and ``results.csv``; the run logs ``grid/min_train_loss``, ``grid/best_val_acc`` and
    ``grid/live_configurations``; its operator statistics and communication are the first live
    configuration's. Callbacks may measure configurations one by one
    (:meth:`load_grid_configuration`, :meth:`grid_running`, :meth:`grid_record`,
    :meth:`grid_finish`), as :class:`~pl_privfed.callbacks.GradientNorm` does.
    """

    logs_train_loss = False
    #: what RunSummary reports as the group's validation accuracy and training loss: the best
    #: configuration's (each configuration's own are in its summary.json and results.csv row)
    validation_accuracy_key = "grid/best_val_acc"
    training_loss_key = "grid/min_train_loss"
    tests_finished_checkpoint = False  # its configurations are tested in its training loop
    # the evaluation at the round a run resumes at is not one of the uninterrupted grid's: it
    # would enter neither the history nor results.csv, and costs a pass per configuration
    evaluates_on_resume = False

    def __init__(
        self,
        model: nn.Module,
        algorithm: Any,
        *,
        grid: dict[str, list[Any]] | list[dict[str, Any]],
        grid_dir: str | None = None,
        grid_chunk: int | None = None,
        grid_memory: str = "disk",
        **kwargs: Any,
    ) -> None:
        super().__init__(model, algorithm, **kwargs)
        self.grid = grid
        self.grid_dir = grid_dir
        self.grid_chunk = grid_chunk
        self.grid_memory = check_choice("grid_memory", grid_memory, ("disk", "refuse"))
        if grid_chunk is not None:
            check_positive_int("grid_chunk", grid_chunk)
        points = grid_points(self.algorithm, grid)
        self.grid_algorithms = nn.ModuleList(
            rebuild_algorithm(self.algorithm, point) for point in points
        )
        #: the configurations, each a run of its own (:class:`Configuration`)
        self.configurations = [
            Configuration(k, point, algorithm, point.get(RUN_SEED))
            for k, (point, algorithm) in enumerate(zip(points, self.grid_algorithms))
        ]
        models = self._initial_models()
        self.register_buffer("grid_params", torch.stack([self.layout.flatten(m) for m in models]))
        self._grid_buffer_names = {}
        for name, buf in self.model.named_buffers():
            if buf is None:
                continue
            key = "grid_buffer__" + name.replace(".", "__")
            self._grid_buffer_names[name] = key
            values = [dict(m.named_buffers())[name].detach() for m in models]
            self.register_buffer(key, torch.stack(values))
        self.seed_views = SeedViews(self.grid_seeds)  # each seed's data, built at setup
        self._grid_eval: Tensor | None = None  # per configuration: loss sum, correct, count

    @property
    def grid_points(self) -> list[dict[str, Any]]:
        """Each configuration's point (its values of the grid's parameters)."""
        return [c.point for c in self.configurations]

    @property
    def grid_seeds(self) -> list[int | None]:
        """Each configuration's run seed (``"--seed"`` points), else ``None``."""
        return [c.seed for c in self.configurations]

    def _initial_models(self) -> list[nn.Module]:
        """Each configuration's initial model: the model, or for a grid over the run's seed
        the model initialized from each point's seed (:mod:`pl_privfed.grid.seeds`; the model
        must be the first point's initialization)."""
        seeds = self.grid_seeds
        if seeds[0] is None:
            return [self.model] * len(seeds)
        check_initialization(self.model, seeds[0])
        built = {seeds[0]: self.model}
        for seed in seeds:
            if seed not in built:
                built[seed] = initial_parameters(self.model, seed)
        return [built[seed] for seed in seeds]

    @override
    def setup(self, stage: str) -> None:
        if self.oracle is None:  # before the algorithms are configured with their data
            self.seed_views.build(self.trainer)
        super().setup(stage)
        self.algorithm.invariants = None  # the check mode: the template draws nothing

    def algorithm_datamodule(self, prefix: str) -> Any:
        """The datamodule of the algorithm with this ``state_dict`` prefix: its seed's
        (``None``: the trainer's), what :func:`~pl_privfed.wiring.set_up` configures it with."""
        if not prefix.startswith("grid_algorithms."):
            return None
        return self.seed_views.of(int(prefix.split(".")[1]))

    @override
    def algorithms(self) -> list[tuple[str, Any]]:
        grid = [(f"grid_algorithms.{k}.", a) for k, a in enumerate(self.grid_algorithms)]
        return [*super().algorithms(), *grid]

    @override
    def configure_optimizers(self):
        # one learning rate per configuration (LearningRateMonitor: lr-RoundOptimizer/config_k)
        configurations = [(f"config_{k}", a) for k, a in enumerate(self.grid_algorithms)]
        return wiring.RoundOptimizer(self.parameters(), configurations)

    @override
    def _privacy_ledger(self, num_rounds: int) -> PrivacyLedger:
        """The run's ledger is ``algorithm``'s (what the run logs as ``privacy/*``); beside it
        every private configuration gets its own ledger, calibrated and accounted as its
        separate run's (its ε, its ``privacy`` report in its ``summary.json``), so that the
        configurations may differ in their target ε or noise."""
        ledger = super()._privacy_ledger(num_rounds)
        for c in self.configurations:
            alg = c.algorithm
            if alg.noise is not None:
                c.ledger = wiring.privacy_ledger(alg, [alg.noise_std], num_rounds)
                c.load_ledger()  # load_from_checkpoint before setup
        return ledger

    def grid_ledger(self, k: int) -> PrivacyLedger | None:
        """Configuration ``k``'s privacy ledger (``None`` when it adds no noise)."""
        return self.configurations[k].ledger

    # ------------------------------------------------------------------ what callbacks use
    def _grid_buffers(self) -> dict[str, Tensor]:
        """The configurations' buffers ``{model buffer name: [K, ...]}``."""
        return {name: getattr(self, key) for name, key in self._grid_buffer_names.items()}

    def _config_buffers(self, k: int) -> dict[str, Tensor] | None:
        """Configuration ``k``'s buffers ``{model buffer name: tensor}`` (``None``: none)."""
        return {name: v[k] for name, v in self._grid_buffers().items()} or None

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
        return [c.index for c in self.configurations if c.running]

    def grid_record(self, k: int, metric: str, round_index: int, value: float) -> None:
        """Add a point to configuration ``k``'s curve ``metric`` (its ``curves.csv``)."""
        self.configurations[k].add(metric, round_index, value)

    def grid_entries(self, k: int) -> dict[str, Any]:
        """Configuration ``k``'s extra ``summary.json`` entries (e.g. ``rounds_to_target``),
        which callbacks may fill; kept in checkpoints."""
        return self.configurations[k].entries

    def grid_finish(self, k: int, reason: str) -> None:
        """Stop training configuration ``k``: its status is ``finished`` and its
        ``summary.json`` says why in ``stopped_reason``, as a single run's does; the run stops
        when no configuration is left training."""
        self.configurations[k].finish(reason)
        if not self.grid_running():
            self.trainer.should_stop = True

    # ------------------------------------------------------------------ a grid's round
    @override
    def run_round(self, batch: Any, round_index: int) -> None:
        """One round of every live configuration, in lockstep chunk by chunk: the first
        request of each configuration for a chunk's gradients at its current parameters (what
        every server algorithm asks first) is served from one oracle call for every live
        configuration (``[K·c, d]``, per-configuration BatchNorm buffers); any other request
        (local steps, per-example gradients) goes to the oracle as in a single run."""
        live = self.grid_running()
        if not live:  # every configuration is done (e.g. reached its target)
            self.trainer.should_stop = True
            return None
        outcomes = self._lockstep(batch, live)
        computed = [k for k in live if outcomes[k].loss is not None]
        values = torch.stack([outcomes[k].loss for k in computed]).tolist() if computed else []
        loss_of = dict(zip(computed, values))
        record = round_index % self.trainer.log_every_n_steps == 0 or (
            trainer_rounds.is_last_round(self.trainer, round_index)
        )
        for k in live:
            result, loss = outcomes[k], loss_of.get(k)
            configuration = self.configurations[k]
            if loss is not None and not math.isfinite(loss):
                configuration.fail(round_index)  # frozen at the rounds it completed
                continue
            self.grid_params[k] = result.params  # every round has run: x^k is no longer read
            configuration.sent(result.client_transmissions)
            ledger = self.grid_ledger(k)
            if ledger is not None:  # what its separate run accounts after this round
                ledger.account(round_index, released=result.released)
                invariants.charged(self.grid_algorithms[k], round_index, result.released)
            for name, value in (result.buffers or {}).items():
                getattr(self, self._grid_buffer_names[name])[k].copy_(value)
            if loss is not None and record:
                self.grid_record(k, "train/loss", round_index + 1, loss)
        running = self.grid_running()
        if not running and not any(c.status == "finished" for c in self.configurations):
            self.write_grid_results()  # every configuration failed: the table still says how
            raise NonFiniteLossError(
                f"every configuration of the grid has a non-finite training loss by round "
                f"{round_index}; stopping (lower the step sizes, or check the data and model)"
            )
        if not running:
            self.trainer.should_stop = True
            return None
        finite = [loss_of[k] for k in running if k in loss_of]
        if finite and self._logging_round:
            self.log("grid/min_train_loss", min(finite), prog_bar=True, batch_size=1)
        if self._logging_round:
            self.log("grid/live_configurations", float(len(running)), batch_size=1)
        self._end_round(outcomes[running[0]], round_index)  # the first live configuration's
        return None

    def _lockstep(self, batch: Any, live: list[int]) -> dict[int, RoundResult]:
        """Every live configuration's round through the engine, one chunk of each per pass."""
        shared = GridBatch(self, batch, live)
        rounds = {}
        for k in live:
            buffers = self._config_buffers(k)
            data, steps = self.seed_views.batch(k, batch, self.local_batches)
            own = RoundOracle(self.oracle, data, steps, buffers, rows=self.grid_rows(k))
            x = self.grid_params[k]
            oracle = GridConfigOracle(shared, k, x, own)
            rounds[k] = iter_round(
                self.grid_algorithms[k],
                x,
                oracle,
                chunk_size=self._chunk_size,
                statistics=self._logging_round,
            )
        outcomes: dict[int, RoundResult] = {}
        pending = list(live)
        mapped: dict[int, Reduction] = {}  # map done, sums deferred (Reduction.defer)
        while pending:  # one chunk of every configuration per pass
            for k in [k for k in pending if k not in mapped]:
                try:
                    step = next(rounds[k])
                except StopIteration as done:
                    outcomes[k] = done.value
                    pending.remove(k)
                else:
                    if isinstance(step, Reduction):
                        mapped[k] = step
            shared.clear()
            if mapped and len(mapped) == len(pending):  # their sums in one product per seed
                expand_together(list(mapped.values()))
                mapped.clear()
        return outcomes

    def configuration_gradients(
        self, configs: list[int], ids: Tensor, batch: Any
    ) -> list[OracleOutput]:
        """The gradients of the clients ``ids`` of the configurations ``configs`` at their
        parameters (each ``[c, d]``, with losses ``[c]`` and the sums over those clients of the
        configuration's updated buffers).

        Stacked (:meth:`_stacks`): one oracle call with per-client parameters ``[K·c, d]``, the
        configurations' data along the client axis; else one call per configuration at its
        parameters ``[d]`` shared by its clients, as its separate run makes it, on its seed's
        data (fetched once per seed), which copies neither the parameters nor the data.
        Configurations whose client rows compute their own gradients (:meth:`grid_rows`, e.g.
        coordinates in the clients' data span) get them from it, those sharing one
        representation (a seed's) from one call (:meth:`~pl_privfed.engine.ClientRows.
        gradients`)."""
        own = [k for k in configs if self.grid_rows(k).computes_gradients]
        if own:
            got = dict(zip(own, self._own_gradients(own, ids, batch), strict=True))
            rest = [k for k in configs if k not in got]
            got.update(zip(rest, self.configuration_gradients(rest, ids, batch) if rest else []))
            return [got[k] for k in configs]
        if not self._stacks(len(configs), ids.numel()):
            per_view = self.seed_views.data_of(self.oracle, configs, ids, batch, self.local_batches)
            outs = []
            for k, (inputs, targets) in zip(configs, per_view, strict=True):
                x = self.grid_params[k]
                outs.append(
                    call_from_buffers(self.oracle, x, inputs, targets, self._config_buffers(k))
                )
            return outs
        inputs, targets = self.seed_views.data(self.oracle, configs, ids, batch, self.local_batches)
        k = len(configs)
        c = inputs.shape[0] // k
        rows = torch.tensor(configs, device=self.grid_params.device)

        def per_row(t: Tensor) -> Tensor:
            return t[rows].repeat_interleave(c, 0)

        buffers = {name: per_row(v) for name, v in self._grid_buffers().items()}
        out = self.oracle(per_row(self.grid_params), inputs, targets, buffers=buffers or None)
        per_config = {
            name: v.view(k, c, *v.shape[1:])
            for name, v in (self.oracle.client_buffers or {}).items()
        }
        summed = sum_client_buffers(per_config, dim=1)
        grads, losses = out.grads.view(k, c, -1), out.losses.view(k, c)
        return [
            OracleOutput(
                grads=grads[pos],
                losses=losses[pos],
                buffer_sums={name: v[pos] for name, v in summed.items()} or None,
            )
            for pos in range(k)
        ]

    def _own_gradients(self, configs: list[int], ids: Tensor, batch: Any) -> list[OracleOutput]:
        """:meth:`configuration_gradients` for configurations whose client rows compute their
        own gradients: per representation (one per seed), its data once and one call at all
        its configurations' parameters."""
        by_rows: dict[int, list[int]] = {}
        for k in configs:
            by_rows.setdefault(id(self.grid_rows(k)), []).append(k)
        out: dict[int, OracleOutput] = {}
        for group in by_rows.values():
            data, _ = self.seed_views.batch(group[0], batch, self.local_batches)
            params = self.grid_params[torch.tensor(group, device=self.grid_params.device)]
            out.update(
                zip(group, self.grid_rows(group[0]).gradients(params, ids, data), strict=True)
            )
        return [out[k] for k in configs]

    def grid_rows(self, k: int) -> ClientRows:
        """How configuration ``k``'s client rows are represented, decided at setup
        (:func:`~pl_privfed.engine.choose_client_rows`)."""
        return self.grid_algorithms[k].client_rows

    def _stacks(self, configs: int, clients: int) -> bool:
        """Whether the gradients of ``configs`` configurations for ``clients`` clients come
        from one stacked call: always on an accelerator (one launch sequence for all), on the
        CPU while its per-client parameters ``[K·c, d]`` take at most
        :data:`STACKED_PARAMETER_BYTES` (there many small calls cost more than the copy, and
        larger ones less than copying the parameters and data ``K`` times)."""
        if self.grid_params.device.type != "cpu":
            return True
        size = self.grid_params.element_size() * configs * clients * self.grid_params.shape[1]
        return size <= STACKED_PARAMETER_BYTES

    # ------------------------------------------------------------------ evaluation
    @override
    def validation_step(self, batch: Any, batch_idx: int) -> None:
        self.evaluate_configurations(*batch)

    @override
    def test_step(self, batch: Any, batch_idx: int) -> None:
        self.evaluate_configurations(*batch)

    @override
    def on_validation_epoch_end(self) -> None:
        self.seed_views.evaluate(self, "val")  # the other seeds' own validation splits
        self._grid_record_evaluation("val")
        super().on_validation_epoch_end()

    @override
    def on_test_epoch_end(self) -> None:
        self.seed_views.evaluate(self, "test")
        self._grid_record_evaluation("test")

    def evaluate_configurations(self, inputs: Tensor, targets: Tensor, configs: Any = None) -> None:
        """Loss and accuracy sums of every configuration that has not failed, on this batch
        (``configs``: of those; default, those evaluated on the trainer's datamodule)."""
        if self._grid_eval is None:
            self._grid_eval = torch.zeros(len(self.grid_points), 3, device=inputs.device)
        chosen = self.seed_views.on_trainer_data() if configs is None else configs
        for k, configuration in enumerate(self.configurations):
            if configuration.failed or k not in chosen:
                continue
            self.load_grid_configuration(k)
            out, loss = model_loss(self.model, self.criterion, inputs, targets)
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

    @override
    @torch.no_grad()
    def evaluate_test_set(self) -> dict[str, Any] | None:
        """The test set for every configuration that has not failed (its ``test/*`` point and
        ``final_test_accuracy``), once, at the end of fit."""
        if self.oracle is None:
            return None
        self._grid_eval = None
        if self._test_metrics(batch_metrics=self.evaluate_configurations) is None:
            return None
        self.seed_views.evaluate(self, "test")
        self._grid_record_evaluation("test", log=False)
        return {"round": int(self.global_step)}

    @override
    def on_train_end(self) -> None:
        self._final_test = self.evaluate_test_set()  # before the results are written
        for configuration in self.configurations:
            if configuration.running:
                configuration.finish()
        results = self.write_grid_results()
        if results is not None:  # on a W&B logger, the table as an artifact
            log_artifact(self.trainer, results, "grid-results")

    # ------------------------------------------------------------------ results
    def _grid_results_dir(self) -> Path:
        """``grid_dir``, by default ``<log dir>/grid``."""
        if self.grid_dir is not None:
            return Path(self.grid_dir)
        return Path(local_log_dir(self.trainer) or self.trainer.default_root_dir) / "grid"

    def write_grid_results(self) -> Any:
        """Write the grid's ``results.csv`` and ``runs/<id>/`` (:func:`write_grid_results`)."""
        if not self.trainer.is_global_zero:
            return None
        return write_grid_results(
            self._grid_results_dir(),
            self.configurations,
            int(self.global_step),
            [self.seed_views.entries(k) for k in range(len(self.configurations))],
        )

    @override
    def summary_entries(self) -> dict[str, Any]:
        entries = super().summary_entries()
        entries["grid"] = {
            "configurations": len(self.grid_points),
            "finished": sum(c.status == "finished" for c in self.configurations),
            "failed": sum(c.failed for c in self.configurations),
            "results": str(self._grid_results_dir() / "results.csv"),  # written by the module
        }
        return entries

    # ------------------------------------------------------------------ checkpoints
    @override
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["grid"] = {"configurations": [c.state_dict() for c in self.configurations]}

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        if "grid" not in checkpoint:
            return
        saved = checkpoint["grid"].get("configurations")
        if saved is None:
            raise ValueError(
                "this grid checkpoint was written by an older pl-privfed (its configurations "
                "kept as parallel lists): resume it with the version that wrote it, or start "
                "the grid again"
            )
        for configuration, state in zip(self.configurations, saved, strict=True):
            configuration.load_state_dict(state)
