"""The replay's new-size control on a real engine (CPU, the session's tiny
Llama): a line whose first run stays an outlier after its steady runs is run
again with one prompt token more per request, and the worker's steps show
the token counts the control was meant to have.

``LLM.generate`` leaves its finished requests in the runner until the
scheduler's next step names them; the test sends that step itself, so the
session engine's runner is idle for the tests after it (left busy, it failed
every test_hook test that drives it)."""

from __future__ import annotations

import pytest

from stepwarm.compile import cleanup_output
from stepwarm.coverage.detectors import Detectors
from stepwarm.coverage.replay import NEW_SIZE_RUNS, STEADY_RUNS, Gate, replay_line
from stepwarm.coverage.traffic import TrafficLimits, loads_traffic
from stepwarm.runner import WorkerClock

pytestmark = pytest.mark.e2e

#: Passes every first run (no ratio, no floor) and calls none noise: every
#: line gets its steady runs and the control.
EVERY_RUN = Gate(ratio=0.0, min_excess_ms=-1e9)


@pytest.fixture
def detectors():
    d = Detectors.watch()
    yield d
    d.stop()


def test_an_outlier_line_gets_steady_runs_then_the_same_requests_one_token_longer(
        engine, profile, detectors):
    traffic = loads_traffic("\n".join([
        '{"name": "batch 3", "prompt": 9, "count": 3, "sampling": {"temperature": 0.0}}',
        '{"name": "prefix hit", "prompt": 300, "count": 2, "sampling": {"temperature": 0.0}, '
        '"prefix": {"group": "sys", "tokens": 256}}',
    ]), "t.jsonl")
    limits = TrafficLimits(profile.max_model_len, profile.vocab_size, profile.max_logprobs)
    clock = WorkerClock()
    with clock.attached(engine.worker):
        batch, prefix = (replay_line(engine.llm, tl, limits, detectors, clock, EVERY_RUN)
                         for tl in traffic.lines)
    assert batch.error is None and prefix.error is None
    assert len(batch.steady_ms) == STEADY_RUNS and batch.new_size_delta == 1
    assert len(batch.new_size_ms) == len(batch.new_size_steps) == NEW_SIZE_RUNS
    # the line's prefill step: 3 x 9 tokens; the control's: 3 x 10, then decodes
    # of 3 (max_tokens 4 by default: the prefill samples the first token)
    assert [s[:2] for s in batch.first_steps] == [[27, 3]] + [[3, 3]] * 3
    for steps in batch.new_size_steps:
        assert [s[:2] for s in steps] == [[30, 3]] + [[3, 3]] * 3
    assert batch.new_size_steps[0][0][3] == 1  # no step before it had 30 tokens
    assert batch.tokens == [12, 12]  # the control's tokens are not the line's
    # a prefix hit: the 256 cached tokens (two blocks of 128) are not
    # scheduled; the control's prompts are 301 tokens with the same prefix
    assert [s[:2] for s in prefix.first_steps][0] == [2 * (300 - 256), 2]
    assert [s[:2] for s in prefix.new_size_steps[0]][0] == [2 * (301 - 256), 2]
    # the verdict: with this gate the control explains nothing (0 x its first run)
    assert not EVERY_RUN.same_cost(batch.first_ms, batch.new_size_ms)
    # the last run's 2 requests stay in the runner until the next step names
    # them finished: send that step, as the scheduler would
    leftover = engine.view.live_request_ids()
    assert len(leftover) == 2
    with engine.view.kv_connector_disabled():
        engine.worker.execute_model(cleanup_output(leftover))
    assert engine.view.live_request_ids() == set()


def test_a_prefix_shorter_than_the_engines_block_is_named_before_it_runs(profile):
    """The session engine caches prefixes in blocks of 128 tokens (its
    profile says so): a 100-token prefix cannot hit, a 256-token one can."""
    from stepwarm.blocks import prefix_cache_alignment
    from stepwarm.coverage.traffic import prefix_notes

    traffic = loads_traffic("\n".join([
        '{"prompt": 300, "prefix": {"group": "sys", "tokens": 256}}',
        '{"prompt": 300, "prefix": {"group": "short", "tokens": 100}}',
    ]), "t.jsonl")
    align = prefix_cache_alignment(profile.kv_cache_groups, profile.enable_prefix_caching)
    assert profile.enable_prefix_caching and align == 128
    assert prefix_notes(traffic, profile.enable_prefix_caching, align) == [
        "t.jsonl:2: prefix: 100 tokens is less than one prefix-cache block of this engine "
        "(128 tokens): no prefix hit"]


def test_a_traced_runs_side_effects_are_the_timed_runs_not_the_profilers(
        engine, profile, detectors, monkeypatch):
    """The profiler's summary after a run makes garbage of its own (and on a
    busy host waits for a CPU): what it does is not the run's. Here the
    summary runs three full collector passes; the run's side effects do not
    count them."""
    import gc

    from stepwarm.coverage import trace as trace_mod
    from stepwarm.coverage.trace import Tracer

    real = trace_mod.summarize

    def summarize_with_garbage(*args, **kwargs):
        for _ in range(3):
            gc.collect(2)
        return real(*args, **kwargs)

    monkeypatch.setattr(trace_mod, "summarize", summarize_with_garbage)
    traffic = loads_traffic('{"name": "one", "prompt": 9, "sampling": {"temperature": 0.0}}',
                            "t.jsonl")
    limits = TrafficLimits(profile.max_model_len, profile.vocab_size, profile.max_logprobs)
    tracer = Tracer()
    result = replay_line(engine.llm, traffic.lines[0], limits, detectors, tracer=tracer)
    assert result.error is None and tracer.broken == "" and "cpu" in result.trace_first
    for fx in (result.side_effects_first, result.side_effects_second):
        assert fx.get("gc_collections", [0, 0, 0])[2] < 3
    leftover = engine.view.live_request_ids()
    with engine.view.kv_connector_disabled():
        engine.worker.execute_model(cleanup_output(leftover))
    assert engine.view.live_request_ids() == set()


def test_a_traced_run_names_the_operators_the_worker_ran(engine, profile, detectors):
    """``--trace``: each run profiled; the summary holds the real engine's
    operators with their calls and time, and the kernels seen so far carry
    over from run to run (on the CPU build none: no device activity)."""
    from stepwarm.coverage.trace import Tracer

    traffic = loads_traffic(
        '{"name": "batch 2", "prompt": 17, "count": 2, "sampling": {"temperature": 0.0}}',
        "t.jsonl")
    limits = TrafficLimits(profile.max_model_len, profile.vocab_size, profile.max_logprobs)
    layers = engine.llm.llm_engine.model_config.hf_config.num_hidden_layers
    tracer = Tracer()
    tracer.prime()
    result = replay_line(engine.llm, traffic.lines[0], limits, detectors, tracer=tracer)
    assert result.error is None and tracer.broken == ""
    for trace in (result.trace_first, result.trace_second):
        assert set(trace) == {"cpu", "device", "new_kernels", "slow_calls", "stacks"}
        # the thread's stack outside the worker: vLLM's engine, never its runner
        assert set(trace["stacks"]) == {"outside_ms", "samples", "sites"}
        assert not any("model_runner" in site for site in trace["stacks"]["sites"])
        # vLLM's attention op: once per layer and step (a prefill, then 3
        # decodes: 4 tokens each), with its time
        calls, total_us, max_us = trace["cpu"]["vllm::unified_attention_with_output"]
        assert calls == layers * 4 and total_us >= max_us > 0
        assert trace["device"] == {} and trace["new_kernels"] == [0, []]
    sites = {**result.trace_first["stacks"]["sites"], **result.trace_second["stacks"]["sites"]}
    assert any(site.startswith("vllm.") for site in sites)
    leftover = engine.view.live_request_ids()
    with engine.view.kv_connector_disabled():
        engine.worker.execute_model(cleanup_output(leftover))
    assert engine.view.live_request_ids() == set()
