"""The process environment of the ``pl-privfed`` command (the command's own, not the library's).

The package's environment variables with a fixed set of values checked before anything runs
(:func:`check_environment`: an unknown value is a one-line error naming the variable, the
value and the values accepted), glibc's allocator kept for reuse (:func:`tune_allocator`),
third-party noise filtered (:func:`quiet_third_party`), W&B offline without credentials
(:func:`wandb_offline_unless_logged_in`).
"""

from __future__ import annotations

import logging
import os
import sys
import warnings
from pathlib import Path

__all__ = [
    "ALLOCATOR_ENV",
    "DEBUG_ENV",
    "check_environment",
    "debug_asked",
    "quiet_third_party",
    "tune_allocator",
    "wandb_offline_unless_logged_in",
]

#: set to anything but ``""`` or ``"0"`` to see tracebacks instead of one-line errors
DEBUG_ENV = "PL_PRIVFED_DEBUG"

#: the values of an on/off variable (:data:`DEBUG_ENV`), read case-insensitively; empty is off
_OFF, _ON = ("", "0", "false", "no", "off"), ("1", "true", "yes", "on")
#: pl_privfed.privacy.invariants.ENV, named here without importing it (it imports torch)
INVARIANTS_ENV = "PL_PRIVFED_CHECK_INVARIANTS"


def debug_asked() -> bool:
    """Whether :data:`DEBUG_ENV` asks for tracebacks (an unknown value does not:
    :func:`check_environment` refuses it)."""
    return os.environ.get(DEBUG_ENV, "").strip().lower() in _ON


def check_environment() -> None:
    """Refuse an unknown value of the package's environment variables that take one of a
    fixed set of values, before anything runs: :data:`DEBUG_ENV` and
    ``PL_PRIVFED_CHECK_INVARIANTS`` (on/off; :mod:`pl_privfed.privacy.invariants`),
    :data:`ALLOCATOR_ENV` (``tuned`` or ``default``) and ``PL_PRIVFED_CLIENT_CHUNK`` (a
    positive integer, ``all`` or ``auto``; :data:`~pl_privfed.engine.CHUNK_ENV`). Before, a
    typo (``PL_PRIVFED_MALLOC=defualt``) was accepted without a word and did nothing.
    ``PL_PRIVFED_DATA`` and ``PL_PRIVFED_CACHE`` are folders (a missing one is named where it
    is read).

    Raises:
        ValueError: naming the variable, its value and the values accepted.
    """
    debug = os.environ.get(DEBUG_ENV, "")
    if debug.strip().lower() not in _OFF + _ON:
        raise ValueError(
            f"{DEBUG_ENV}={debug!r} is not an on/off value: give one of "
            f"{', '.join(v for v in _OFF + _ON if v)} (or unset it)"
        )
    allocator = os.environ.get(ALLOCATOR_ENV, "")
    if allocator.strip() not in _ALLOCATOR_CHOICES:
        raise ValueError(
            f"{ALLOCATOR_ENV}={allocator!r} is not an allocator setting: give 'tuned' (the "
            "command's thresholds, the default) or 'default' (glibc's own), or unset it"
        )
    checks = os.environ.get(INVARIANTS_ENV, "")
    if checks.strip().lower() not in _OFF + _ON:
        raise ValueError(
            f"{INVARIANTS_ENV}={checks!r} is not an on/off value: give one of "
            f"{', '.join(v for v in _OFF + _ON if v)} (or unset it)"
        )
    if os.environ.get("PL_PRIVFED_CLIENT_CHUNK"):  # its own check (the engine's: torch)
        import torch

        from pl_privfed.engine import choose_chunk_size

        choose_chunk_size(1, 1, torch.device("cpu"))


#: glibc's mallopt parameters (malloc.h) and the values the command sets
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
ALLOCATOR_ENV = "PL_PRIVFED_MALLOC"
_ALLOCATOR = {"mmap_threshold": 32 * 2**20, "trim_threshold": 256 * 2**20}
#: the values of :data:`ALLOCATOR_ENV` (empty: ``tuned``)
_ALLOCATOR_CHOICES = ("", "tuned", "default")


def tune_allocator() -> bool:
    """Let glibc's malloc keep freed memory for reuse in this process (the command's own).

    A round frees and allocates the same activations again and again. Under glibc's defaults a
    freed block above the mmap threshold, or a free top of the heap above the trim threshold, goes
    back to the kernel, and the next round's allocation faults every page in again: on this
    project's CPU that made a CNN client step through the layer rules' capturing pass (which
    holds every layer's activations at once) 1.35× as long as with these settings, and the
    plain loop's up to 1.12× (CHANGELOG.md). Fixed thresholds of 32 MiB (glibc's own
    ceiling for its adaptive one) and 256 MiB keep that memory in the process; blocks above 32 MiB
    are still returned (``PL_PRIVFED_MALLOC=tuned``, the default; :func:`check_environment`
    refuses other values). Skipped (``False``) off Linux/glibc, with ``PL_PRIVFED_MALLOC=default``,
    and when the user chose already (``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_`` or
    an ``LD_PRELOAD``ed allocator such as jemalloc or tcmalloc).

    Returns:
        Whether both thresholds were set.
    """
    import ctypes

    chosen = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "LD_PRELOAD")
    if (
        not sys.platform.startswith("linux")
        or os.environ.get(ALLOCATOR_ENV, "").strip() == "default"
        or any(os.environ.get(k) for k in chosen)
    ):
        return False
    try:
        mallopt = ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):  # not glibc (e.g. musl)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _ALLOCATOR["mmap_threshold"])) and bool(
        mallopt(_M_TRIM_THRESHOLD, _ALLOCATOR["trim_threshold"])
    )


def wandb_offline_unless_logged_in() -> None:
    """Run W&B offline (``WANDB_MODE=offline``) unless an API key or a login is available.

    Offline runs are written under the logger's ``save_dir`` and can be uploaded later with
    ``wandb sync <dir>``; :class:`~pl_privfed.cli.PrivFedCLI` prints that command after each run.
    """
    if "WANDB_MODE" in os.environ or os.environ.get("WANDB_API_KEY"):
        return
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    if netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="ignore"):
        return
    os.environ["WANDB_MODE"] = "offline"


#: third-party warnings a run cannot act on (filtered by the command only, not the library):
#: Lightning's pytree helper calls a torch API deprecated in torch 2.10; Lightning compares
#: ``log_every_n_steps`` with an epoch's batches, but a federation logs by rounds across epochs;
#: on machines with more than two cores Lightning asks the evaluation DataLoader for workers,
#: which over the package's in-memory tensors would only add process start-up
_NOISE_WARNINGS = (
    r".*isinstance\(treespec, LeafSpec\)` is deprecated.*",
    r"The number of training batches \(\d+\) is smaller than the logging interval.*",
    r"The '(val|test)_dataloader' does not have many workers.*",
    r"LightningCLI's args parameter is intended to run from within Python.*",  # main(args)
)
#: Lightning info lines that are advertisements or restate the config; "Restoring states"
#: restates ``--ckpt_path`` before the checkpoint is read, so a resume refused as a different
#: run printed it above its one-line error ("Restored all states ..." still says that a resume
#: succeeded)
_NOISE_INFO = (
    "💡 Tip:",
    "GPU available:",
    "TPU available:",
    "HPU available:",
    "Seed set to",
    "`Trainer.fit` stopped:",
    "Restoring states from the checkpoint path at",
)
_LIGHTNING_LOGGERS = (
    "pytorch_lightning",
    "lightning.pytorch",
    "lightning_fabric",
    "lightning.fabric",
)


class _DropNoise(logging.Filter):
    """Drops Lightning's info lines that advertise or restate the config."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(_NOISE_INFO)


def _add_filter(logger: logging.Logger) -> None:
    if not any(isinstance(f, _DropNoise) for f in logger.filters):
        logger.addFilter(_DropNoise())


def quiet_third_party() -> None:
    """Filter the noise of third-party libraries that a normal run prints and cannot prevent
    (Lightning tips, a pytree deprecation, W&B's offline chatter); the command only."""
    for pattern in _NOISE_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name in _LIGHTNING_LOGGERS:
        _add_filter(logging.getLogger(name))
        for child in list(logging.root.manager.loggerDict):
            if child.startswith(name + "."):
                _add_filter(logging.getLogger(child))
    if os.environ.get("WANDB_MODE") == "offline":
        os.environ.setdefault("WANDB_SILENT", "true")  # the sync hint is printed after the run
