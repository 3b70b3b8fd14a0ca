"""The ``pl-privfed`` command: LightningCLI over :class:`FederatedModule` and the datamodules.

``pl-privfed fit --config configs/quickstart.yaml`` trains; every value can be overridden on the
command line (``--model.algorithm.init_args.beta 0.1``); ``--print_config`` shows the resolved
config; ``validate`` and ``test`` evaluate a checkpoint (``--ckpt_path``). ``pl-privfed sweep
<sweep.yaml>`` runs a grid sweep file locally (:mod:`pl_privfed.sweep`) and ``pl-privfed report
<results.csv>`` draws its figures and table (:mod:`pl_privfed.report`); ``pl-privfed compare
<a/results.csv> <b/results.csv> --out DIR`` draws the best configuration of each sweep against
rounds and bits (with ``--frontier``, the privacy–utility frontier: test accuracy against
certified ε); ``pl-privfed demo`` runs the demo (:mod:`pl_privfed.demo`). ``pl-privfed
--help`` lists them all.

Beside the LightningCLI arguments, ``fit`` takes ``--seed N`` (every seed of the run, see
:func:`set_seeds`; an integer ``--seed_everything N`` on the command line without ``--seed`` is taken as
``--seed N``,
and ``summary.json`` lists every seed used), ``--output_dir`` (the run's summary, curves and the loggers' files),
``--run_name`` and ``--run_group`` (its W&B run's name and group). Arguments as ``wandb agent``
writes them are accepted (:func:`agent_arguments`): every file in ``configs/sweeps`` runs
unchanged under ``wandb sweep`` + ``wandb agent``, from any working directory of a checkout.

An error the user can fix ends the command with one line, ``pl-privfed: error: <what>``, and exit
status 2 (:func:`error_line`); ``--debug`` or ``PL_PRIVFED_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentError, ArgumentParser, Namespace
from lightning_fabric.utilities.exceptions import MisconfigurationException
from pytorch_lightning import Callback, seed_everything
from pytorch_lightning.callbacks import ModelCheckpoint, ProgressBar
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback, _InstantiatorFn
from pytorch_lightning.loggers import CSVLogger, WandbLogger
from pytorch_lightning.utilities.exceptions import SIGTERMException

from pl_privfed.callbacks import (
    RoundCheckpoint,
    RoundProgressBar,
    RunSummary,
    TrainingCurves,
    default_callbacks,
)
from pl_privfed.callbacks.checkpoint import check_checkpoint_file
from pl_privfed.datamodules import FederatedDataModule
from pl_privfed.datamodules.files import DataFileError
from pl_privfed.engine.distributed import check_strategy, close_process_group
from pl_privfed.grid import federation
from pl_privfed.logdir import check_writable_dir, reserve_log_dir
from pl_privfed.module import FederatedModule, NonFiniteLossError

__all__ = [
    "LoggedConfig",
    "PrivFedCLI",
    "agent_arguments",
    "check_config_files",
    "condense_parser_error",
    "error_line",
    "main",
    "set_seeds",
    "wandb_offline_unless_logged_in",
]

#: one-line help of the Trainer subcommands, in the package's terms
TRAINER_COMMANDS = {
    "fit": "Train a federation: one training step is one communication round (--config <yaml>).",
    "validate": "Evaluate a model on the held-out set (--ckpt_path <checkpoint> to load one).",
    "test": "Test a model on the held-out set (--ckpt_path <checkpoint> to load one).",
}
#: the subcommands that are not Trainer methods, with their one-line help
EXTRA_COMMANDS = {
    "sweep": "Run a W&B grid sweep file locally (sequentially, resumable).",
    "report": "Heatmaps, curves and a paper-style table from a sweep's results.csv.",
    "compare": "The best run of each sweep side by side, against rounds and bits; with "
    "--frontier, test accuracy against certified ε per method.",
    "demo": "Train on the embedded digits: a useful private run beside its non-private "
    "twin and a second algorithm at the same ε; prints a table, saves a figure.",
}
DEBUG_ENV = "PL_PRIVFED_DEBUG"
ERROR_PREFIX = "pl-privfed: error: "
PACKAGE_DIR = Path(__file__).resolve().parent

#: The repository root of the installed package: sweep commands name configs relative to it.
REPO_ROOT = Path(__file__).resolve().parents[1]

#: The seeds numpy (and so ``seed_everything``) accepts.
SEED_RANGE = (0, 2**32 - 1)


def check_seed(value: Any, option: str) -> None:
    """``ValueError`` naming ``option`` unless ``value`` is a seed numpy accepts (an integer from
    0 to 2³² − 1; Lightning's ``seed_everything`` ends in numpy's traceback otherwise)."""
    if isinstance(value, bool) or value is None:
        return  # seed_everything: true (a random seed) or false (none)
    low, high = SEED_RANGE
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(
            f"{option} {value} is out of range: a seed is an integer from {low} to {high}"
        )


#: Seed arguments that ``--seed`` leaves alone: the train/test split stays fixed.
_FIXED_SEEDS = ("split_seed",)


def _seed_slots(
    node: Any, path: str = "", fixed: bool = False
) -> Iterator[tuple[Namespace, str, str]]:
    """``(namespace, key, dotted path)`` of every seed argument (``seed`` or ``*_seed``) under
    ``node``, a parsed config; the seeds that stay fixed (``split_seed``) only with ``fixed``."""
    if isinstance(node, Namespace):
        for key in list(vars(node)):
            value = getattr(node, key)
            dotted = f"{path}.{key}" if path else key
            seedlike = key == "seed" or (
                key.endswith("_seed") and (fixed or key not in _FIXED_SEEDS)
            )
            if seedlike and (
                value is None or (isinstance(value, int) and not isinstance(value, bool))
            ):
                yield node, key, dotted
            else:
                yield from _seed_slots(value, dotted, fixed)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            yield from _seed_slots(item, f"{path}[{i}]", fixed)


def set_seeds(config: Namespace, seed: int) -> list[str]:
    """Set every seed of a parsed run config to ``seed``; return the dotted paths set.

    ``seed_everything`` (the model's initialization and any global generator) and every
    ``seed`` or ``*_seed`` argument of the model and the data (the validation split and the
    clients' minibatch streams, the partition, the noise, client sampling, a random graph),
    except ``split_seed``: the train/test split stays fixed, so every seed is measured on the
    same test set. One integer thus gives a consistent, reproducible replicate of a run.
    """
    config["seed_everything"] = seed
    done = ["seed_everything"]
    for section in ("model", "data"):
        for node, key, dotted in _seed_slots(config.get(section), section):
            setattr(node, key, seed)
            done.append(dotted)
    return done


#: strategies that shard the model (named as ``--trainer.strategy`` strings): refused by name
#: before Lightning builds them (on a CPU Lightning's own refusal of FSDP is a traceback)
_SHARDING_STRATEGIES = ("fsdp", "deepspeed", "model_parallel", "xla_fsdp")


def _loggers(config: Namespace) -> list[Any]:
    loggers = config.get("trainer.logger")
    return loggers if isinstance(loggers, list) else [loggers]


def check_run_config(config: Namespace, subcommand: str | None) -> None:
    """Refuse, before anything is built or written, what would fail later with a traceback: a
    run of no rounds, a strategy that shards the model, and folders that cannot be written
    (``--output_dir``, ``trainer.default_root_dir``, the loggers' ``save_dir``,
    ``model.state_dir``, ``model.grid_dir``: a file on the way, or read-only)."""
    max_steps = config.get("trainer.max_steps")
    if subcommand == "fit" and isinstance(max_steps, int) and (max_steps == 0 or max_steps < -1):
        raise ValueError(
            f"trainer.max_steps={max_steps}: a run trains at least one round; give a positive "
            "number of rounds (or -1 with trainer.max_epochs)"
        )
    strategy = config.get("trainer.strategy")
    if isinstance(strategy, str) and strategy.lower().startswith(_SHARDING_STRATEGIES):
        raise ValueError(
            f"trainer.strategy={strategy!r} is not supported: pl-privfed shards the clients over "
            "processes with strategy 'ddp' (or 'auto' for one device); sharding the model (FSDP, "
            "DeepSpeed, model parallelism) does not apply to a simulated federation"
        )
    folders = [
        ("--output_dir", config.get("output_dir")),
        ("trainer.default_root_dir", config.get("trainer.default_root_dir")),
        ("model.state_dir", config.get("model.state_dir")),
        ("model.grid_dir", config.get("model.grid_dir")),
    ]
    for logger in _loggers(config):
        init_args = getattr(logger, "init_args", None)
        if isinstance(init_args, Namespace) and isinstance(init_args.get("save_dir"), str):
            kind = str(logger.class_path).rsplit(".", 1)[-1]
            folders.append((f"trainer.logger ({kind}) save_dir", init_args["save_dir"]))
    for what, folder in folders:
        if isinstance(folder, str | os.PathLike) and str(folder):
            check_writable_dir(folder, what)


#: the run folder that the first process reserved, for the processes Lightning's DDP launcher
#: starts (``<pid of the first process>:<folder>``)
RUN_DIR_ENV = "PL_PRIVFED_RUN_DIR"


def _first_process() -> bool:
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def place_run(config: Namespace) -> None:
    """Keep every file of a run in its folder: with ``--output_dir`` the trainer's
    ``default_root_dir`` becomes it too (checkpoints, ``config.yaml``, client state), unless
    given; without a logger and without either, the run gets its own
    ``lightning_logs/version_<k>`` (reserved atomically, as a logger's) instead of the working
    directory, for its summary, curves, checkpoints and ``config.yaml``."""
    output_dir = config.get("output_dir")
    if config.get("trainer.default_root_dir") is not None:
        return
    if output_dir is not None:
        config["trainer.default_root_dir"] = output_dir
        return
    loggers = config.get("trainer.logger")
    if loggers is not False and loggers != []:
        return  # the loggers' folders hold the run (Lightning's default logger: lightning_logs/)
    if _first_process():
        holder = CSVLogger(os.getcwd())  # lightning_logs/version_<k>, as the default logger's
        reserve_log_dir(holder)
        run_dir = holder.log_dir
        os.environ[RUN_DIR_ENV] = f"{os.getpid()}:{run_dir}"
    else:
        pid, _, run_dir = os.environ.get(RUN_DIR_ENV, "").partition(":")
        if not run_dir or pid == str(os.getpid()):
            return
    config["trainer.default_root_dir"] = run_dir


#: arguments typed ``nn.Module``, whose help listed every subclass in torch and Opacus (some
#: 1,400 lines): it names the package's own and says that any class_path is accepted
_MODULE_ARGUMENTS = {
    "model.model": ("models", "e.g. torch.nn.Linear, torchvision.models.resnet18"),
    "model.criterion": ("losses", "e.g. torch.nn.CrossEntropyLoss, torch.nn.MSELoss"),
}


def _short_module_help(parser: ArgumentParser) -> None:
    """Show the package's classes, not every ``nn.Module`` subclass, in the help of the
    arguments typed ``nn.Module``; any ``nn.Module`` is still accepted through its
    ``class_path``."""
    from torch import nn

    import pl_privfed.models as models

    own = [
        f"{models.__name__}.{name}"
        for name in models.__all__
        if isinstance(getattr(models, name), type) and issubclass(getattr(models, name), nn.Module)
    ]
    losses = [path for path in own if path.endswith(("Loss", "Error"))]
    listed = {"model.model": [p for p in own if p not in losses], "model.criterion": losses}
    for action in parser._actions:
        if action.dest in _MODULE_ARGUMENTS and hasattr(action, "extra_help"):
            _, example = _MODULE_ARGUMENTS[action.dest]
            text = (
                f", the package's: {', '.join(listed[action.dest])}; or any torch.nn.Module by "
                f"its class_path ({example}, your own)"
            )
            action.extra_help = lambda text=text: text


def nested_nulls(args: list[str]) -> list[str]:
    """``--a.init_args.b.c null`` as an inline config, ``--config '{"a": {"init_args": {"b":
    {"c": null}}}}'``, in its place: jsonargparse (4.53) turns a ``null`` two levels below a
    class's ``init_args`` into the string ``'None'`` ("Expected a float; Expected a NoneType"),
    while a config merges it as it should (e.g. ``--model.algorithm.init_args.noise.epsilon
    null`` with a ``noise_multiplier``: a noise multiplier instead of a target ε)."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        key, value, step = None, None, 1
        if arg.startswith("--") and "=" in arg:
            key, value = arg[2:].split("=", 1)
        elif arg.startswith("--") and i + 1 < len(args):
            key, value, step = arg[2:], args[i + 1], 2
        nested = key is not None and "." in key.partition(".init_args.")[2]
        if nested and value is not None and value.strip() in ("null", "Null", "NULL", "~"):
            tree: Any = None
            for part in reversed(key.split(".")):
                tree = {part: tree}
            out += ["--config", json.dumps(tree)]
            i += step
            continue
        out.append(arg)
        i += 1
    return out


def seeds_of(config: Namespace) -> dict[str, int | None]:
    """Every seed of a parsed run config, ``{dotted path: value}``: ``seed_everything`` and each
    ``seed`` or ``*_seed`` argument of the model and the data (``split_seed`` included)."""
    out: dict[str, int | None] = {"seed_everything": config.get("seed_everything")}
    for section in ("model", "data"):
        for node, key, dotted in _seed_slots(config.get(section), section, fixed=True):
            out[dotted] = getattr(node, key)
    return out


class RunSeeds(Callback):
    """Puts the run's seeds in ``summary.json`` (``seeds``: what set them, ``--seed`` or
    ``seed_everything``, and every seed argument's value), through ``summary_entries``."""

    def __init__(self, seeds: dict[str, Any]) -> None:
        self.seeds = dict(seeds)

    def summary_entries(self) -> dict[str, Any]:
        return {"seeds": self.seeds}


def agent_arguments(args: list[str]) -> list[str]:
    """Arguments as ``wandb agent`` writes them, made parseable: ``--key=None`` (Python's
    spelling of a null sweep value) becomes ``--key=null``; a relative ``--config`` path that
    does not exist from the working directory is taken relative to the repository
    (:data:`REPO_ROOT`), so a sweep's command runs from any directory."""
    out: list[str] = []
    expect_config = False
    for arg in args:
        if arg.startswith("--") and arg.endswith("=None"):
            arg = arg[: -len("None")] + "null"
        if expect_config:
            arg = _config_path(arg)
        elif arg.startswith("--config="):
            arg = "--config=" + _config_path(arg[len("--config=") :])
        expect_config = arg == "--config"
        out.append(arg)
    return out


def _config_path(path: str) -> str:
    candidate = Path(path)
    if candidate.is_absolute() or candidate.exists() or not (REPO_ROOT / candidate).is_file():
        return path
    return str(REPO_ROOT / candidate)


def _sweep_run_name() -> str | None:
    """Under ``wandb agent``: the run's name from its sweep parameters (the file the agent
    writes at ``WANDB_SWEEP_PARAM_PATH``), e.g. ``beta=0.1 step_size=0.01 seed=0``."""
    path = os.environ.get("WANDB_SWEEP_PARAM_PATH")
    if not path or not Path(path).is_file():
        return None
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError:
        return None
    from pl_privfed.sweep import run_name

    # {parameter: {value: v}}, beside W&B's own keys (``wandb_version``)
    params = {k: v["value"] for k, v in raw.items() if isinstance(v, dict) and "value" in v}
    return run_name(params) if params else None


def wandb_offline_unless_logged_in() -> None:
    """Run W&B offline (``WANDB_MODE=offline``) unless an API key or a login is available.

    Offline runs are written under the logger's ``save_dir`` and can be uploaded later with
    ``wandb sync <dir>``; :class:`PrivFedCLI` prints that command after each run.
    """
    if "WANDB_MODE" in os.environ or os.environ.get("WANDB_API_KEY"):
        return
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return
    os.environ["WANDB_MODE"] = "offline"


class LoggedConfig(SaveConfigCallback):
    """Saves ``config.yaml`` in the log dir (and in ``--output_dir``) and logs the full resolved
    config to W&B runs."""

    def save_config(self, trainer, pl_module, stage: str) -> None:
        text = self.parser.dump(self.config, skip_none=False)
        output_dir = self.config.get("output_dir")
        if output_dir is not None and trainer.is_global_zero:
            Path(output_dir).mkdir(parents=True, exist_ok=True)
            (Path(output_dir) / self.config_filename).write_text(text)
        config = yaml.safe_load(text)
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                logger.experiment.config.update(config, allow_val_change=True)


class PrivFedCLI(LightningCLI):
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
      with ``sweep``, ``report``, ``compare`` and ``demo`` listed in ``--help`` (:func:`main`
      runs them);
    * before the classes are instantiated, ``--seed`` sets every seed of the config
      (:func:`set_seeds`); with ``--output_dir`` every logger's ``save_dir`` becomes that
      directory (the run's CSV logs and offline W&B files live with its summary); a
      ``WandbLogger`` is named ``--run_name`` (under ``wandb agent``: after the sweep
      parameters the agent wrote) and grouped by ``--run_group``.
    """

    def __init__(self, *args, **kwargs) -> None:
        wandb_offline_unless_logged_in()
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        self._own_callbacks = "trainer_defaults" not in kwargs
        argv = kwargs.get("args")
        argv = sys.argv[1:] if argv is None else argv
        #: ``--seed_everything`` given on the command line (not from a config file): the one knob
        self._seed_everything_given = isinstance(argv, list | tuple) and any(
            str(a) == "--seed_everything" or str(a).startswith("--seed_everything=") for a in argv
        )
        kwargs.setdefault("trainer_defaults", {"callbacks": default_callbacks()})
        kwargs.setdefault("save_config_callback", LoggedConfig)
        kwargs.setdefault("auto_configure_optimizers", False)
        parser_kwargs = dict(kwargs.pop("parser_kwargs", None) or {})
        parser_kwargs.setdefault("exit_on_error", False)  # main() prints errors on one line
        parser_kwargs.setdefault(
            "description",
            "Simulate private, communication-efficient federated learning: one training step "
            "is one communication round.",
        )
        parser_kwargs.setdefault(
            "epilog",
            "Errors print on one line; --debug (or PL_PRIVFED_DEBUG=1) shows the traceback.",
        )
        for name in self.subcommands():
            parser_kwargs.setdefault(name, {}).setdefault("exit_on_error", False)
        kwargs["parser_kwargs"] = parser_kwargs
        super().__init__(federation, FederatedDataModule, *args, **kwargs)

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        """``fit``, ``validate`` and ``test``; Lightning's ``predict`` is not offered."""
        return {
            name: skip
            for name, skip in LightningCLI.subcommands().items()
            if name in ("fit", "validate", "test")
        }

    def _add_subcommands(self, parser, **kwargs) -> None:
        super()._add_subcommands(parser, **kwargs)
        action = getattr(parser, "_subcommands_action", None)
        if action is None:
            return
        for name, description in EXTRA_COMMANDS.items():  # for --help; main() runs them
            sub = ArgumentParser(prog=f"pl-privfed {name}", description=description)
            action.add_subcommand(name, sub, help=description)
        for choice in getattr(action, "_choices_actions", []):  # argparse's help entries
            choice.help = TRAINER_COMMANDS.get(choice.dest, choice.help)

    def _parse_ckpt_path(self) -> None:
        """Check ``ckpt_path`` before Lightning reads the checkpoint's hyperparameters from it
        (:func:`~pl_privfed.callbacks.checkpoint.check_checkpoint_file`)."""
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if ckpt_path is not None and ckpt_path not in ("last", "best", "hpc", "registry"):
            check_checkpoint_file(ckpt_path)
        # not Lightning's merge of the checkpoint's hyperparameters into the config: the config
        # given defines the run (a resume is checked against its checkpoint, not replaced by it)

    def _add_instantiators(self) -> None:
        """Lightning's instantiators, keyed by :class:`FederatedModule` (the config's ``model:``
        section builds one through :func:`~pl_privfed.grid.federation`): the module saves that
        section as its hyperparameters, so ``FederatedModule.load_from_checkpoint(path)``
        rebuilds the model and the algorithm from a checkpoint of the command."""
        with warnings.catch_warnings():  # as Lightning's own call (deprecated in jsonargparse)
            warnings.simplefilter("ignore", DeprecationWarning)
            self.parser.add_instantiator(
                _InstantiatorFn(cli=self, key="model"), FederatedModule, subclasses=True
            )
            self.parser.add_instantiator(
                _InstantiatorFn(cli=self, key="data"), FederatedDataModule, subclasses=True
            )

    def add_arguments_to_parser(self, parser) -> None:
        _short_module_help(parser)
        parser.add_argument(
            "--output_dir",
            type=str | None,
            default=None,
            help="Directory for summary.json, curves.png and curves.csv (default: the first "
            "logger's log_dir); the loggers' save_dir too, so that a run's CSV logs and "
            "offline W&B files live with it. Used by `pl-privfed sweep` for each run.",
        )
        parser.add_argument(
            "--seed",
            type=int | None,
            default=None,
            help="Set every seed of the run to this value: seed_everything (model init) and "
            "every `seed`/`*_seed` argument of the model and data (validation split, "
            "minibatches, partition, noise, client sampling), except split_seed (the test set "
            "stays fixed). An integer --seed_everything on the command line without --seed does "
            "the same (one knob; a config file's seed_everything seeds the model only); "
            "summary.json lists every seed used under `seeds`. A sweep's seed axis: "
            "`seed: {values: [0, 1, 2]}`.",
        )
        parser.add_argument(
            "--resume_allow_changes",
            type=str | None,
            default=None,
            help="With fit --ckpt_path: comma-separated settings this run may change from the "
            "checkpoint's run (as the refusal names them, e.g. algorithm.noise.seed,data.num_"
            "clients; a prefix such as algorithm.noise allows all below it); recorded in "
            "summary.json. Without it a resumed run must match the checkpoint's.",
        )
        parser.add_argument(
            "--run_name",
            type=str | None,
            default=None,
            help="The W&B run's name (a sweep names each run after its parameters).",
        )
        parser.add_argument(
            "--run_group",
            type=str | None,
            default=None,
            help="The W&B run's group (a sweep groups its runs under the sweep's name).",
        )

    def _set_seed(self) -> None:
        """Check ``--seed`` and ``seed_everything`` (numpy's range) before Lightning seeds; an
        integer ``--seed_everything`` on the command line without ``--seed`` is taken as
        ``--seed`` (one knob: it sets every seed of the run, :func:`set_seeds`). A config file's
        ``seed_everything`` keeps Lightning's meaning (the model's initialization), so the seeds
        a config or the command line sets one by one are never overwritten by it."""
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_seed(config.get("seed"), "--seed")
        check_seed(config.get("seed_everything"), "--seed_everything")
        given = config.get("seed_everything")
        self._seed_source = "--seed" if config.get("seed") is not None else None
        if (
            self._seed_source is None
            and self._seed_everything_given
            and isinstance(given, int)
            and not isinstance(given, bool)
        ):
            config["seed"] = given
            self._seed_source = "seed_everything"
        super()._set_seed()

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        check_run_config(config, self.subcommand)
        place_run(config)
        if config.get("seed") is not None:
            set_seeds(config, int(config["seed"]))
            seed_everything(int(config["seed"]), workers=True)
        self._seeds = {"set_by": getattr(self, "_seed_source", None), **seeds_of(config)}
        output_dir = config.get("output_dir")
        name = config.get("run_name") or _sweep_run_name()
        loggers = config.get("trainer.logger")
        for logger in loggers if isinstance(loggers, list) else [loggers]:
            init_args = getattr(logger, "init_args", None)
            if not isinstance(init_args, Namespace):
                continue
            if output_dir is not None and "save_dir" in init_args:
                init_args["save_dir"] = output_dir
            if str(logger.class_path).endswith("WandbLogger"):
                if name:
                    init_args["name"] = name
                if config.get("run_group"):
                    init_args["group"] = config["run_group"]

    def _allow_resume_changes(self) -> None:
        """``--resume_allow_changes``: the settings a resumed run may change (the module checks
        the checkpoint's run record when it loads it)."""
        allowed = self.config["fit"].get("resume_allow_changes")
        if allowed:
            keys = tuple(key.strip() for key in str(allowed).split(",") if key.strip())
            self.model.resume_allow_changes = keys

    def instantiate_trainer(self, **kwargs: Any):
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
            trainer.callbacks.append(RunSeeds(getattr(self, "_seeds", {})))
            return trainer
        except (ValueError, MisconfigurationException, ImportError) as exc:
            if _raised_here(exc):
                raise
            init = self.config_init[self.subcommand] if self.subcommand else self.config_init
            trainer = init.get("trainer") or {}
            settings = ", ".join(
                f"{key}={trainer.get(key)!r}"
                for key in ("accelerator", "strategy", "devices", "num_nodes", "precision")
                if isinstance(trainer.get(key), str | int | None)
            )
            raise ValueError(f"trainer ({settings}) cannot run here: {_one_line(exc)}") from exc

    def _apply_output_dir(self) -> None:
        output_dir = self.config[self.subcommand].get("output_dir")
        if output_dir is None:
            return
        for callback in self.trainer.callbacks:
            if isinstance(callback, RunSummary | TrainingCurves):
                callback.dirpath = output_dir

    def _before_run(self) -> None:
        """Checks and set-up before a subcommand runs: a strategy that shards clients, the
        run's own log directory (reserved by the first process only: under DDP the others
        are launched with ``LOCAL_RANK``/``RANK`` set and write no logs), ``--output_dir``."""
        check_strategy(self.trainer.strategy)
        first = _first_process()
        for logger in self.trainer.loggers:
            if first:
                reserve_log_dir(logger)
            init = getattr(logger, "_wandb_init", None)
            if isinstance(logger, WandbLogger) and isinstance(init, dict):
                if init.get("anonymous", False) is None:  # W&B warns about any value passed
                    del init["anonymous"]
        self._apply_output_dir()

    def before_fit(self) -> None:
        self._before_run()
        self._allow_resume_changes()

    def before_validate(self) -> None:
        self._before_run()
        self._say_what_is_scored()

    def before_test(self) -> None:
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
            if isinstance(logger, WandbLogger) and logger._experiment is not None:
                run = logger.experiment
                offline = bool(getattr(run, "offline", False))
                folder = Path(run.dir).parent if offline and getattr(run, "dir", None) else None
                run.finish()
                if folder is not None and self.trainer.is_global_zero:
                    print(
                        f"[pl-privfed] W&B run saved offline in {folder} (upload: wandb sync {folder})"
                    )

    def after_fit(self) -> None:
        self._finish_wandb()

    def after_validate(self) -> None:
        self._finish_wandb()

    def after_test(self) -> None:
        self._finish_wandb()


def _sweep_main(args: list[str]) -> int:
    from pl_privfed.sweep import SweepLockedError, failed_runs, run_sweep

    parser = argparse.ArgumentParser(
        prog="pl-privfed sweep",
        description="Run a W&B grid sweep file locally (sequentially, resumable).",
        epilog="Arguments after `--` are added to every run, e.g. "
        "`-- --config=configs/paper/paper_reading.yaml` or `-- --trainer.max_steps=20`; they "
        "are part of each run's identity, so a shortened run is never reused as a full one.",
    )
    parser.add_argument("sweep", help="the sweep YAML (configs/sweeps/*.yaml)")
    parser.add_argument("--out", default=None, help="output directory (default sweeps/<name>)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    parser.add_argument(
        "--rerun", action="store_true", help="run the points that finished before as well"
    )
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    ns = parser.parse_args(args)
    try:
        path = run_sweep(ns.sweep, ns.out, overrides=extra, dry_run=ns.dry_run, rerun=ns.rerun)
    except SweepLockedError as error:
        print(f"pl-privfed sweep: {error}", file=sys.stderr)
        return 2
    if ns.dry_run:
        return 0
    failed = failed_runs(path)
    note = f"; {len(failed)} run(s) failed: {', '.join(failed)}" if failed else ""
    print(f"[pl-privfed sweep] results: {path}{note}")
    return 1 if failed else 0


def _report_main(args: list[str]) -> int:
    from pl_privfed.report import make_report

    parser = argparse.ArgumentParser(
        prog="pl-privfed report",
        description="Heatmaps, curves and a paper-style table from a sweep's results.csv: "
        "configurations selected on the validation split, mean ± std and 95 % intervals over "
        "seeds, the selected configurations' test accuracy.",
    )
    parser.add_argument(
        "results", nargs="+", help="results.csv written by `pl-privfed sweep` (several: one set)"
    )
    parser.add_argument("--out", default=None, help="output directory (default: report/ beside)")
    parser.add_argument("--x", default="beta", help="heatmap x column (default beta)")
    parser.add_argument("--y", default="step_size", help="heatmap y column (default step_size)")
    parser.add_argument(
        "--facet", default=None, help="one panel per value of this column (default: all others)"
    )
    parser.add_argument(
        "--metric",
        default="final_val_accuracy",
        help="validation column that selects (default final_val_accuracy; or best_val_accuracy)",
    )
    parser.add_argument(
        "--vmin", type=float, default=None, help="heatmap colour minimum (default 0 %%)"
    )
    parser.add_argument(
        "--vmax", type=float, default=None, help="heatmap colour maximum (default 100 %%)"
    )
    ns = parser.parse_args(args)
    written = make_report(ns.results, ns.out, x=ns.x, y=ns.y, facet=ns.facet,
                          metric=ns.metric, vmin=ns.vmin, vmax=ns.vmax)  # fmt: skip
    for path in written:
        print(path)
    md = next(p for p in written if p.name == "table.md").read_text()
    if "## Notes" in md:  # panels left out for want of data, overlapping intervals
        print(md.split("## Notes", 1)[1].strip())
    return 0


def _compare_main(args: list[str]) -> int:
    from pl_privfed.report import FRONTIER_SELECTION, compare_methods, frontier

    parser = argparse.ArgumentParser(
        prog="pl-privfed compare",
        description="The best configuration (on validation) of each sweep side by side, against "
        "rounds and against bits (train utility ||∇f(x̄)||² and validation accuracy, paper 001 "
        "Figs. 2-3), mean over seeds with 95 % bands; test accuracy with intervals in the table. "
        "With --frontier: the privacy-utility frontier, test accuracy against certified ε, one "
        "curve per method with 95 % bands over seeds, the non-private accuracy beside it; "
        f"{FRONTIER_SELECTION}.",
        epilog="Frontier: pl-privfed compare --frontier sweeps/frontier/frontier_<config>/"
        "results.csv sweeps/frontier/frontier_<config>_nonprivate/results.csv ... --out DIR "
        "[--labels A A ...]; files with the same label (by default the sweep folder's name "
        "without frontier_ and _nonprivate) are one method.",
    )
    parser.add_argument("results", nargs="+", help="results.csv files, one sweep per method")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--metric", default="final_val_accuracy", help="validation column that selects"
    )
    parser.add_argument(
        "--frontier",
        action="store_true",
        help="draw the privacy-utility frontier (frontier.png, .csv, .md): at each target ε the "
        "configuration selected on validation, its test accuracy against the certified ε",
    )
    parser.add_argument(
        "--labels", nargs="+", default=None, help="with --frontier: one method label per file"
    )
    ns = parser.parse_args(args)
    if ns.labels is not None and not ns.frontier:
        parser.error("--labels goes with --frontier")
    if ns.frontier:
        written = frontier(ns.results, ns.out, select=ns.metric, labels=ns.labels)
        for path in written:
            print(path)
        print(written[-1].read_text(), end="")
        return 0
    for path in compare_methods(ns.results, ns.out, metric=ns.metric):
        print(path)
    md = Path(ns.out) / "comparison.md"
    notes = md.read_text().split("Notes:", 1)[1].strip() if "Notes:" in md.read_text() else ""
    if notes:
        print(notes)
    return 0


def _demo_main(args: list[str]) -> int:
    from pl_privfed.demo import main as demo_main

    return demo_main(args, runner=main)  # the demo's runs go through this command


#: third-party warnings a run cannot act on (filtered by the command only, not the library):
#: Lightning's pytree helper calls a torch API deprecated in torch 2.10; Lightning compares
#: ``log_every_n_steps`` with an epoch's batches, but a federation logs by rounds across epochs;
#: on machines with more than two cores Lightning asks the evaluation DataLoader for workers,
#: which over the package's in-memory tensors would only add process start-up
_NOISE_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r"The number of training batches \(\d+\) is smaller than the logging interval.*",
    r"The '(val|test)_dataloader' does not have many workers.*",
    r"LightningCLI's args parameter is intended to run from within Python.*",  # main(args)
)
#: Lightning info lines that are advertisements or restate the config
_NOISE_INFO = (
    "💡 Tip:",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "Seed set to",
    "`Trainer.fit` stopped:",
)


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_NOISE_INFO)


def _quiet_third_party() -> None:
    """Filter the noise of third-party libraries that a normal run prints and cannot prevent
    (Lightning tips, a pytree deprecation, W&B's offline chatter); the command only."""
    for pattern in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in ("pytorch_lightning", "lightning.pytorch", "lightning_fabric", "lightning.fabric"):
        target = logging.getLogger(name)
        if not any(isinstance(f, _DropNoise) for f in target.filters):
            target.addFilter(_DropNoise())
        for child in list(logging.root.manager.loggerDict):
            if child.startswith(name + "."):
                child_logger = logging.getLogger(child)
                if not any(isinstance(f, _DropNoise) for f in child_logger.filters):
                    child_logger.addFilter(_DropNoise())
    if os.environ.get("WANDB_MODE") == "offline":
        os.environ.setdefault("WANDB_SILENT", "true")  # the sync hint is printed after the run


def _config_files(argv: list[str]) -> list[str]:
    """The ``--config``/``-c`` files named on the command line."""
    files = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(argv[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def check_config_files(argv: list[str]) -> None:
    """Refuse a ``--config`` file that is missing, empty or not a YAML mapping, naming it
    (jsonargparse reports an empty file as "Unexpected config: ")."""
    for name in _config_files(argv):
        if name.lstrip().startswith("{"):
            continue  # an inline YAML/JSON mapping
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"--config {name}: no such file")
        try:
            content = yaml.safe_load(path.read_text())
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"--config {name} is not a text (YAML) file: byte {exc.start} is not UTF-8"
            ) from exc
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"--config {name} is not valid YAML: {first}") from exc
        if content is None:
            raise ValueError(
                f"--config {name} is empty: a config is a YAML mapping with trainer, model "
                "and data sections (see configs/quickstart.yaml)"
            )
        if not isinstance(content, dict):
            raise ValueError(
                f"--config {name} holds a {type(content).__name__}, not a YAML mapping with "
                "trainer, model and data sections"
            )


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    out: list[BaseException] = []
    while exc is not None and all(exc is not e for e in out):
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _raised_here(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by this package's code (its innermost frame is ours)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and Path(last.tb_frame.f_code.co_filename).resolve().is_relative_to(
        PACKAGE_DIR
    )


def _raising_class(exc: BaseException) -> str | None:
    """The package class whose code raised ``exc`` (the outermost of our frames with a
    ``self``), e.g. ``DigitsDataModule`` for a bad ``data.init_args.batch_size``."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if Path(frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR):
            owner = frame.f_locals.get("self")
            if owner is not None and not isinstance(owner, LightningCLI):
                return type(owner).__name__
        tb = tb.tb_next
    return None


def _one_line(text: str) -> str:
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


_PARSER_SCAFFOLDING = (
    "Parser key",
    "Problem with given class_path",
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value",
)


def condense_parser_error(text: str) -> str:
    """jsonargparse's nested error report (one ``Parser key`` per level, the subtypes of each
    union tried, the value given at each level) as one line: the full key, the innermost class,
    what was expected or refused, and the value given.

    >>> condense_parser_error('Parser key "trainer.max_steps":\\n  Expected a <class \\'int\\'>. '
    ...                       'Got value: abc')
    "trainer.max_steps: Expected a <class 'int'>. Got value: abc"
    """
    keys = re.findall(r'Parser key "([^"]+)"', text)
    classes = re.findall(r"class_path '([^']+)'", text)
    given = re.findall(r"Given value: (.*)", text)
    problems: list[str] = []
    for raw in str(text).splitlines():
        line = raw.strip().removeprefix("- ").strip()
        if line and not line.startswith(_PARSER_SCAFFOLDING) and line not in problems:
            problems.append(line)
    if not keys or not problems:
        return _one_line(text)
    abstract = [line for line in problems if line.endswith(" is abstract")]
    if abstract:  # e.g. the base FederatedAlgorithm: the path was found, the class is a base
        name = abstract[0].rsplit(" but ", 1)[-1].removesuffix(" is abstract")
        return (
            f"{'.'.join(keys)}: {name} is an abstract base class; give one of its concrete "
            "subclasses (pl-privfed fit --help lists them)"
        )
    where = ".".join(keys) + (f" ({classes[-1]})" if classes else "")
    what = "; ".join(problems) + (f" (given: {given[0].strip()})" if given else "")
    return f"{where}: {what}"


#: errors of a file or folder the user can fix, with their exit status: a folder that is a file,
#: read-only or missing (2), a full disk (1, as a run that stopped)
_FILE_ERRNOS = {
    errno.EACCES: 2,
    errno.EPERM: 2,
    errno.EROFS: 2,
    errno.ENOTDIR: 2,
    errno.EEXIST: 2,
    errno.EISDIR: 2,
    errno.ENOSPC: 1,
    errno.EDQUOT: 1,
}


def error_line(exc: BaseException) -> tuple[str, int] | None:
    """The one line and exit status :func:`main` reports for an error the user can fix (a
    configuration, a data file, a checkpoint, a diverged run), or ``None`` for anything else
    (a bug: the traceback is shown).

    A ``ValueError`` (or ``FileNotFoundError``) raised by this package's checks is reported
    with its message, prefixed by the class that refused the value, wherever it surfaced
    (jsonargparse wraps errors raised while it instantiates classes in a "Does not validate
    against any of the Union subtypes" error with the whole namespace); jsonargparse's own
    parse errors and Lightning's configuration errors with theirs. Exit status 2 for
    configuration errors, 1 for a run that stopped on a non-finite loss.
    """
    chain = _chain(exc)
    for e in reversed(chain):  # innermost first: the package's own check
        if isinstance(e, NonFiniteLossError):
            return _one_line(str(e)), 1
        if isinstance(e, ValueError | FileNotFoundError | DataFileError) and _raised_here(e):
            owner = _raising_class(e)
            message = _one_line(str(e))
            return (f"{owner}: {message}" if owner else message), 2
    for e in chain:  # outermost first: the parser's or Lightning's own words
        if isinstance(e, ArgumentError):
            return condense_parser_error(str(e)), 2
        if isinstance(e, MisconfigurationException):
            return _one_line(str(e)), 2
    for e in reversed(chain):  # a folder or file the run could not write (or a full disk)
        if isinstance(e, OSError) and e.filename is not None and e.errno in _FILE_ERRNOS:
            return f"cannot write {str(e.filename)!r}: {e.strerror}", _FILE_ERRNOS[e.errno]
    return None


#: glibc's mallopt parameters (malloc.h) and the values the command sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
ALLOCATOR_ENV = "PL_PRIVFED_MALLOC"
_ALLOCATOR = {"mmap_threshold": 32 * 2**20, "trim_threshold": 256 * 2**20}


def tune_allocator() -> bool:
    """Let glibc's malloc keep freed memory for reuse in this process (the command's own).

    A round frees and allocates the same activations again and again. Under glibc's defaults a
    freed block above the mmap threshold, or a free top of the heap above the trim threshold, goes
    back to the kernel, and the next round's allocation faults every page in again: on this
    project's CPU that made a CNN client step through the layer rules' capturing pass (which
    holds every layer's activations at once) 1.35× as long as with these settings, and the
    plain loop's up to 1.12× (docs/performance.md). Fixed thresholds of 32 MiB (glibc's own
    ceiling for its adaptive one) and 256 MiB keep that memory in the process; blocks above 32 MiB
    are still returned. Skipped (``False``) off Linux/glibc, with ``PL_PRIVFED_MALLOC=default``,
    and when the user chose already (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
    an ``LD_PRELOAD``ed allocator such as jemalloc or tcmalloc).
    """
    import ctypes

    chosen = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")
    if (
        not sys.platform.startswith("linux")
        or os.environ.get(ALLOCATOR_ENV, "") == "default"
        or any(os.environ.get(k) for k in chosen)
    ):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _ALLOCATOR["mmap_threshold"])) and bool(
        mallopt(_M_TRIM_THRESHOLD, _ALLOCATOR["trim_threshold"])
    )


def main(args: list[str] | None = None) -> None:
    """Console entry point: LightningCLI subcommands ``fit``, ``validate`` and ``test``, plus
    ``sweep``, ``report``, ``compare`` and ``demo``.

    Every error the user can fix (a bad value, a missing data file, a damaged checkpoint, an
    empty config) ends the command with one line on stderr, ``pl-privfed: error: <what>``, and
    exit status 2 (1 for a run stopped by a non-finite loss); ``--debug`` (anywhere before a
    sweep's ``--``) or ``PL_PRIVFED_DEBUG=1`` shows the traceback instead.
    """
    argv = list(sys.argv[1:] if args is None else args)
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut] or os.environ.get(DEBUG_ENV, "") not in ("", "0")
    argv = [a for a in argv[:cut] if a != "--debug"] + argv[cut:]
    if argv and argv[0] not in ("sweep", "report", "compare", "demo"):
        argv = agent_arguments(argv)  # as `wandb agent` writes them (None, relative configs)
    wandb_offline_unless_logged_in()
    tune_allocator()
    if not debug:
        _quiet_third_party()
    try:
        if argv and argv[0] in ("sweep", "report", "compare", "demo"):
            command = {
                "sweep": _sweep_main,
                "report": _report_main,
                "compare": _compare_main,
                "demo": _demo_main,
            }[argv[0]]
            raise SystemExit(command(argv[1:]))
        if not argv:
            names = ", ".join(["fit", "validate", "test", *EXTRA_COMMANDS])
            raise ValueError(f"choose a subcommand: {names} (pl-privfed --help describes them)")
        argv = nested_nulls(argv)
        check_config_files(argv)
        if args is None:  # LightningCLI reads sys.argv (given args beside it draw a warning)
            sys.argv[1:] = argv
            PrivFedCLI()
        else:
            PrivFedCLI(args=argv)
        close_process_group()  # several processes (--trainer.strategy ddp): exit cleanly
    except SIGTERMException as exc:  # stopped on SIGTERM or Ctrl-C after a round: not finished
        raise SystemExit(exc.code or 128 + signal.SIGTERM) from None
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as exc:
        reported = None if debug else error_line(exc)
        if reported is None:
            raise
        line, code = reported
        sys.stdout.flush()
        print(ERROR_PREFIX + line, file=sys.stderr, flush=True)
        raise SystemExit(code) from None


if __name__ == "__main__":
    main()
