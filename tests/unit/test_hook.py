"""The plugin's wrapper around compile_or_warm_up_model (plain classes; the
real worker start-up is in tests/e2e/test_hook.py)."""

from __future__ import annotations

from stepwarm import hook


class Base:
    def compile_or_warm_up_model(self):
        return "base"


class Sub(Base):
    def compile_or_warm_up_model(self):
        return "sub+" + super().compile_or_warm_up_model()


def test_scenarios_run_once_when_a_wrapped_subclass_calls_its_wrapped_base(monkeypatch):
    calls = []
    monkeypatch.setattr(hook, "warmup", lambda worker, names: calls.append(list(names)) or ["r"])
    monkeypatch.setenv(hook.ENV_SCENARIOS, " default , spec-decode,,")
    monkeypatch.setattr(Base, "compile_or_warm_up_model", Base.__dict__["compile_or_warm_up_model"])
    monkeypatch.setattr(Sub, "compile_or_warm_up_model", Sub.__dict__["compile_or_warm_up_model"])
    hook._wrap(Base)
    hook._wrap(Sub)
    hook._wrap(Sub)  # wrapping twice is a no-op
    worker = Sub()
    assert worker.compile_or_warm_up_model() == "sub+base"
    assert calls == [["default", "spec-decode"]]
    assert worker.stepwarm_reports == ["r"]
    assert Base().compile_or_warm_up_model() == "base" and len(calls) == 2


def test_nothing_runs_without_the_variable(monkeypatch):
    monkeypatch.delenv(hook.ENV_SCENARIOS, raising=False)
    monkeypatch.setattr(hook, "warmup", lambda *a: (_ for _ in ()).throw(AssertionError("ran")))
    monkeypatch.setattr(Base, "compile_or_warm_up_model", Base.__dict__["compile_or_warm_up_model"])
    hook._wrap(Base)
    assert Base().compile_or_warm_up_model() == "base"
    assert hook._scenario_names() == []
