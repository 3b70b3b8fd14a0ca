"""One-line error reporting of the ``pl-privfed`` command.

An error the user can fix (a bad value, a missing data file, a damaged checkpoint, an empty
config) ends the command with one line, ``pl-privfed: error: <what>``
(:func:`error_line`); jsonargparse's nested reports are condensed to one line
(:func:`condense_parser_error`); a ``--config`` file that is missing, empty or not a YAML mapping
is named before jsonargparse reads it (:func:`check_config_files`).
"""

from __future__ import annotations

import errno
import re
import sys
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentError

__all__ = [
    "ERROR_PREFIX",
    "check_config_files",
    "condense_parser_error",
    "error_line",
    "one_line",
    "raised_here",
]

ERROR_PREFIX = "pl-privfed: error: "
#: the package's own code: an error raised there is one of its checks
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _loaded(module: str, name: str) -> Any:
    """The class ``name`` of ``module`` if that module was imported, else ``None``: an exception
    of a class never imported was not raised, and a command that does not train (``report``,
    ``--help``) must not import torch or Lightning to report its own errors."""
    return getattr(sys.modules.get(module), name, None)


def _is(exc: BaseException, module: str, name: str) -> bool:
    kind = _loaded(module, name)
    return kind is not None and isinstance(exc, kind)


def one_line(text: object) -> str:
    """``text`` on one line: its non-blank lines stripped and joined by spaces."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from, outermost first."""
    out: list[BaseException] = []
    while exc is not None and all(exc is not e for e in out):
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def raised_here(exc: BaseException) -> bool:
    """Whether ``exc`` was raised by this package's code (its innermost frame is ours)."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last, tb = tb, tb.tb_next
    return last is not None and Path(last.tb_frame.f_code.co_filename).resolve().is_relative_to(
        PACKAGE_DIR
    )


def _raising_class(exc: BaseException) -> str | None:
    """The package class whose code raised ``exc`` (the outermost of our frames with a
    ``self``), e.g. ``DigitsDataModule`` for a bad ``data.init_args.batch_size``."""
    tb = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        if Path(frame.f_code.co_filename).resolve().is_relative_to(PACKAGE_DIR):
            owner = frame.f_locals.get("self")
            cli = _loaded("pytorch_lightning.cli", "LightningCLI")
            if owner is not None and not (cli is not None and isinstance(owner, cli)):
                return type(owner).__name__
        tb = tb.tb_next
    return None


_PARSER_SCAFFOLDING = (
    "Parser key",
    "Problem with given class_path",
    "Does not validate against any of the Union subtypes",
    "Subtypes:",
    "Errors:",
    "Given value",
)


def condense_parser_error(text: str) -> str:
    """jsonargparse's nested error report (one ``Parser key`` per level, the subtypes of each
    union tried, the value given at each level) as one line: the full key, the innermost class,
    what was expected or refused, and the value given.

    >>> condense_parser_error('Parser key "trainer.max_steps":\\n  Expected a <class \\'int\\'>. '
    ...                       'Got value: abc')
    "trainer.max_steps: Expected a <class 'int'>. Got value: abc"
    """
    keys = re.findall(r'Parser key "([^"]+)"', text)
    classes = re.findall(r"class_path '([^']+)'", text)
    given = re.findall(r"Given value: (.*)", text)
    problems: list[str] = []
    for raw in str(text).splitlines():
        line = raw.strip().removeprefix("- ").strip()
        if line and not line.startswith(_PARSER_SCAFFOLDING) and line not in problems:
            problems.append(line)
    if not keys or not problems:
        return one_line(text)
    abstract = [line for line in problems if line.endswith(" is abstract")]
    if abstract:  # e.g. the base FederatedAlgorithm: the path was found, the class is a base
        name = abstract[0].rsplit(" but ", 1)[-1].removesuffix(" is abstract")
        return (
            f"{'.'.join(keys)}: {name} is an abstract base class; give one of its concrete "
            "subclasses (pl-privfed fit --help lists them)"
        )
    where = ".".join(keys) + (f" ({classes[-1]})" if classes else "")
    what = "; ".join(problems) + (f" (given: {given[0].strip()})" if given else "")
    return f"{where}: {what}"


#: errors of a file or folder the user can fix, with their exit status: a folder that is a file,
#: read-only or missing (2), a full disk (1, as a run that stopped)
_FILE_ERRNOS = {
    errno.EACCES: 2,
    errno.EPERM: 2,
    errno.EROFS: 2,
    errno.ENOTDIR: 2,
    errno.EEXIST: 2,
    errno.EISDIR: 2,
    errno.ENOSPC: 1,
    errno.EDQUOT: 1,
}


def error_line(exc: BaseException) -> tuple[str, int] | None:
    """The one line and exit status :func:`~pl_privfed.cli.main` reports for an error the user
    can fix (a configuration, a data file, a checkpoint, a diverged run), or ``None`` for
    anything else (a bug: the traceback is shown).

    A ``ValueError`` (or ``FileNotFoundError``) raised by this package's checks is reported
    with its message, prefixed by the class that refused the value, wherever it surfaced
    (jsonargparse wraps errors raised while it instantiates classes in a "Does not validate
    against any of the Union subtypes" error with the whole namespace); jsonargparse's own
    parse errors and Lightning's configuration errors with theirs. Exit status 2 for
    configuration errors, 1 for a run that stopped on a non-finite loss.

    Args:
        exc: the exception that ended the command.

    Returns:
        ``(line, exit status)``, or ``None`` when the traceback should be shown.
    """
    chain = _chain(exc)
    for e in reversed(chain):  # innermost first: the package's own check
        if _is(e, "pl_privfed.module", "NonFiniteLossError"):
            return one_line(e), 1
        data_file = _is(e, "pl_privfed.datamodules.files", "DataFileError")
        if (isinstance(e, ValueError | FileNotFoundError) or data_file) and raised_here(e):
            owner = _raising_class(e)
            message = one_line(e)
            return (f"{owner}: {message}" if owner else message), 2
    for e in chain:  # outermost first: the parser's or Lightning's own words
        if isinstance(e, ArgumentError):
            return condense_parser_error(str(e)), 2
        if _is(e, "lightning_fabric.utilities.exceptions", "MisconfigurationException"):
            return one_line(e), 2
    for e in chain:  # a folder or file the run could not write (or a full disk): outermost
        # first, since the package re-raises a staging file's error naming the user's folder
        if isinstance(e, OSError) and e.filename is not None and e.errno in _FILE_ERRNOS:
            return f"cannot write {str(e.filename)!r}: {e.strerror}", _FILE_ERRNOS[e.errno]
    return None


def _config_files(argv: list[str]) -> list[str]:
    """The ``--config``/``-c`` files named on the command line."""
    files = []
    for i, arg in enumerate(argv):
        if arg in ("--config", "-c") and i + 1 < len(argv):
            files.append(argv[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def check_config_files(argv: list[str]) -> None:
    """Refuse a ``--config`` file that is missing, empty or not a YAML mapping, naming it
    (jsonargparse reports an empty file as "Unexpected config: ").

    Args:
        argv: the command's arguments.

    Raises:
        ValueError: naming the file and what is wrong with it.
    """
    for name in _config_files(argv):
        if name.lstrip().startswith("{"):
            continue  # an inline YAML/JSON mapping
        path = Path(name)
        if not path.is_file():
            raise ValueError(f"--config {name}: no such file")
        try:
            content = yaml.safe_load(path.read_text())
        except UnicodeDecodeError as exc:
            raise ValueError(
                f"--config {name} is not a text (YAML) file: byte {exc.start} is not UTF-8"
            ) from exc
        except yaml.YAMLError as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise ValueError(f"--config {name} is not valid YAML: {first}") from exc
        if content is None:
            raise ValueError(
                f"--config {name} is empty: a config is a YAML mapping with trainer, model "
                "and data sections (see configs/quickstart.yaml)"
            )
        if not isinstance(content, dict):
            raise ValueError(
                f"--config {name} holds a {type(content).__name__}, not a YAML mapping with "
                "trainer, model and data sections"
            )
