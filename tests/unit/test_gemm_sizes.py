"""The linear GEMMs per token count (stepwarm.gemm_sizes): the ladder, the
layers it picks, the setting. What it does on a GPU is measured on the H200
(campaigns/results/README.md); on CPU it runs nothing."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from stepwarm.gemm_sizes import (
    ALIGNMENTS,
    _eager_floor,
    gemm_token_counts,
    linear_layers,
    logits_heads,
    logits_rows,
    next_odd_multiple,
    token_counts,
    warm_gemm_sizes,
)
from stepwarm.settings import HookSettings, SettingsError
from stepwarm.worker_view import WorkerView


def test_ladder_small_cases():
    # ceil(2 ** (k / 8)): 1, 2 (k = 1..8), 3 (k = 9..12), 4 (k = 13..16)
    assert token_counts(1, 4) == [1, 2, 3, 4]
    # from 100 (the first eager count): 2 ** (54 / 8) = 107.6, 2 ** (55 / 8) = 117.4, 128
    assert token_counts(100, 128) == [100, 108, 118, 128]
    # max_num_batched_tokens itself is always run; 2 ** (73 / 8) = 558.4
    assert token_counts(513, 600) == [513, 559, 600]
    assert token_counts(700, 600) == []
    assert token_counts(1, 16384, per_octave=1) == [2 ** i for i in range(15)]


def test_ladder_steps_at_most_an_eighth_of_an_octave():
    counts = token_counts(513, 16384)
    assert counts[:2] == [513, 559] and counts[-1] == 16384 and len(counts) == 41
    assert counts == sorted(set(counts))
    assert all(b / a <= 2 ** (1 / 8) + 1 / a for a, b in zip(counts, counts[1:]))
    assert math.log2(counts[-1] / counts[1]) == pytest.approx((len(counts) - 2) / 8, abs=0.01)


def test_next_odd_multiple():
    assert [next_odd_multiple(m, 8) for m in (1, 8, 9, 16, 17, 24)] == [8, 8, 24, 24, 24, 24]
    assert [next_odd_multiple(m, 32) for m in (2400, 2401, 2465)] == [2400, 2464, 2528]
    assert next_odd_multiple(513, 16) == 528 and next_odd_multiple(535, 16) == 560


def test_gemm_ladder_adds_the_aligned_counts_of_each_rung():
    # sixteen an octave: 513, ceil(2 ** (145 / 16)) = 535, 559 (k = 146), 584 (k = 147), 600;
    # then each rung's next odd multiple of 8, 16, 32: 513 -> 520, 528, 544;
    # 535 -> 536, 560, 544; 559 -> 568, 560 (608 > 600); 584 -> 584, 592; 600 -> 600
    assert gemm_token_counts(513, 600) == [513, 520, 528, 535, 536, 544, 559, 560, 568,
                                           584, 592, 600]
    counts = gemm_token_counts(513, 16384)
    base = token_counts(513, 16384, per_octave=16)
    assert set(base) <= set(counts) and counts == sorted(set(counts))
    assert counts[0] == 513 and counts[-1] == 16384 and len(counts) == 305
    for m in base:
        for a in ALIGNMENTS:
            aligned = next_odd_multiple(m, a)
            assert aligned > 16384 or aligned in counts
            assert aligned % a == 0 and (aligned // a) % 2 == 1 and aligned - m < 2 * a
    assert gemm_token_counts(700, 600) == []


def _config(**cc):
    return SimpleNamespace(model_config=SimpleNamespace(enforce_eager=cc.pop("eager", False)),
                           compilation_config=SimpleNamespace(**cc))


def test_eager_floor_is_above_the_largest_cuda_graph():
    assert _eager_floor(_config(max_cudagraph_capture_size=512)) == 513
    assert _eager_floor(_config(cudagraph_capture_sizes=[1, 2, 4, 8])) == 9
    assert _eager_floor(_config(max_cudagraph_capture_size=512, eager=True)) == 1
    from vllm.config.compilation import CUDAGraphMode

    for mode, floor in ((CUDAGraphMode.NONE, 1), (CUDAGraphMode.FULL_DECODE_ONLY, 1),
                        (CUDAGraphMode.PIECEWISE, 513), (CUDAGraphMode.FULL_AND_PIECEWISE, 513),
                        (CUDAGraphMode.FULL, 513)):
        assert _eager_floor(_config(max_cudagraph_capture_size=512, cudagraph_mode=mode)) == floor


class _Layer(torch.nn.Module):
    def __init__(self, out: int, inp: int, bias: bool, method: object):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(out, inp), requires_grad=False)
        self.bias = torch.nn.Parameter(torch.zeros(out), requires_grad=False) if bias else None
        self.quant_method = method


def test_linear_layers_one_per_distinct_unquantized_gemm():
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod

    plain = UnquantizedLinearMethod()
    model = torch.nn.Sequential(
        _Layer(8, 4, False, plain), _Layer(8, 4, False, plain),   # the same GEMM
        _Layer(8, 4, True, plain),                                # with a bias: addmm
        _Layer(4, 8, False, plain),
        _Layer(6, 4, False, object()),                            # not unquantized
    )
    picked = linear_layers(model, device_type="cpu")
    assert [(tuple(m.weight.shape), m.bias is not None) for m in picked] == [
        ((8, 4), False), ((8, 4), True), ((4, 8), False)]
    assert picked[0] is model[0]
    # on CUDA only: these weights are on the CPU
    assert linear_layers(model) == []


def test_nothing_runs_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here")
    report = warm_gemm_sizes(WorkerView(SimpleNamespace()))
    assert report.skipped == "no CUDA device" and report.counts == [] and report.shapes == 0


def test_setting():
    on = {"STEPWARM_SCENARIOS": "default"}
    assert HookSettings.from_env(on).gemm_sizes is True
    assert HookSettings.from_env({**on, "STEPWARM_GEMM_SIZES": "off"}).gemm_sizes is False
    assert HookSettings.from_env({**on, "STEPWARM_GEMM_SIZES": "auto"}).gemm_sizes is True
    with pytest.raises(SettingsError, match="STEPWARM_GEMM_SIZES='on'"):
        HookSettings.from_env({**on, "STEPWARM_GEMM_SIZES": "on"})


def test_logits_heads_one_per_distinct_vocabulary_table():
    """vLLM's own LM head and input embedding (a tied head's table): same
    shape and dtype, one GEMM; a linear layer is not a head."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    table = UnquantizedEmbeddingMethod()
    model = torch.nn.Sequential(
        _Layer(32, 8, False, table),                       # embed_tokens
        _Layer(8, 8, False, UnquantizedLinearMethod()),
        _Layer(32, 8, False, table),                       # lm_head: the same GEMM
        _Layer(48, 8, False, table),                       # another vocabulary
    )
    picked = logits_heads(model, device_type="cpu")
    assert [tuple(m.weight.shape) for m in picked] == [(32, 8), (48, 8)]
    assert picked[0] is model[0]
    assert logits_heads(model) == []  # on CUDA only


def test_logits_rows_count_the_drafts_verified_in_a_step():
    config = SimpleNamespace(scheduler_config=SimpleNamespace(
        max_num_seqs=64, max_num_batched_tokens=2048), speculative_config=None)
    assert logits_rows(config) == 64
    config.speculative_config = SimpleNamespace(num_speculative_tokens=3)
    assert logits_rows(config) == 256
    config.scheduler_config.max_num_batched_tokens = 200  # a row per scheduled token at most
    assert logits_rows(config) == 200
    assert token_counts(1, 64)[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]


def test_the_heads_ladder_runs_every_row_count_up_to_256_then_the_gemm_ladder():
    from stepwarm.gemm_sizes import head_row_counts

    assert head_row_counts(64) == list(range(1, 65))
    assert head_row_counts(256) == list(range(1, 257))
    # 300 rows: 2 ** (129 / 16) = 267.9 -> 268, 280 (k = 130), 292 (k = 131), 300;
    # odd multiples of 8, 16, 32 above 268: 280, 272, 288; 280: 280, 304 > 300; 292: 296
    assert head_row_counts(300) == list(range(1, 257)) + [
        264, 268, 272, 280, 288, 292, 296, 300]
    rows = head_row_counts(1024)
    assert rows[:256] == list(range(1, 257)) and rows[256:] == gemm_token_counts(257, 1024)[1:]


def test_the_log_says_what_ran():
    from stepwarm.gemm_sizes import GemmReport, gemm_text

    both = GemmReport(shapes=7, counts=[513, 600, 16384], heads=1, head_counts=[1, 2, 1024])
    assert gemm_text(both) == "7 shapes x 3 counts (513-16384 tokens); 1 LM head x 3 counts (1-1024 rows)"
    assert gemm_text(GemmReport(heads=2, head_counts=[1, 64])) == "2 LM heads x 2 counts (1-64 rows)"
    assert gemm_text(GemmReport()) == "nothing"


def test_a_ladder_runs_the_largest_count_first():
    """The caching allocator keeps the first (largest) output's block, and
    every later output fits in it; the head's bias goes with its GEMM."""
    from stepwarm.gemm_sizes import _run_ladder

    class Recording:
        def __init__(self):
            self.calls = []

        def apply(self, layer, x, bias=None):
            self.calls.append((x.shape[0], bias is layer.bias))
            return x @ layer.weight.t()

    layer = _Layer(8, 4, True, Recording())
    _run_ladder(layer, [1, 2, 3, 5, 8], layer.bias)
    assert layer.quant_method.calls == [(8, True), (5, True), (3, True), (2, True), (1, True)]


class _FirstLaunches:
    """A GEMM whose first call at a count in ``loading`` takes 60 ms on the
    host, as a kernel's first launch does (past the test's threshold of 30
    ms, far from a busy CI machine's noise); every call recorded."""

    def __init__(self, loading):
        self.loading, self.loaded, self.calls = set(loading), set(), []

    def apply(self, layer, x, bias=None):
        import time

        m = x.shape[0]
        self.calls.append(m)
        if m in self.loading and m not in self.loaded:
            self.loaded.add(m)
            time.sleep(0.06)


def test_a_ladder_names_the_calls_that_loaded_a_kernel_and_a_restart_runs_those_alone(monkeypatch):
    from stepwarm import gemm_sizes
    from stepwarm.gemm_sizes import GemmLadder, gemm_text, run_gemm_ladder

    assert gemm_sizes.FIRST_LAUNCH_MS <= 1  # a launch: microseconds; a load: 5-15 ms
    monkeypatch.setattr(gemm_sizes, "FIRST_LAUNCH_MS", 30)
    linear, head = _Layer(8, 4, False, _FirstLaunches({600, 513})), \
        _Layer(32, 4, False, _FirstLaunches({40}))
    ladder = GemmLadder(layers=[linear], counts=[513, 559, 600], heads=[head],
                        head_counts=[1, 2, 39, 40, 41])
    fresh = run_gemm_ladder(ladder)
    assert sorted(fresh.loads) == [(0, 513), (0, 600), (1, 40)]
    assert (fresh.calls_run, fresh.calls_total) == (8, 8)
    assert linear.quant_method.calls == [600, 559, 513] and head.quant_method.calls == [41, 40, 39, 2, 1]
    # a new process: the kernels load again, at the calls the record kept
    for layer in (linear, head):
        layer.quant_method.loaded.clear()
        layer.quant_method.calls.clear()
    restart = run_gemm_ladder(ladder, frozenset(fresh.loads))
    assert linear.quant_method.calls == [600, 513] and head.quant_method.calls == [40]
    assert sorted(restart.loads) == sorted(fresh.loads)
    assert (restart.calls_run, restart.calls_total) == (3, 8)
    assert gemm_text(restart) == ("1 shapes x 3 counts (513-600 tokens); 1 LM head x 5 counts "
                                  "(1-41 rows); ran 3 of its 8 calls")
    # nothing loaded at the last start: nothing runs
    assert run_gemm_ladder(ladder, frozenset()).calls_run == 0


def test_a_ladders_signature_names_the_shapes_and_counts():
    from stepwarm.gemm_sizes import GemmLadder

    a = GemmLadder(layers=[_Layer(8, 4, False, None)], counts=[513, 600])
    assert a.signature().splitlines()[-1] == "(8, 4) torch.float32 bias=False [513, 600]"
    assert a.signature() != GemmLadder(layers=[_Layer(8, 4, True, None)], counts=[513, 600]).signature()
    assert a.signature() != GemmLadder(layers=[_Layer(8, 4, False, None)], counts=[513]).signature()
    assert GemmLadder(layers=a.layers, counts=[]).rungs() == []


def test_the_ladder_reaches_cublass_kernels_on_the_h200_map():
    """The map ``benchmarks/gpu_probe_gemm_choice.py`` took on the H200 (run
    s20's session): the kernels cuBLAS ran for Llama-3.1-8B's four
    projections at every count from 1 to 16,384. Of the counts above 512,
    those that pick a kernel no count of the ladder loaded: 0.5 % with the
    ladder, 13.2 % with eight counts an octave alone."""
    import bisect
    import gzip
    import json
    from pathlib import Path

    path = (Path(__file__).parents[2] / "campaigns" / "results"
            / "h200-gemm-choice-1203s20-llama-3.1-8b.json.gz")
    choice = json.loads(gzip.decompress(path.read_bytes()))
    limit = choice["limit"]
    assert limit == 16384 and len(choice["shapes"]) == 4

    def missed(counts: list[int]) -> float:
        misses = 0
        for shape in choice["shapes"]:
            kernels = [frozenset(k) for k in shape["sets"]]
            runs = shape["runs"]  # [first count, last count, kernel set], in order
            starts = [first for first, _, _ in runs]
            loaded = frozenset().union(*(kernels[runs[bisect.bisect(starts, m) - 1][2]]
                                         for m in counts))
            misses += sum(min(last, limit) - max(first, 513) + 1 for first, last, i in runs
                          if last >= 513 and not kernels[i] <= loaded)
        return misses / (4 * (limit - 512))

    assert round(100 * missed(gemm_token_counts(513, limit)), 2) == 0.50
    assert round(100 * missed(token_counts(513, limit)), 2) == 13.23
