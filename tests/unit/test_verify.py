"""The consistency oracle's pure parts (no engine): what a plan samples, the
prefix fills, and the step-by-step comparison."""

from __future__ import annotations

from stepwarm.driver import RunReport, StepResult
from stepwarm.plan import PlanBuilder, PlannedRequest
from stepwarm.profile import CacheSpec, RunnerProfile
from stepwarm.verify import FILL_PREFIX, as_greedy, compare, planned_outputs, with_prefix_fills
from tests.helpers import make_profile

A, B = "_stepwarm_t_a_", "_stepwarm_t_b_"


def _profile(**kw) -> RunnerProfile:
    return make_profile(**{**dict(
        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),), num_blocks=100,
        max_model_len=64, max_num_batched_tokens=32, vocab_size=70, num_speculative_steps=2,
        decode_query_len=3, num_lookahead_tokens=2), **kw})


def _plan():
    p = _profile(enable_prefix_caching=True)  # B's hit: vLLM gives none without caching
    b = PlanBuilder(p, name="t")
    b.add_request(PlannedRequest(A, 6, name="a"))
    b.add_request(PlannedRequest(B, 10, name="b"))
    b.set_computed(B, 8)
    b.step("prefill", "p", prefill={A: 6})                     # A samples output 0
    b.step("mixed_prefill_decode", "m", decode={A: 2}, prefill={B: 2})  # A 1..3, B 0
    b.step("preempt", "x", preempt=(A,))
    b.step("resume", "r", resume={A: 6})  # A: a 4-token hit on resumption, recomputes 6, samples 4
    b.cleanup()
    return p, b.build()


def test_planned_outputs_count_drafts_as_accepted():
    _, plan = _plan()
    assert planned_outputs(plan) == {A: 5, B: 1}


def test_as_greedy_changes_sampling_only():
    _, plan = _plan()
    g = as_greedy(plan)
    assert [r.sampling for r in plan.requests] == ["warmup", "warmup"]
    assert [r.sampling for r in g.requests] == ["greedy", "greedy"]
    assert g.steps == plan.steps


def test_prefix_fill_prefills_the_hit_into_the_hit_blocks_and_is_finished_by_it():
    p, plan = _plan()
    filled, origin = with_prefix_fills(plan, p)
    assert origin == (0, 1, 1, 2, 3, 4)
    fill, hit = filled.steps[1], filled.steps[2]
    (row,) = fill.scheduled
    (hit_row,) = [r for r in hit.scheduled if r.req_id == B]
    assert row.req_id.startswith(FILL_PREFIX) and row.new and row.samples
    assert (row.num_computed_tokens, row.num_scheduled_tokens) == (0, 8)
    # 8 cached tokens at block_size 4 plus 2 lookahead tokens: the hit's first 3 blocks.
    assert row.block_ids == (hit_row.block_ids[0][:3],)
    assert row.req_id in hit.finished_req_ids
    assert [s.index for s in filled.steps] == list(range(6))
    assert filled.request(row.req_id).prompt_len == 8


def _report(plan, sampled):
    steps = [StepResult(index=s.index, kind=s.kind, label=s.label, num_reqs=0,
                        num_scheduled_tokens=0, num_spec_tokens=0, new_blocks=[],
                        held_blocks={}, wall_ms=0.0, sampled_token_ids=t)
             for s, t in zip(plan.steps, sampled)]
    return RunReport(plan=plan.name, runner="v1", model="m", steps=steps)


def test_compare_names_the_first_step_and_position_that_differ():
    _, plan = _plan()
    reference = {A: [1, 2, 3, 4, 5], B: [9]}
    origin = tuple(range(len(plan.steps)))
    same = _report(plan, [{A: [1]}, {A: [2, 3, 4], B: [9]}, None, {A: [5]}, None])
    rep = compare(plan, origin, same, reference)
    assert rep.ok and rep.checked == {"a": 5, "b": 1}
    # A draft rejected at output 2 (the worker computed 7 there), then A's resume differs too.
    bad = _report(plan, [{A: [1]}, {A: [2, 7], B: [9]}, None, {A: [6]}, None])
    rep = compare(plan, origin, bad, reference)
    (d,) = rep.differences
    assert (d.request, d.step, d.step_kind, d.position) == ("a", 1, "mixed_prefill_decode", 2)
    assert (d.stepwarm, d.reference) == ((2, 7), (2, 3, 4))


def test_a_reference_cut_short_is_a_difference():
    # With ignore_eos only a length cap stops vLLM's scheduler early, and the
    # plan keeps each request within max_model_len: a short reference means
    # the scheduler ran another request (a Whisper decoder prompt one token
    # longer, before prompts began with the decoder start token).
    _, plan = _plan()
    origin = tuple(range(len(plan.steps)))
    reference = {A: [1, 2, 3], B: [9]}
    rep = compare(plan, origin, _report(plan, [{A: [1]}, {A: [2, 3, 4], B: [9]}, None,
                                               {A: [5]}, None]), reference)
    (d,) = rep.differences
    assert (d.request, d.step, d.position, d.stepwarm, d.reference) == ("a", 1, 3, (2, 3, 4),
                                                                          (2, 3))


def test_a_prefix_fill_longer_than_the_token_budget_is_chunked():
    p = _profile(max_num_batched_tokens=4, num_speculative_steps=0, decode_query_len=1,
                 num_lookahead_tokens=0, enable_prefix_caching=True)
    b = PlanBuilder(p, name="t")
    b.add_request(PlannedRequest(B, 10, name="b"))
    b.set_computed(B, 8)
    b.step("prefix_hit", "h", prefill={B: 2})
    plan = b.build()
    filled, origin = with_prefix_fills(plan, p)
    assert origin == (0, 0, 0)
    rows = [s.scheduled[0] for s in filled.steps[:2]]  # 8 tokens in chunks of 4
    assert [(r.num_computed_tokens, r.num_scheduled_tokens, r.new, r.samples) for r in rows] == [
        (0, 4, True, False), (4, 4, False, True)]
    assert rows[0].block_ids == (plan.steps[0].scheduled[0].block_ids[0][:2],)
    assert rows[1].block_ids == ()


def _mamba_align_profile(block: int, budget: int) -> RunnerProfile:
    return _profile(max_num_batched_tokens=budget, num_speculative_steps=0, decode_query_len=1,
                    num_lookahead_tokens=0, enable_prefix_caching=True, kv_cache_groups=(
                        CacheSpec(kind="mamba", block_size=block, mamba_cache_mode="align"),
                        CacheSpec(kind="full_attention", block_size=block)))


def test_a_prefix_fill_in_mamba_align_mode_goes_one_mamba_block_per_step():
    p = _mamba_align_profile(4, 32)
    b = PlanBuilder(p, name="t")
    b.add_request(PlannedRequest(B, 10, name="b"))
    b.set_computed(B, 8)
    b.step("prefix_hit", "h", prefill={B: 2})
    filled, _ = with_prefix_fills(b.build(), p)
    assert [(s.scheduled[0].num_computed_tokens, s.scheduled[0].num_scheduled_tokens)
            for s in filled.steps[:2]] == [(0, 4), (4, 4)]


def test_a_mamba_block_wider_than_the_budget_stops_only_a_plan_with_a_prefix_hit():
    """A fresh user's find: on a Mamba align runner whose block (8) is wider
    than max_num_batched_tokens (4; the scheduler then splits anywhere, and vLLM
    serves it) --verify failed every scenario, hit or not: the fill chunk was
    found before any hit was seen. A plan without a hit is left as it is."""
    import pytest

    p = _mamba_align_profile(8, 4)
    b = PlanBuilder(p, name="t")
    b.add_request(PlannedRequest(A, 3, name="a"))
    b.step("prefill", "p", prefill={A: 3})
    b.step("decode", "d", decode={A: 0})
    b.cleanup()
    plan = b.build()
    filled, origin = with_prefix_fills(plan, p)
    assert filled.steps == plan.steps and origin == (0, 1, 2)
    b = PlanBuilder(p, name="t")
    b.add_request(PlannedRequest(B, 10, name="b"))
    b.set_computed(B, 8)
    b.step("prefix_hit", "h", prefill={B: 2})
    with pytest.raises(ValueError, match="Mamba align block of 8 tokens exceeds "
                       "max_num_batched_tokens 4"):
        with_prefix_fills(b.build(), p)
