"""jsonargparse's and :mod:`argparse`'s private names that the command uses: a parser's actions,
its subcommands action, and the help entries of a subcommands action.

Tested with jsonargparse ``TESTED`` (``tests/test_compat.py``); :mod:`argparse` is the standard
library's. It imports neither library: it reads attributes of the parsers it is given.
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["TESTED", "parser_actions", "subcommand_help_entries", "subcommands_action"]

#: the jsonargparse versions this module was checked against (``pyproject.toml`` pins them)
TESTED = ">=4.53,<4.54"


def parser_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's arguments (argparse's ``_actions``), in the order they were added."""
    return list(parser._actions)


def subcommands_action(parser: Any) -> Any | None:
    """The subcommands action of a jsonargparse parser (``parser.add_subcommands()``'s), or
    ``None`` when it has no subcommands."""
    return getattr(parser, "_subcommands_action", None)


def subcommand_help_entries(action: Any) -> list[argparse.Action]:
    """The entries ``--help`` lists for a subcommands action, one per subcommand with a help
    text (argparse's ``_choices_actions``: ``entry.dest`` is the subcommand, ``entry.help``
    its line)."""
    return list(getattr(action, "_choices_actions", []))
