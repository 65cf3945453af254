"""PlanBuilder: the request lifecycle and runner limits (no engine)."""

from __future__ import annotations

import pytest

from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest, max_prompt_len
from stepwarm.profile import CacheSpec, RunnerProfile

A = "_stepwarm_a_"


def _builder(**kw) -> PlanBuilder:
    base = dict(runner="v1", kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16),),
                num_blocks=64, max_model_len=32, max_num_seqs=4, max_num_batched_tokens=64,
                vocab_size=100)
    base.update(kw)
    return PlanBuilder(RunnerProfile(**base))


def test_sampling_prompt_must_leave_room_for_the_sampled_token():
    b = _builder()
    with pytest.raises(PlanError, match=r"prompt_len 32 exceeds 31; allowed: 1\.\.31") as info:
        b.add_request(PlannedRequest(A, 32))
    assert info.value.field == "prompt_len"
    b.add_request(PlannedRequest("_stepwarm_pool_", 32, kind="pool"))  # pooling samples nothing


def test_max_prompt_len_is_vllms_front_end_limit():
    # InputProcessor._validate_prompt_len: > max_model_len refused; == refused
    # when the runner generates (a sampling request), allowed when it pools.
    p = _builder().profile
    assert (max_prompt_len(p), max_prompt_len(p, "sample"), max_prompt_len(p, "pool")) == (
        31, 31, 32)
    whisper = _builder(max_model_len=448, is_encoder_decoder=True, max_encoder_len=1500,
                       decoder_start_token_id=3).profile
    assert max_prompt_len(whisper) == 447


def test_decodes_stop_at_max_model_len_counting_sampled_tokens():
    b = _builder()
    b.add_request(PlannedRequest(A, 30))
    b.step("prefill", "p", prefill={A: 30})            # 30 + 1 sampled = 31
    b.step("decode", "d", decode={A: 0})               # 32 = max_model_len
    with pytest.raises(PlanError) as info:
        b.step("decode", "d", decode={A: 0})
    assert str(info.value) == (
        f"step 2: request {A!r} would reach 33 tokens (prompt 30 + 3 sampled), "
        "beyond max_model_len 32"
    )
    assert (info.value.step, info.value.field) == (2, "tokens")


def test_resume_needs_a_preempted_request():
    b = _builder()
    b.add_request(PlannedRequest(A, 20))
    b.step("prefill", "p", prefill={A: 20})
    b.step("decode", "d", decode={A: 0})
    with pytest.raises(PlanError, match="cannot be resumed: it is running \\(never preempted\\)"):
        b.step("resume", "r", resume={A: 1})
    b.step("preempt", "x", preempt=(A,))
    # 20 prompt + 2 sampled tokens to recompute, in two chunks.
    first = b.step("resume", "r1", resume={A: 16})
    assert first.scheduled[0].resumed and not first.scheduled[0].samples
    second = b.step("resume", "r2", resume={A: 6})
    row = second.scheduled[0]
    assert (row.resumed, row.num_computed_tokens, row.samples) == (False, 16, True)
    with pytest.raises(PlanError, match="cannot be resumed: it is running"):
        b.step("resume", "r3", resume={A: 1})  # recomputed: a decode now
    assert b.step("decode", "d", decode={A: 0}).scheduled[0].num_computed_tokens == 22


def test_refused_step_leaves_no_block_handed_out():
    b = _builder(num_blocks=3)  # 2 usable blocks of 16 tokens
    b.add_request(PlannedRequest(A, 20))
    b.add_request(PlannedRequest("_stepwarm_b_", 10))
    b.step("prefill", "p", prefill={A: 20})             # 2 blocks
    with pytest.raises(PlanError, match="needs 1 more block\\(s\\) .* only 0 of 2 are free"):
        b.step("prefill", "p", prefill={"_stepwarm_b_": 10})
    assert b.ledger.num_free == 0 and b.ledger.held_counts(A) == (2,)
    finish = b.step("finish", "f", finish=(A,))
    assert finish.finished_req_ids == {A} and b.ledger.num_free == 2


def test_at_most_max_num_seqs_requests_running():
    b = _builder(max_num_seqs=2)
    for rid in ("_stepwarm_a_", "_stepwarm_b_", "_stepwarm_c_"):
        b.add_request(PlannedRequest(rid, 4))
    b.step("prefill", "p", prefill={"_stepwarm_a_": 4})
    b.step("prefill", "p", prefill={"_stepwarm_b_": 4})
    with pytest.raises(PlanError) as info:
        b.step("prefill", "p", prefill={"_stepwarm_c_": 4})  # a and b still run
    assert str(info.value) == ("step 2: 3 requests would be running after this step but "
                               "max_num_seqs is 2; allowed: finish or preempt some first")
    assert (info.value.field, info.value.limit) == ("requests", "max_num_seqs")
    with pytest.raises(PlanError) as info:  # three at once: the scheduled count itself
        b.step("decode", "d", decode=dict.fromkeys(("_stepwarm_a_", "_stepwarm_b_", "_stepwarm_c_"), 0))
    assert (info.value.field, info.value.limit) == ("requests", "max_num_seqs")
    assert str(info.value) == "step 2: 3 requests scheduled but max_num_seqs is 2"
    step = b.step("prefill", "p", prefill={"_stepwarm_c_": 4}, finish=("_stepwarm_a_",))
    assert step.finished_req_ids == {"_stepwarm_a_"} and step.req_ids == ("_stepwarm_c_",)


def test_pooling_requests_finish_in_the_step_after_their_prefill():
    b = _builder(max_num_seqs=1)
    b.add_request(PlannedRequest("_stepwarm_p_", 8, kind="pool"))
    b.add_request(PlannedRequest("_stepwarm_q_", 8, kind="pool"))
    first = b.step("prefill", "p", prefill={"_stepwarm_p_": 8})
    assert first.sample is False and first.finished_req_ids == frozenset()
    second = b.step("prefill", "q", prefill={"_stepwarm_q_": 8})  # p left: room for q
    assert second.finished_req_ids == {"_stepwarm_p_"}
    with pytest.raises(PlanError, match="is a pooling request: it samples no token"):
        b.step("decode", "d", decode={"_stepwarm_q_": 0})
    assert b.cleanup().finished_req_ids == {"_stepwarm_q_"}
    assert b.live_req_ids() == ()


def test_mamba_align_prefill_chunks_end_on_block_boundaries():
    """Scheduler._mamba_block_aligned_split: in align mode every prefill chunk
    but the last ends on a multiple of the Mamba block size."""
    b = _builder(kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16),
                                  CacheSpec(kind="mamba", block_size=16, mamba_cache_mode="align")),
                 max_model_len=128)
    b.add_request(PlannedRequest(A, 40))
    with pytest.raises(PlanError) as info:
        b.step("chunked_prefill", "c", prefill={A: 20})
    assert str(info.value) == (
        f"step 0: request {A!r}: prefill chunk ends at token 20, not on a Mamba block "
        "boundary; allowed in Mamba align mode: a chunk that finishes the prefill, or one "
        "ending on a multiple of block_size 16 (next: 32)")
    b.step("chunked_prefill", "c", prefill={A: 32})
    b.step("prefill", "rest", prefill={A: 8})  # the last chunk may end anywhere
    # A block wider than the token budget advances by sub-block chunks.
    wide = _builder(kv_cache_groups=(CacheSpec(kind="mamba", block_size=128, mamba_cache_mode="align"),),
                    max_model_len=256, max_num_batched_tokens=64)
    wide.add_request(PlannedRequest(A, 200))
    assert wide.step("chunked_prefill", "c", prefill={A: 50}).total_num_scheduled_tokens == 50
    # ... and so does a block wider than the scheduler's chunk limit
    # (max_num_scheduled_tokens less long_prefill_token_threshold, 12 here),
    # though not wider than the budget; without the limit the chunk is refused.
    for limit, ok in ((12, True), (0, False)):
        capped = _builder(kv_cache_groups=(CacheSpec(kind="mamba", block_size=16,
                                                     mamba_cache_mode="align"),),
                          max_model_len=128, max_num_batched_tokens=64, max_prefill_tokens=limit)
        capped.add_request(PlannedRequest(A, 40))
        if ok:
            assert capped.step("chunked_prefill", "c", prefill={A: 12}).total_num_scheduled_tokens == 12
        else:
            with pytest.raises(PlanError, match="prefill chunk ends at token 12, not on a Mamba"):
                capped.step("chunked_prefill", "c", prefill={A: 12})


def test_mamba_align_resume_chunk_may_end_one_token_before_the_last():
    """Regression (found by the property tests): a resumed request's prefill
    ends at max(prompt_len, num_tokens - 1), so recomputing a 1-token prompt
    plus 1 sampled token may stop after token 1 even with Mamba block 2."""
    b = _builder(kv_cache_groups=(CacheSpec(kind="mamba", block_size=2, mamba_cache_mode="align"),),
                 max_model_len=8)
    b.add_request(PlannedRequest(A, 1))
    b.step("prefill", "p", prefill={A: 1})
    b.step("preempt", "x", preempt=(A,))
    first = b.step("resume", "r1", resume={A: 1})
    assert first.scheduled[0].resumed and first.scheduled[0].num_scheduled_tokens == 1
    b.add_request(PlannedRequest("_stepwarm_b_", 5))
    with pytest.raises(PlanError, match="prefill chunk ends at token 3, not on a Mamba block"):
        b.step("chunked_prefill", "c", prefill={"_stepwarm_b_": 3})


def test_no_prefix_hit_for_a_request_that_reads_no_prefix_cache():
    """``KVCacheManager.get_computed_blocks`` looks up nothing for a request
    with ``skip_reading_prefix_cache`` (prompt logprobs, per-token pooling):
    the builder refuses a hit for it, as data, and plans its plain prefill."""
    b = _builder(enable_prefix_caching=True)
    b.add_request(PlannedRequest(A, 20, skip_reading_prefix_cache=True, name="a"))
    with pytest.raises(PlanError) as e:
        b.set_computed(A, 16)
    err = e.value
    assert (err.step, err.request, err.field) == (0, A, "prefix_hit")
    assert err.reason.startswith(f"request {A!r} reads no prefix cache (skip_reading_prefix_cache")
    assert str(err) == f"step 0: {err.reason}"
    step = b.step("prefill", "p", prefill={A: 20})
    (row,) = step.scheduled
    assert (row.num_computed_tokens, row.num_scheduled_tokens, row.block_ids) == (0, 20, ((1, 2),))


def test_no_prefix_hit_without_prefix_caching():
    """``get_computed_blocks`` looks nothing up with caching off: vLLM's
    scheduler never sends a hit there, so the builder refuses one, as data,
    before anything is held."""
    b = _builder()  # enable_prefix_caching False
    b.add_request(PlannedRequest(A, 20))
    with pytest.raises(PlanError) as e:
        b.set_computed(A, 16)
    assert (e.value.step, e.value.request, e.value.field) == (0, A, "prefix_hit")
    assert e.value.reason == (
        f"request {A!r}: a prefix hit of 16 tokens, but prefix caching is off "
        "(enable_prefix_caching False), so vLLM's scheduler gives no request a prefix hit; "
        "allowed: a plain prefill, or an engine with prefix caching on")
    assert b.ledger.num_free == 63
    b.set_computed(A, 0)  # no hit: a plain prefill
    (row,) = b.step("prefill", "p", prefill={A: 20}).scheduled
    assert (row.num_computed_tokens, row.block_ids) == (0, ((1, 2),))


def test_a_prefix_hit_is_whole_cache_hit_units():
    """A hit of 12 tokens on 16-token blocks computes tokens no hit block
    holds; the scheduler never sends it. Refused as data; nothing is held and
    the whole-block hit then plans from block 2 on."""
    b = _builder(enable_prefix_caching=True)
    b.add_request(PlannedRequest(A, 20))
    with pytest.raises(PlanError) as e:
        b.set_computed(A, 12)
    assert (e.value.step, e.value.request, e.value.field) == (0, A, "prefix_hit")
    assert e.value.reason == (f"request {A!r}: prefix hit of 12 tokens is not a whole number "
                              "of the scheduler's cache-hit units (16 tokens); allowed: a "
                              "multiple of 16")
    assert b.ledger.num_free == 63
    b.set_computed(A, 16)
    (row,) = b.step("prefill", "p", prefill={A: 4}).scheduled
    assert (row.num_computed_tokens, row.num_scheduled_tokens, row.block_ids) == (16, 4, ((1, 2),))


def test_plan_errors_carry_step_request_field_and_reason():
    b = _builder()
    b.add_request(PlannedRequest(A, 20))
    b.step("prefill", "p", prefill={A: 20})
    with pytest.raises(PlanError) as e:
        b.step("decode", "d", decode={A: 1})
    err = e.value
    assert (err.step, err.request, err.field) == (1, A, "spec_tokens")
    assert err.reason == (f"request {A!r}: 1 draft token(s) but the runner has no speculator "
                          "(num_speculative_steps is 0)")
    assert str(err) == "step 1: " + err.reason


def test_display_names_come_from_the_declared_requests():
    b = _builder()
    b.add_request(PlannedRequest("_stepwarm_t_x_0_", 4, name="x", index=0))
    b.add_request(PlannedRequest("_stepwarm_t_x_", 4, name="y"))
    b.add_request(PlannedRequest("_stepwarm_t_z_", 4))
    plan = b.build()
    assert [plan.display_name(r.req_id) for r in plan.requests] == ["x[0]", "y", "_stepwarm_t_z_"]
    assert plan.display_name("other") == "other"
    assert plan.with_display_names("'_stepwarm_t_x_0_' and _stepwarm_t_x_.") == "'x[0]' and y."


def test_a_refused_step_leaves_the_ledger_as_it_was():
    """A step that surely fits saves no ledger state; one that may not (Mamba
    align) saves it and a refused step leaves the ledger exactly as it was."""
    mamba = CacheSpec(kind="mamba", block_size=16, mamba_cache_mode="align")
    b = _builder(kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16), mamba),
                 num_blocks=6, mamba_cache_mode="align")
    b.add_request(PlannedRequest(A, 20))
    b.add_request(PlannedRequest("_stepwarm_b_", 20))
    b.step("prefill", "p", prefill={A: 20})
    before = (b.ledger.held(A), b.ledger.num_free, b.ledger.live_requests())
    with pytest.raises(PlanError) as e:
        b.step("prefill", "q", prefill={"_stepwarm_b_": 20})
    assert e.value.field == "blocks"
    assert (b.ledger.held(A), b.ledger.num_free, b.ledger.live_requests()) == before


def test_segments_cut_where_no_request_is_left_in_the_runner():
    b = _builder()
    for rid in ("_stepwarm_a_", "_stepwarm_b_", "_stepwarm_c_", "_stepwarm_d_"):
        b.add_request(PlannedRequest(rid, 8))
    b.step("prefill", "a", prefill={"_stepwarm_a_": 8})                    # 0
    b.step("decode", "a", decode={"_stepwarm_a_": 0})                      # 1
    b.step("finish", "a", finish=("_stepwarm_a_",))                        # 2: none left
    b.step("prefill", "b", prefill={"_stepwarm_b_": 8})                    # 3: cut before
    b.step("preempt", "b", preempt=("_stepwarm_b_",))                      # 4: b still held
    b.step("resume", "b", resume={"_stepwarm_b_": 1})                      # 5
    # c starts as b finishes: nothing of b's is left once the step begins
    b.step("prefill", "c", prefill={"_stepwarm_c_": 8}, finish=("_stepwarm_b_",))  # 6
    b.step("prefill", "d", prefill={"_stepwarm_d_": 8})                    # 7: c still held
    b.cleanup()                                                            # 8
    plan = b.build()
    assert [st.kind for st in plan.steps] == [
        "prefill", "decode", "finish", "prefill", "preempt", "resume", "prefill", "prefill",
        "cleanup"]
    assert plan.segments() == (range(3), range(3, 6), range(6, 9))
    assert plan.only([0, 1, 2]).steps == plan.steps and plan.only([]).steps == ()
    # b's segment alone: its steps, their indices; nobody finishes b but the
    # driver's cleanup (the step that did is left out)
    only = plan.only([1])
    assert [st.index for st in only.steps] == [3, 4, 5]
    assert only.steps == plan.steps[3:6] and only.requests == plan.requests
    # the steps left out are counted (the driver's "step 4/9")
    assert (plan.left_out, only.left_out, plan.only([]).left_out) == (0, 6, 9)
    # c's without b's: step 6 finishes nothing the kept steps started
    only = plan.only([2])
    assert [(st.index, st.finished_req_ids) for st in only.steps] == [
        (6, frozenset()), (7, frozenset()),
        (8, frozenset({"_stepwarm_c_", "_stepwarm_d_"}))]
    assert plan.steps[6].finished_req_ids == {"_stepwarm_b_"}  # the plan itself unchanged
    # a's and c's: the finish of b is dropped, a's own finish kept
    assert [sorted(st.finished_req_ids) for st in plan.only([0, 2]).steps] == [
        [], [], ["_stepwarm_a_"], [], [], ["_stepwarm_c_", "_stepwarm_d_"]]


def test_a_finish_a_left_out_segment_owed_goes_with_the_next_step_kept():
    b = _builder()
    for rid in ("_stepwarm_a_", "_stepwarm_b_", "_stepwarm_c_"):
        b.add_request(PlannedRequest(rid, 8))
    b.step("prefill", "a", prefill={"_stepwarm_a_": 8})
    b.step("prefill", "b", prefill={"_stepwarm_b_": 8}, finish=("_stepwarm_a_",))
    b.step("prefill", "c", prefill={"_stepwarm_c_": 8}, finish=("_stepwarm_b_",))
    b.cleanup()
    plan = b.build()
    assert plan.segments() == (range(1), range(1, 2), range(2, 4))
    # a kept, b left out, c kept: a is finished as c starts
    assert [(st.index, sorted(st.finished_req_ids)) for st in plan.only([0, 2]).steps] == [
        (0, []), (2, ["_stepwarm_a_"]), (3, ["_stepwarm_c_"])]


def test_a_plan_left_with_live_requests_ends_in_one_more_segment():
    b = _builder()
    b.add_request(PlannedRequest(A, 8))
    b.add_request(PlannedRequest("_stepwarm_b_", 8))
    b.step("prefill", "a", prefill={A: 8})
    b.step("finish", "a", finish=(A,))
    b.step("prefill", "b", prefill={"_stepwarm_b_": 8})
    assert b.build().segments() == (range(2), range(2, 3))
    assert PlanBuilder(b.profile).build().segments() == ()


def test_a_plan_with_an_encoder_input_is_one_segment():
    """A later request may read an earlier one's encoder output from the
    runner's encoder cache: no cut."""
    b = _builder(max_model_len=448, max_num_batched_tokens=512, num_blocks=256,
                 is_encoder_decoder=True, max_encoder_len=1500, decoder_start_token_id=3)
    for rid in (A, "_stepwarm_b_"):
        b.add_request(PlannedRequest(rid, 4, encoder_len=1500))
    b.step("prefill", "a", prefill={A: 4})
    b.step("finish", "a", finish=(A,))
    b.step("prefill", "b", prefill={"_stepwarm_b_": 4})
    b.cleanup()
    assert b.build().segments() == (range(4),)
