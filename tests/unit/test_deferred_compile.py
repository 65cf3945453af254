"""deferred_compiles: Triton's ``jit_cache_hook`` protocol, driven as Triton's
``JITFunction._call_hook`` calls it (no GPU here, so no launch reaches it:
the kernel objects below stand in for ``JITFunction``s, the runtime for
``triton.knobs.runtime``). The real compile-and-launch path runs in the GPU
lane (benchmarks/gpu_deferred_compile.py)."""

from __future__ import annotations

import threading
import time
import types

import pytest

from stepwarm import vllm_facts
from stepwarm.deferred_compile import default_threads, deferred_compiles
from stepwarm.settings import HookSettings, SettingsError, compile_threads

TOPK = "vllm.v1.sample.ops.topk_topp_triton:_topk_topp_kernel"


class Kernel:
    """A ``JITFunction`` as the hook sees it: ``preload`` compiles a variant."""

    def __init__(self, seconds: float = 0.0, fail: bool = False):
        self.preloaded: list[str] = []
        self.threads: set[str] = set()
        self.seconds, self.fail = seconds, fail

    def preload(self, data: str) -> None:
        self.threads.add(threading.current_thread().name)
        time.sleep(self.seconds)
        if self.fail:
            raise RuntimeError("ptxas failed")
        self.preloaded.append(data)


def call(runtime, kernel: Kernel, key: str, module="vllm.v1.sample.ops.topk_topp_triton",
         name="_topk_topp_kernel", warmup=False):
    """What ``JITFunction._call_hook`` passes (Triton 3.6)."""
    fn = types.SimpleNamespace(module=module, name=name, jit_function=kernel)
    return runtime.jit_cache_hook(key=key, repr=name, fn=fn,
                                  compile={"key": key, "device": 0,
                                           "specialization_data": f"spec-{key}"},
                                  is_manual_warmup=warmup, already_compiled=False)


def test_listed_kernel_launch_skipped_and_compiled_in_a_thread():
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    kernel = Kernel(seconds=0.05)
    with deferred_compiles(2, runtime=runtime) as d:
        d.step = 3
        assert call(runtime, kernel, "k16") is True  # launch skipped
        assert call(runtime, kernel, "k16") is True  # pending: skipped, not resubmitted
        d.step = 5
        assert call(runtime, kernel, "k17") is True
        assert call(runtime, kernel, "other", name="_zero_kv_blocks_kernel",
                    module="vllm.v1.worker.gpu.block_table") is None  # not listed: compiles inline
        assert call(runtime, kernel, "k1", warmup=True) is None  # someone's warmup(): untouched
    assert runtime.jit_cache_hook is None  # put back
    assert sorted(kernel.preloaded) == ["spec-k16", "spec-k17"]
    assert all(t.startswith("stepwarm-compile") for t in kernel.threads)
    assert [(c.kernel, c.step, c.error) for c in d.result.compiles] == [
        ("_topk_topp_kernel", 3, None), ("_topk_topp_kernel", 5, None)]
    assert all(c.seconds is not None and c.seconds >= 0.05 for c in d.result.compiles)


class SideBySide(Kernel):
    """Each compile waits until all four run at once (a Barrier: run one
    after another, they break it and fail) and until the caller lets them go."""

    def __init__(self):
        super().__init__()
        self.together = threading.Barrier(4, timeout=10)
        self.go = threading.Event()

    def preload(self, data: str) -> None:
        self.together.wait()
        assert self.go.wait(10)
        time.sleep(0.05)
        super().preload(data)


def test_compiles_run_in_parallel_and_exit_waits_for_them():
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    kernel = SideBySide()
    with deferred_compiles(4, runtime=runtime) as d:
        for key in ("a", "b", "c", "d"):
            assert call(runtime, kernel, key) is True
        assert kernel.preloaded == []  # the caller went on before any compile ended
        kernel.go.set()
    assert sorted(kernel.preloaded) == ["spec-a", "spec-b", "spec-c", "spec-d"]  # exit waited
    assert [c.error for c in d.result.compiles] == [None] * 4  # the barrier held: side by side
    assert d.result.waited_s > 0.0


def test_a_failed_compile_is_reported_not_raised():
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    with deferred_compiles(1, runtime=runtime) as d:
        call(runtime, Kernel(fail=True), "bad")
    assert [(c.step, c.seconds, c.error) for c in d.result.compiles] == [
        (None, None, "RuntimeError: ptxas failed")]


def test_previous_hook_chained_and_its_skip_respected():
    seen = []

    def previous(**kw):
        seen.append(kw["key"])
        return kw["key"] == "theirs"

    runtime = types.SimpleNamespace(jit_cache_hook=previous)
    kernel = Kernel()
    with deferred_compiles(1, runtime=runtime) as d:
        assert call(runtime, kernel, "theirs") is True
        assert call(runtime, kernel, "ours") is True
    assert runtime.jit_cache_hook is previous
    assert seen == ["theirs", "ours"]
    assert kernel.preloaded == ["spec-ours"]  # "theirs" was the previous hook's skip
    assert [c.kernel for c in d.result.compiles] == ["_topk_topp_kernel"]


def test_off_changes_nothing():
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    with deferred_compiles(0, runtime=runtime) as d:
        assert runtime.jit_cache_hook is None
        d.step = 1
    assert d.result.compiles == [] and d.result.waited_s == 0.0


def test_hook_put_back_when_the_body_raises():
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    kernel = Kernel(seconds=0.05)
    with pytest.raises(KeyError), deferred_compiles(1, runtime=runtime):
        call(runtime, kernel, "k")
        raise KeyError("step failed")
    assert runtime.jit_cache_hook is None and kernel.preloaded == ["spec-k"]


def test_inner_contexts_share_the_outer_pool_and_only_the_outer_waits():
    """The plugin's one pool around every scenario: each scenario's context
    records its own steps' compiles and returns while they still run; the
    outer one waits for them all and puts the hook back."""
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    kernel = Kernel()
    gate = threading.Event()
    slow = Kernel()
    slow.preload = lambda data: (gate.wait(10), Kernel.preload(slow, data))  # type: ignore[method-assign]
    with deferred_compiles(2, runtime=runtime) as outer:
        hook = runtime.jit_cache_hook
        with deferred_compiles(2, runtime=runtime) as first:
            assert runtime.jit_cache_hook is hook  # no second hook
            first.step = 4
            assert call(runtime, slow, "topktopp17") is True
        assert first.result.waited_s == 0.0 and slow.preloaded == []  # left running
        with deferred_compiles(2, runtime=runtime) as second:
            second.step = 1
            assert call(runtime, kernel, "topktopp17") is True  # pending: not again
            assert call(runtime, kernel, "topk16") is True
        with deferred_compiles(0, runtime=runtime) as verify:
            verify.step = 0
            assert call(runtime, kernel, "topk17") is None  # threads 0: the step compiles it
        gate.set()
    assert runtime.jit_cache_hook is None
    assert slow.preloaded == ["spec-topktopp17"] and kernel.preloaded == ["spec-topk16"]
    assert [(c.key, c.step) for c in first.result.compiles] == [("topktopp17", 4)]
    assert [(c.key, c.step) for c in second.result.compiles] == [("topk16", 1)]
    assert verify.result.compiles == []
    assert [c.key for c in outer.result.compiles] == ["topktopp17", "topk16"]
    assert all(c.seconds is not None for c in outer.result.compiles)
    assert outer.result.waited_s > 0.0
    with deferred_compiles(1, runtime=runtime) as alone:  # no outer left: its own hook again
        assert runtime.jit_cache_hook is not None and runtime.jit_cache_hook is not hook
        assert call(runtime, kernel, "k1") is True
    assert [c.key for c in alone.result.compiles] == ["k1"] and kernel.preloaded[-1] == "spec-k1"
    assert runtime.jit_cache_hook is None


def test_listed_kernels_are_the_sampler_leaves():
    assert vllm_facts.DEFERRABLE_TRITON_KERNELS == {
        TOPK, "vllm.v1.worker.gpu.sample.logprob:_topk_log_softmax_kernel"}


def test_listed_kernels_exist_in_the_installed_vllm():
    import importlib

    for entry in sorted(vllm_facts.DEFERRABLE_TRITON_KERNELS):
        module, name = entry.split(":")
        assert hasattr(importlib.import_module(module), name), entry


def test_settings_compile_threads():
    assert HookSettings.from_env({"STEPWARM_SCENARIOS": "default"}).compile_threads is None
    for value, want in (("auto", None), ("off", 0), ("OFF", 0), ("3", 3), ("64", 64), ("", None)):
        got = HookSettings.from_env({"STEPWARM_SCENARIOS": "default",
                                     "STEPWARM_COMPILE_THREADS": value}).compile_threads
        assert got == want, value
    for bad in ("0", "65", "-1", "2.5", "yes", " ", "²", "٣"):  # non-ASCII digits: isdigit() but not int()
        with pytest.raises(SettingsError) as e:
            HookSettings.from_env({"STEPWARM_SCENARIOS": "default",
                                   "STEPWARM_COMPILE_THREADS": bad})
        assert str(e.value) == (f"STEPWARM_COMPILE_THREADS={bad!r}: allowed: auto | off | "
                                "a whole number from 1 to 64")
    assert compile_threads({"STEPWARM_COMPILE_THREADS": "off"}) == 0
    assert compile_threads({"STEPWARM_COMPILE_THREADS": "5"}) == 5
    assert compile_threads({}) == default_threads()


@pytest.mark.parametrize("args", [["run", "-s", "default"], ["run", "-s", "default", "--verify"]])
def test_run_refuses_a_bad_compile_threads_before_the_engine(monkeypatch, args):
    """``stepwarm run`` reads STEPWARM_COMPILE_THREADS before anything starts;
    under --verify (which compiles in the steps) a bad value is refused too."""
    from typer.testing import CliRunner

    from stepwarm.cli import app

    monkeypatch.setenv("STEPWARM_COMPILE_THREADS", "²")
    r = CliRunner().invoke(app, args, env={"COLUMNS": "400"})
    assert r.exit_code == 2, r.output
    assert r.stderr == ("error: STEPWARM_COMPILE_THREADS='²': allowed: auto | off | "
                        "a whole number from 1 to 64\n")
    assert "engine up" not in r.stdout


def test_run_lists_a_bad_compile_threads_with_the_scenario_and_engine_arg_errors(
        monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from stepwarm.cli import app

    f = tmp_path / "bad.toml"
    f.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefil"\nrequests = ["a"]\n')
    monkeypatch.setenv("STEPWARM_COMPILE_THREADS", "many")
    r = CliRunner().invoke(app, ["run", "-s", str(f), "-e", "max_num_seqs=four"],
                           env={"COLUMNS": "400"})
    assert r.exit_code == 2, r.output
    assert [ln for ln in r.stderr.splitlines() if ln.startswith("error")] == [
        "error: STEPWARM_COMPILE_THREADS='many': allowed: auto | off | a whole number from 1 "
        "to 64",
        f"error: {f}:4: step 0, field 'kind': unknown step kind 'prefil' (did you mean "
        "'prefill'?); allowed kinds: prefill, chunked_prefill, prefix_hit, decode, spec_decode, "
        "mixed_decode, mixed_prefill_decode, preempt, resume, finish",
        "error: -e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer or null "
        "(int | None)"]
    assert "engine up" not in r.stdout


def test_default_threads_shared_by_local_ranks():
    import os

    cores = len(os.sched_getaffinity(0))
    assert default_threads() == max(1, min(8, cores))
    assert default_threads(local_ranks=cores * 2) == 1


MOE = "vllm_like.fused_moe:fused_moe_kernel"


def _moe_modules(runtime, kernel: Kernel):
    """A launcher module as vLLM's ``fused_moe.py`` (``invoke(A, B, C, ...)``
    launches the kernel into ``C``; a launch the hook did not skip writes it)
    and a caller that imported it by name, as ``experts/triton_moe.py`` does."""
    import sys

    import torch

    home = types.ModuleType("vllm_like.fused_moe")

    def invoke(A, B, C, top_k, key="k"):
        if runtime.jit_cache_hook is None or call(
                runtime, kernel, key, module="vllm_like.fused_moe", name="fused_moe_kernel") \
                is not True:
            C.copy_(A * B)  # launched
        return top_k

    home.invoke = invoke
    caller = types.ModuleType("vllm_like.triton_moe")
    caller.invoke = invoke
    sys.modules.update({home.__name__: home, caller.__name__: caller})
    return home, caller, torch


def test_a_zeroed_kernel_is_deferred_inside_its_launcher_and_its_output_zeroed():
    """fused MoE's output feeds the next layer's router: a skipped launch
    leaves zeros in ``C`` (not what was there), through either module's
    name for the launcher; outside the launcher the kernel compiles inline;
    the launchers are put back on exit."""
    import sys

    runtime = types.SimpleNamespace(jit_cache_hook=None)
    kernel = Kernel()
    home, caller, torch = _moe_modules(runtime, kernel)
    original = home.invoke
    try:
        with deferred_compiles(2, frozenset({TOPK}), runtime=runtime,
                               zeroed={MOE: ("vllm_like.fused_moe", "invoke", "C")}) as d:
            assert home.invoke is not original and caller.invoke is home.invoke
            d.step = 7
            c = torch.full((2, 3), float("nan"))
            assert caller.invoke(torch.ones(2, 3), torch.ones(2, 3), c, top_k=8, key="m513") == 8
            assert c.tolist() == [[0.0] * 3] * 2  # skipped: zeroed, not NaN
            c2 = torch.full((2, 3), 5.0)
            home.invoke(torch.ones(2, 3), torch.ones(2, 3), C=c2, top_k=1, key="m513")  # pending
            assert c2.tolist() == [[0.0] * 3] * 2
            assert call(runtime, kernel, "m769", module="vllm_like.fused_moe",
                        name="fused_moe_kernel") is None  # not through the launcher: inline
            c3 = torch.full((1, 1), 9.0)
            home.invoke(torch.full((1, 1), 2.0), torch.full((1, 1), 3.0), c3, 1, key="m513")
            assert c3.tolist() == [[0.0]]  # still pending: skipped again, zeroed again
        assert home.invoke is original and caller.invoke is original
        assert kernel.preloaded == ["spec-m513"]
        assert [(c.kernel, c.step, c.key) for c in d.result.compiles] == [
            ("fused_moe_kernel", 7, "m513")]
        c4 = torch.zeros(1, 1)
        home.invoke(torch.full((1, 1), 2.0), torch.full((1, 1), 3.0), c4, 1, key="m513")
        assert c4.tolist() == [[6.0]]  # no hook now: launched
    finally:
        for name in ("vllm_like.fused_moe", "vllm_like.triton_moe"):
            sys.modules.pop(name, None)


def test_a_zeroed_kernel_without_its_launcher_is_not_deferred():
    """A release whose launcher is missing (or has no output parameter)
    defers none of its launches: each compiles inline as before."""
    runtime = types.SimpleNamespace(jit_cache_hook=None)
    kernel = Kernel()
    home, caller, torch = _moe_modules(runtime, kernel)
    try:
        for zeroed in ({MOE: ("vllm_like.fused_moe", "gone", "C")},
                       {MOE: ("vllm_like.fused_moe", "invoke", "out")},
                       {MOE: ("vllm_like.not_loaded", "invoke", "C")}):
            with deferred_compiles(1, frozenset({TOPK}), runtime=runtime, zeroed=zeroed) as d:
                c = torch.zeros(1, 1)
                home.invoke(torch.full((1, 1), 2.0), torch.full((1, 1), 3.0), c, 1)
                assert c.tolist() == [[6.0]]  # launched: compiled inline
            assert d.result.compiles == [] and home.invoke is caller.invoke
    finally:
        import sys

        for name in ("vllm_like.fused_moe", "vllm_like.triton_moe"):
            sys.modules.pop(name, None)


def test_zeroed_kernels_are_vllms_fused_moe_launcher():
    """The listed launcher exists in the installed vLLM with its output
    parameter, and launches the listed kernel."""
    import importlib
    import inspect

    assert vllm_facts.DEFERRABLE_ZEROED_KERNELS == {
        "vllm.model_executor.layers.fused_moe.fused_moe:fused_moe_kernel": (
            "vllm.model_executor.layers.fused_moe.fused_moe", "invoke_fused_moe_triton_kernel",
            "C")}
    for kernel, (module, name, output) in vllm_facts.DEFERRABLE_ZEROED_KERNELS.items():
        home = importlib.import_module(module)
        launcher = getattr(home, name)
        assert output in inspect.signature(launcher).parameters
        assert f"{kernel.split(':')[1]}[grid]" in inspect.getsource(launcher)
        assert hasattr(importlib.import_module(kernel.split(":")[0]), kernel.split(":")[1])
