"""A preempted request looks itself up in the prefix cache when it resumes
(issue 41; vLLM's scheduler: ``num_computed_tokens == 0`` ->
``get_computed_blocks``), planned from a scenario on the embedded tiny
Llama's saved profile (one full-attention group of 128-token blocks, prefix
caching on), as ``stepwarm show --tables`` shows it."""

from __future__ import annotations

import textwrap

from stepwarm.profile import tiny_profile
from stepwarm.scenario import expand
from stepwarm.scenario.load import loads

SCENARIO = textwrap.dedent("""
    description = "150-token prompt, preempted and resumed"
    requests.a = {prompt = 150, sampling = "greedy"}
    steps = [{kind = "prefill", requests = ["a"]},
             {kind = "decode", requests = ["a"], repeat = 3},
             {kind = "preempt", requests = ["a"]}, {kind = "resume", requests = ["a"]},
             {kind = "decode", requests = ["a"]}]
""")


def _resume_row(profile):
    plan = expand(loads(SCENARIO, "resume150.toml", "resume150"), profile)
    (step,) = [st for st in plan.steps if st.kind == "resume"]
    (row,) = step.scheduled
    return row


def test_resumed_150_token_prompt_hits_its_first_block() -> None:
    """Prompt 150 + 4 sampled tokens: block 1 (128 prompt tokens) is still
    cached, so the resumed row starts at 128 computed tokens, recomputes 26
    and sends block 1 (the hit) and block 2 (from the pool)."""
    profile = tiny_profile()
    assert profile.enable_prefix_caching and profile.kv_cache_groups[0].block_size == 128
    row = _resume_row(profile)
    assert (row.resumed, row.num_computed_tokens, row.num_scheduled_tokens) == (True, 128, 26)
    assert row.block_ids == ((1, 2),)
    assert row.allocated == ((2,),)


def test_without_prefix_caching_the_resumption_recomputes_everything() -> None:
    row = _resume_row(tiny_profile().model_copy(update={"enable_prefix_caching": False}))
    assert (row.num_computed_tokens, row.num_scheduled_tokens) == (0, 154)
    assert row.block_ids == ((2, 1),)


def test_beside_a_sliding_window_the_hit_ends_on_a_run_its_window_reads() -> None:
    """A sliding-window group (window 32, 16-token blocks: a hit needs a run
    of cdiv(31, 16) = 2 cached blocks) beside the full one: the full group
    hits the 9 whole prompt blocks (144 tokens), the window group's blocks 7
    and 8 are still cached, so the row recomputes 10 tokens; the window's
    table starts with 7 null blocks (tokens before 144 - 32 + 1 skipped) and
    then the two blocks its prefill cached."""
    from stepwarm.profile import CacheSpec

    full = CacheSpec(kind="full_attention", block_size=16)
    window = CacheSpec(kind="sliding_window", block_size=16, sliding_window=32)
    profile = tiny_profile().model_copy(update={"kv_cache_groups": (full, window),
                                                "num_blocks": 64})
    plan = expand(loads(SCENARIO, "resume150.toml", "resume150"), profile)
    (prefill,) = [st.scheduled[0] for st in plan.steps if st.kind == "prefill"]
    row = _resume_row(profile)
    assert (row.resumed, row.num_computed_tokens, row.num_scheduled_tokens) == (True, 144, 10)
    full_ids, window_ids = row.block_ids
    assert full_ids[:9] == prefill.block_ids[0][:9] and len(full_ids) == 10
    assert window_ids[:9] == (0,) * 7 + prefill.block_ids[1][7:9] and len(window_ids) == 10
