"""``PlanBuilder.step(accepted=...)``: drafts the runner rejected come back
off the request's computed tokens (vLLM's ``update_from_output``); its blocks
stay. Bad values are refused before the step changes anything."""

from __future__ import annotations

import pytest

from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest
from stepwarm.profile import CacheSpec
from tests.helpers import make_profile

SPEC = make_profile(num_speculative_steps=3, max_num_seqs=4, num_lookahead_tokens=0,
                    draft_slots=0, num_blocks=64, enable_prefix_caching=False,
                    kv_cache_groups=(CacheSpec(kind="full_attention", block_size=4),))


def _running() -> PlanBuilder:
    b = PlanBuilder(SPEC, name="t")
    b.add_request(PlannedRequest("a", 6, sampling="greedy"))
    b.step("prefill", "p", prefill={"a": 6})  # 6 computed, 1 sampled: 7 tokens
    return b


def test_rejected_drafts_come_off_the_computed_tokens_and_blocks_stay():
    b = _running()
    step = b.step("decode", "d", decode={"a": 3}, accepted={"a": 1})
    (row,) = step.scheduled
    # 4 tokens (1 + 3 drafts) from position 6: blocks for 10 tokens (3)
    assert (row.num_computed_tokens, row.num_scheduled_tokens, row.block_ids) == (6, 4, ((3,),))
    # 1 sampled + 1 accepted: 8 computed, 9 tokens; the next step starts at 8
    assert b.num_computed_tokens("a") == 8
    (row,) = b.step("decode", "d2", decode={"a": 3}).scheduled
    # 12 tokens needed, 3 blocks held: nothing new
    assert (row.num_computed_tokens, row.block_ids) == (8, ((),))
    assert b.num_computed_tokens("a") == 12


def test_all_accepted_is_the_default():
    b = _running()
    b.step("decode", "d", decode={"a": 3})
    assert b.num_computed_tokens("a") == 10


@pytest.mark.parametrize(("accepted", "message"), [
    ({"a": 4}, "request 'a': accepted 4; allowed: a whole number from 0 to its 3 draft(s)"),
    ({"a": -1}, "request 'a': accepted -1; allowed: a whole number from 0 to its 3 draft(s)"),
    ({"b": 0}, "request 'b' has accepted drafts but is not decoded in this step"),
])
def test_bad_accepted_is_refused_before_the_step(accepted, message):
    b = _running()
    with pytest.raises(PlanError) as e:
        b.step("decode", "d", decode={"a": 3}, accepted=accepted)
    assert message in str(e.value)
    assert e.value.field == "accepted"
    assert b.num_computed_tokens("a") == 6  # nothing changed
