"""The subcommands that are not Trainer methods: a typed function each, one registration each.

A subcommand is a function whose signature is its command line, read by jsonargparse (types
checked, one-line errors as for ``fit``)::

    @subcommand("hello")
    def hello(name: str, *, times: int = 1, loud: bool = False) -> int:
        \"\"\"Greet someone (the first paragraph is the help in ``pl-privfed --help``).

        Args:
            name: who to greet
            times: how often
            loud: shout
        \"\"\"

gives ``pl-privfed hello NAME [--times N] [--loud]``. A parameter without a default (not
keyword-only) is positional; a ``list[...]`` takes one value or more (``nargs="+"``); a ``bool``
defaulting to ``False`` is a flag; ``a_b`` is spelled ``--a_b`` or ``--a-b``; ``*rest: str`` takes
the arguments after ``--``. The docstring's first paragraph is the help in ``pl-privfed --help``, the
rest the description of ``pl-privfed <name> --help``, its ``Args:`` each option's help.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import docstring_parser
from jsonargparse import ArgumentParser

__all__ = ["COMMANDS", "Subcommand", "run_subcommand", "subcommand"]


@dataclass(frozen=True)
class Subcommand:
    """One subcommand: its name, its typed function and an optional epilog.

    Args:
        name: the word after ``pl-privfed``.
        run: the function; its return value is the exit status (``None``: 0).
        epilog: text after the options in ``--help`` (a function: computed when shown).
    """

    name: str
    run: Callable[..., int | None]
    epilog: str | Callable[[], str] | None = None

    @property
    def help(self) -> str:
        """The one-line help: the first paragraph of the function's docstring."""
        first = (inspect.getdoc(self.run) or self.name).split("\n\n", 1)[0]
        return " ".join(first.split())

    def parser(self) -> ArgumentParser:
        """The typed parser of the subcommand's arguments (jsonargparse)."""
        doc = _docstring(self.run)
        epilog = self.epilog() if callable(self.epilog) else self.epilog
        description = " ".join(filter(None, [doc.short_description, doc.long_description]))
        parser = ArgumentParser(
            prog=f"pl-privfed {self.name}",
            description=description,
            epilog=epilog,
            exit_on_error=False,  # main() reports errors on one line
        )
        helps = {p.arg_name: p.description for p in doc.params}
        hints = typing.get_type_hints(self.run)
        for param in inspect.signature(self.run).parameters.values():
            if param.kind is not param.VAR_POSITIONAL:
                _add_parameter(parser, param, hints.get(param.name, str), helps.get(param.name))
        return parser


#: the extra subcommands, by name, in the order of ``pl-privfed --help``
COMMANDS: dict[str, Subcommand] = {}


def subcommand(
    name: str, *, epilog: str | Callable[[], str] | None = None
) -> Callable[[Callable[..., int | None]], Callable[..., int | None]]:
    """Register the decorated function as ``pl-privfed <name>`` (see the module's docstring).

    Args:
        name: the word after ``pl-privfed``.
        epilog: text after the options in ``--help`` (a function: computed when shown).

    Returns:
        A decorator that registers the function and returns it unchanged.
    """

    def register(run: Callable[..., int | None]) -> Callable[..., int | None]:
        COMMANDS[name] = Subcommand(name, run, epilog)
        return run

    return register


def run_subcommand(command: Subcommand, args: list[str]) -> int:
    """Parse ``args`` (those after the subcommand's name) and run the subcommand's function.

    Args:
        command: the subcommand.
        args: its arguments; those after ``--`` go to its ``*rest`` parameter.

    Returns:
        The exit status.
    """
    params = inspect.signature(command.run).parameters.values()
    rest: list[str] = []
    if "--" in args and any(p.kind is p.VAR_POSITIONAL for p in params):
        cut = args.index("--")
        args, rest = args[:cut], args[cut + 1 :]
    values = command.parser().parse_args(args).as_dict()
    positional = [values.pop(p.name) for p in params if _is_positional(p)]
    status = command.run(*positional, *rest, **values)
    return 0 if status is None else int(status)


def _docstring(function: Callable[..., Any]) -> docstring_parser.Docstring:
    return docstring_parser.parse(inspect.getdoc(function) or "")


def _is_positional(param: inspect.Parameter) -> bool:
    """A parameter without a default, not keyword-only: given by position."""
    return param.kind is param.POSITIONAL_OR_KEYWORD and param.default is param.empty


def _list_item(annotation: Any) -> Any | None:
    """``X`` for ``list[X]`` or ``list[X] | None``, else ``None``."""
    options = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    for option in options:
        if typing.get_origin(option) is list:
            return (typing.get_args(option) or (str,))[0]
    return None


def _is_union(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType)


def _add_parameter(
    parser: ArgumentParser, param: inspect.Parameter, annotation: Any, help: str | None
) -> None:
    """Add one parameter of a subcommand's function to its parser."""
    kwargs: dict[str, Any] = {"help": help}
    item = _list_item(annotation)
    if item is not None:
        kwargs.update(type=item, nargs="+")
    elif annotation is bool and param.default is False:
        kwargs.update(action="store_true")
    else:
        kwargs.update(type=annotation)
    if _is_positional(param):
        parser.add_argument(param.name, **kwargs)
        return
    names = [f"--{param.name}"]
    if "_" in param.name:
        names.insert(0, f"--{param.name.replace('_', '-')}")
    if param.default is param.empty:
        kwargs["required"] = True
    else:
        kwargs["default"] = param.default
    parser.add_argument(*names, dest=param.name, **kwargs)
