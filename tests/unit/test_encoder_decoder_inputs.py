"""Encoder-decoder (Whisper) encoder inputs in plans: which rows run the
encoder (``scheduled_encoder_inputs``), the steps split over the encoder
budget, and the ``free_encoder_mm_hashes`` vLLM's EncoderDecoderCacheManager
sends (real vLLM SchedulerOutput; no engine)."""

from __future__ import annotations

import pytest

from stepwarm.compile import freed_encoder_keys, to_scheduler_output
from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest
from stepwarm.profile import CacheSpec, RunnerProfile
from tests.helpers import FULL16, make_profile


def _profile(**kw) -> RunnerProfile:
    return make_profile(**{**dict(
        kv_cache_groups=(FULL16, CacheSpec(kind="cross_attention", block_size=16)),
        max_model_len=448, max_num_seqs=8, max_num_batched_tokens=1500, vocab_size=512,
        is_encoder_decoder=True, max_encoder_len=1500, encoder_budget=1500,
        decoder_start_token_id=3, enable_prefix_caching=True), **kw})


def _req(name: str, prompt: int = 2, enc: int = 1500) -> PlannedRequest:
    return PlannedRequest(f"_stepwarm_{name}_", prompt, encoder_len=enc, sampling="greedy")


def _rows(step):
    return [(r.req_id.strip("_").removeprefix("stepwarm_"), r.num_scheduled_tokens,
             r.encoder_inputs) for r in step.scheduled]


def test_first_tokens_run_the_encoder_later_chunks_and_decodes_do_not():
    b = PlanBuilder(_profile())
    b.add_request(_req("a", prompt=20))
    b.step("chunked_prefill", "c1", prefill={"_stepwarm_a_": 8})
    b.step("chunked_prefill", "c2", prefill={"_stepwarm_a_": 12})
    b.step("decode", "d", decode={"_stepwarm_a_": 0})
    plan = b.build()
    assert [_rows(s) for s in plan.steps] == [[("a", 8, (0,))], [("a", 12, ())], [("a", 1, ())]]
    # the encoder output is dropped the step after it ran, never again
    assert [freed_encoder_keys(s, plan) for s in plan.steps] == [
        [], ["_stepwarm_a_encoder"], []]


def test_a_resumed_request_runs_its_encoder_again():
    b = PlanBuilder(_profile())
    b.add_request(_req("a"))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 2})
    b.step("preempt", "x", preempt=("_stepwarm_a_",))
    b.step("resume", "r", resume={"_stepwarm_a_": 3})
    plan = b.build()
    assert _rows(plan.steps[2]) == [("a", 3, (0,))]
    so = to_scheduler_output(plan.steps[2], plan, _profile())
    assert so.scheduled_encoder_inputs == {"_stepwarm_a_": [0]}


def test_starts_over_the_encoder_budget_are_split_into_steps_in_order():
    b = PlanBuilder(_profile(encoder_budget=3000))
    for n in "abcde":
        b.add_request(_req(n))
    b.step("prefill", "p", prefill={f"_stepwarm_{n}_": 2 for n in "abcde"})
    plan = b.build()
    assert [(s.kind, s.label, _rows(s)) for s in plan.steps] == [
        ("prefill", "p (encoder budget, part 1/3)", [("a", 2, (0,)), ("b", 2, (0,))]),
        ("prefill", "p (encoder budget, part 2/3)", [("c", 2, (0,)), ("d", 2, (0,))]),
        ("prefill", "p (encoder budget, part 3/3)", [("e", 2, (0,))]),
    ]
    assert [freed_encoder_keys(s, plan) for s in plan.steps] == [
        [], ["_stepwarm_a_encoder", "_stepwarm_b_encoder"],
        ["_stepwarm_c_encoder", "_stepwarm_d_encoder"]]


def test_a_split_keeps_decodes_and_continuing_chunks_in_the_last_part():
    b = PlanBuilder(_profile())
    for n in ("run", "chunk", "x", "y"):
        b.add_request(_req(n, prompt=10))
    b.step("prefill", "p", prefill={"_stepwarm_run_": 10})
    b.step("chunked_prefill", "c", prefill={"_stepwarm_chunk_": 4})
    b.step("mixed_prefill_decode", "m", decode={"_stepwarm_run_": 0},
           prefill={"_stepwarm_x_": 10, "_stepwarm_chunk_": 6, "_stepwarm_y_": 10})
    plan = b.build()
    assert [(s.kind, _rows(s)) for s in plan.steps[2:]] == [
        ("prefill", [("x", 10, (0,))]),
        # the running queue (run, then chunk: their admission order), then
        # WAITING, as schedule() takes them
        ("mixed_prefill_decode", [("run", 1, ()), ("chunk", 6, ()), ("y", 10, (0,))]),
    ]


def test_an_encoder_input_over_the_budget_is_refused():
    b = PlanBuilder(_profile(encoder_budget=1000))
    b.add_request(_req("a"))
    with pytest.raises(PlanError, match=r"encoder input of 1500 tokens exceeds the encoder "
                                        r"budget 1000") as e:
        b.step("prefill", "p", prefill={"_stepwarm_a_": 2})
    assert e.value.field == "encoder"


def test_unknown_budget_or_no_encoder_input_splits_nothing():
    b = PlanBuilder(_profile(encoder_budget=0))
    for n in "abc":
        b.add_request(_req(n))
    b.add_request(_req("none", enc=0))
    b.step("prefill", "p", prefill={f"_stepwarm_{n}_": 2 for n in ("a", "b", "c", "none")})
    plan = b.build()
    assert len(plan.steps) == 1
    assert [r.encoder_inputs for r in plan.steps[0].scheduled] == [(0,), (0,), (0,), ()]


def test_verify_leaves_out_encoder_decoder_requests_without_an_encoder_input():
    from stepwarm.verify import _without_audio

    b = PlanBuilder(_profile())
    b.add_request(_req("none", enc=0))
    b.step("prefill", "p", prefill={"_stepwarm_none_": 2})
    plan = b.build()
    # no worker needed: a request without encoder input carries no audio
    assert _without_audio(None, plan, _profile(), ["_stepwarm_none_"]) == {
        "_stepwarm_none_": "no encoder input"}
    assert _without_audio(None, plan, _profile(is_encoder_decoder=False, encoder_budget=0),
                          ["_stepwarm_none_"]) == {}


def test_after_a_prefix_hit_the_fill_runs_the_encoder_and_the_hit_does_not():
    from stepwarm.verify import with_prefix_fills

    p = _profile()
    b = PlanBuilder(p)
    b.add_request(_req("hit", prompt=20))
    b.set_computed("_stepwarm_hit_", 16)
    b.step("prefix_hit", "h", prefill={"_stepwarm_hit_": 4})
    plan = b.build()
    # vLLM's scheduler skips an encoder-decoder input once num_computed_tokens > 0
    assert _rows(plan.steps[0]) == [("hit", 4, ())]
    filled, origin = with_prefix_fills(plan, p)
    fill = filled.steps[0].scheduled[0]
    assert (fill.num_scheduled_tokens, fill.encoder_inputs, origin) == (16, (0,), (0, 0))
    assert filled.request(fill.req_id).encoder_len == 1500
    # the fill writes the cross-attention blocks the hit request reads
    assert fill.block_ids[1] == filled.steps[1].scheduled[0].block_ids[1]
    assert freed_encoder_keys(filled.steps[1], filled) == [f"{fill.req_id}encoder"]
