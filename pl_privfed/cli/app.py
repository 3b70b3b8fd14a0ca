"""The LightningCLI of the ``pl-privfed`` command: :class:`PrivFedCLI` over
:func:`~pl_privfed.grid.federation` and the datamodules, and :func:`run_trainer_command`, which
runs ``fit``, ``validate`` or ``test`` through it."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentError, Namespace
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning import LightningModule, Trainer
from pytorch_lightning.callbacks import ModelCheckpoint, ProgressBar
from pytorch_lightning.cli import (
    ArgsType,
    LightningArgumentParser,
    LightningCLI,
    SaveConfigCallback,
)
from pytorch_lightning.loggers import WandbLogger

from pl_privfed.callbacks import (
    RoundCheckpoint,
    RoundProgressBar,
    RunSummary,
    TrainingCurves,
    check_checkpoint_file,
    default_callbacks,
)
from pl_privfed.callbacks.interrupt import restore_signals, watch_setup_signals
from pl_privfed.cli.arguments import agent_arguments, nested_nulls, sweep_run_name
from pl_privfed.cli.environment import wandb_offline_unless_logged_in
from pl_privfed.cli.errors import (
    check_config_files,
    condense_parser_error,
    one_line,
    raised_here,
)
from pl_privfed.cli.folders import (
    check_run_config,
    first_process,
    last_round_checkpoint,
    place_run,
    redirect_loggers,
)
from pl_privfed.cli.help import list_subcommands, short_module_help
from pl_privfed.cli.print_config import print_config, take_print_config
from pl_privfed.cli.seeds import RunSeeds, fan_out, given_on_command_line, seeds_of
from pl_privfed.compat.lightning import LightningCLIHooks, wandb_init_arguments, wandb_run_started
from pl_privfed.datamodules import FederatedDataModule
from pl_privfed.engine.distributed import check_strategy, close_process_group
from pl_privfed.grid import federation
from pl_privfed.logdir import local_log_dir, reserve_log_dir
from pl_privfed.module import FederatedModule

__all__ = ["LoggedConfig", "PrivFedCLI", "check_fit_arguments", "run_trainer_command"]

_DESCRIPTION = (
    "Simulate private, communication-efficient federated learning: one training step is one "
    "communication round."
)
_EPILOG = "Errors print on one line; --debug (or PL_PRIVFED_DEBUG=1) shows the traceback."
#: ``ckpt_path`` values that name no file (Lightning looks the checkpoint up)
_CKPT_ALIASES = ("last", "best", "hpc", "registry")


#: the package's arguments of fit, validate and test: ``{name: (type, help)}``
_ARGUMENTS: dict[str, tuple[Any, str]] = {
    "output_dir": (
        str | None,
        "Directory for summary.json, curves.png and curves.csv (default: the first "
        "logger's log_dir); the loggers' save_dir too, so that a run's CSV logs and "
        "offline W&B files live with it. Used by `pl-privfed sweep` for each run.",
    ),
    "seed": (
        int | None,
        "Set every seed of the run to this value: seed_everything (model init) and "
        "every `seed`/`*_seed` argument of the model and data (validation split, "
        "minibatches, partition, noise, client sampling), except split_seed (the test set "
        "stays fixed). An integer --seed_everything on the command line without --seed does "
        "the same (one knob; a config file's seed_everything seeds the model only); "
        "--print_config prints every seed so set; "
        "summary.json lists every seed used under `seeds`. A sweep's seed axis: "
        "`seed: {values: [0, 1, 2]}`.",
    ),
    "resume_allow_changes": (
        str | None,
        "With fit --ckpt_path: comma-separated settings this run may change from the "
        "checkpoint's run (as the refusal names them, e.g. algorithm.noise.seed,data.num_"
        "clients; a prefix such as algorithm.noise allows all below it); recorded in "
        "summary.json. Without it a resumed run must match the checkpoint's.",
    ),
    "run_name": (
        str | None,
        "The W&B run's name (a sweep names each run after its parameters).",
    ),
    "run_group": (
        str | None,
        "The W&B run's group (a sweep groups its runs under the sweep's name).",
    ),
}


class LoggedConfig(SaveConfigCallback):
    """Saves ``config.yaml`` in the log dir (and in ``--output_dir``) and logs the full resolved
    config to W&B runs."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Lightning's, with ``config.yaml`` in the run's own folder
        (:func:`~pl_privfed.logdir.local_log_dir`: beside its summary and checkpoints), not in
        ``trainer.log_dir``, which for a W&B logger is the ``save_dir`` every run shares."""
        if self.already_saved:
            return
        if trainer.is_global_zero:
            folder = local_log_dir(trainer)
            if self.save_to_log_dir and folder is not None:
                Path(folder).mkdir(parents=True, exist_ok=True)
                self.parser.save(
                    self.config,
                    str(Path(folder) / self.config_filename),
                    skip_none=False,
                    overwrite=True,
                    multifile=self.multifile,
                )
            self.save_config(trainer, pl_module, stage)
            self.already_saved = True
        self.already_saved = trainer.strategy.broadcast(self.already_saved)

    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """Write ``config.yaml`` to ``--output_dir`` and the config to every W&B run."""
        text = self.parser.dump(self.config, skip_none=False)
        output_dir = self.config.get("output_dir")
        if output_dir is not None and trainer.is_global_zero:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            (Path(output_dir) / self.config_filename).write_text(text)
        config = yaml.safe_load(text)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.config.update(config, allow_val_change=True)


class PrivFedCLI(LightningCLIHooks, LightningCLI):
    """LightningCLI over :class:`FederatedModule` and the datamodules.

    * the callbacks of :func:`pl_privfed.default_callbacks` on every run (summary, operator
      statistics, communication, curves, a progress bar of rounds, checkpoints named in rounds
      and written atomically, one at the end of every fit), leaving out the bar and the
      checkpoints when the trainer turns them off or brings its own bar;
    * each run's ``version_<k>`` log directory reserved atomically
      (:func:`~pl_privfed.logdir.reserve_log_dir`);
    * a model-sharding strategy (FSDP, DeepSpeed) and an unreadable ``ckpt_path`` refused
      before anything starts (DDP shards the clients over processes);
    * W&B offline without credentials, the resolved config logged to W&B runs;
    * ``fit``, ``validate`` and ``test`` (no ``predict``: a federation has no prediction set),
      with the registered subcommands (``sweep``, ``report``, ``compare``, ``demo``) listed in
      ``--help`` (:func:`~pl_privfed.cli.main` runs them);
    * while the arguments are parsed, ``--seed`` (or an integer ``--seed_everything`` on the
      command line) sets every seed of the config (:func:`~pl_privfed.cli.seeds.fan_out`), so
      ``--print_config`` prints the seeds the run uses; with ``--output_dir`` every logger's
      ``save_dir`` becomes that directory (the run's CSV logs and offline W&B files live with
      its summary); a ``WandbLogger`` is named ``--run_name`` (under ``wandb agent``: after the
      sweep parameters the agent wrote) and grouped by ``--run_group``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        wandb_offline_unless_logged_in()
        given = kwargs.get("args")
        given = sys.argv[1:] if given is None else given
        first = given[0] if isinstance(given, list | tuple) and given else None
        # the parser of the subcommand that runs, not all three (each costs some 0.4 s of CPU
        # to build); a command line without one first gets them all (and the error naming them)
        self._only = first if first in ("fit", "validate", "test") else None
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        self._own_callbacks = "trainer_defaults" not in kwargs
        kwargs.setdefault("trainer_defaults", {"callbacks": default_callbacks()})
        kwargs.setdefault("save_config_callback", LoggedConfig)
        kwargs.setdefault("auto_configure_optimizers", False)
        parser_kwargs = dict(kwargs.pop("parser_kwargs", None) or {})
        parser_kwargs.setdefault("exit_on_error", False)  # main() prints errors on one line
        parser_kwargs.setdefault("description", _DESCRIPTION)
        parser_kwargs.setdefault("epilog", _EPILOG)
        for name in self.subcommands():
            parser_kwargs.setdefault(name, {}).setdefault("exit_on_error", False)
        kwargs["parser_kwargs"] = parser_kwargs
        super().__init__(federation, FederatedDataModule, *args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test``; Lightning's ``predict`` is not offered. Only the
        one the command line starts with, when it starts with one of them: the parser of each
        is built from the signatures of the trainer, the module and the datamodules."""
        return {
            name: skip
            for name, skip in LightningCLI.subcommands().items()
            if name in ("fit", "validate", "test") and getattr(self, "_only", None) in (None, name)
        }

    #: not Lightning's merge of the checkpoint's hyperparameters into the config: the config
    #: given defines the run (a resume is checked against its checkpoint, not replaced by it);
    #: :meth:`parse_arguments` checks the file
    merge_checkpoint_hyperparameters = False

    def subcommands_added(self, parser: LightningArgumentParser, action: Any | None) -> None:
        """The registered subcommands listed for ``--help`` beside Lightning's."""
        if action is not None:
            list_subcommands(action)

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        """Parse the arguments, fan ``--seed`` out to every seed
        (:func:`~pl_privfed.cli.seeds.fan_out`), print the config if ``--print_config`` asks
        (the seeded config: it reproduces the run), and check ``ckpt_path``
        (:func:`~pl_privfed.callbacks.check_checkpoint_file`)."""
        if isinstance(args, dict | Namespace):
            super().parse_arguments(parser, args)
            argv: list[str] = []
            flags = None
        else:
            argv = [str(a) for a in (sys.argv[1:] if args is None else args)]
            rest, flags = take_print_config(argv)
            self.config = parser.parse_args(rest)
        subcommand = self.config.get("subcommand")
        config = self.config[subcommand] if subcommand else self.config
        self._seed_source = fan_out(config, given_on_command_line(argv))
        if flags is not None:
            print_config(parser, self.config, flags)
        ckpt_path = config.get("ckpt_path") if subcommand else None
        if ckpt_path is not None and ckpt_path not in _CKPT_ALIASES:
            check_checkpoint_file(ckpt_path)

    def add_instantiators(self) -> None:
        """Lightning's instantiators, keyed by :class:`FederatedModule` (the config's ``model:``
        section builds one through :func:`~pl_privfed.grid.federation`): the module saves that
        section as its hyperparameters, so ``FederatedModule.load_from_checkpoint(path)``
        rebuilds the model and the algorithm from a checkpoint of the command."""
        with warnings.catch_warnings():  # as Lightning's own call (deprecated in jsonargparse)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.parser.add_instantiator(
                self.instantiator("model"), FederatedModule, subclasses=True
            )
            self.parser.add_instantiator(
                self.instantiator("data"), FederatedDataModule, subclasses=True
            )

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        """The package's arguments beside Lightning's (``--seed``, ``--output_dir``, ...)."""
        short_module_help(parser)
        for name, (kind, help) in _ARGUMENTS.items():
            parser.add_argument(f"--{name}", type=kind, default=None, help=help)

    def before_instantiate_classes(self) -> None:
        """Check and place the run's folders, record its seeds, point its loggers at
        ``--output_dir`` and name its W&B run."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_run_config(config, self.subcommand)
        place_run(config)
        self._seeds = {"set_by": getattr(self, "_seed_source", None), **seeds_of(config)}
        redirect_loggers(config, config.get("run_name") or sweep_run_name())

    def _allow_resume_changes(self) -> None:
        """``--resume_allow_changes``: the settings a resumed run may change (the module checks
        the checkpoint's run record when it loads it)."""
        allowed = self.config["fit"].get("resume_allow_changes")
        if allowed:
            keys = tuple(key.strip() for key in str(allowed).split(",") if key.strip())
            self.model.resume_allow_changes = keys

    def instantiate_trainer(self, **kwargs: Any) -> Trainer:
        """The trainer, with :func:`pl_privfed.default_callbacks` fitted to its settings: the
        bar and the checkpoints left out when the trainer turns them off, and each default
        replaced by a callback of its kind that the config lists (a ``RunSummary`` with its own
        ``accuracy_key``, a ``RoundCheckpoint`` every 50 rounds, any progress bar or
        ``ModelCheckpoint``). ``validate`` and ``test`` write no checkpoints: no checkpoint
        callback is attached to them (unless the config lists one)."""
        init = self.config_init[self.subcommand] if self.subcommand else self.config_init
        config = {**(init.get("trainer") or {}), **kwargs}
        given = config.get("callbacks") or []
        given = given if isinstance(given, list) else [given]
        evaluation = self.subcommand in ("validate", "test")
        if evaluation and not any(isinstance(c, ModelCheckpoint) for c in given):
            kwargs["enable_checkpointing"] = False  # nor Lightning's default ModelCheckpoint
        if self._own_callbacks:
            defaults = default_callbacks(
                progress_bar=config.get("enable_progress_bar") is not False,
                checkpoint=config.get("enable_checkpointing") is not False and not evaluation,
            )
            kinds = {RoundProgressBar: ProgressBar, RoundCheckpoint: ModelCheckpoint}
            self.trainer_defaults["callbacks"] = [
                d
                for d in defaults
                if not any(isinstance(c, kinds.get(type(d), type(d))) for c in given)
            ]
        try:
            trainer = super().instantiate_trainer(**kwargs)
        except (ValueError, MisconfigurationException, ImportError) as exc:
            if raised_here(exc):
                raise
            raise ValueError(
                f"trainer ({_settings(init)}) cannot run here: {one_line(exc)}"
            ) from exc
        trainer.callbacks.append(RunSeeds(getattr(self, "_seeds", {})))
        return trainer

    def _before_run(self) -> None:
        """Checks and set-up before a subcommand runs: a strategy that shards clients, the
        run's own log directory (reserved by the first process only: under DDP the others
        are launched with ``LOCAL_RANK``/``RANK`` set and write no logs), ``--output_dir``."""
        check_strategy(self.trainer.strategy)
        first = first_process()
        for logger in self.trainer.loggers:
            if first:
                reserve_log_dir(logger)
            init = wandb_init_arguments(logger) if isinstance(logger, WandbLogger) else None
            if init is not None:
                if init.get("anonymous", False) is None:  # W&B warns about any value passed
                    del init["anonymous"]
        output_dir = self.config[self.subcommand].get("output_dir")
        for callback in self.trainer.callbacks if output_dir is not None else []:
            if isinstance(callback, RunSummary | TrainingCurves):
                callback.dirpath = output_dir

    def run_subcommand(self, subcommand: str) -> None:
        """Lightning's, with ``fit``'s signals handled from before its set-up
        (:func:`~pl_privfed.callbacks.interrupt.watch_setup_signals`: a SIGTERM or Ctrl-C
        during set-up or the privacy calibration ends the run with exit status 143/130 and a
        ``summary.json`` saying so; a second Ctrl-C ends the process at once, in one line) and
        the handlers found restored however it ends."""
        if subcommand != "fit":
            super().run_subcommand(subcommand)
            return
        watch_setup_signals(self.trainer, own_process=True)
        try:
            super().run_subcommand(subcommand)
        finally:
            restore_signals(self.trainer)

    def before_fit(self) -> None:
        """Check and set up the run; pass on ``--resume_allow_changes``; ``--ckpt_path last``
        becomes the newest round checkpoint of the run's folder
        (:func:`~pl_privfed.cli.folders.last_round_checkpoint`)."""
        self._before_run()
        self._allow_resume_changes()
        fit = self.config_init["fit"]
        if fit.get("ckpt_path") == "last":
            found = last_round_checkpoint(self.trainer, fit.get("output_dir"))
            fit["ckpt_path"] = str(check_checkpoint_file(found))

    def before_validate(self) -> None:
        """Check and set up the run; say what is scored."""
        self._before_run()
        self._say_what_is_scored()

    def before_test(self) -> None:
        """Check and set up the run; say what is scored."""
        self._before_run()
        self._say_what_is_scored()

    def _say_what_is_scored(self) -> None:
        """``validate``/``test`` without ``--ckpt_path`` score the config's model as
        initialized: say so (one line on stderr), since the config describes a training run."""
        if self.config[self.subcommand].get("ckpt_path") is None and self.trainer.is_global_zero:
            print(
                f"[pl-privfed] {self.subcommand}: no --ckpt_path, so this scores the model as "
                "initialized (untrained); give --ckpt_path <checkpoint> to score a trained one",
                file=sys.stderr,
                flush=True,
            )

    def _finish_wandb(self) -> None:
        """Close the W&B runs so that one process can run several fits (e.g. a local sweep);
        say where an offline run was saved and how to upload it."""
        for logger in self.trainer.loggers:
            if isinstance(logger, WandbLogger) and wandb_run_started(logger):
                run = logger.experiment
                offline = bool(getattr(run, "offline", False))
                folder = Path(run.dir).parent if offline and getattr(run, "dir", None) else None
                run.finish()
                if folder is not None and self.trainer.is_global_zero:
                    print(
                        f"[pl-privfed] W&B run saved offline in {folder} "
                        f"(upload: wandb sync {folder})"
                    )

    def after_fit(self) -> None:
        """Close the W&B runs."""
        self._finish_wandb()

    def after_validate(self) -> None:
        """Close the W&B runs."""
        self._finish_wandb()

    def after_test(self) -> None:
        """Close the W&B runs."""
        self._finish_wandb()


def _settings(init: Any) -> str:
    """The trainer's device settings, ``accelerator='cpu', devices=2, ...``, for an error."""
    trainer = init.get("trainer") or {}
    return ", ".join(
        f"{key}={trainer.get(key)!r}"
        for key in ("accelerator", "strategy", "devices", "num_nodes", "precision")
        if isinstance(trainer.get(key), str | int | None)
    )


def run_trainer_command(argv: list[str], *, from_command_line: bool = False) -> None:
    """Run ``fit``, ``validate`` or ``test`` (``argv[0]``) through :class:`PrivFedCLI`.

    Args:
        argv: the arguments, the subcommand first.
        from_command_line: ``argv`` is the process's command line: LightningCLI reads it from
            ``sys.argv`` (given ``args`` beside a command line draw Lightning's warning).
    """
    argv = nested_nulls(argv)
    check_config_files(argv)
    if from_command_line:
        sys.argv[1:] = argv
        PrivFedCLI()
    else:
        PrivFedCLI(args=argv)
    close_process_group()  # several processes (--trainer.strategy ddp): exit cleanly


class _ParserReady(Exception):
    """Raised by :class:`_FitParser` once its parser is built: nothing more is wanted."""

    def __init__(self, parser: LightningArgumentParser) -> None:
        self.parser = parser


class _FitParser(PrivFedCLI):
    """:class:`PrivFedCLI` as far as its parser of ``fit``: parses nothing, builds nothing."""

    def parse_arguments(self, parser: LightningArgumentParser, args: ArgsType) -> None:
        raise _ParserReady(parser)


def check_fit_arguments(points: list[tuple[str, list[str]]]) -> None:
    """Parse each ``(label, arguments)`` (``fit`` first) as ``pl-privfed fit`` parses its command line
    (the arguments as ``wandb agent`` writes them, the ``--config`` files checked), with one
    parser and without building anything: ``pl-privfed sweep`` checks its points so before the
    first one runs, and a misspelt key or a value of the wrong type is refused once, in one
    line, rather than by every process of the sweep.

    Raises:
        ValueError: naming the point's label and what its arguments get wrong.
    """
    try:
        _FitParser(args=["fit"])
    except _ParserReady as ready:
        parser = ready.parser
    else:  # pragma: no cover - parse_arguments always raises
        raise AssertionError("the parser of fit was not built")
    for label, args in points:
        argv = nested_nulls(agent_arguments(list(args)))
        try:
            check_config_files(argv)
            parser.parse_args(argv)
        except ArgumentError as exc:  # jsonargparse's: one line, as fit prints it
            raise ValueError(f"sweep point {label}: {condense_parser_error(str(exc))}") from exc
        except ValueError as exc:
            raise ValueError(f"sweep point {label}: {one_line(exc)}") from exc
