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
