"""Stopping a fit on SIGTERM or Ctrl-C (SIGINT) at the end of a round, without losing it.

Lightning already turns SIGTERM into a stop between two training steps: its signal handler sets
``trainer.received_sigterm`` (forwarding the signal to the other processes of a DDP run) and the
training loop raises :class:`~pytorch_lightning.utilities.exceptions.SIGTERMException` at the
next step boundary, after which every callback's ``on_exception`` runs. Two things are missing
for a federation, where one step is one communication round: the exit status (``SIGTERMException``
is a ``SystemExit`` without a code, so the process exits 0) and Ctrl-C, which Lightning lets
interrupt a round anywhere (``KeyboardInterrupt``), so no consistent state is left to save.

:func:`watch_signals` (called by :class:`~pl_privfed.callbacks.RoundCheckpoint` and
:class:`~pl_privfed.callbacks.RunSummary` when training starts) routes the first Ctrl-C through
Lightning's SIGTERM handler, so the current round completes and the same stop follows; a second
Ctrl-C interrupts at once. It records which signal arrived; :func:`stop_signal` then names it and
sets the exception's exit status to ``128 + signal`` (130 for Ctrl-C, 143 for SIGTERM), the
shell's convention, so a scheduler or a sweep sees that the run did not finish. Lightning
restores the previous handlers when the fit ends (its signal connector's ``teardown``).
"""

from __future__ import annotations

import signal
import threading
import weakref
from typing import Any

from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_info

__all__ = ["stop_signal", "watch_signals"]

#: the signal that stopped each trainer's fit (``None`` until one arrives)
_RECEIVED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def watch_signals(trainer: Any) -> None:
    """Record SIGTERM and SIGINT during ``trainer``'s fit; make the first SIGINT stop at the end
    of the round (as SIGTERM does). Idempotent; a no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    record = _RECEIVED.get(trainer)
    if record is not None and record.get("installed") is signal.getsignal(signal.SIGINT):
        return
    record = {"signal": None}
    _RECEIVED[trainer] = record
    lightning_sigterm = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum, frame) -> None:
        record["signal"] = record["signal"] or signum
        if callable(lightning_sigterm):
            lightning_sigterm(signum, frame)

    def on_sigint(signum, frame) -> None:
        if record["signal"] is not None or not callable(lightning_sigterm):
            raise KeyboardInterrupt  # a second Ctrl-C (or no Lightning handler): stop now
        record["signal"] = signum
        rank_zero_info(
            f"\n[pl-privfed] Ctrl-C: stopping after round {trainer.global_step + 1} and saving "
            "a checkpoint (Ctrl-C again to abort without one)"
        )
        lightning_sigterm(signal.SIGTERM, frame)

    signal.signal(signal.SIGTERM, on_sigterm)
    signal.signal(signal.SIGINT, on_sigint)
    record["installed"] = on_sigint


def stop_signal(trainer: Any, exception: BaseException) -> str | None:
    """The name of the signal that stopped the fit (``"SIGTERM"``, ``"SIGINT"``) when
    ``exception`` is Lightning's stop on a signal, else ``None``; sets the exception's exit
    status to ``128 + signal`` (SIGTERM when this process was stopped by another one's
    signal, e.g. the rank 0 of a DDP run)."""
    if not isinstance(exception, SIGTERMException):
        return None
    record = _RECEIVED.get(trainer) or {}
    signum = signal.Signals(record.get("signal") or signal.SIGTERM)
    if not exception.code:
        exception.code = 128 + int(signum)
    return signum.name
