"""Every built-in scenario, planned on each reference profile, compiles to the
installed vLLM's ``SchedulerOutput`` / ``GrammarOutput`` and passes that
release's own pure-Python consistency checks.

Run against each release of the matrix (``nox -s compat``): the profiles
take the installed release's facts (:func:`stepwarm.probe.installed_facts`),
as ``read_profile`` would on a live runner of that release.
"""

from __future__ import annotations

import dataclasses

import pytest

from stepwarm.compile import to_grammar_output, to_scheduler_output
from stepwarm.probe import installed_facts
from stepwarm.profile import CacheSpec, RunnerProfile, tiny_profile
from stepwarm.scenario import ScenarioError, builtin_names, expand, load


def _profiles() -> dict[str, RunnerProfile]:
    tiny = tiny_profile()
    hybrid = (CacheSpec(kind="full_attention", block_size=64),
              CacheSpec(kind="mamba", block_size=64, mamba_cache_mode="align",
                        num_speculative_blocks=2))
    raw = {
        "tiny-llama-v1": tiny,
        "tiny-llama-v2": tiny.model_copy(update={"runner": "v2"}),
        "tiny-llama-v2-eagle2": tiny.model_copy(update={
            "runner": "v2", "num_speculative_steps": 2, "decode_query_len": 3,
            "num_lookahead_tokens": 2}),
        "tiny-llama-v1-ngram3": tiny.model_copy(update={
            "num_speculative_steps": 3, "decode_query_len": 4, "num_lookahead_tokens": 3}),
        "hybrid-align-v2-spec2": tiny.model_copy(update={
            "runner": "v2", "kv_cache_groups": hybrid, "mamba_cache_mode": "align",
            "num_blocks": 400, "num_speculative_steps": 2, "decode_query_len": 3,
            "num_lookahead_tokens": 2, "zeroes_new_blocks": True}),
        "pooling-v1": tiny.model_copy(update={"is_pooling_model": True, "pooling_task": "embed"}),
    }
    return {name: p.model_copy(update=installed_facts(p.runner, p.kv_cache_groups,
                                                      p.enable_prefix_caching))
            for name, p in raw.items()}


PROFILES = _profiles()


def _bitmask_rows_expected(step, profile: RunnerProfile) -> int:
    """The bitmask rows the installed release's V2 ``StructuredOutputsWorker.
    apply_grammar_bitmask`` asserts on (``num_masks == len(mapping)``).

    Its mapping needs CUDA streams and pinned memory, so it cannot run here;
    the release's own rule, by what the release has:

    - ``_build_grammar_mapping`` (vLLM 0.28 - 0.32, ``vllm/v1/worker/gpu/
      structured_outputs.py``): called; one row per logit position a grammar
      request has in the step (1 + its drafts).
    - a ``mask_stride`` argument to ``StructuredOutputsWorker`` (vLLM 0.33,
      the runner passes ``decode_query_len``): ``mask_stride`` rows per
      grammar request, mirrored (the mapping is inline there).
    - neither (vLLM 0.26 - 0.27): the ``cu_num_logits`` range of each grammar
      request, 1 + its drafts (``num_new_sampled_tokens_per_step`` is 1 for
      the tiny profiles), mirrored (inline there too).
    """
    import inspect

    import numpy as np
    from vllm.v1.worker.gpu import structured_outputs as so

    req_ids = [r.req_id for r in step.scheduled]
    logits = [1 + len(r.spec_token_ids) for r in step.scheduled]
    if hasattr(so, "_build_grammar_mapping"):
        cu = np.concatenate([[0], np.cumsum(logits)])
        return len(so._build_grammar_mapping(req_ids, list(step.grammar_req_ids), cu, None, 1,
                                             profile.decode_query_len))
    if "mask_stride" in inspect.signature(so.StructuredOutputsWorker).parameters:
        return len(step.grammar_req_ids) * profile.decode_query_len
    per_req = dict(zip(req_ids, logits))
    return sum(per_req[r] for r in step.grammar_req_ids)


CASES = [(p, n) for p in sorted(PROFILES) for n in builtin_names()]


@pytest.mark.parametrize("profile_name,scenario", CASES)
def test_builtin_compiles_to_this_release(profile_name: str, scenario: str) -> None:
    from vllm.v1.core.sched.output import GrammarOutput, NewRequestData, SchedulerOutput

    profile = PROFILES[profile_name]
    try:
        plan = expand(load(scenario), profile)
    except ScenarioError as e:
        pytest.skip(f"not plannable on {profile_name}: {e}")
    if plan.skipped:
        pytest.skip(plan.skipped)
    params: dict = {}
    for step in plan.steps:
        out = to_scheduler_output(step, plan, profile, params)
        assert type(out) is SchedulerOutput
        # Every field of this release's dataclass is set (no default left
        # missing), and the tokens add up as the runner checks them.
        missing = [f.name for f in dataclasses.fields(out) if not hasattr(out, f.name)]
        assert missing == []
        assert all(type(r) is NewRequestData for r in out.scheduled_new_reqs)
        assert out.total_num_scheduled_tokens == sum(out.num_scheduled_tokens.values())
        for rid, drafts in out.scheduled_spec_decode_tokens.items():
            assert len(drafts) <= profile.num_speculative_steps
            assert out.num_scheduled_tokens[rid] >= len(drafts) + 1
        if step.sample:
            grammar = to_grammar_output(step, profile)
            if step.grammar_req_ids and profile.is_last_pp_rank:
                assert type(grammar) is GrammarOutput
                rows = (_bitmask_rows_expected(step, profile) if profile.runner == "v2"
                        else len(step.grammar_req_ids))  # V1: one row per request, unchanged
                assert grammar.grammar_bitmask.shape == (rows, profile.bitmask_width)
                if profile.runner == "v2" and profile.has_speculator and profile.grammar_rows_per_position:
                    # vLLM 0.33's own warmup: num_requests x decode_query_len rows.
                    assert grammar.grammar_bitmask.shape[0] == (
                        len(step.grammar_req_ids) * profile.decode_query_len)
            else:
                assert grammar is None


def test_skip_drafts_is_set_as_the_scheduler_sets_it():
    """vLLM 0.33 ``Scheduler._drafts_unused``: a step of non-final prefill
    chunks only skips drafts on a V2 runner with lookahead slots; a step that
    samples does not. Releases without the field: it is not set."""
    from vllm.v1.core.sched.output import SchedulerOutput

    from stepwarm.plan import PlanBuilder, PlannedRequest

    profile = PROFILES["tiny-llama-v2-eagle2"]
    b = PlanBuilder(profile, name="chunks")
    b.add_request(PlannedRequest("_stepwarm_a_", 20))
    b.step("prefill", "chunk", prefill={"_stepwarm_a_": 10})
    b.step("prefill", "last chunk", prefill={"_stepwarm_a_": 10})
    b.step("cleanup", "cleanup", finish=("_stepwarm_a_",))
    plan = b.build()
    outs = [to_scheduler_output(s, plan, profile, {}) for s in plan.steps[:2]]
    if "skip_drafts" not in {f.name for f in dataclasses.fields(SchedulerOutput)}:
        assert all(not hasattr(o, "skip_drafts") for o in outs)
        return
    assert [o.skip_drafts for o in outs] == [True, False]
    v1 = PROFILES["tiny-llama-v1-ngram3"]
    assert to_scheduler_output(plan.steps[0], plan, v1, {}).skip_drafts is False
