"""Placeholder drafts on a waiting request (``pad_spec_decode`` in vLLM's
``Scheduler.schedule``, :attr:`RunnerProfile.pad_spec_decode`): a request
whose one token is left after its prefix hit (or on resumption) is sent as
``1 + num_speculative_steps`` tokens with ``-1`` drafts, which the runner
rejects. The rules of the three release families, exact rows and blocks;
the ``SchedulerOutput`` carries the placeholders as they are. (vLLM's own
scheduler against these: tests/property/test_scheduler_oracle.py.)"""

from __future__ import annotations

import pytest

from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest
from stepwarm.plan.output import PLACEHOLDER_DRAFT
from stepwarm.profile import CacheSpec
from tests.helpers import make_profile


def _profile(rule: str, max_model_len: int = 64):
    return make_profile(num_speculative_steps=2, max_num_seqs=4, num_lookahead_tokens=0,
                        draft_slots=0, num_blocks=32, enable_prefix_caching=True,
                        max_model_len=max_model_len, pad_spec_decode=rule,
                        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),))


def _builder(rule: str, max_model_len: int = 64) -> PlanBuilder:
    """r0 prefilled (9 tokens: blocks 1, 2 cached, 3) and decoding; r1 of 9
    tokens waits with an 8-token hit on blocks 1, 2."""
    b = PlanBuilder(_profile(rule, max_model_len), name="t")
    b.add_request(PlannedRequest("r0", 9, sampling="greedy"))
    b.add_request(PlannedRequest("r1", 9, sampling="greedy"))
    b.step("prefill", "p", prefill={"r0": 9})
    b.set_computed("r1", 8)
    return b


@pytest.mark.parametrize("rule", ["0.26", "0.29", "0.30"])
def test_beside_a_decode_every_rule_pads(rule):
    b = _builder(rule)
    step = b.step("mixed", "m", decode={"r0": 2}, prefill={"r1": 1})
    rows = {r.req_id: r for r in step.scheduled}
    r1 = rows["r1"]
    # 1 token + 2 placeholders from position 8: slots to 11, block 4 new
    # (r0's 1 + 2 tokens fit its block 3)
    assert (r1.num_computed_tokens, r1.num_scheduled_tokens, r1.spec_token_ids, r1.block_ids,
            r1.samples, r1.num_drafts_verified) == (8, 3, (-1, -1), ((1, 2, 4),), True, 0)
    assert rows["r0"].spec_token_ids == (0, 0) and rows["r0"].num_drafts_verified == 2
    assert step.total_num_scheduled_tokens == 6
    # the runner rejects the placeholders: r1 advances by its one token
    assert (b.num_computed_tokens("r1"), b.num_tokens("r1")) == (9, 10)
    (row,) = [r for r in b.step("decode", "d", decode={"r1": 0}).scheduled]
    assert (row.num_computed_tokens, row.num_scheduled_tokens, row.block_ids) == (9, 1, ((),))


@pytest.mark.parametrize(("rule", "padded"), [("", False), ("0.26", False), ("0.29", False),
                                              ("0.30", True)])
def test_alone_only_0_30_pads_a_hit(rule, padded):
    b = _builder(rule)
    b.step("finish", "f", finish=("r0",))
    (row,) = b.step("prefix_hit", "h", prefill={"r1": 1}).scheduled
    assert (row.num_scheduled_tokens, row.spec_token_ids) == (
        (3, (PLACEHOLDER_DRAFT,) * 2) if padded else (1, ()))
    assert b.num_computed_tokens("r1") == 9


@pytest.mark.parametrize("rule", ["0.26", "0.29", "0.30"])
def test_beside_a_prefill_chunk_no_rule_pads(rule):
    b = _builder(rule)
    b.add_request(PlannedRequest("r2", 20, sampling="greedy"))
    b.step("chunked", "c", prefill={"r2": 8})  # r2 still prefilling: a running chunk
    step = b.step("mixed", "m", prefill={"r2": 4, "r1": 1}, decode={"r0": 0})
    assert {r.req_id: (r.num_scheduled_tokens, r.spec_token_ids) for r in step.scheduled} == {
        "r2": (4, ()), "r0": (1, ()), "r1": (1, ())}


def test_a_resumed_request_with_one_token_left_is_padded():
    b = _builder("0.30")
    for i in range(3):  # r0: 12 computed, 13 tokens: block 3 full and cached
        b.step("decode", f"d{i}", decode={"r0": 0})
    b.step("preempt", "x", preempt=("r0",))
    # its hit: blocks 1, 2 (prompt) and 3 (its own sampled tokens); one token left
    (row,) = b.step("resume", "r", resume={"r0": 1}).scheduled
    assert (row.num_computed_tokens, row.num_scheduled_tokens, row.spec_token_ids,
            row.resumed, row.block_ids) == (12, 3, (-1, -1), True, ((1, 2, 3, 4),))
    assert (b.num_computed_tokens("r0"), b.num_tokens("r0")) == (13, 14)


def test_0_29_and_on_leave_it_unpadded_where_the_sampled_token_would_not_fit():
    # max_model_len 11: 8 + 3 + 1 > 11, so 0.29's rule sends the one token alone
    b = _builder("0.29", max_model_len=11)
    step = b.step("mixed", "m", decode={"r0": 0}, prefill={"r1": 1})
    assert {r.req_id: r.num_scheduled_tokens for r in step.scheduled} == {"r0": 1, "r1": 1}


def test_0_26_refuses_a_padded_row_past_max_model_len():
    """vLLM 0.26 - 0.28 leave the request waiting rather than send it
    unpadded: the step is not one their scheduler sends."""
    b = _builder("0.26", max_model_len=10)
    with pytest.raises(PlanError) as e:
        b.step("mixed", "m", decode={"r0": 0}, prefill={"r1": 1})
    assert str(e.value).endswith(
        "request 'r1': vLLM pads its one token left to 3 with placeholder drafts, past "
        "max_model_len 10 (8 computed), and then leaves it waiting; allowed: schedule it "
        "beside a prefill chunk, or where it fits")
    assert e.value.field == "tokens"
    assert b.num_computed_tokens("r1") == 8  # nothing changed


def test_the_scheduler_output_carries_the_placeholders():
    """The driver sends the -1 drafts as vLLM's scheduler does (not the
    expected tokens it puts in real drafts' places under --verify)."""
    pytest.importorskip("vllm.v1.core.sched.output")
    from stepwarm.compile import OutputHistory, to_scheduler_output

    b = _builder("0.30")
    b.step("mixed", "m", decode={"r0": 2}, prefill={"r1": 1})
    plan = b.build()
    tokens = OutputHistory(expected={"r1": [7, 8, 9], "r0": [5, 6, 7, 8]})
    out = to_scheduler_output(plan.steps[1], plan, b.profile, {}, tokens)
    assert out.scheduled_spec_decode_tokens == {"r0": [6, 7], "r1": [-1, -1]}
    assert out.num_scheduled_tokens == {"r0": 3, "r1": 3}


def test_a_mamba_align_runner_sends_the_row_unpadded():
    """vLLM drops the padding where its block-aligned split clips the row;
    stepwarm does not model that split for padded rows and sends one token."""
    p = _profile("0.30").model_copy(update=dict(
        mamba_cache_mode="align",
        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),
                         CacheSpec(kind="mamba", block_size=4, mamba_cache_mode="align"))))
    b = PlanBuilder(p, name="t")
    b.add_request(PlannedRequest("r0", 9, sampling="greedy"))
    b.add_request(PlannedRequest("r1", 9, sampling="greedy"))
    b.step("prefill", "p", prefill={"r0": 8})
    b.step("prefill", "p2", prefill={"r0": 1})
    b.set_computed("r1", 8)
    step = b.step("mixed", "m", decode={"r0": 0}, prefill={"r1": 1})
    assert {r.req_id: (r.num_scheduled_tokens, r.spec_token_ids) for r in step.scheduled} == {
        "r0": (1, ()), "r1": (1, ())}


@pytest.mark.parametrize(("after_output", "hit", "table"), [(False, 4, (1, 4, 2)),
                                                           (True, 8, (1, 2, 4))])
def test_blocks_filled_by_accepted_drafts_are_cached_after_the_output(after_output, hit,
                                                                       table):
    """vLLM 0.33 on, with a speculator, ``update_from_output`` caches a
    request's blocks up to its computed tokens (``caches_after_output``):
    r0's block of tokens 4-7, filled by its two accepted drafts, is a cache
    entry before r0 is preempted, so its resumption hits it. Before 0.33
    its next allocation would have cached it, and the preemption came
    first. (vLLM's scheduler: tests/property/test_scheduler_oracle.py's
    PREEMPT_STREAM on 0.34's sources.)"""
    profile = _profile("0.30").model_copy(update={"caches_after_output": after_output})
    b = PlanBuilder(profile, name="t")
    b.add_request(PlannedRequest("r0", 6, sampling="greedy"))
    b.add_request(PlannedRequest("r1", 3, sampling="greedy"))
    b.step("prefill", "p", prefill={"r0": 6, "r1": 3})
    b.step("decode", "d", decode={"r0": 2, "r1": 0})  # r0: positions 6-8, both drafts kept
    assert b.num_computed_tokens("r0") == 9
    b.step("decode", "d2", decode={"r1": 0}, preempt=("r0",))
    assert b.resume_lookup("r0") == hit
    (row,) = b.step("resume", "r", resume={"r0": 10 - hit}).scheduled
    # uncached, r0's blocks 2 and 4 went back to the free queue's head (its
    # last first) and come back in that order
    assert (row.num_computed_tokens, row.num_scheduled_tokens, row.block_ids) == (
        hit, 10 - hit, (table,))


@pytest.mark.parametrize(("accepted", "table"), [
    # both drafts kept: r0's 9 computed tokens fill block 2, cached after the
    # output though r0 finishes; freed cached it goes to the free queue's
    # tail, and r2 takes block 4 (uncached) then fresh ones
    (None, (4, 5, 6)),
    # r0 stopped at its first token (max_tokens): the drafts are dropped,
    # 7 tokens computed, block 2 uncached: back at the head with block 4
    ({"r0": 0}, (4, 2, 5)),
])
def test_a_request_finished_next_step_is_cached_after_its_output_as_far_as_it_kept(
        accepted, table):
    """vLLM 0.33+ caches every request that sampled ("Publish finalized
    states"), one that finishes next included, as far as its output keeps
    (the accepted count a recording gives: drafts past a stop dropped)."""
    profile = _profile("0.30").model_copy(update={"caches_after_output": True})
    b = PlanBuilder(profile, name="t")
    b.add_request(PlannedRequest("r0", 6, sampling="greedy"))
    b.add_request(PlannedRequest("r1", 3, sampling="greedy"))
    b.add_request(PlannedRequest("r2", 9, sampling="greedy"))
    b.step("prefill", "p", prefill={"r0": 6, "r1": 3})
    b.step("decode", "d", decode={"r0": 2, "r1": 0}, accepted=accepted or {})
    assert b.ledger.held("r0") == ((1, 2, 4),)
    (row,) = b.step("prefill", "p2", prefill={"r2": 9}, finish=("r0",)).scheduled
    assert row.block_ids == (table,)


def test_the_after_output_rule_is_read_off_the_installed_scheduler():
    """0.33 and 0.34 cache after the output; 0.26 - 0.32 do not (the
    version matrix runs this on each release's sources)."""
    import vllm

    from stepwarm.vllm_facts import scheduler_caches_after_output

    major_minor = tuple(int(x) for x in vllm.__version__.split(".")[:2])
    assert scheduler_caches_after_output() is (major_minor >= (0, 33))
