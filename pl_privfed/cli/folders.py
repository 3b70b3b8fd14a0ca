"""A run's folders, checked and placed before anything is built or written.

:func:`check_run_config` refuses what would fail later with a traceback (no rounds, a
model-sharding strategy, a folder that cannot be written); :func:`place_run` keeps every file of a
run in its folder.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from jsonargparse import Namespace
from pytorch_lightning.loggers import CSVLogger

from pl_privfed.logdir import check_writable_dir, logger_run_dir, reserve_log_dir

__all__ = [
    "RUN_DIR_ENV",
    "check_run_config",
    "check_run_folder_unused",
    "first_process",
    "last_round_checkpoint",
    "place_run",
    "redirect_loggers",
]

#: strategies that shard the model (named as ``--trainer.strategy`` strings): refused by name
#: before Lightning builds them (on a CPU Lightning's own refusal of FSDP is a traceback)
_SHARDING_STRATEGIES = ("fsdp", "deepspeed", "model_parallel", "xla_fsdp")

#: ``trainer.precision`` values a fit runs under (as :func:`pl_privfed.trainer_rounds.
#: check_precision` checks the trainer's, before anything is built)
_PRECISIONS = ("32", "64", "32-true", "64-true")

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
    precision = config.get("trainer.precision")
    if subcommand == "fit" and precision is not None and str(precision) not in _PRECISIONS:
        raise ValueError(
            f"trainer.precision={precision!r} is not supported: a federation's clipping, "
            "normalization, compression and noise need 32 or 64 bits (in 16 bits a clipped "
            "norm may round above its bound and the noise's scale is rounded); give 32-true "
            "(the default) or 64-true"
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
    if subcommand == "fit" and config.get("ckpt_path") is None:
        check_run_folder_unused(config)


def check_run_folder_unused(config: Namespace) -> None:
    """Refuse a fit into a folder that holds another run's ``summary.json``: ``--output_dir``,
    or ``trainer.default_root_dir`` of a run without loggers (the run's own folder, where its
    summary, config and checkpoints go). The new run would overwrite that summary beside the
    other run's checkpoints; a run that continues it gives ``--ckpt_path`` (this check is not
    made then). A sweep deletes a point's stale ``summary.json`` before it reruns the point.

    Raises:
        ValueError: naming the setting, the folder and the summary found there.
    """
    named = [("--output_dir", config.get("output_dir"))]
    if config.get("output_dir") is None and config.get("trainer.logger") in (False, []):
        named.append(("trainer.default_root_dir", config.get("trainer.default_root_dir")))
    for what, folder in named:
        if not isinstance(folder, str | os.PathLike) or not str(folder):
            continue
        summary = Path(folder) / "summary.json"
        if summary.is_file():
            raise ValueError(
                f"{what} {str(folder)!r} holds another run already ({summary}): a new run "
                "there would overwrite it; give a new folder, or continue that run with "
                "--ckpt_path last"
            )


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


def _round_of(path: Path) -> int:
    match = re.fullmatch(r"round=(\d+)\.ckpt", path.name)
    return int(match.group(1)) if match else -1


def last_round_checkpoint(trainer: Any, output_dir: str | None) -> str:
    """The checkpoint ``--ckpt_path last`` resumes: the newest round checkpoint
    (``round=<k>.ckpt``, the most recently written; of equally new ones the latest round) under
    the run's folder, ``--output_dir``, else the folder of the runs of the trainer's first
    logger (``<save_dir>/<name>``: every ``version_<k>`` or W&B run id beside this run's own
    new one), else the folder of ``trainer.default_root_dir``'s runs. Lightning's own ``last``
    looks for a ``last.ckpt`` in this run's new checkpoint folder, so it never resumed.

    Raises:
        ValueError: when there is no round checkpoint there, naming the folder.
    """
    if output_dir is not None:
        root = Path(output_dir)
    elif trainer.loggers:
        logger = trainer.loggers[0]
        root = Path(logger_run_dir(logger, trainer.default_root_dir)).parent
    else:
        root = Path(trainer.default_root_dir)
        root = root.parent if re.fullmatch(r"version_\d+", root.name) else root
    found = [p for p in root.rglob("round=*.ckpt") if p.is_file()] if root.is_dir() else []
    if not found:
        raise ValueError(
            f"--ckpt_path last: no round checkpoint (round=<k>.ckpt) under {str(root)!r}, the "
            "run's folder; give the checkpoint's path, or the --output_dir of the run to resume"
        )
    return str(max(found, key=lambda p: (p.stat().st_mtime, _round_of(p))))
