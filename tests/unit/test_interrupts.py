"""stepwarm.interrupts: a Ctrl-C swallowed below ``run`` is still one, and a
handled one exits 130, not killed by SIGINT (CI's failure of 2026-12-06: a
Ctrl-C 3 s into 'starting vLLM engine' said its line, then exit -2). No
engine: the engine-level test is tests/e2e/test_cli_run.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from stepwarm import interrupts


@pytest.fixture
def handlers():
    """Python's own handlers and an empty record back after the test."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    interrupts.RECEIVED.clear()
    yield
    signal.signal(signal.SIGINT, before[0])
    signal.signal(signal.SIGTERM, before[1])
    interrupts.RECEIVED.clear()


def test_an_interrupt_swallowed_inside_the_block_is_raised_on_leaving_it(handlers):
    interrupts.as_interrupt()
    swallowed = []
    with pytest.raises(KeyboardInterrupt):
        with interrupts.kept():
            try:  # as torch's C start does with numpy's import
                os.kill(os.getpid(), signal.SIGINT)
            except BaseException as e:  # noqa: BLE001
                swallowed.append(type(e).__name__)
            swallowed.append("went on")
    assert swallowed == ["KeyboardInterrupt", "went on"]
    assert (interrupts.RECEIVED, interrupts.status(), interrupts.label()) == (
        [signal.SIGINT], 130, "interrupted:")


def test_no_signal_no_interrupt_and_one_that_left_the_block_is_not_raised_twice(handlers):
    interrupts.as_interrupt()
    with interrupts.kept():
        pass
    raised = 0
    try:
        with interrupts.kept():
            os.kill(os.getpid(), signal.SIGTERM)
    except KeyboardInterrupt:
        raised += 1
    assert raised == 1
    assert (interrupts.RECEIVED, interrupts.status(), interrupts.label()) == (
        [signal.SIGTERM], 143, "terminated (SIGTERM):")


def test_an_error_a_signal_caused_is_the_interrupt_and_one_without_a_signal_stays_itself(handlers):
    # CI, 2026-12-06: Ctrl-C inside torch.compile's guard check came out of the
    # forward as an AssertionError, and bench said the step failed (exit 1).
    interrupts.as_interrupt()

    def guard_check() -> None:
        try:
            os.kill(os.getpid(), signal.SIGINT)
        except KeyboardInterrupt:
            raise AssertionError("Guard failed on the same frame it was created") from None

    with pytest.raises(KeyboardInterrupt) as caught:
        with interrupts.broken_by_signal(AssertionError):
            guard_check()
    assert isinstance(caught.value.__cause__, AssertionError)
    interrupts.RECEIVED.clear()
    with pytest.raises(ValueError, match="no signal"):  # no signal inside: the error itself
        with interrupts.broken_by_signal():
            raise ValueError("no signal")
    with pytest.raises(OSError, match="not of the kinds"):  # a kind not named passes through
        with interrupts.broken_by_signal(AssertionError):
            interrupts.RECEIVED.append(signal.SIGINT)  # a signal came
            raise OSError("not of the kinds")


def test_being_handled_ignores_later_signals(handlers):
    interrupts.as_interrupt()
    interrupts.being_handled()
    os.kill(os.getpid(), signal.SIGINT)  # ignored: nothing raised, nothing recorded
    os.kill(os.getpid(), signal.SIGTERM)
    assert interrupts.RECEIVED == []
    assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN


MODULE = """\
import os, signal, sys
from stepwarm import interrupts

interrupts.as_interrupt()
try:  # the interrupt lands inside exec'd source text, as in a dataclass's making
    exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nwhile True: pass")
except KeyboardInterrupt:
    if sys.argv[1:] == ["handled"]:
        interrupts.being_handled()
    print("said", flush=True)
    sys.exit(interrupts.status())
"""


@pytest.mark.parametrize("how, status", [("handled", 130), ("as CPython does", -signal.SIGINT)])
def test_a_handled_interrupt_exits_130_under_python_m(tmp_path: Path, how: str, status: int):
    """Under ``python -m`` an interrupt that left exec'd text kills the
    process at exit (-2: the second case shows the test reaches CPython's
    flag); :func:`interrupts.being_handled` clears it: 130."""
    (tmp_path / "interrupted_main.py").write_text(MODULE)
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-m", "interrupted_main", how], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": f"{repo}{os.pathsep}{tmp_path}"})
    assert (done.returncode, done.stdout, done.stderr) == (status, "said\n", "")
