"""The ``pl-privfed`` command: LightningCLI over :class:`FederatedModule` and the datamodules.

``pl-privfed fit --config configs/quickstart.yaml`` trains; every value can be overridden on the
command line (``--model.algorithm.init_args.beta 0.1``); ``--print_config`` shows the resolved
config; ``validate`` and ``test`` evaluate a checkpoint (``--ckpt_path``). ``pl-privfed sweep
<sweep.yaml>`` runs a grid sweep file locally (:mod:`pl_privfed.sweep`) and ``pl-privfed report
<results.csv>`` draws its figures and table (:mod:`pl_privfed.report`); ``pl-privfed compare
<a/results.csv> <b/results.csv> --out DIR`` draws the best run of each sweep against rounds and
bits.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import yaml
from pytorch_lightning.cli import LightningCLI, SaveConfigCallback
from pytorch_lightning.loggers import WandbLogger

from pl_privfed.callbacks import CommunicationCost, OperatorStatistics, RunSummary, TrainingCurves
from pl_privfed.datamodules import FederatedDataModule
from pl_privfed.module import FederatedModule

__all__ = ["LoggedConfig", "PrivFedCLI", "main", "wandb_offline_unless_logged_in"]


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
    :class:`CommunicationCost`, :class:`TrainingCurves`."""

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
            "logger's log_dir). Used by `pl-privfed sweep` to find each run's results.",
        )

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
    from pl_privfed.sweep import failed_runs, run_sweep

    parser = argparse.ArgumentParser(
        prog="pl-privfed sweep",
        description="Run a W&B grid sweep file locally (sequentially, resumable).",
        epilog="Arguments after `--` are added to every run, e.g. "
        "`-- --config=configs/paper/paper_reading.yaml` or `-- --trainer.max_steps=20`.",
    )
    parser.add_argument("sweep", help="the sweep YAML (configs/sweeps/*.yaml)")
    parser.add_argument("--out", default=None, help="output directory (default sweeps/<name>)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands only")
    extra: list[str] = []
    if "--" in args:
        cut = args.index("--")
        args, extra = args[:cut], args[cut + 1 :]
    ns = parser.parse_args(args)
    path = run_sweep(ns.sweep, ns.out, overrides=extra, dry_run=ns.dry_run)
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
        description="Heatmaps, curves and a paper-style table from a sweep's results.csv.",
    )
    parser.add_argument("results", help="results.csv written by `pl-privfed sweep`")
    parser.add_argument("--out", default=None, help="output directory (default: report/ beside)")
    parser.add_argument("--x", default="beta", help="heatmap x column (default beta)")
    parser.add_argument("--y", default="step_size", help="heatmap y column (default step_size)")
    parser.add_argument(
        "--facet", default=None, help="one panel per value of this column (default: all others)"
    )
    ns = parser.parse_args(args)
    for path in make_report(ns.results, ns.out, x=ns.x, y=ns.y, facet=ns.facet):
        print(path)
    return 0


def _compare_main(args: list[str]) -> int:
    from pl_privfed.report import compare_methods

    parser = argparse.ArgumentParser(
        prog="pl-privfed compare",
        description="The best run of each sweep side by side, against rounds and against bits "
        "(train utility ||∇f(x̄)||² and test accuracy, paper 001 Figs. 2-3).",
    )
    parser.add_argument("results", nargs="+", help="results.csv files, one sweep per method")
    parser.add_argument("--out", required=True, help="output directory")
    ns = parser.parse_args(args)
    for path in compare_methods(ns.results, ns.out):
        print(path)
    return 0


def main(args: list[str] | None = None) -> None:
    """Console entry point: LightningCLI subcommands (fit, validate, test, ...), plus ``sweep``,
    ``report`` and ``compare``."""
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] == "sweep":
        raise SystemExit(_sweep_main(argv[1:]))
    if argv and argv[0] == "report":
        raise SystemExit(_report_main(argv[1:]))
    if argv and argv[0] == "compare":
        raise SystemExit(_compare_main(argv[1:]))
    PrivFedCLI(args=args)


if __name__ == "__main__":
    main()
