"""PlannedStep -> vLLM's SchedulerOutput / GrammarOutput (real vLLM classes)."""

from __future__ import annotations

import numpy as np
import pytest

from stepwarm.compile import prompt_token_ids, to_grammar_output, to_scheduler_output
from stepwarm.plan import PlanBuilder, PlannedRequest
from stepwarm.profile import CacheSpec, RunnerProfile
from stepwarm.vllm_facts import resumed_requests_sent_as_new
from tests.helpers import make_profile

#: vLLM 0.34 re-sends a resumed request in full, as a new one, to every
#: runner, and sends no all_token_ids (its V1 GPU runner is gone)
V1_CACHED_RESUME = pytest.mark.skipif(
    resumed_requests_sent_as_new(), reason="this vLLM sends resumed requests as new, no all_token_ids")


def _profile(runner: str = "v1", **kw) -> RunnerProfile:
    return make_profile(**{**dict(
        runner=runner, kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),
                                        CacheSpec(kind="sliding_window", block_size=4,
                                                  sliding_window=8)),
        num_blocks=100, max_model_len=64, max_num_batched_tokens=32, vocab_size=70), **kw})


def _preempt_resume(runner: str):
    p = _profile(runner)
    b = PlanBuilder(p)
    b.add_request(PlannedRequest("_stepwarm_a_", 6, structured_output=True))
    b.add_request(PlannedRequest("_stepwarm_b_", 3))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 6, "_stepwarm_b_": 3})
    b.step("decode", "d", decode={"_stepwarm_a_": 0, "_stepwarm_b_": 0})
    b.step("preempt", "x", preempt=("_stepwarm_a_",))
    b.step("resume", "r", resume={"_stepwarm_a_": 8})
    b.cleanup()
    return p, b.build()


def test_prefill_and_decode_outputs():
    p, plan = _preempt_resume("v1")
    so = to_scheduler_output(plan.steps[0], plan, p)
    assert [r.req_id for r in so.scheduled_new_reqs] == ["_stepwarm_a_", "_stepwarm_b_"]
    a = so.scheduled_new_reqs[0]
    assert a.prompt_token_ids == [0, 1, 2, 3, 4, 5] and a.num_computed_tokens == 0
    # 6 tokens, block_size 4: 2 blocks in each group, ids 1..4 from the shared pool.
    assert a.block_ids == ([1, 2], [3, 4])
    assert so.num_scheduled_tokens == {"_stepwarm_a_": 6, "_stepwarm_b_": 3}
    assert so.total_num_scheduled_tokens == 9
    if hasattr(so, "num_common_prefix_blocks"):  # gone in vLLM 0.34 (cascade attention removed)
        assert so.num_common_prefix_blocks == [0, 0]
    go = to_grammar_output(plan.steps[0], p)
    assert go.structured_output_request_ids == ["_stepwarm_a_"]
    assert go.grammar_bitmask.shape == (1, 3) and go.grammar_bitmask.dtype == np.int32
    assert (go.grammar_bitmask == -1).all()

    so = to_scheduler_output(plan.steps[1], plan, p)
    c = so.scheduled_cached_reqs
    assert c.req_ids == ["_stepwarm_a_", "_stepwarm_b_"]
    assert c.num_computed_tokens == [6, 3] and c.num_output_tokens == [1, 1]
    assert c.new_block_ids == [None, None]  # 7 and 4 tokens still fit
    assert so.scheduled_new_reqs == []


@V1_CACHED_RESUME
def test_resume_on_v1_replaces_the_block_table_as_a_cached_row():
    p, plan = _preempt_resume("v1")
    assert to_scheduler_output(plan.steps[2], plan, p).preempted_req_ids == {"_stepwarm_a_"}
    so = to_scheduler_output(plan.steps[3], plan, p)
    c = so.scheduled_cached_reqs
    assert c.req_ids == ["_stepwarm_a_"] and c.resumed_req_ids == {"_stepwarm_a_"}
    assert c.num_computed_tokens == [0] and c.num_output_tokens == [2]
    # Blocks of the preempted request were freed and handed out again, whole.
    assert [len(g) for g in c.new_block_ids[0]] == [2, 2]
    assert len(c.all_token_ids["_stepwarm_a_"]) == 8
    assert so.scheduled_new_reqs == []


@pytest.mark.parametrize("runner", ["v2", "v1"])
def test_resume_on_v2_is_sent_as_a_new_request(runner):
    """A V2 runner gets a resumed request as a new one, prompt and outputs in
    prefill_token_ids; from vLLM 0.34 on every runner does."""
    if runner == "v1" and not resumed_requests_sent_as_new():
        pytest.skip("this vLLM sends a V1 runner its resumed requests as cached rows")
    p, plan = _preempt_resume(runner)
    so = to_scheduler_output(plan.steps[3], plan, p)
    assert so.scheduled_cached_reqs.req_ids == []
    (r,) = so.scheduled_new_reqs
    assert r.req_id == "_stepwarm_a_" and r.num_computed_tokens == 0
    assert r.prompt_token_ids == [0, 1, 2, 3, 4, 5]
    assert len(r.prefill_token_ids) == 8  # prompt + the 2 tokens sampled before
    assert [len(g) for g in r.block_ids] == [2, 2]


def test_spec_tokens_only_for_scheduled_requests():
    p = _profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2)
    b = PlanBuilder(p)
    for rid in ("_stepwarm_a_", "_stepwarm_b_"):
        b.add_request(PlannedRequest(rid, 4))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 4, "_stepwarm_b_": 4})
    step = b.step("mixed_decode", "m", decode={"_stepwarm_a_": 2, "_stepwarm_b_": 0})
    so = to_scheduler_output(step, b.build(), p)
    assert so.scheduled_spec_decode_tokens == {"_stepwarm_a_": [0, 0]}
    assert so.num_scheduled_tokens == {"_stepwarm_a_": 3, "_stepwarm_b_": 1}
    assert so.num_spec_tokens_to_schedule == 2
    # a: 4 + 3 tokens + 2 lookahead = 9 -> 3 blocks per group, had 2 (4 + 2 -> 6).
    assert [len(g) for g in so.scheduled_cached_reqs.new_block_ids[0]] == [1, 1]


def test_cleanup_step_finishes_every_live_request():
    p, plan = _preempt_resume("v1")
    so = to_scheduler_output(plan.steps[-1], plan, p)
    assert so.finished_req_ids == {"_stepwarm_a_", "_stepwarm_b_"}
    assert so.total_num_scheduled_tokens == 0 and so.num_spec_tokens_to_schedule == 0
    assert to_grammar_output(plan.steps[-1], p) is None


@pytest.mark.parametrize("runner, kept", [("v1", False), ("v2", True)])
def test_sampler_warmup_params_with_a_speculator(runner, kept):
    """vLLM refuses min_p / logit_bias with spec decoding
    (SamplingParams._validate_spec_decode); the V2 warmup still sends them."""
    p = _profile(runner, num_speculative_steps=1, decode_query_len=2)
    b = PlanBuilder(p)
    b.add_request(PlannedRequest("_stepwarm_a_", 3))
    step = b.step("prefill", "p", prefill={"_stepwarm_a_": 3})
    sp = to_scheduler_output(step, b.build(), p).scheduled_new_reqs[0].sampling_params
    assert (sp.min_p > 0, bool(sp.logit_bias)) == (kept, kept)
    assert sp.top_k == 50 and sp.logprobs == 5  # the rest of for_sampler_warmup()


def test_new_block_ids_to_zero_on_runners_that_zero_new_blocks():
    """Mamba hybrids: the scheduler sends the attention blocks handed out in
    the step (not Mamba blocks, not a prefix hit's cached blocks)."""
    p = _profile(
        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),
                         CacheSpec(kind="mamba", block_size=4, mamba_cache_mode="align")),
        zeroes_new_blocks=True, enable_prefix_caching=True,
    )
    b = PlanBuilder(p)
    b.add_request(PlannedRequest("_stepwarm_a_", 6))
    b.add_request(PlannedRequest("_stepwarm_h_", 10))
    prefill = b.step("prefill", "p", prefill={"_stepwarm_a_": 6})
    so = to_scheduler_output(prefill, b.build(), p)
    full, mamba = so.scheduled_new_reqs[0].block_ids
    # Align mode: a null placeholder, then one state block.
    assert so.new_block_ids_to_zero == full == [1, 2] and mamba == [0, 3]
    decode = b.step("decode", "d", decode={"_stepwarm_a_": 0})  # 7 tokens: no new block
    assert to_scheduler_output(decode, b.build(), p).new_block_ids_to_zero is None
    b.set_computed("_stepwarm_h_", 8)  # two cached blocks per group
    hit = b.step("prefix_hit", "h", prefill={"_stepwarm_h_": 2})
    so = to_scheduler_output(hit, b.build(), p)
    full, mamba = so.scheduled_new_reqs[0].block_ids
    # The hit shares a's cached prompt block (id 1; a's prompt of 6 tokens
    # fills one block); the second hit block stands in for an uncached one;
    # only the third block is new, so only it is zeroed.
    assert full[0] == 1 and len(full) == 3 and so.new_block_ids_to_zero == full[2:]
    assert mamba[0] == 0  # the Mamba hit keeps only its last state


def test_no_zeroing_without_the_runner_flag():
    p, plan = _preempt_resume("v1")
    assert to_scheduler_output(plan.steps[0], plan, p).new_block_ids_to_zero is None


@V1_CACHED_RESUME
def test_resumed_requests_carry_their_real_sampled_tokens():
    """Scheduler._make_cached_request_data sends prompt + outputs in
    all_token_ids (V1), the V2 scheduler in prefill_token_ids: the driver's
    history supplies the outputs, not zeros."""
    from stepwarm.compile import OutputHistory

    history = OutputHistory(sampled={"_stepwarm_a_": [41, 42]})
    p, plan = _preempt_resume("v1")
    c = to_scheduler_output(plan.steps[3], plan, p, tokens=history).scheduled_cached_reqs
    assert c.all_token_ids["_stepwarm_a_"] == [0, 1, 2, 3, 4, 5, 41, 42]
    p2, plan2 = _preempt_resume("v2")
    (r,) = to_scheduler_output(plan2.steps[3], plan2, p2, tokens=history).scheduled_new_reqs
    assert r.prefill_token_ids == [0, 1, 2, 3, 4, 5, 41, 42]
    # Unknown outputs (no history) are still 0, as before.
    c = to_scheduler_output(plan.steps[3], plan, p).scheduled_cached_reqs
    assert c.all_token_ids["_stepwarm_a_"] == [0, 1, 2, 3, 4, 5, 0, 0]


@V1_CACHED_RESUME
def test_a_running_request_not_scheduled_in_the_previous_step_gets_all_token_ids():
    """V1's scheduler sends all_token_ids for a request absent from the
    previous step (the runner dropped it from its persistent batch)."""
    from stepwarm.compile import OutputHistory

    p = _profile()
    b = PlanBuilder(p)
    for rid in ("_stepwarm_a_", "_stepwarm_b_"):
        b.add_request(PlannedRequest(rid, 3))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 3, "_stepwarm_b_": 3})
    b.step("decode", "a", decode={"_stepwarm_a_": 0})
    b.step("decode", "ab", decode={"_stepwarm_a_": 0, "_stepwarm_b_": 0})
    plan = b.build()
    history = OutputHistory(sampled={"_stepwarm_a_": [7, 8], "_stepwarm_b_": [9]})
    c = to_scheduler_output(plan.steps[1], plan, p, tokens=history).scheduled_cached_reqs
    assert c.all_token_ids == {}
    c = to_scheduler_output(plan.steps[2], plan, p, tokens=history).scheduled_cached_reqs
    assert c.all_token_ids == {"_stepwarm_b_": [0, 1, 2, 9]}


def test_drafts_come_from_the_expected_outputs_where_known():
    from stepwarm.compile import OutputHistory

    p = _profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2)
    b = PlanBuilder(p)
    for rid in ("_stepwarm_a_", "_stepwarm_b_"):
        b.add_request(PlannedRequest(rid, 4))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 4, "_stepwarm_b_": 4})
    b.step("spec_decode", "s", decode={"_stepwarm_a_": 2, "_stepwarm_b_": 2})
    plan = b.build()
    # a: outputs 0..1 known (the prefill sampled output 0; drafts are outputs 1, 2)
    history = OutputHistory(expected={"_stepwarm_a_": [5, 6, 7, 8], "_stepwarm_b_": [3, 4]})
    so = to_scheduler_output(plan.steps[1], plan, p, tokens=history)
    assert so.scheduled_spec_decode_tokens == {"_stepwarm_a_": [6, 7], "_stepwarm_b_": [4, 0]}


def test_prompt_ids_count_from_zero_modulo_the_vocabulary():
    p = _profile(vocab_size=4)
    assert prompt_token_ids(PlannedRequest("_stepwarm_a_", 6), p) == [0, 1, 2, 3, 0, 1]


def test_an_encoder_decoder_prompt_starts_with_the_decoder_start_token():
    # vLLM's front end prepends decoder_start_token_id to a decoder prompt that
    # lacks it (_prepare_decoder_input_ids_for_generation): stepwarm's prompt
    # starts with it, so the scheduler's prompt is these ids, of this length.
    p = _profile(kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),
                                  CacheSpec(kind="cross_attention", block_size=4)),
                 is_encoder_decoder=True, max_encoder_len=8, decoder_start_token_id=3)
    b = PlanBuilder(p)
    b.add_request(PlannedRequest("_stepwarm_a_", 5, encoder_len=8))
    b.add_request(PlannedRequest("_stepwarm_b_", 1, encoder_len=8))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 5, "_stepwarm_b_": 1})
    plan = b.build()
    so = to_scheduler_output(plan.steps[0], plan, p)
    assert [r.prompt_token_ids for r in so.scheduled_new_reqs] == [[3, 1, 2, 3, 4], [3]]


def test_rows_after_rejections_follow_acceptance():
    """Drafts the worker rejected (OutputHistory.rejected) lower a running
    row's num_computed_tokens / num_output_tokens and move its draft
    positions, as update_from_output does; follow_acceptance=False keeps the
    plan's rows; drafts made wrong from reject_drafts_from on."""
    from stepwarm.compile import OutputHistory

    p = _profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2)
    b = PlanBuilder(p)
    b.add_request(PlannedRequest("_stepwarm_a_", 5))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 5})
    b.step("spec_decode", "s", decode={"_stepwarm_a_": 2})
    b.step("spec_decode", "s", decode={"_stepwarm_a_": 2})
    plan = b.build()
    ref = [10, 11, 12, 13, 14, 15, 16]
    # 1 sampled by the prefill, 2 by the first spec step (one draft rejected).
    h = OutputHistory(sampled={"_stepwarm_a_": [10, 11, 12]}, expected={"_stepwarm_a_": ref},
                      rejected={"_stepwarm_a_": 1})
    so = to_scheduler_output(plan.steps[2], plan, p, tokens=h)
    c = so.scheduled_cached_reqs
    assert (c.num_computed_tokens, c.num_output_tokens) == ([7], [3])  # plan: 8, 4
    assert so.scheduled_spec_decode_tokens == {"_stepwarm_a_": [13, 14]}
    h.follow_acceptance = False
    so = to_scheduler_output(plan.steps[2], plan, p, tokens=h)
    assert so.scheduled_cached_reqs.num_computed_tokens == [8]
    assert so.scheduled_spec_decode_tokens == {"_stepwarm_a_": [14, 15]}
    wrong = OutputHistory(expected={"_stepwarm_a_": ref}, reject_drafts_from=1, vocab_size=70)
    so = to_scheduler_output(plan.steps[1], plan, p, tokens=wrong)
    assert so.scheduled_spec_decode_tokens == {"_stepwarm_a_": [11, 13]}
