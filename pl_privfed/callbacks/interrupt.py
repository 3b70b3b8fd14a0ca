"""Stopping a fit on SIGTERM or Ctrl-C (SIGINT) without losing it, at any point of its life.

Lightning turns SIGTERM into a stop between two training steps (its handler sets
``trainer.received_sigterm``; the loop raises
:class:`~pytorch_lightning.utilities.exceptions.SIGTERMException`), but only once training
runs, and for a federation, where one step is one communication round, three things go wrong:
the process exits 0 (``SIGTERMException`` is a ``SystemExit`` without a code); Ctrl-C interrupts
a round anywhere (``KeyboardInterrupt``), leaving no consistent state to save; and under DDP its
handler runs a collective (``broadcast``) inside the signal handler, which can meet another
collective of the round on the other processes and hang them. Before training (set-up, the
privacy calibration, restoring a checkpoint) a SIGTERM used to kill the process outright,
leaving a run folder without ``summary.json``.

A fit's signals are handled in two phases:

* **set-up** (:func:`watch_setup_signals`, installed by ``pl-privfed fit`` before the trainer
  starts and by :class:`~pl_privfed.callbacks.RunSummary` at ``setup``): nothing has been
  trained in this fit, so there is nothing to save and nothing to finish; a SIGTERM or Ctrl-C
  stops the fit at once by raising ``SIGTERMException`` with exit status ``128 + signal``
  (130 for Ctrl-C, 143 for SIGTERM, the shell's convention). Every callback's ``on_exception``
  runs: the summary says ``interrupted: <signal> before training``, no checkpoint is written.
* **training** (:func:`watch_signals`, called by :class:`~pl_privfed.callbacks.RoundCheckpoint`
  and :class:`~pl_privfed.callbacks.RunSummary` when training starts): the handler only
  records the signal and forwards it to the processes a DDP launcher started. At the end of
  every round :func:`stop_if_signalled` agrees across the processes (one ``all_reduce`` of a
  flag, at the same point of the same round everywhere) and raises ``SIGTERMException`` with
  exit status ``128 + signal`` at the point where a checkpoint taken every round is saved;
  every callback's ``on_exception`` then runs (the round checkpoint saves the round, the
  summary says ``interrupted``).

In either phase a second Ctrl-C aborts at once. In the ``pl-privfed`` command, which owns its
process (``watch_setup_signals(trainer, own_process=True)``), that is one line on stderr and
exit status 130, with no checkpoint, no summary and no traceback (:func:`abort_now`); in a
Python session (a notebook) it is a ``KeyboardInterrupt``, which Lightning shuts down as usual
(a process that is not the command's is not ended). A second SIGTERM is ignored.
:func:`restore_signals` puts back the handlers the fit found (``pl-privfed fit`` and
``RunSummary`` call it when the fit ends, however it ends), so that a process that runs several
fits (a local sweep) or goes on after one is not left with a fit's handler.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import weakref
from typing import Any

import torch
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_info

__all__ = [
    "abort_now",
    "restore_signals",
    "stop_if_signalled",
    "stop_signal",
    "stopped_before_training",
    "watch_setup_signals",
    "watch_signals",
]

#: the signals a fit stops on
_SIGNALS = (signal.SIGTERM, signal.SIGINT)
#: per trainer: the signal received during its fit (``None`` until one arrives), the phase
#: (``"set-up"`` or ``"training"``), the round last checked, the handler installed and the
#: handlers found before the fit
_RECEIVED: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
#: the line a second Ctrl-C prints before the process exits
ABORT_LINE = "[pl-privfed] second Ctrl-C: aborting now, without a checkpoint"


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def _record(trainer: Any) -> dict[str, Any]:
    """The trainer's record, created with the handlers in place before its fit."""
    record = _RECEIVED.get(trainer)
    if record is None:
        previous = {signum: signal.getsignal(signum) for signum in _SIGNALS}
        record = {"signal": None, "checked": None, "phase": None, "previous": previous}
        _RECEIVED[trainer] = record
    return record


def _install(record: dict[str, Any], handler: Any, phase: str) -> None:
    for signum in _SIGNALS:
        signal.signal(signum, handler)
    record.update(installed=handler, phase=phase, retired=False)


def _retired(record: dict[str, Any], signum: int, frame: Any) -> bool:
    """Whether the fit's handlers were retired (:func:`restore_signals`); if so, ``signum`` is
    handled as the handler found before the fit would (Lightning's signal connector may put one
    of ours back after the fit ended)."""
    if not record.get("retired"):
        return False
    previous = record["previous"].get(signum)
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:  # the default action (SIGINT's is KeyboardInterrupt)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
    return True


def _forward(trainer: Any, signum: int) -> None:
    """Send ``signum`` to the processes a DDP launcher started (they stop at the same round)."""
    launcher = getattr(getattr(trainer, "strategy", None), "launcher", None)
    kill = getattr(launcher, "kill", None)
    if callable(kill):
        kill(signum)


def _second_ctrl_c(record: dict[str, Any], trainer: Any) -> None:
    if record.get("own_process"):
        abort_now(trainer)
    raise KeyboardInterrupt  # a Python session: Lightning's own shutdown


def abort_now(trainer: Any = None) -> None:
    """A second Ctrl-C: print :data:`ABORT_LINE` on stderr and end the process at once with
    status 130 (``os._exit``: no checkpoint, no summary, no traceback, no clean-up that could
    hang); the processes a DDP launcher started are killed first."""
    _forward(trainer, getattr(signal, "SIGKILL", signal.SIGTERM))
    sys.stdout.flush()
    print(ABORT_LINE, file=sys.stderr, flush=True)
    os._exit(128 + int(signal.SIGINT))


def _watching(record: dict[str, Any] | None) -> bool:
    return record is not None and record.get("installed") is signal.getsignal(signal.SIGINT)


def watch_setup_signals(trainer: Any, own_process: bool = False) -> None:
    """Until ``trainer``'s training starts, stop its fit at once on SIGTERM or Ctrl-C (exit
    status ``128 + signal``; nothing trained, nothing saved). Idempotent (a no-op once a
    handler of this fit is installed, of either phase); a no-op off the main thread.

    Args:
        trainer: the trainer whose fit is watched.
        own_process: the process is the fit's own (the ``pl-privfed`` command): a second
            Ctrl-C ends it at once (:func:`abort_now`), not with a ``KeyboardInterrupt``.
    """
    if not _main_thread() or _watching(_RECEIVED.get(trainer)):
        return
    record = _record(trainer)
    record["own_process"] = record.get("own_process") or own_process

    def on_setup_signal(signum, frame) -> None:
        if _retired(record, signum, frame):
            return
        if record["signal"] is not None:  # the stop is under way
            if signum == signal.SIGINT:
                _second_ctrl_c(record, trainer)
            return
        record["signal"] = signum
        _forward(trainer, signum)
        name = signal.Signals(signum).name
        print(f"\n[pl-privfed] {name} before training: stopping now (nothing to save)",
              file=sys.stderr, flush=True)  # fmt: skip
        raise SIGTERMException(128 + int(signum))

    _install(record, on_setup_signal, "set-up")


def watch_signals(trainer: Any) -> None:
    """Record SIGTERM and SIGINT during ``trainer``'s training (:func:`stop_if_signalled` stops
    at the end of the round). Idempotent; a no-op off the main thread."""
    if not _main_thread():
        return
    record = _RECEIVED.get(trainer)
    if _watching(record) and record["phase"] == "training":
        return
    record = _record(trainer)
    record.update(signal=None, checked=None)

    def on_signal(signum, frame) -> None:
        if _retired(record, signum, frame):
            return
        if record["signal"] is not None:
            if signum == signal.SIGINT:
                _second_ctrl_c(record, trainer)  # a second Ctrl-C: stop now, no checkpoint
            return
        record["signal"] = signum
        _forward(trainer, signum)  # the processes a DDP launcher started stop at the same round
        rank_zero_info(
            f"\n[pl-privfed] {signal.Signals(signum).name}: stopping after this round and saving "
            "a checkpoint"
            + (" (Ctrl-C again to abort without one)" if signum == signal.SIGINT else "")
        )

    _install(record, on_signal, "training")


def restore_signals(trainer: Any) -> None:
    """Put back the SIGTERM and SIGINT handlers found before ``trainer``'s fit (when this
    module installed its own); idempotent, a no-op off the main thread."""
    record = _RECEIVED.get(trainer)
    if not _main_thread() or record is None or record.get("installed") is None:
        return
    for signum, handler in record["previous"].items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
    record.update(installed=None, retired=True)


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


def stopped_before_training(trainer: Any) -> bool:
    """Whether ``trainer``'s fit was stopped by a signal before training started (during
    set-up: nothing of this fit to save)."""
    record = _RECEIVED.get(trainer) or {}
    return record.get("phase") == "set-up" and record.get("signal") is not None
