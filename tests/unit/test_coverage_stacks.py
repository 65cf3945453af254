"""``stepwarm.coverage.stacks``: where the request's thread was outside the
worker, sampled off the real interpreter's stacks, and the phrase a flagged
request gets from two runs' samples."""

from __future__ import annotations

import time

import pytest

from stepwarm.coverage import stacks as stacks_module
from stepwarm.coverage.stacks import StackSampler, stacks_explanation

#: When (``time.perf_counter``) the sampler found the thread in :func:`_waits_here`.
_LOOKS: list[float] = []
#: The longest a :func:`_waits_here` waits for a sampler that does not run.
_GIVE_UP_S = 20.0


@pytest.fixture(autouse=True)
def _record_looks(monkeypatch):
    """Each look the sampler takes at a :func:`_waits_here` frame is recorded
    (:func:`stepwarm.coverage.stacks.site` wrapped, what it returns unchanged)."""
    real = stacks_module.site

    def site(frame):
        if frame is not None and frame.f_code is _waits_here.__code__:
            _LOOKS.append(time.perf_counter())
        return real(frame)

    monkeypatch.setattr(stacks_module, "site", site)
    _LOOKS.clear()


def _waits_here(s: float, looks: int = 2) -> None:
    """Waits ``s`` seconds of the sampler's looks: until at least ``looks``
    of them found the thread here, the first and last ``s`` apart. The
    sampler charges the time from one look to the next to where the next
    finds the thread, so at least ``s`` is charged here however long a loaded
    host keeps the sampler's thread off the CPU (a fixed sleep loses its
    tail after the sampler's last look: 17.2 of 30 ms under load)."""
    mark = len(_LOOKS)
    deadline = time.perf_counter() + _GIVE_UP_S
    while time.perf_counter() < deadline:
        seen = _LOOKS[mark:]
        if len(seen) >= looks and seen[-1] - seen[0] >= s:
            return
        time.sleep(0.001)
    pytest.fail(f"the sampler looked {len(_LOOKS) - mark} times in {_GIVE_UP_S} s")


def _fake_module(name: str, func: str):
    """A function ``func(f, *a)`` calling ``f(*a)``, defined in a module
    named ``name`` (its frames carry that module name, as vLLM's do)."""
    ns = {"__name__": name}
    exec(compile(f"def {func}(f, *a):\n    return f(*a)\n", name, "exec"), ns)
    return ns[func]


def test_time_is_charged_to_where_the_thread_waited():
    with StackSampler().run() as stacks:
        _waits_here(0.08, looks=10)
    here = f"{__name__}._waits_here"
    assert set(stacks) == {"outside_ms", "samples", "sites"}
    assert stacks["sites"][here] >= 60.0 and stacks["samples"] >= 10
    assert stacks["outside_ms"] >= stacks["sites"][here]


def test_a_site_names_the_vllm_function_above_the_innermost_frame():
    process_outputs = _fake_module("vllm.v1.engine.fake_processor", "process_outputs")
    with StackSampler().run() as stacks:
        process_outputs(_waits_here, 0.06)
    site = f"vllm.v1.engine.fake_processor.process_outputs > {__name__}._waits_here"
    assert stacks["sites"][site] >= 40.0


@pytest.mark.parametrize("module, func", [
    ("vllm.v1.worker.fake_worker", "execute_model"),  # the worker's own time
    # a snapshot inside the sampled block (the replay takes them around the
    # timed run): the measurement's time, not the request's
    ("stepwarm.coverage.explain", "snapshot"),
])
def test_time_that_is_not_the_requests_outside_the_worker_is_not_sampled(module, func):
    call = _fake_module(module, func)
    with StackSampler().run() as stacks:
        call(_waits_here, 0.1)
        _waits_here(0.03)
    # the 30 ms after it are (a sampler held off by a busy host charges its
    # wait to where it next finds the thread: at most all of it)
    assert not any(module in k for k in stacks["sites"])
    assert stacks["sites"][f"{__name__}._waits_here"] >= 20.0


def test_the_sites_that_grew_in_the_first_run_are_named():
    first = {"outside_ms": 81.0, "samples": 40,
             "sites": {"vllm.v1.engine.output_processor.process_outputs": 52.0,
                       "vllm.v1.engine.processor.process_inputs > threading.wait": 20.0,
                       "vllm.v1.core.sched.scheduler.schedule": 9.0}}
    second = {"outside_ms": 12.0, "samples": 10,
              "sites": {"vllm.v1.engine.output_processor.process_outputs": 4.0,
                        "vllm.v1.core.sched.scheduler.schedule": 8.0}}
    assert stacks_explanation(first, second, 69.0) == (
        "sampled outside the worker: vllm.v1.engine.output_processor.process_outputs "
        "+48.0 ms, vllm.v1.engine.processor.process_inputs > threading.wait +20.0 ms "
        "(81.0 ms in all, second run 12.0 ms)")
    # a fifth of the excess at least: 20 ms of a 120 ms excess is not named
    assert stacks_explanation(first, second, 120.0) == (
        "sampled outside the worker: vllm.v1.engine.output_processor.process_outputs "
        "+48.0 ms (81.0 ms in all, second run 12.0 ms)")
    assert stacks_explanation(second, first, 10.0) == ""  # nothing grew
    assert stacks_explanation(first, None, 69.0) == ""  # not sampled
    assert stacks_explanation({"error": "x"}, second, 69.0) == ""


def test_an_unexplained_verdict_says_where_the_thread_was_and_whether_it_worked():
    """s14's unexplained line (tiny granite, `top-p + top-k, batch 17`), as a
    run with this module's samples and the thread's CPU time would carry it:
    the verdict stays unexplained and says both."""
    import copy
    import gzip
    import json
    from pathlib import Path

    from stepwarm.coverage.report import CoverageReport

    path = (Path(__file__).parents[2] / "campaigns" / "results"
            / "h200-coverage-1203s14-one-pool-granite-v2.json.gz")
    run = json.loads(gzip.decompress(path.read_bytes()))["stepwarm"]
    line = copy.deepcopy(next(r for r in run["requests"] if r["name"] == "top-p + top-k, batch 17"))
    # the thread's CPU time, and of it the worker's: 20.1 and 16.0 ms outside it
    line["side_effects_first"].update(thread_cpu_ms=60.1, worker_cpu_ms=40.0)
    line["side_effects_second"].update(thread_cpu_ms=46.0, worker_cpu_ms=30.0)
    line["trace_first"]["stacks"] = {"outside_ms": 76.0, "samples": 30, "sites": {
        "vllm.v1.engine.core.step > threading.wait": 61.0, "vllm.v1.engine.llm_engine.step": 9.0}}
    line["trace_second"]["stacks"] = {"outside_ms": 8.1, "samples": 8, "sites": {
        "vllm.v1.engine.llm_engine.step": 7.9}}
    run["requests"] = [line]
    assert CoverageReport.from_dict(run).flagged(line) == (
        "ratio > 1.2: unexplained; step 1 of 5 (153 tokens, 17 requests) +11.6 ms (all the "
        "worker's steps +12.2 ms); outside the worker +68.1 ms of the 80.3 ms excess (mostly "
        "waiting, off the CPU: the thread's CPU time there +4.1 ms); sampled outside the worker: "
        "vllm.v1.engine.core.step > threading.wait +61.0 ms (76.0 ms in all, second run "
        "8.1 ms); one more prompt token each, run next: 47.4 then "
        "44.7 ms (a kernel class this line reached first, not a cost of every new size)")

