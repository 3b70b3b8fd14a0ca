"""``--print_config`` after the seed fan-out: the printed file reproduces the run.

jsonargparse prints the config while it parses, before :class:`~pl_privfed.cli.PrivFedCLI` could
fan ``--seed`` out (``--seed_everything 1 --print_config`` printed ``seed: null`` and every
component seed 0). The command takes ``--print_config[=flags]`` out of the arguments
(:func:`take_print_config`) and prints the parsed, seeded config itself
(:func:`print_config`), with jsonargparse's flags.
"""

from __future__ import annotations

import sys

import yaml
from jsonargparse import ArgumentParser, Namespace

from pl_privfed.checks import check_choice

__all__ = ["PRINT_CONFIG_FLAGS", "print_config", "take_print_config"]

#: jsonargparse's ``--print_config`` flags (``skip_null``: its old name of ``skip_unset``)
PRINT_CONFIG_FLAGS = ("skip_default", "skip_unset", "skip_null", "comments")
_OPTION = "--print_config"


def take_print_config(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``argv`` without ``--print_config[=flags]``, and the flags given (``None``: not asked).

    Args:
        argv: the command's arguments.

    Returns:
        ``(the other arguments, the flags or None)``.

    Raises:
        ValueError: a flag jsonargparse does not know.
    """
    rest, flags = [], None
    for arg in argv:
        if arg == _OPTION or arg.startswith(_OPTION + "="):
            flags = [f for f in arg.partition("=")[2].split(",") if f]
            for flag in flags:
                check_choice(_OPTION, flag, PRINT_CONFIG_FLAGS)
        else:
            rest.append(arg)
    return rest, flags


def print_config(parser: ArgumentParser, config: Namespace, flags: list[str]) -> None:
    """Print ``config`` as YAML (a subcommand's section only) and exit with status 0.

    Args:
        parser: the root parser that parsed ``config``.
        config: the parsed config, seeds fanned out.
        flags: ``--print_config``'s flags (``comments`` is not kept).
    """
    text = parser.dump(
        config,
        skip_unset=bool({"skip_unset", "skip_null"} & set(flags)),
        skip_default="skip_default" in flags,
    )
    subcommand = config.get("subcommand")
    if subcommand:
        section = yaml.safe_load(text).get(subcommand) or {}
        text = yaml.safe_dump(
            section, sort_keys=False, allow_unicode=True, default_flow_style=False
        )
    sys.stdout.write(text)
    sys.stdout.flush()
    raise SystemExit(0)
