"""The ``pl-privfed`` command: LightningCLI over :class:`FederatedModule` and the datamodules.

``pl-privfed fit --config configs/quickstart.yaml`` trains; every value can be overridden on the
command line (``--model.algorithm.init_args.beta 0.1``); ``--print_config`` shows the resolved
config; ``validate`` and ``test`` evaluate a checkpoint (``--ckpt_path``). ``pl-privfed sweep
<sweep.yaml>`` runs a grid sweep file locally (:mod:`pl_privfed.sweep`) and ``pl-privfed report
<results.csv>`` draws its figures and table (:mod:`pl_privfed.report`); ``pl-privfed compare
<a/results.csv> <b/results.csv> --out DIR`` draws the best configuration of each sweep against
rounds and bits.

Beside the LightningCLI arguments, ``fit`` takes ``--seed N`` (every seed of the run, see
:func:`set_seeds`), ``--output_dir`` (the run's summary, curves and the loggers' files),
``--run_name`` and ``--run_group`` (its W&B run's name and group). Arguments as ``wandb agent``
writes them are accepted (:func:`agent_arguments`): every file in ``configs/sweeps`` runs
unchanged under ``wandb sweep`` + ``wandb agent``, from any working directory of a checkout.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import Namespace
from pytorch_lightning import seed_everything
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback
from pytorch_lightning.loggers import WandbLogger

from pl_privfed.callbacks import CommunicationCost, OperatorStatistics, RunSummary, TrainingCurves
from pl_privfed.datamodules import FederatedDataModule
from pl_privfed.module import FederatedModule

__all__ = [
    "LoggedConfig",
    "PrivFedCLI",
    "agent_arguments",
    "main",
    "set_seeds",
    "wandb_offline_unless_logged_in",
]

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
    ``wandb sync <dir>``.
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
    """LightningCLI with W&B offline without credentials, the resolved config logged to W&B, and
    these callbacks always on: :class:`RunSummary`, :class:`OperatorStatistics`,
    :class:`CommunicationCost`, :class:`TrainingCurves`.

    Before the classes are instantiated, ``--seed`` sets every seed of the config
    (:func:`set_seeds`); with ``--output_dir`` every logger's ``save_dir`` becomes that directory
    (the run's CSV logs and offline W&B files live with its summary); a ``WandbLogger`` is named
    ``--run_name`` (under ``wandb agent``: after the sweep parameters the agent wrote) and
    grouped by ``--run_group``."""

    def __init__(self, *args, **kwargs) -> None:
        wandb_offline_unless_logged_in()
        kwargs.setdefault("subclass_mode_data", True)
        kwargs.setdefault("save_config_kwargs", {"overwrite": True})
        kwargs.setdefault(
            "trainer_defaults",
            {
                "callbacks": [
                    RunSummary(),
                    OperatorStatistics(),
                    CommunicationCost(),
                    TrainingCurves(),
                ]
            },
        )
        kwargs.setdefault("save_config_callback", LoggedConfig)
        kwargs.setdefault("auto_configure_optimizers", False)
        super().__init__(FederatedModule, FederatedDataModule, *args, **kwargs)

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

    def _apply_output_dir(self) -> None:
        output_dir = self.config[self.subcommand].get("output_dir")
        if output_dir is None:
            return
        for callback in self.trainer.callbacks:
            if isinstance(callback, RunSummary | TrainingCurves):
                callback.dirpath = output_dir

    def before_fit(self) -> None:
        self._apply_output_dir()

    def before_validate(self) -> None:
        self._apply_output_dir()

    def before_test(self) -> None:
        self._apply_output_dir()

    def _finish_wandb(self) -> None:
        """Close the W&B runs so that one process can run several fits (e.g. a local sweep)."""
        for logger in self.trainer.loggers:
            if isinstance(logger, WandbLogger) and logger._experiment is not None:
                logger.experiment.finish()

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
    for path in make_report(ns.results, ns.out, x=ns.x, y=ns.y, facet=ns.facet,
                            metric=ns.metric, vmin=ns.vmin, vmax=ns.vmax):  # fmt: skip
        print(path)
    return 0


def _compare_main(args: list[str]) -> int:
    from pl_privfed.report import compare_methods

    parser = argparse.ArgumentParser(
        prog="pl-privfed compare",
        description="The best configuration (on validation) of each sweep side by side, against "
        "rounds and against bits (train utility ||∇f(x̄)||² and validation accuracy, paper 001 "
        "Figs. 2-3), mean over seeds with 95 % bands; test accuracy with intervals in the table.",
    )
    parser.add_argument("results", nargs="+", help="results.csv files, one sweep per method")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument(
        "--metric", default="final_val_accuracy", help="validation column that selects"
    )
    ns = parser.parse_args(args)
    for path in compare_methods(ns.results, ns.out, metric=ns.metric):
        print(path)
    md = Path(ns.out) / "comparison.md"
    notes = md.read_text().split("Notes:", 1)[1].strip() if "Notes:" in md.read_text() else ""
    if notes:
        print(notes)
    return 0


def main(args: list[str] | None = None) -> None:
    """Console entry point: LightningCLI subcommands (fit, validate, test, ...), plus ``sweep``,
    ``report`` and ``compare``."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] not in ("sweep", "report", "compare"):
        argv = agent_arguments(argv)
    if argv and argv[0] == "sweep":
        raise SystemExit(_sweep_main(argv[1:]))
    if argv and argv[0] == "report":
        raise SystemExit(_report_main(argv[1:]))
    if argv and argv[0] == "compare":
        raise SystemExit(_compare_main(argv[1:]))
    PrivFedCLI(args=argv)


if __name__ == "__main__":
    main()
