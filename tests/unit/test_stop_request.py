"""stepwarm.stop_request: SIGTERM recorded during the warmup, acted on at the
next step boundary, then handed to the handler that was there (no engine;
the engine test is tests/e2e/test_stop_signal.py)."""

from __future__ import annotations

import os
import signal

import pytest

from stepwarm.stop_request import StopRequested, StopSignal, stop_at_step_boundary


def test_sigterm_is_recorded_in_the_block_then_delivered_to_the_previous_handler():
    got: list[int] = []

    def previous(signum, frame):
        got.append(signum)

    before = signal.signal(signal.SIGTERM, previous)
    try:
        with stop_at_step_boundary() as stop:
            stop.check(None, "x step 0/9 (prefill, p)")  # nothing asked: no stop
            os.kill(os.getpid(), signal.SIGTERM)
            assert stop.signum == signal.SIGTERM and got == []
            with pytest.raises(StopRequested) as e:
                stop.check(None, "x step 3/9 (decode, d)")
            assert str(e.value) == "SIGTERM before x step 3/9 (decode, d)"
            assert e.value.before == "x step 3/9 (decode, d)"
            assert not isinstance(e.value, Exception)  # the driver's cleanup, no failed step
        assert got == [signal.SIGTERM]  # delivered again, once, on leaving the block
        assert signal.getsignal(signal.SIGTERM) is previous
        with stop_at_step_boundary():  # no signal: nothing delivered
            pass
        assert got == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, before)


def test_a_stop_on_another_rank_stops_this_one_at_the_same_step():
    asked: list[tuple[bool, str]] = []
    stop = StopSignal(agree=lambda mine, what: asked.append((mine, what)) or True)
    with pytest.raises(StopRequested) as e:
        stop.check(None, "x step 2/9 (decode, d)")
    assert asked == [(False, "x step 2/9 (decode, d)")] and e.value.signum == signal.SIGTERM
