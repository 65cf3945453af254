"""Stopping the warmup at the next step boundary when the process is asked to end.

vLLM's engine core (and its workers) turn SIGTERM into ``SystemExit`` at
once (``run_engine_core``'s ``signal_handler``), wherever the process is:
in the middle of a stepwarm step, before the driver's cleanup could leave
the runner clean. Around its scenarios the plugin instead installs a
handler that only records the request (:func:`stop_at_step_boundary`);
before each step the warmup asks :meth:`StopSignal.check`, which raises
:class:`StopRequested` once the signal came (every rank of an agreement at
the same step). The step running then finishes, the driver's cleanup runs,
and on leaving the block the previous handler is put back and the signal
delivered to it again (``signal.raise_signal``): vLLM's own shutdown goes on
from there, a step later than without stepwarm, not a scenario later.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15; the number where Python knows no name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class StopRequested(BaseException):
    """Raised before a step once the process was asked to end: a
    ``BaseException``, so that the driver cleans the runner up as after any
    exception but does not report a failed step."""

    def __init__(self, signum: int, before: str):
        super().__init__(f"{signal_name(signum)} before {before}")
        self.signum, self.before = signum, before


@dataclass
class StopSignal:
    """The signal received while :func:`stop_at_step_boundary` is active
    (None: none)."""

    signum: int | None = None
    #: Called with the local request (a bool) and the step's name; returns
    #: whether any rank has one (every rank calls it at the same step). The
    #: local request alone when None.
    agree: Callable[[bool, str], bool] | None = None

    def check(self, step: Any, what: str) -> None:
        """Raise :class:`StopRequested` before ``step`` (named ``what``) when a
        stop was asked, on this rank or (with :attr:`agree`) another; the
        driver's ``on_step_start``."""
        asked = self.signum is not None
        if self.agree is not None:
            asked = self.agree(asked, what)
        if asked:
            raise StopRequested(self.signum if self.signum is not None else signal.SIGTERM, what)


@contextmanager
def stop_at_step_boundary(signum: int = signal.SIGTERM) -> Iterator[StopSignal]:
    """Record ``signum`` instead of acting on it inside the block; on leaving
    it, put the previous handler back and, if the signal came, deliver it
    again (to that handler: vLLM's ``SystemExit``, or the default action).
    Signals reach Python's main thread only: elsewhere nothing is installed."""
    stop = StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    previous = signal.getsignal(signum)

    def record(received: int, frame: Any) -> None:
        stop.signum = received

    signal.signal(signum, record)
    try:
        yield stop
    finally:
        signal.signal(signum, previous if previous is not None else signal.SIG_DFL)
        if stop.signum is not None:
            signal.raise_signal(stop.signum)
