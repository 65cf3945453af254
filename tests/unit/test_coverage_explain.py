"""``stepwarm.coverage.explain``: a first run's side effects, read off the
real process state (imports, the garbage collector, torch.compile's
counters), and the phrase a flagged request gets."""

from __future__ import annotations

import gc
import sys
import threading

import torch

from stepwarm.coverage.explain import explanation, side_effects, snapshot


def test_nothing_happened_is_nothing():
    before = snapshot()
    fx = side_effects(before, snapshot())
    # the host's other tasks may take a CPU meanwhile (not this test's doing)
    fx.pop("preempted", None), fx.pop("cpu_stall_ms", None)
    assert 0.0 <= fx.pop("thread_cpu_ms") < 50.0
    assert fx == {}


def test_a_lazy_import_a_full_gc_and_a_thread_are_seen(tmp_path, monkeypatch):
    (tmp_path / "stepwarm_lazy_probe.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "stepwarm_lazy_probe", raising=False)
    before = snapshot()
    import stepwarm_lazy_probe  # noqa: F401

    gc.collect(2)
    done = threading.Event()
    t = threading.Thread(target=done.wait)
    t.start()
    try:
        fx = side_effects(before, snapshot())
    finally:
        done.set()
        t.join()
    fx.pop("preempted", None), fx.pop("cpu_stall_ms", None)  # the host's doing
    assert fx.pop("thread_cpu_ms") >= 0.0
    assert fx["imports"] == 1 and fx["imported"] == ["stepwarm_lazy_probe"]
    assert fx["gc_collections"][2] >= 1
    assert fx["threads"] == 1
    assert explanation(fx, {}) == ("1 module(s) imported (stepwarm_lazy_probe); "
                                   f"1 thread(s) started; {fx['gc_collections'][2]} full gc pass(es)")
    # the same in both runs explains nothing
    assert explanation(fx, fx) == ""


def test_torch_compile_graphs_and_recompiles_are_counted():
    torch._dynamo.reset()

    @torch.compile(backend="eager", dynamic=False)
    def f(x):
        return x * 2

    f(torch.ones(2))
    before = snapshot()
    f(torch.ones(3))  # a new static shape: guard failure, recompile
    fx = side_effects(before, snapshot())
    fx.pop("preempted", None), fx.pop("cpu_stall_ms", None)  # the host's doing
    assert fx["dynamo_frames"] == 1 and fx["dynamo_graphs"] == 1
    assert explanation(fx, {}) == "1 torch.compile frame compile(s); 1 torch.compile graph(s)"
    before = snapshot()
    f(torch.ones(3))  # guards hold: nothing compiled
    fx = side_effects(before, snapshot())
    assert "dynamo_frames" not in fx and "dynamo_graphs" not in fx


def _snap(preempted: int, stall_us: int):
    from stepwarm.coverage.explain import Snapshot

    return Snapshot(modules=frozenset(), dynamo_frames=0, dynamo_graphs=0, reserved_bytes=0,
                    device_allocs=0, gc_collections=(0, 0, 0), threads=1,
                    preempted=preempted, cpu_stall_us=stall_us)


def test_host_contention_is_said_when_the_first_run_lost_the_cpu_well_beyond_the_second():
    first = side_effects(_snap(100, 1_000_000), _snap(260, 1_021_500))
    second = side_effects(_snap(300, 2_000_000), _snap(330, 2_003_000))
    assert first == {"preempted": 160, "cpu_stall_ms": 21.5, "thread_cpu_ms": 0.0}
    assert second == {"preempted": 30, "cpu_stall_ms": 3.0, "thread_cpu_ms": 0.0}
    assert explanation(first, second) == (
        "host CPU contention: 160 involuntary context switches (second run 30), "
        "tasks waited 21.5 ms for a CPU (second run 3)")
    # under twice the second run's, or fewer than 50 switches / 5 ms more: not said
    assert explanation({"preempted": 59, "cpu_stall_ms": 6.0}, {"preempted": 30, "cpu_stall_ms": 3.1}) == ""
    assert explanation({"preempted": 70, "cpu_stall_ms": 4.0}, {"preempted": 10}) == \
        "host CPU contention: 70 involuntary context switches (second run 10)"


def test_cpu_pressure_is_read_from_psi(tmp_path, monkeypatch):
    from stepwarm.coverage import explain

    psi = tmp_path / "cpu"
    psi.write_text("some avg10=0.00 avg60=0.02 avg300=0.00 total=535770672\n"
                   "full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    monkeypatch.setattr(explain, "PSI_CPU", str(psi))
    assert snapshot().cpu_stall_us == 535770672
    monkeypatch.setattr(explain, "PSI_CPU", str(tmp_path / "none"))
    assert snapshot().cpu_stall_us == 0


def test_the_collectors_time_is_counted_while_its_clock_is_on():
    from stepwarm.coverage.explain import _gc_callback, gc_clock

    garbage = [[i] for i in range(200_000)]
    with gc_clock():
        before = snapshot()
        gc.collect(2)
        fx = side_effects(before, snapshot())
    assert _gc_callback not in gc.callbacks
    assert fx["gc_ms"] > 0.0
    before = snapshot()
    gc.collect(2)  # the clock is off: passes counted, their time not
    fx = side_effects(before, snapshot())
    assert "gc_ms" not in fx and fx["gc_collections"][2] >= 1
    del garbage


def test_the_collectors_time_explains_an_outlier_where_it_covers_half_the_excess():
    first, second = {"gc_ms": 42.0}, {"gc_ms": 2.0}
    assert explanation(first, second, 60.0) == "garbage collector +40.0 ms (42 ms, second run 2 ms)"
    assert explanation(first, second, 100.0) == ""  # 40 of 100 ms
    assert explanation(first, second) == ""  # no excess given
    assert explanation({"gc_ms": 1.5}, {}, 2.0) == "garbage collector +1.5 ms (1.5 ms, second run 0 ms)"
    assert explanation({"gc_ms": 0.9}, {}, 1.0) == ""  # under GC_MIN_MS


def test_the_threads_cpu_time_tells_work_from_waiting():
    import time

    before = snapshot()
    t0 = time.thread_time()
    while time.thread_time() - t0 < 0.03:
        pass
    busy = side_effects(before, snapshot())["thread_cpu_ms"]
    before = snapshot()
    time.sleep(0.05)
    idle = side_effects(before, snapshot())["thread_cpu_ms"]
    assert busy >= 30.0 and idle < 10.0


def test_outside_the_worker_says_whether_the_thread_worked_or_waited():
    from stepwarm.coverage.explain import outside_worker

    assert outside_worker(123.79, 43.48, 47.4, 35.2, 3.2) == (
        "outside the worker +68.1 ms of the 80.3 ms excess "
        "(mostly waiting, off the CPU: the thread's CPU time there +3.2 ms)")
    assert outside_worker(123.79, 43.48, 47.4, 35.2, 40.0) == (
        "outside the worker +68.1 ms of the 80.3 ms excess "
        "(on the CPU: the thread's CPU time there +40.0 ms)")
