"""A run's folders, checked and placed before anything is built or written.

:func:`check_run_config` refuses what would fail later with a traceback (no rounds, a
model-sharding strategy, a folder that cannot be written); :func:`place_run` keeps every file of a
run in its folder.
"""

from __future__ import annotations

import os
from typing import Any

from jsonargparse import Namespace
from pytorch_lightning.loggers import CSVLogger

from pl_privfed.logdir import check_writable_dir, reserve_log_dir

__all__ = ["RUN_DIR_ENV", "check_run_config", "first_process", "place_run", "redirect_loggers"]

#: strategies that shard the model (named as ``--trainer.strategy`` strings): refused by name
#: before Lightning builds them (on a CPU Lightning's own refusal of FSDP is a traceback)
_SHARDING_STRATEGIES = ("fsdp", "deepspeed", "model_parallel", "xla_fsdp")

#: the run folder that the first process reserved, for the processes Lightning's DDP launcher
#: starts (``<pid of the first process>:<folder>``)
RUN_DIR_ENV = "PL_PRIVFED_RUN_DIR"


def first_process() -> bool:
    """Whether this is the first process of the run (not one Lightning's DDP launcher started)."""
    return all(int(os.environ.get(k, "0") or 0) == 0 for k in ("RANK", "LOCAL_RANK", "NODE_RANK"))


def _loggers(config: Namespace) -> list[Any]:
    loggers = config.get("trainer.logger")
    return loggers if isinstance(loggers, list) else [loggers]


def _folders(config: Namespace) -> list[tuple[str, Any]]:
    """``(what, folder)`` of every folder the run writes that the config names."""
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
    return folders


def check_run_config(config: Namespace, subcommand: str | None) -> None:
    """Refuse, before anything is built or written, what would fail later with a traceback: a
    run of no rounds, a strategy that shards the model, and folders that cannot be written
    (``--output_dir``, ``trainer.default_root_dir``, the loggers' ``save_dir``,
    ``model.state_dir``, ``model.grid_dir``: a file on the way, or read-only).

    Args:
        config: the subcommand's parsed config.
        subcommand: ``fit``, ``validate``, ``test`` or ``None``.

    Raises:
        ValueError: naming the setting and its value.
    """
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
    for what, folder in _folders(config):
        if isinstance(folder, str | os.PathLike) and str(folder):
            check_writable_dir(folder, what)


def place_run(config: Namespace) -> None:
    """Keep every file of a run in its folder: with ``--output_dir`` the trainer's
    ``default_root_dir`` becomes it too (checkpoints, ``config.yaml``, client state), unless
    given; without a logger and without either, the run gets its own
    ``lightning_logs/version_<k>`` (reserved atomically, as a logger's) instead of the working
    directory, for its summary, curves, checkpoints and ``config.yaml``.

    Args:
        config: the subcommand's parsed config, changed in place.
    """
    output_dir = config.get("output_dir")
    if config.get("trainer.default_root_dir") is not None:
        return
    if output_dir is not None:
        config["trainer.default_root_dir"] = output_dir
        return
    loggers = config.get("trainer.logger")
    if loggers is not False and loggers != []:
        return  # the loggers' folders hold the run (Lightning's default logger: lightning_logs/)
    if first_process():
        holder = CSVLogger(os.getcwd())  # lightning_logs/version_<k>, as the default logger's
        reserve_log_dir(holder)
        run_dir = holder.log_dir
        os.environ[RUN_DIR_ENV] = f"{os.getpid()}:{run_dir}"
    else:
        pid, _, run_dir = os.environ.get(RUN_DIR_ENV, "").partition(":")
        if not run_dir or pid == str(os.getpid()):
            return
    config["trainer.default_root_dir"] = run_dir


def redirect_loggers(config: Namespace, run_name: str | None) -> None:
    """Every logger's ``save_dir`` becomes ``--output_dir`` (the run's CSV logs and offline
    W&B files live with its summary); a ``WandbLogger`` is named ``run_name`` and grouped by
    ``--run_group``.

    Args:
        config: the subcommand's parsed config, changed in place.
        run_name: the W&B run's name, or ``None``.
    """
    output_dir = config.get("output_dir")
    for logger in _loggers(config):
        init_args = getattr(logger, "init_args", None)
        if not isinstance(init_args, Namespace):
            continue
        if output_dir is not None and "save_dir" in init_args:
            init_args["save_dir"] = output_dir
        if str(logger.class_path).endswith("WandbLogger"):
            if run_name:
                init_args["name"] = run_name
            if config.get("run_group"):
                init_args["group"] = config["run_group"]
