"""The plugin: what register() touches, the wrapper around
compile_or_warm_up_model, the STEPWARM_* settings and the JIT monitor hold.
The real worker start-up is in tests/e2e/test_hook.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from stepwarm import hook
from stepwarm.runner import jit_monitor_deferred
from stepwarm.worker_view import WorkerView
from stepwarm.settings import HookSettings, SettingsError


class Base:
    def compile_or_warm_up_model(self):
        return "base"


class Sub(Base):
    def compile_or_warm_up_model(self):
        return "sub+" + super().compile_or_warm_up_model()


@pytest.fixture
def plain_classes(monkeypatch):
    monkeypatch.setattr(Base, "compile_or_warm_up_model", Base.__dict__["compile_or_warm_up_model"])
    monkeypatch.setattr(Sub, "compile_or_warm_up_model", Sub.__dict__["compile_or_warm_up_model"])


def test_scenarios_run_once_when_a_wrapped_subclass_calls_its_wrapped_base(monkeypatch, plain_classes):
    calls = []
    monkeypatch.setattr(hook, "warmup",
                        lambda worker, names, settings: calls.append(list(names)) or ["r"])
    monkeypatch.setenv("STEPWARM_SCENARIOS", " default , spec-decode,,")
    hook._wrap(Base)
    hook._wrap(Sub)
    hook._wrap(Sub)  # wrapping twice is a no-op
    worker = Sub()
    assert worker.compile_or_warm_up_model() == "sub+base"
    assert calls == [["default", "spec-decode"]]
    assert worker.stepwarm_reports == ["r"]
    assert Base().compile_or_warm_up_model() == "base" and len(calls) == 2


def test_nothing_runs_without_the_variable(monkeypatch, plain_classes):
    monkeypatch.delenv("STEPWARM_SCENARIOS", raising=False)
    monkeypatch.setattr(hook, "warmup", lambda *a, **k: (_ for _ in ()).throw(AssertionError("ran")))
    hook._wrap(Base)
    assert Base().compile_or_warm_up_model() == "base"
    assert HookSettings.from_env().scenarios == ()


# register() in a fresh interpreter: what it imports and what it changes.
REGISTER_PROBE = textwrap.dedent(
    """
    import json, sys, torch
    before = (torch.cuda.Event, torch.cuda.Stream)
    from stepwarm.hook import register
    register()
    register()  # twice: still one finder
    after = (torch.cuda.Event, torch.cuda.Stream)
    out = {
        "same_event": before[0] is after[0], "same_stream": before[1] is after[1],
        "worker_modules": sorted(m for m in sys.modules if m.startswith("vllm.v1.worker")),
        "vllm_loaded": "vllm" in sys.modules,
        "finders": sum(getattr(f, "owner", None) == "hook" for f in sys.meta_path),
    }
    # What the CPU platform's worker_cls resolves to, imported the way vLLM does.
    from vllm.utils.import_utils import resolve_obj_by_qualname
    cls = resolve_obj_by_qualname("vllm.v1.worker.cpu_worker.CPUWorker")
    from vllm.v1.worker.gpu_worker import Worker
    out["cpu_wrapped"] = getattr(cls.__dict__["compile_or_warm_up_model"], "_stepwarm", False)
    out["gpu_base_wrapped"] = getattr(Worker.__dict__["compile_or_warm_up_model"], "_stepwarm", False)
    out["event_after_cpu_import_is_placeholder"] = torch.cuda.Event is not before[0]
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.llm_engine import LLMEngine
    out["front_end_wrapped"] = [getattr(c.__dict__["__init__"], "_stepwarm", False)
                                for c in (AsyncLLM, LLMEngine)]
    print("RESULT " + json.dumps(out))
    """
)


def _probe(env_extra: dict[str, str]) -> tuple[subprocess.CompletedProcess, dict | None]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWARM_")}
    env.update(env_extra)
    proc = subprocess.run([sys.executable, "-c", REGISTER_PROBE], capture_output=True,
                          text=True, env=env, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    return proc, json.loads(lines[-1][7:]) if lines else None


def test_register_imports_no_worker_module_and_keeps_torch_cuda_event_and_stream():
    proc, out = _probe({"STEPWARM_SCENARIOS": "default,triton-buckets"})
    assert out is not None, proc.stderr[-3000:]
    assert out["same_event"] and out["same_stream"]
    assert out["worker_modules"] == [] and not out["vllm_loaded"]
    assert out["finders"] == 1
    # The worker this process runs (CPU here) is wrapped once vLLM imports it;
    # importing it is what replaces torch.cuda.Event (vLLM's shm.py), which is
    # why register() must not.
    assert out["cpu_wrapped"] and out["gpu_base_wrapped"]
    assert out["event_after_cpu_import_is_placeholder"]
    assert out["front_end_wrapped"] == [True, True]


def test_register_without_scenarios_installs_nothing():
    proc, out = _probe({})
    assert out is not None, proc.stderr[-3000:]
    assert out["finders"] == 0 and not out["cpu_wrapped"] and not out["gpu_base_wrapped"]


@pytest.mark.parametrize("var, value, allowed", [
    ("STEPWARM_ON_ERROR", "ignore", "allowed: raise | warn"),
    ("STEPWARM_ROLE", "consumer", "allowed: auto | prefill | decode | both"),
    ("STEPWARM_TIME_LIMIT_S", "soon", "allowed: a number > 0"),
    ("STEPWARM_TIME_LIMIT_S", "-5", "allowed: a number > 0"),
    ("STEPWARM_RANK_TIMEOUT_S", "nan", "allowed: a number > 0"),
])
def test_bad_setting_is_one_line_naming_variable_and_allowed_values(var, value, allowed):
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({"STEPWARM_SCENARIOS": "default", var: value})
    msg = str(e.value)
    assert msg.startswith(f"{var}={value!r}: ") and allowed in msg and "\n" not in msg


def test_register_fails_on_a_bad_setting(monkeypatch):
    monkeypatch.setenv("STEPWARM_SCENARIOS", "default")
    monkeypatch.setenv("STEPWARM_ON_ERROR", "later")
    with pytest.raises(SettingsError, match=r"^STEPWARM_ON_ERROR='later': allowed: raise \| warn$"):
        hook.register()


def test_settings_values():
    s = HookSettings.from_env({"STEPWARM_SCENARIOS": "a, b", "STEPWARM_ON_ERROR": "WARN",
                               "STEPWARM_TIME_LIMIT_S": "2.5", "STEPWARM_ROLE": "decode",
                               "STEPWARM_RANK_TIMEOUT_S": "30"})
    assert (s.scenarios, s.on_error, s.time_limit_s, s.role, s.rank_timeout_s) == (
        ("a", "b"), "warn", 2.5, "decode", 30.0)
    d = HookSettings.from_env({})
    assert (d.enabled, d.on_error, d.time_limit_s, d.role, d.rank_timeout_s) == (
        False, "raise", None, "auto", 300.0)


def test_jit_monitor_is_activated_after_the_block_with_vllms_arguments():
    from vllm.utils import jit_monitor

    original = jit_monitor.activate
    seen = []
    jit_monitor.activate = lambda **kw: seen.append(("activated", kw))
    try:
        with jit_monitor_deferred():
            jit_monitor.activate(mode="error", verbose=False)  # what the worker calls
            seen.append("stepwarm ran")
        assert seen == ["stepwarm ran", ("activated", {"mode": "error", "verbose": False})]
        with pytest.raises(KeyError), jit_monitor_deferred():
            jit_monitor.activate(mode="warn", verbose=True)
            raise KeyError("a step failed")
        assert seen[-1] == ("activated", {"mode": "warn", "verbose": True})
    finally:
        jit_monitor.activate = original


@pytest.mark.parametrize("kv_role, role", [(None, "both"), ("kv_both", "both"),
                                           ("kv_producer", "prefill"), ("kv_consumer", "decode")])
def test_role_of_kv_role(kv_role, role):
    from stepwarm.settings import role_of_kv_role

    assert role_of_kv_role(kv_role) == role


def test_other_variables_are_not_read_while_the_plugin_is_off():
    # A bad STEPWARM_ON_ERROR cannot break a vLLM start-up that runs no scenario.
    assert HookSettings.from_env({"STEPWARM_ON_ERROR": "later", "STEPWARM_ROLE": "x"}) == HookSettings()


def test_rank_timeout_beyond_a_day_is_refused():
    with pytest.raises(SettingsError, match=r"STEPWARM_RANK_TIMEOUT_S='1e15': .* <= 86400"):
        HookSettings.from_env({"STEPWARM_SCENARIOS": "default", "STEPWARM_RANK_TIMEOUT_S": "1e15"})


def test_register_warns_of_a_misspelt_name_while_the_plugin_is_off(monkeypatch, caplog):
    # STEPWARM_SCENARIO (no S) leaves the plugin off: the warning is all that says so.
    monkeypatch.delenv("STEPWARM_SCENARIOS", raising=False)
    monkeypatch.setenv("STEPWARM_SCENARIO", "all")
    monkeypatch.setenv(hook.WARNED_MARKER, "")  # (restored to absent after the test)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    with caplog.at_level("WARNING", logger="vllm.stepwarm"):
        hook.register()
        # vllm serve's engine core and workers inherit the environment: warned once in all
        hook.register()
    assert [r.getMessage() for r in caplog.records] == [
        "stepwarm: STEPWARM_SCENARIO is not a stepwarm variable (ignored); "
        "did you mean STEPWARM_SCENARIOS?"]
    assert os.environ[hook.WARNED_MARKER] == "1"
    child = subprocess.run(
        [sys.executable, "-c", "import logging; logging.basicConfig(); "
         "from stepwarm.hook import register; register()"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert child.returncode == 0 and "STEPWARM_SCENARIO" not in child.stderr, child.stderr
    from stepwarm.wrap_on_import import finder_of

    assert finder_of("hook") is None


def test_register_checks_scenario_names_before_vllm_loads_anything(monkeypatch, caplog):
    from stepwarm.scenario import ScenarioError

    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder goes with the test
    monkeypatch.setenv("STEPWARM_SCENARIOS", "default,tritonbuckets")
    with pytest.raises(ScenarioError, match="unknown scenario 'tritonbuckets' .*triton-buckets"):
        hook.register()
    monkeypatch.setenv("STEPWARM_ON_ERROR", "warn")
    with caplog.at_level("WARNING", logger="vllm.stepwarm"):
        hook.register()  # logged, start-up goes on
    assert any("tritonbuckets" in r.message for r in caplog.records)


def test_a_misspelt_scenario_name_ends_register_with_one_line_and_no_traceback():
    """vLLM's plugin loader calls register() unguarded: a bad STEPWARM_SCENARIOS
    name must end the process with one line (ScenarioExit), exit 1."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "STEPWARM_SCENARIOS": "defualt", "STEPWARM_ON_ERROR": "raise"}
    proc = subprocess.run([sys.executable, "-c", "from stepwarm.hook import register; register()"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("stepwarm: unknown scenario 'defualt' (did you mean 'default'?); "
                           "allowed: a path to a .toml file, a built-in name: ")


def test_an_unknown_fact_in_a_scenario_file_ends_register_before_the_model_loads(tmp_path):
    """A new user's `prompt = "twenty"` (run s20's session) was found only once
    the worker was up, with a traceback: it is the file's format, so
    register() says it, one paragraph, exit 1."""
    import os
    import subprocess
    import sys

    f = tmp_path / "t1.toml"
    f.write_text('[requests.a]\nprompt = "twenty"\n[[steps]]\nkind = "prefill"\n'
                 'requests = ["a"]\n')
    env = {**os.environ, "STEPWARM_SCENARIOS": f"{f},default"}
    proc = subprocess.run([sys.executable, "-c", "from stepwarm.hook import register; register()"],
                          capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    # the paragraph check says: the error, then the step it left unchecked
    line, note = proc.stderr.strip().splitlines()
    assert line.startswith(f"stepwarm: {f}:2: request 'a', field 'prompt': 'twenty': unknown "
                           "fact 'twenty'; allowed facts: decode_query_len, ")
    assert note == (f"{f}: the steps were checked only as far as they do not depend on the "
                    "requests above that failed (a); not checked: step 0, which selects them; "
                    "fix the errors above and check again")


@pytest.mark.parametrize("value", [" ", ",", " , "])
def test_a_blank_scenarios_variable_is_refused_with_one_line(value):
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({"STEPWARM_SCENARIOS": value})
    assert str(e.value) == (f"STEPWARM_SCENARIOS={value!r}: names no scenario; allowed: "
                            "comma-separated built-in names, .toml paths or all; unset or "
                            "empty: the plugin is off")


def test_an_empty_scenarios_variable_is_unset():
    assert HookSettings.from_env({"STEPWARM_SCENARIOS": "", "STEPWARM_ON_ERROR": "x"}) \
        == HookSettings()


@pytest.mark.parametrize("var, allowed", [
    ("STEPWARM_ON_ERROR", "allowed: raise | warn"),
    ("STEPWARM_ROLE", "allowed: auto | prefill | decode | both"),
    ("STEPWARM_TIME_LIMIT_S", "not a number of seconds; allowed: a number > 0"),
    ("STEPWARM_STEP_WARN_S", "not a number of seconds; allowed: a number > 0"),
])
def test_a_blank_setting_is_refused_and_an_empty_one_is_the_default(var, allowed):
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({"STEPWARM_SCENARIOS": "default", var: "  "})
    assert str(e.value).startswith(f"{var}='  ': {allowed}")
    assert HookSettings.from_env({"STEPWARM_SCENARIOS": "default", var: ""}) \
        == HookSettings(scenarios=("default",))


def test_register_ends_on_a_blank_scenarios_variable(monkeypatch):
    monkeypatch.setenv("STEPWARM_SCENARIOS", " ")
    with pytest.raises(SystemExit) as e:
        hook.register()
    assert e.value.code == ("stepwarm: STEPWARM_SCENARIOS=' ': names no scenario; allowed: "
                            "comma-separated built-in names, .toml paths or all; unset or "
                            "empty: the plugin is off")


@pytest.mark.parametrize("value, what", [("-5", "out of range"), ("0", "out of range"),
                                         ("1e9", "too long"), ("soon", "not a number of seconds")])
def test_a_seconds_setting_says_why_it_is_refused(value, what):
    with pytest.raises(SettingsError) as e:
        HookSettings.from_env({"STEPWARM_SCENARIOS": "default", "STEPWARM_TIME_LIMIT_S": value})
    assert str(e.value) == (f"STEPWARM_TIME_LIMIT_S={value!r}: {what}; allowed: a number > 0 "
                            "and <= 86400 (e.g. 60), or unset")


def test_register_hands_the_settings_to_ray_workers_that_copy_known_prefixes():
    """vLLM's legacy Ray executor copies only the prefixes it knows to its
    actors; with the plugin on, register() adds STEPWARM_ (once, keeping the
    user's), so vLLM's own copy list carries STEPWARM_SCENARIOS. In a fresh
    process: register() installs its import hook there."""
    code = (
        "import json, os\n"
        "from stepwarm.hook import RAY_PREFIXES_VAR, register\n"
        "register(); register()\n"
        "from vllm.ray.ray_env import get_env_vars_to_copy\n"
        "print(json.dumps([os.environ.get(RAY_PREFIXES_VAR),"
        " 'STEPWARM_SCENARIOS' in get_env_vars_to_copy()]))\n")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STEPWARM_") and k != "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"}
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                        env={**env, "STEPWARM_SCENARIOS": "default",
                             "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY": "MY_"})
    assert json.loads(on.stdout.splitlines()[-1]) == ["MY_,STEPWARM_", True], on.stderr[-2000:]
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert json.loads(off.stdout.splitlines()[-1]) == [None, False], off.stderr[-2000:]


def test_the_front_end_loads_the_logits_processor_classes_before_the_first_request(
        monkeypatch, caplog):
    """vLLM's own cache (``cached_load_custom_logitsprocs``) is filled when
    the wrapped front end is built, under the key its input processor's
    validation uses: the first request's validation (vLLM's
    ``validate_logits_processors_parameters``) then finds it there."""
    from functools import partial
    from types import SimpleNamespace

    from vllm import SamplingParams

    class Engine:
        def __init__(self, input_processor):
            self.input_processor = input_processor

    try:
        from vllm.v1.sample.logits_processor import (
            cached_load_custom_logitsprocs,
            validate_logits_processors_parameters,
        )
    except ImportError:
        # vLLM 0.34: the input processor loaded its classes when it was
        # built (``_build_logits_processors_params_validator``): nothing left
        monkeypatch.setenv("STEPWARM_SCENARIOS", "default")
        hook._wrap_front_end(Engine)
        with caplog.at_level("DEBUG", logger="vllm.stepwarm"):
            Engine(SimpleNamespace(validate_logits_processors_params=lambda params: None))
        assert caplog.records == []  # nothing loaded, nothing failed
        return

    hook._wrap_front_end(Engine)
    hook._wrap_front_end(Engine)  # wrapping twice is a no-op
    assert Engine.__init__._stepwarm and Engine.__init__.__wrapped__.__name__ == "__init__"
    # vLLM 0.31+ with the V1 runner (this CPU build): a partial over the key
    v1 = SimpleNamespace(validate_logits_processors_params=partial(
        validate_logits_processors_parameters, None), model_config=None)
    cached_load_custom_logitsprocs.cache_clear()
    monkeypatch.delenv("STEPWARM_SCENARIOS", raising=False)
    Engine(v1)  # the plugin off: nothing loaded
    assert cached_load_custom_logitsprocs.cache_info().currsize == 0
    monkeypatch.setenv("STEPWARM_SCENARIOS", "default")
    with caplog.at_level("INFO", logger="vllm.stepwarm"):
        Engine(v1)
    assert [r.getMessage() for r in caplog.records] == [
        "stepwarm: front end: the logits-processor classes (0) loaded before the first request"]
    v1.validate_logits_processors_params(SamplingParams())
    info = cached_load_custom_logitsprocs.cache_info()
    assert (info.hits, info.misses) == (1, 1)
    # vLLM 0.26-0.30: no validator; SamplingParams.verify keys by the model config
    Engine(SimpleNamespace(model_config=SimpleNamespace(logits_processors=["a.B"])))
    Engine(SimpleNamespace(model_config=SimpleNamespace(logits_processors=None)))
    info = cached_load_custom_logitsprocs.cache_info()
    assert (info.hits, info.misses, info.currsize) == (2, 2, 1)  # a.B cannot load: not cached
    # vLLM 0.31+'s V2 runner loaded its classes when the input processor was built
    caplog.clear()
    with caplog.at_level("INFO", logger="vllm.stepwarm"):
        Engine(SimpleNamespace(validate_logits_processors_params=lambda params: None))
    assert caplog.records == [] and cached_load_custom_logitsprocs.cache_info().misses == 2


def _one_request_plan(name: str, sampling, structured: bool = False):
    from stepwarm.plan import PlanBuilder, PlannedRequest
    from tests.helpers import make_profile

    b = PlanBuilder(make_profile(max_num_seqs=4), name=name)
    b.add_request(PlannedRequest("_stepwarm_a_", 8, sampling=sampling,
                                 structured_output=structured))
    b.step("prefill", "a", prefill={"_stepwarm_a_": 8}, grammar=structured or None)
    b.cleanup()
    return b.build()


def test_the_idle_records_key_changes_with_a_scenarios_sampling():
    """Same steps, other sampling (other sampler kernels): another
    configuration, so the edited scenario runs again."""
    greedy = _one_request_plan("samp", "greedy")
    topk = _one_request_plan("samp", (("temperature", 0.8), ("top_k", 5)))
    grammar = _one_request_plan("samp", "greedy", structured=True)
    assert greedy.lockstep_signature() == topk.lockstep_signature()
    texts = {hook._plan_text(p) for p in (greedy, topk, grammar)}
    assert len(texts) == 3
    assert hook._plan_text(greedy) == hook._plan_text(_one_request_plan("samp", "greedy"))


def test_two_scenarios_of_one_name_get_their_own_record_entries():
    plans = [_one_request_plan(n, "greedy") for n in ("x", "default", "x", "x")]
    assert hook.record_names(plans) == ["x", "default", "x#2", "x#3"]


def test_a_restart_runs_the_gemm_calls_that_loaded_a_kernel_at_the_fresh_start(
        monkeypatch, tmp_path, caplog):
    """Under STEPWARM_SKIP_IDLE the record keeps the ladder's calls that took
    a first launch's time, and the next process with the same ladder runs
    those alone; another ladder (another device or shapes) runs whole."""
    from types import SimpleNamespace

    from stepwarm import gemm_sizes
    from stepwarm.gemm_sizes import GemmLadder
    from stepwarm.idle_record import IdleRecord, configuration_key
    from tests.unit.test_gemm_sizes import _FirstLaunches, _Layer

    monkeypatch.setattr(gemm_sizes, "FIRST_LAUNCH_MS", 30)
    linear = _Layer(8, 4, False, _FirstLaunches({600}))
    head = _Layer(32, 4, False, _FirstLaunches({40, 2}))
    ladder = GemmLadder(layers=[linear], counts=[513, 559, 600], heads=[head],
                        head_counts=[1, 2, 39, 40])
    monkeypatch.setattr(gemm_sizes, "gemm_ladder", lambda worker: ladder)
    key = configuration_key(["gemm restart"])

    def start():
        for layer in (linear, head):
            layer.quant_method.loaded.clear()
            layer.quant_method.calls.clear()
        worker = SimpleNamespace()
        record = IdleRecord.load(key, "rank0", tmp_path)
        with caplog.at_level("INFO", logger="vllm.stepwarm"):
            hook._warm_gemm_sizes(WorkerView(worker), "rank 0", record)
        assert record.save()
        _SAVED.discard(record.path)  # the next start is another process
        return worker.stepwarm_gemm

    from stepwarm.idle_record import _SAVED

    fresh = start()
    assert sorted(fresh.loads) == [(0, 600), (1, 2), (1, 40)] and fresh.calls_run == 7
    assert linear.quant_method.calls == [600, 559, 513] and head.quant_method.calls == [40, 39, 2, 1]
    caplog.clear()
    again = start()
    assert linear.quant_method.calls == [600] and head.quant_method.calls == [40, 2]
    assert (again.calls_run, again.calls_total) == (3, 7)
    assert "ran 3 of its 7 calls, those that loaded a kernel at the last start" in caplog.text
    # the same kernels loaded again: the record keeps the same calls
    assert IdleRecord.load(key, "rank0", tmp_path).gemm_loads(ladder.signature()) == {
        (0, 600), (1, 2), (1, 40)}
    ladder.head_counts = [1, 2, 39, 40, 41]  # another ladder: all of it runs
    assert start().calls_run == 8
