"""The command's arguments as users and ``wandb agent`` write them, made parseable.

``--key=None`` (Python's spelling of a null sweep value) and a ``--config`` path relative to the
repository (:func:`agent_arguments`); a ``null`` nested below a class's ``init_args``
(:func:`nested_nulls`); a W&B sweep run's name from its parameters (:func:`sweep_run_name`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

__all__ = ["REPO_ROOT", "agent_arguments", "nested_nulls", "sweep_run_name"]

#: The repository root of the installed package: sweep commands name configs relative to it.
REPO_ROOT = Path(__file__).resolve().parents[2]


def agent_arguments(args: list[str]) -> list[str]:
    """Arguments as ``wandb agent`` writes them, made parseable: ``--key=None`` (Python's
    spelling of a null sweep value) becomes ``--key=null``; a relative ``--config`` path that
    does not exist from the working directory is taken relative to the repository
    (:data:`REPO_ROOT`), so a sweep's command runs from any directory.

    Args:
        args: the command's arguments.

    Returns:
        The arguments, rewritten.
    """
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


def _null_override(args: list[str], i: int) -> tuple[str, int] | None:
    """``(key, arguments taken)`` when ``args[i]`` gives a ``null`` two levels or more below a
    class's ``init_args`` (``--key null`` or ``--key=null``), else ``None``."""
    arg = args[i]
    if arg.startswith("--") and "=" in arg:
        (key, value), step = arg[2:].split("=", 1), 1
    elif arg.startswith("--") and i + 1 < len(args):
        key, value, step = arg[2:], args[i + 1], 2
    else:
        return None
    nested = "." in key.partition(".init_args.")[2]
    return (key, step) if nested and value.strip() in ("null", "Null", "NULL", "~") else None


def nested_nulls(args: list[str]) -> list[str]:
    """``--a.init_args.b.c null`` as an inline config, ``--config '{"a": {"init_args": {"b":
    {"c": null}}}}'``, in its place: jsonargparse (4.53) turns a ``null`` two levels below a
    class's ``init_args`` into the string ``'None'`` ("Expected a float; Expected a NoneType"),
    while a config merges it as it should (e.g. ``--model.algorithm.init_args.noise.epsilon
    null`` with a ``noise_multiplier``: a noise multiplier instead of a target ε).

    Args:
        args: the command's arguments.

    Returns:
        The arguments, each such ``null`` as an inline config.
    """
    out: list[str] = []
    i = 0
    while i < len(args):
        found = _null_override(args, i)
        if found is None:
            out.append(args[i])
            i += 1
            continue
        key, step = found
        tree: Any = None
        for part in reversed(key.split(".")):
            tree = {part: tree}
        out += ["--config", json.dumps(tree)]
        i += step
    return out


def sweep_run_name() -> str | None:
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
