"""``stepwarm.runner.WorkerClock``: the worker's time per run and per step,
read off the real ``SchedulerOutput`` each ``execute_model`` gets."""

from __future__ import annotations

import time

from vllm.v1.core.sched.output import SchedulerOutput

from stepwarm.runner import WorkerClock


class _Worker:
    """The two methods vLLM's executor calls, each sleeping a known time."""

    def execute_model(self, scheduler_output):
        time.sleep(0.02)
        return None

    def sample_tokens(self, grammar_output):
        time.sleep(0.01)
        return "sampled"


def _step(tokens_per_request):
    out = SchedulerOutput.make_empty()
    out.num_scheduled_tokens = dict(tokens_per_request)
    out.total_num_scheduled_tokens = sum(tokens_per_request.values())
    return out


def test_steps_are_kept_apart_with_tokens_requests_and_both_halves():
    worker, clock = _Worker(), WorkerClock()
    with clock.attached(worker):
        worker.execute_model(_step({"a": 290, "b": 290}))
        assert worker.sample_tokens(None) == "sampled"
        worker.execute_model(_step({"a": 1, "b": 1}))
        worker.sample_tokens(None)
    assert "execute_model" not in worker.__dict__  # unwrapped on exit
    steps = clock.take_steps()
    # tokens, requests, ms, and 1: no step before had that many tokens
    assert [s[:2] + s[3:] for s in steps] == [[580, 2, 1], [2, 2, 1]]
    for _, _, ms, _ in steps:  # 20 ms + 10 ms each, sleeps never shorter
        assert 30.0 <= ms < 300.0
    total = clock.take()
    assert abs(total - sum(s[2] for s in steps)) < 0.1
    assert clock.take_steps() == [] and clock.take() == 0.0
    with clock.attached(worker):  # the counts seen before are remembered
        worker.execute_model(_step({"c": 580}))
        worker.execute_model(_step({"c": 7}))
    assert [s[:2] + s[3:] for s in clock.take_steps()] == [[580, 1, 0], [7, 1, 1]]


def test_the_threads_cpu_time_in_the_workers_calls_is_kept_apart():
    """Sleeping in the worker is wall time, not CPU time; spinning is both."""

    class Spinning(_Worker):
        def execute_model(self, scheduler_output):
            t0 = time.thread_time()
            while time.thread_time() - t0 < 0.03:
                pass

    clock, spinning = WorkerClock(), Spinning()
    with clock.attached(spinning):
        spinning.execute_model(_step({"a": 1}))
        spinning.sample_tokens(None)  # sleeps 10 ms
    cpu, wall = clock.take_cpu(), clock.take()
    assert 30.0 <= cpu < wall and wall >= 40.0
    assert clock.take_cpu() == 0.0
