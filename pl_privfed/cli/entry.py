"""The console entry point :func:`main`: a registered subcommand (:mod:`.commands`) or ``fit``,
``validate``, ``test`` (:class:`~.app.PrivFedCLI`), every error the user can fix on one line."""

from __future__ import annotations

import signal
import sys

from pytorch_lightning.utilities.exceptions import SIGTERMException

from pl_privfed.cli import commands as _commands  # noqa: F401  (registers the subcommands)
from pl_privfed.cli.app import run_trainer_command
from pl_privfed.cli.arguments import agent_arguments
from pl_privfed.cli.environment import (
    check_environment,
    debug_asked,
    quiet_third_party,
    tune_allocator,
    wandb_offline_unless_logged_in,
)
from pl_privfed.cli.errors import ERROR_PREFIX, error_line
from pl_privfed.cli.help import TRAINER_COMMANDS
from pl_privfed.cli.registry import COMMANDS, run_subcommand

__all__ = ["main"]


def _take_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (before a sweep's ``--``), and whether tracebacks are
    asked for (``--debug`` or ``PL_PRIVFED_DEBUG``)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut] or debug_asked()
    return [a for a in argv[:cut] if a != "--debug"] + argv[cut:], debug


def _dispatch(argv: list[str], from_command_line: bool) -> None:
    """Run the subcommand ``argv[0]``."""
    if argv and argv[0] in COMMANDS:
        raise SystemExit(run_subcommand(COMMANDS[argv[0]], argv[1:]))
    if not argv:
        names = ", ".join([*TRAINER_COMMANDS, *COMMANDS])
        raise ValueError(f"choose a subcommand: {names} (pl-privfed --help describes them)")
    run_trainer_command(argv, from_command_line=from_command_line)


def main(args: list[str] | None = None) -> None:
    """Console entry point: LightningCLI subcommands ``fit``, ``validate`` and ``test``, plus
    the registered ones (``sweep``, ``report``, ``compare``, ``demo``).

    Every error the user can fix (a bad value, a missing data file, a damaged checkpoint, an
    empty config) ends the command with one line on stderr, ``pl-privfed: error: <what>``, and
    exit status 2 (1 for a run stopped by a non-finite loss); ``--debug`` (anywhere before a
    sweep's ``--``) or ``PL_PRIVFED_DEBUG=1`` shows the traceback instead.

    Args:
        args: the arguments (``None``: the command line's).
    """
    argv, debug = _take_debug(list(sys.argv[1:] if args is None else args))
    if not (argv and argv[0] in COMMANDS):
        argv = agent_arguments(argv)  # as `wandb agent` writes them (None, relative configs)
    wandb_offline_unless_logged_in()
    if not debug:
        quiet_third_party()
    try:
        check_environment()  # an unknown PL_PRIVFED_* value: one line, before anything runs
        tune_allocator()
        _dispatch(argv, from_command_line=args is None)
    except SIGTERMException as exc:  # stopped on SIGTERM or Ctrl-C after a round: not finished
        raise SystemExit(exc.code or 128 + signal.SIGTERM) from None
    except SystemExit:
        raise
    except KeyboardInterrupt:  # Ctrl-C outside a fit's handling (parsing, a report, a sweep)
        sys.stdout.flush()
        print(f"{ERROR_PREFIX}interrupted (Ctrl-C)", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    except Exception as exc:
        reported = None if debug else error_line(exc)
        if reported is None:
            raise
        line, code = reported
        sys.stdout.flush()
        print(ERROR_PREFIX + line, file=sys.stderr, flush=True)
        raise SystemExit(code) from None
