"""``--print_config`` after the seed fan-out: the printed file reproduces the run.

jsonargparse prints the config while it parses, before :class:`~pl_privfed.cli.PrivFedCLI` could
fan ``--seed`` out (``--seed_everything 1 --print_config`` printed ``seed: null`` and every
component seed 0). The command takes ``--print_config[=flags]`` out of the arguments
(:func:`take_print_config`), fans the seeds out, and has jsonargparse print the seeded config
(:func:`print_config`), with its flags.
"""

from __future__ import annotations

import yaml
from jsonargparse import ArgumentParser, Namespace

__all__ = ["print_config", "take_print_config"]
_OPTION = "--print_config"


def take_print_config(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """``argv`` without ``--print_config[=flags]``, and the flags given (``None``: not asked).

    Args:
        argv: the command's arguments.

    Returns:
        ``(the other arguments, the flags or None)``.
    """
    rest, flags = [], None
    for arg in argv:
        if arg == _OPTION or arg.startswith(_OPTION + "="):
            flags = [f for f in arg.partition("=")[2].split(",") if f]  # jsonargparse checks them
        else:
            rest.append(arg)
    return rest, flags


def print_config(parser: ArgumentParser, config: Namespace, flags: list[str]) -> None:
    """Print ``config`` as ``--print_config`` does (a subcommand's section, with its flags) and
    exit with status 0.

    jsonargparse prints it: the resolved, seeded config is parsed again as an inline
    ``--config``, followed by ``--print_config`` with its flags, so the output is jsonargparse's
    own (its header, ``skip_default``, ``comments``).

    Args:
        parser: the root parser that parsed ``config``.
        config: the parsed config, seeds fanned out.
        flags: ``--print_config``'s flags.
    """
    resolved = yaml.safe_load(parser.dump(config, skip_unset=False))
    subcommand = config.get("subcommand")
    section = resolved.get(subcommand) if subcommand else resolved
    inline = yaml.safe_dump(section, sort_keys=False, allow_unicode=True)
    again = [subcommand] if subcommand else []
    parser.parse_args([*again, "--config", inline, f"{_OPTION}={','.join(flags)}"])
    raise SystemExit(0)  # jsonargparse exits after printing
