"""StepWatch: name a step that runs too long.

A thread started around each step (:meth:`StepWatch.watching`) logs, once
the step has run ``warn_s`` seconds and again every ``warn_s`` seconds::

    stepwarm: <scenario> step i/N (<kind>, <label>) running for S s

on every rank (each rank watches its own steps). vLLM has no such watch for
its own warmup: an engine stuck in a warmup sampling step says nothing until
someone attaches py-spy (vLLM issue #17676).

With ``timeout_s``, a step still running then is failed: the watch raises
:class:`StepTimedOut` in the thread that runs the step (delivered at its next
Python bytecode, so a step stuck inside one C call, a kernel or a
collective is not reached that way), and when the step has still not ended
``grace_s`` seconds later it ends the process (``os._exit``) after logging
why. A running step cannot be cancelled safely: whatever it was doing to the
runner's tensors and tables is half done, so a timed-out step fails start-up
under either ``STEPWARM_ON_ERROR``.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

logger = logging.getLogger("vllm.stepwarm")

#: Exit status of a process the watch ended (a step that outlived the timeout
#: and its grace period): EX_SOFTWARE.
EXIT_STEP_HUNG = 70


def seconds_text(elapsed: float, interval: float | None) -> str:
    """``elapsed`` with as many decimals as ``interval`` needs to tell two
    lines apart (one for 0.1 s and more; three for 0.001 s: the fourth trial
    saw 100 copies of "running for 1.1 s" at STEPWARM_STEP_WARN_S=0.001)."""
    import math

    decimals = 1 if not interval or interval >= 0.1 else min(6, -math.floor(math.log10(interval)))
    return f"{elapsed:.{decimals}f}"


class StepTimedOut(RuntimeError):
    """A step ran longer than ``STEPWARM_STEP_TIMEOUT_S`` (raised in the
    thread that ran it)."""


@dataclass(frozen=True)
class StepWatch:
    """When to log a running step and when to fail it.

    Attributes:
        warn_s: seconds before the first log line, and between repeats
            (None: never logged).
        timeout_s: seconds after which the step is failed (None: never).
        grace_s: seconds the step gets after the timeout to end before the
            process is ended.
        who: the log lines' prefix (``stepwarm`` or ``stepwarm [tp1 pp0]``).
    """

    warn_s: float | None = 10.0
    timeout_s: float | None = None
    grace_s: float = 30.0
    who: str = "stepwarm"

    @contextlib.contextmanager
    def watching(self, what: str,
                 on_running: Callable[[str, float], None] | None = None) -> Iterator[None]:
        """Watch the step run inside the ``with`` block.

        Args:
            what: the step as the log names it: ``<scenario> step i/N (<kind>, <label>)``.
            on_running: called with ``what`` and the seconds so far at each
                interval instead of the warning (the CLI shows its own line on
                stderr, where vLLM's log goes too: the warning is then logged
                at DEBUG, so each shows once).

        Raises:
            StepTimedOut: the block ran past ``timeout_s`` (raised inside it).
        """
        if self.warn_s is None and self.timeout_s is None:
            yield
            return
        done = threading.Event()
        state = {"timed_out": False}
        thread = threading.Thread(
            target=self._watch, args=(what, threading.get_ident(), done, state, on_running),
            name="stepwarm-watchdog", daemon=True)
        thread.start()
        try:
            yield
        except BaseException:
            if state["timed_out"]:
                raise StepTimedOut(self._timeout_text(what)) from None
            raise
        finally:
            done.set()
            thread.join()
            if state["timed_out"]:
                # The step ended on its own while the exception was on its way:
                # drop it, so that it cannot surface after this block.
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(threading.get_ident()), None)
        if state["timed_out"]:
            raise StepTimedOut(self._timeout_text(what))

    def _timeout_text(self, what: str) -> str:
        return (f"{what} still running after STEPWARM_STEP_TIMEOUT_S={self.timeout_s:g} s; "
                "a running step cannot be cancelled safely, so start-up fails "
                "(under STEPWARM_ON_ERROR=warn too)")

    def _watch(self, what: str, target: int, done: threading.Event, state: dict,
               on_running: Callable[[str, float], None] | None) -> None:
        t0 = time.monotonic()
        next_log = self.warn_s
        while True:
            ticks = [t for t in (next_log, self.timeout_s) if t is not None]
            wait = max(0.0, min(ticks) - (time.monotonic() - t0))
            if done.wait(wait):
                return
            elapsed = time.monotonic() - t0
            if next_log is not None and elapsed >= next_log:
                logger.log(logging.WARNING if on_running is None else logging.DEBUG,
                           "%s: %s running for %s s", self.who, what,
                           seconds_text(elapsed, self.warn_s))
                if on_running is not None:
                    on_running(what, elapsed)
                # the next interval after now: a late wake-up (a stalled host, a
                # tiny STEPWARM_STEP_WARN_S) says one line, not one per missed
                # interval (the third trial: 13 copies of one line in a burst)
                next_log = (int(elapsed / self.warn_s) + 1) * self.warn_s
            if self.timeout_s is not None and elapsed >= self.timeout_s:
                break
        state["timed_out"] = True
        logger.error("%s: %s", self.who, self._timeout_text(what))
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target),
                                                   ctypes.py_object(StepTimedOut))
        if done.wait(self.grace_s):
            return
        logger.critical("%s: %s did not end %g s after the timeout (stuck outside Python: "
                        "a kernel, a collective or a C call); ending the process",
                        self.who, what, self.grace_s)
        logging.shutdown()
        os._exit(EXIT_STEP_HUNG)
