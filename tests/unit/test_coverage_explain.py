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
    assert side_effects(before, snapshot()) == {}


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
    assert fx["dynamo_frames"] == 1 and fx["dynamo_graphs"] == 1
    assert explanation(fx, {}) == "1 torch.compile frame compile(s); 1 torch.compile graph(s)"
    before = snapshot()
    f(torch.ones(3))  # guards hold: nothing compiled
    fx = side_effects(before, snapshot())
    assert "dynamo_frames" not in fx and "dynamo_graphs" not in fx
