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
:func:`set_seeds`), ``--output_dir`` (the run's summary, curves and the loggers' files),
``--run_name`` and ``--run_group`` (its W&B run's name and group). Arguments as ``wandb agent``
writes them are accepted (:func:`agent_arguments`): every file in ``configs/sweeps`` runs
unchanged under ``wandb sweep`` + ``wandb agent``, from any working directory of a checkout.

An error the user can fix ends the command with one line, ``pl-privfed: error: <what>``, and exit
status 2 (:func:`error_line`); ``--debug`` or ``PL_PRIVFED_DEBUG=1`` shows the traceback.
"""

from __future__ import annotations

import argparse
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
from pytorch_lightning import seed_everything
from pytorch_lightning.callbacks import ModelCheckpoint, ProgressBar
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback
from pytorch_lightning.loggers import WandbLogger
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
from pl_privfed.logdir import reserve_log_dir
from pl_privfed.module import NonFiniteLossError

__all__ = [
    "LoggedConfig",
    "PrivFedCLI",
    "agent_arguments",
    "check_config_files",
    "check_results_have_runs",
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

#: Seed arguments that ``--seed`` leaves alone: the train/test split stays fixed.
_FIXED_SEEDS = ("split_seed",)


def _seed_slots(node: Any, path: str = "") -> Iterator[tuple[Namespace, str, str]]:
    """``(namespace, key, dotted path)`` of every seed argument (``seed`` or ``*_seed``) under
    ``node``, a parsed config."""
    if isinstance(node, Namespace):
        for key in list(vars(node)):
            value = getattr(node, key)
            dotted = f"{path}.{key}" if path else key
            seedlike = key == "seed" or (key.endswith("_seed") and key not in _FIXED_SEEDS)
            if seedlike and (
                value is None or (isinstance(value, int) and not isinstance(value, bool))
            ):
                yield node, key, dotted
            else:
                yield from _seed_slots(value, dotted)
    elif isinstance(node, list | tuple):
        for i, item in enumerate(node):
            yield from _seed_slots(item, f"{path}[{i}]")


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
        super()._parse_ckpt_path()

    def add_arguments_to_parser(self, parser) -> None:
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
            "stays fixed). A sweep's seed axis: `seed: {values: [0, 1, 2]}`.",
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

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.get("seed") is not None:
            set_seeds(config, int(config["seed"]))
            seed_everything(int(config["seed"]), workers=True)
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
        ``ModelCheckpoint``)."""
        if self._own_callbacks:
            init = self.config_init[self.subcommand] if self.subcommand else self.config_init
            config = {**(init.get("trainer") or {}), **kwargs}
            given = config.get("callbacks") or []
            given = given if isinstance(given, list) else [given]
            defaults = default_callbacks(
                progress_bar=config.get("enable_progress_bar") is not False,
                checkpoint=config.get("enable_checkpointing") is not False,
            )
            kinds = {RoundProgressBar: ProgressBar, RoundCheckpoint: ModelCheckpoint}
            self.trainer_defaults["callbacks"] = [
                d
                for d in defaults
                if not any(isinstance(c, kinds.get(type(d), type(d))) for c in given)
            ]
        return super().instantiate_trainer(**kwargs)

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
        first = all(
            int(os.environ.get(k, "0") or 0) == 0 for k in ("RANK", "LOCAL_RANK", "NODE_RANK")
        )
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

    def before_test(self) -> None:
        self._before_run()

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


def check_results_have_runs(paths: list[str]) -> None:
    """Refuse a ``results.csv`` with no run, or with no finished one (every run failed or was
    interrupted), naming it: a report of nothing must not look like a report. Files that do not
    exist or do not parse are left to the report to name."""
    import csv

    for name in paths:
        path = Path(name)
        if path.is_dir():
            path = path / "results.csv"
        try:
            with path.open(newline="") as f:
                rows = list(csv.DictReader(f))
        except (OSError, UnicodeDecodeError, csv.Error):
            continue
        if not rows:
            raise ValueError(f"{name} holds no runs: nothing to report (did the sweep run?)")
        statuses = [str(row.get("status") or "") for row in rows]
        if "finished" not in statuses:
            first = next((s for s in statuses if s), "no status")
            raise ValueError(
                f"{name} holds no finished run ({len(rows)} run(s), none finished; e.g. "
                f"{first.splitlines()[0][:120]}): nothing to report"
            )


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
    check_results_have_runs(ns.results)
    for path in make_report(ns.results, ns.out, x=ns.x, y=ns.y, facet=ns.facet,
                            metric=ns.metric, vmin=ns.vmin, vmax=ns.vmax):  # fmt: skip
        print(path)
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
    if not ns.frontier:  # the frontier pools files and names a method without finished runs
        check_results_have_runs(ns.results)
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
    where = ".".join(keys) + (f" ({classes[-1]})" if classes else "")
    what = "; ".join(problems) + (f" (given: {given[0].strip()})" if given else "")
    return f"{where}: {what}"


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
    return None


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
