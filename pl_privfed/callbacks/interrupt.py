"""Stopping a fit on SIGTERM or Ctrl-C (SIGINT) at the end of a round, without losing it.

Lightning turns SIGTERM into a stop between two training steps (its handler sets
``trainer.received_sigterm``; the loop raises
:class:`~pytorch_lightning.utilities.exceptions.SIGTERMException`), but for a federation, where
one step is one communication round, three things go wrong: the process exits 0
(``SIGTERMException`` is a ``SystemExit`` without a code); Ctrl-C interrupts a round anywhere
(``KeyboardInterrupt``), leaving no consistent state to save; and under DDP its handler runs a
collective (``broadcast``) inside the signal handler, which can meet another collective of the
round on the other processes and hang them.

:func:`watch_signals` (called by :class:`~pl_privfed.callbacks.RoundCheckpoint` and
:class:`~pl_privfed.callbacks.RunSummary` when training starts) replaces the SIGTERM and SIGINT
handlers for the fit with one that only records the signal and forwards it to the processes a
DDP launcher started; a second Ctrl-C interrupts at once. At the end of every round
:func:`stop_if_signalled` agrees across the processes (one ``all_reduce`` of a flag, at the
same point of the same round everywhere) and raises ``SIGTERMException`` with exit status
``128 + signal`` (130 for Ctrl-C, 143 for SIGTERM, the shell's convention), at the point where
a checkpoint taken every round is saved; every callback's ``on_exception`` then runs (the round
checkpoint saves the round, the summary says ``interrupted``). Lightning restores the previous
handlers when the fit ends (its signal connector's ``teardown``).
"""

from __future__ import annotations

import signal
import threading
import weakref
from typing import Any

import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_info

__all__ = ["stop_if_signalled", "stop_signal", "watch_signals"]

#: per trainer: the signal received during its fit (``None`` until one arrives), the round last
#: checked, and the handler installed
_RECEIVED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


def watch_signals(trainer: Any) -> None:
    """Record SIGTERM and SIGINT during ``trainer``'s fit (:func:`stop_if_signalled` stops at
    the end of the round). Idempotent; a no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    record = _RECEIVED.get(trainer)
    if record is not None and record.get("installed") is signal.getsignal(signal.SIGINT):
        return
    record = {"signal": None, "checked": None}

    def on_signal(signum, frame) -> None:
        if record["signal"] is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now, without a checkpoint
            return
        record["signal"] = signum
        launcher = getattr(trainer.strategy, "launcher", None)
        if launcher is not None:
            launcher.kill(signum)  # the processes a DDP launcher started stop at the same round
        rank_zero_info(
            f"\n[pl-privfed] {signal.Signals(signum).name}: stopping after this round and saving "
            "a checkpoint"
            + (" (Ctrl-C again to abort without one)" if signum == signal.SIGINT else "")
        )

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    record["installed"] = on_signal
    _RECEIVED[trainer] = record


def stop_if_signalled(trainer: Any) -> None:
    """At the end of a round: raise ``SIGTERMException`` (exit status ``128 + signal``) on every
    process when any of them received SIGTERM or SIGINT. Once per round (several callbacks may
    call it); every process must call it at the same point."""
    record = _RECEIVED.get(trainer)
    if record is None or record["checked"] == trainer.global_step:
        return
    record["checked"] = trainer.global_step
    received = record["signal"]
    stop = received is not None
    if getattr(trainer, "world_size", 1) > 1:
        flag = torch.tensor(float(stop), device=trainer.strategy.root_device)
        stop = float(trainer.strategy.reduce(flag, reduce_op="sum")) > 0
    if stop:
        raise SIGTERMException(128 + int(received or signal.SIGTERM))


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
