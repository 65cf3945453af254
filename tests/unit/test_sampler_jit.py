"""The sampler's Triton kernels vLLM's JIT warmup leaves out (:mod:`stepwarm.sampler_jit`):
when stepwarm compiles them by vLLM's own rules, which variants it keeps, and how
``coverage`` labels what it compiled. vLLM's registry and warmup types are the
installed release's (0.32 on; the version matrix runs 0.34's); the runner is a
stand-in holding them (vLLM's V2 GPU runner does not run here), and Triton's key
derivation needs a GPU, so the compile itself is measured on the H200
(docs/findings.md, run s22)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from stepwarm import vllm_facts
from stepwarm.coverage.detectors import CompileEvent
from stepwarm.coverage.startup import attribute
from stepwarm.sampler_jit import LABEL, SamplerJit, warm_sampler_kernels
from stepwarm.worker_view import WorkerView

sampler_ops = pytest.importorskip(
    "vllm.v1.sample.ops.topk_topp_sampler", reason="vLLM before 0.32 registers no sampler warmups")
if not hasattr(sampler_ops, "register_top_k_top_p_warmups"):
    pytest.skip("vLLM before 0.32 registers no sampler warmups", allow_module_level=True)
from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry  # noqa: E402
from vllm.model_executor.warmup.jit_warmup_triton_helper import (  # noqa: E402
    TritonCompileKey,
    TritonWarmupTensor,
)
from vllm.v1.sample.ops.topk_topp_triton import _topk_topp  # noqa: E402


def _runner(*, flashinfer=False, registered=False, registry=True, sampler=True):
    reg = JitWarmupRegistry(None)
    if registered:  # what vLLM's V2 runner does with a speculator
        with reg.activate():
            _topk_topp.register_warmup()
    runner = SimpleNamespace()
    if registry:
        runner.jit_warmup_registry = reg
    if sampler:
        runner.sampler = SimpleNamespace(use_flashinfer=flashinfer)
    return runner


@pytest.mark.parametrize("flashinfer", [False, True])
def test_the_triton_sampler_without_vllms_registration_is_compiled_by_vllms_own_rules(flashinfer):
    # With FlashInfer's sampler in use, seeded, greedy-mixed and processed-logprobs
    # top-k / top-p batches still take the Triton kernels (0.34's fused_sampler_eligible).
    register, why = vllm_facts.sampler_jit_registration(_runner(flashinfer=flashinfer))
    assert register is sampler_ops.register_top_k_top_p_warmups and why == ""


@pytest.mark.parametrize("runner, why", [
    (dict(registered=True), "vLLM's JIT warmup registered them"),
    (dict(registry=False), "this runner has no JIT warmup registry (vLLM < 0.30 or the V1 runner)"),
    (dict(sampler=False), "the runner has no sampler (a pooling model or not the last PP rank)"),
])
def test_where_vllm_warms_them_or_never_launches_them_nothing_is_compiled(runner, why):
    assert vllm_facts.sampler_jit_registration(_runner(**runner)) == (None, why)


def _key(stride):
    logits = TritonWarmupTensor(torch.float32, shape=(5, 32000), strides=(stride, 1))
    return TritonCompileKey(frozenset(), (("logits", logits), ("p", TritonWarmupTensor(torch.float32))))


@pytest.mark.parametrize("vocab, kept", [(32000, [16, 32000]), (151936, [16, 32000]),
                                         (1024, [16, 32000]), (1000, [2, 50257]), (50257, [2, 50257]), (32001, [2, 50257])])
def test_only_the_logits_stride_class_the_sampler_sees_is_kept(vocab, kept):
    # vLLM warms both classes (16 and 2); the V2 sampler's logits are a float32
    # copy [num_reqs, vocab], so their row stride is the vocabulary.
    strides = [16, 2, 32000, 50257]
    assert [s for s in strides if vllm_facts._stride_class_matches(_key(s), vocab)] == kept


def test_a_key_without_logits_is_kept():
    key = TritonCompileKey(frozenset(), (("x", TritonWarmupTensor(torch.float32)),))
    assert vllm_facts._stride_class_matches(key, 50257)


def test_on_this_platform_vllms_rules_name_nothing_and_it_is_said():
    # vLLM registers no sampler warmup on the CPU (register_top_k_top_p_warmups).
    config = SimpleNamespace(model_config=SimpleNamespace(get_vocab_size=lambda: 32000))
    worker = SimpleNamespace(model_runner=_runner(), vllm_config=config)
    done = warm_sampler_kernels(WorkerView(worker), threads=4)
    assert done == SamplerJit(skipped="vLLM's rules name no sampler kernel variant on this platform")
    assert done.window is None


def test_coverage_labels_the_compiles_in_its_window_stepwarms():
    jit = SamplerJit(wall_s=2.0, keys=44, started_at=100.0, ended_at=102.0)
    assert jit.window == (LABEL, 100.0, 102.0)
    events = [CompileEvent("triton-hook", name, "triton", at) for name, at in
              [("_topk_topp_kernel", 99.0), ("_topp_sb_stats_kernel", 100.5),
               ("_topp_sb_mask_kernel", 102.005), ("_resample_kernel", 103.0)]]
    where = attribute(events, [("vLLM's own warmup", 90.0)], [], [jit.window])
    assert [(w.owner, str(w)) for _, w in where] == [
        ("vllm", "vLLM's own warmup"), ("stepwarm", LABEL), ("stepwarm", LABEL),
        ("vllm", "vLLM's own warmup")]
