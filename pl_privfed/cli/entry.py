"""The console entry point :func:`main`: a registered subcommand (:mod:`.commands`) or ``fit``,
``validate``, ``test`` (:class:`~.app.PrivFedCLI`), every error the user can fix on one line.

Start-up in proportion to the work: this module imports neither torch nor Lightning.
``pl-privfed --help`` is written from the subcommands' one-line helps (:func:`_print_help`),
``report`` and ``compare`` load only what they draw with, and the training stack is imported
when ``fit``, ``validate`` or ``test`` runs (:func:`~.app.run_trainer_command`);
``benchmarks/startup.py`` measures each command's start-up against ``import pytorch_lightning``.
"""

from __future__ import annotations

import argparse
import signal
import sys

from pl_privfed.cli import commands as _commands  # noqa: F401  (registers the subcommands)
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

_DESCRIPTION = (
    "Simulate private, communication-efficient federated learning: one training step is one "
    "communication round."
)
_EPILOG = (
    "`pl-privfed <subcommand> --help` describes each subcommand's options. Errors print on one "
    "line; --debug (or PL_PRIVFED_DEBUG=1) shows the traceback."
)


def _print_help() -> None:
    """``pl-privfed --help``: the subcommands, each with its one-line help, without building the
    Trainer's parser (which imports torch and Lightning: seconds before a word is printed)."""
    parser = argparse.ArgumentParser(
        prog="pl-privfed", description=_DESCRIPTION, epilog=_EPILOG, add_help=True
    )
    parser.add_argument("--debug", action="store_true", help="show tracebacks (anywhere)")
    names = ",".join([*TRAINER_COMMANDS, *COMMANDS])
    action = parser.add_subparsers(title="subcommands", metavar=f"{{{names}}}")
    for name, text in TRAINER_COMMANDS.items():
        action.add_parser(name, help=text)
    for name, command in COMMANDS.items():
        action.add_parser(name, help=command.help)
    parser.print_help()


def _take_debug(argv: list[str]) -> tuple[list[str], bool]:
    """``argv`` without ``--debug`` (before a sweep's ``--``), and whether tracebacks are
    asked for (``--debug`` or ``PL_PRIVFED_DEBUG``)."""
    cut = argv.index("--") if "--" in argv else len(argv)
    debug = "--debug" in argv[:cut] or debug_asked()
    return [a for a in argv[:cut] if a != "--debug"] + argv[cut:], debug


def _dispatch(argv: list[str], from_command_line: bool, quiet: bool = True) -> None:
    """Run the subcommand ``argv[0]`` (``quiet``: third-party noise filtered, also from the
    loggers Lightning creates when the training stack is imported here)."""
    if argv and argv[0] in COMMANDS:
        raise SystemExit(run_subcommand(COMMANDS[argv[0]], argv[1:]))
    if not argv:
        names = ", ".join([*TRAINER_COMMANDS, *COMMANDS])
        raise ValueError(f"choose a subcommand: {names} (pl-privfed --help describes them)")
    if argv in (["--help"], ["-h"]):
        _print_help()
        raise SystemExit(0)
    from pl_privfed.cli.app import run_trainer_command  # the training stack: torch, Lightning

    if quiet:
        quiet_third_party()  # Lightning's loggers exist only now ("Seed set to 0", tips)
    run_trainer_command(argv, from_command_line=from_command_line)


def _stopped_by_signal(exc: SystemExit) -> bool:
    """Whether ``exc`` is Lightning's ``SIGTERMException`` (a fit stopped by a signal), looked
    up only where Lightning was imported: a command that never loaded it raised none."""
    lightning = sys.modules.get("pytorch_lightning.utilities.exceptions")
    kind = getattr(lightning, "SIGTERMException", None)
    return kind is not None and isinstance(exc, kind)


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
        _dispatch(argv, from_command_line=args is None, quiet=not debug)
    except SystemExit as exc:
        if _stopped_by_signal(exc):  # SIGTERM or Ctrl-C after a round: not finished
            raise SystemExit(exc.code or 128 + signal.SIGTERM) from None
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
