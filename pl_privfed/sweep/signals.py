"""A sweep stopped by SIGTERM or Ctrl-C as ``pl-privfed fit`` is: one line, its running fit
stopped the way a fit stops (its round saved, its ``summary.json`` saying ``interrupted``), no
process left behind, the lock released, exit status ``128 + signal`` (143, 130); run again, the
sweep skips what finished and continues the interrupted fit from its checkpoint.

Each point's (or group's) process runs in its own session (``start_new_session``), so that a
Ctrl-C at the terminal reaches the sweep only: the sweep forwards the signal once, and the fit
takes it as one Ctrl-C (a second one, from the terminal as well, would abort it without a
checkpoint). A second Ctrl-C to the sweep is forwarded too: the fit then aborts at once, as
``pl-privfed fit`` does on a second Ctrl-C.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from typing import Any

__all__ = ["SignalGuard", "SweepInterrupted"]

#: the signals a sweep stops on
SIGNALS = (signal.SIGTERM, signal.SIGINT)


class SweepInterrupted(Exception):
    """The sweep stopped on a signal; :attr:`code` is the exit status (``128 + signal``)."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.code = 128 + int(signum)
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class SignalGuard:
    """Holds the sweep's SIGTERM and SIGINT handlers while it runs (a context manager) and runs
    its processes (:meth:`call`): a signal is recorded, announced in one line on stderr and
    forwarded to the running process, and the next :meth:`call` raises
    :class:`SweepInterrupted` instead of starting one."""

    def __init__(self) -> None:
        self.received: int | None = None
        self.child: subprocess.Popen | None = None
        self._forwarded = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> SignalGuard:
        if threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    @property
    def name(self) -> str:
        """The name of the signal received (``SIGTERM``, ``SIGINT``)."""
        return signal.Signals(self.received).name if self.received is not None else ""

    def _handle(self, signum: int, frame: Any) -> None:
        first = self.received is None
        if first:
            self.received = signum
        child = self.child
        running = child is not None and child.poll() is None
        if first:
            what = (
                f"its running fit (pid {child.pid}) saves its round and stops"
                if running and child is not None
                else "no further point is started"
            )
            print(
                f"[pl-privfed sweep] {signal.Signals(signum).name}: stopping the sweep; {what}; "
                "run the same command again to resume",
                file=sys.stderr,
                flush=True,
            )
        if running and child is not None:
            self._forward(child, signum)

    def _forward(self, child: subprocess.Popen, signum: int) -> None:
        self._forwarded = True
        try:
            os.kill(child.pid, signum)
        except ProcessLookupError:  # it ended meanwhile
            pass

    def stop_if_signalled(self) -> None:
        """Raise :class:`SweepInterrupted` if a signal was received."""
        if self.received is not None:
            raise SweepInterrupted(self.received)

    def call(self, cmd: list[str], **kwargs: Any) -> int:
        """Run ``cmd`` to its end (``subprocess.Popen`` arguments), in its own session; its exit
        status (negative: ended by that signal). Raises :class:`SweepInterrupted` instead of
        starting it once a signal was received."""
        self.stop_if_signalled()
        child = subprocess.Popen(cmd, start_new_session=True, **kwargs)
        self.child = child
        if self.received is not None and not self._forwarded:  # arrived while it started
            self._forward(child, self.received)
        try:
            return child.wait()
        except BaseException:  # the sweep itself fails: leave no process behind
            child.kill()
            child.wait()
            raise
        finally:
            self.child = None
