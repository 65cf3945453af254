"""Scenario format, built-ins, needs -> skip, default.toml == vLLM's sequence (no engine)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from stepwarm import sequences
from stepwarm.plan import REQ_ID_PREFIX
from stepwarm.profile import CacheSpec, RunnerProfile
from stepwarm.scenario import (
    ScenarioError,
    builtin_names,
    check,
    expand,
    json_schema,
    load,
    loads,
    plans_for,
    tiny_profile,
)
from tests.helpers import make_profile

FULL = CacheSpec(kind="full_attention", block_size=16)


def profile(**kw) -> RunnerProfile:
    """make_profile with prefix caching on (vLLM's default), unless given."""
    return make_profile(**{"enable_prefix_caching": True, **kw})


PROFILES = {
    "tiny": tiny_profile(),
    "plain": profile(),
    "spec": profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2),
    "spec1": profile(num_speculative_steps=1, decode_query_len=2, max_num_seqs=16,
                     max_num_batched_tokens=2048, max_model_len=4096),
    "one_seq": profile(max_num_seqs=1),
    "no_caching": profile(enable_prefix_caching=False),
    "few_blocks": profile(num_blocks=4),
    "pooling": profile(is_pooling_model=True, pooling_task="embed"),
    "mamba": profile(kv_cache_groups=(FULL, CacheSpec(kind="mamba", block_size=64,
                                                      mamba_cache_mode="align")),
                     mamba_cache_mode="align"),
    "encdec": profile(kv_cache_groups=(FULL, CacheSpec(kind="cross_attention", block_size=16)),
                      is_encoder_decoder=True, max_encoder_len=48),
    "not_last_pp": profile(is_last_pp_rank=False),
    "hybrid_sw": profile(kv_cache_groups=(FULL, CacheSpec(kind="sliding_window", block_size=32,
                                                          sliding_window=64))),
}

EXPECTED_SKIPS = {
    "speculator": {"spec-decode"},
    "mamba_align": {"mamba-align"},
    "encoder_decoder": {"cross-attention"},
    "pooling": {"pooling"},
}


def test_builtins_are_the_issue_list():
    assert set(builtin_names()) == {
        "default", "mixed-prefill-decode", "spec-decode", "triton-buckets", "chunked-prefill",
        "prefix-hit", "mamba-align", "cross-attention", "pooling", "structured-output",
        "preempt-resume", "sampler-matrix", "sampler-spec-decode", "vision-encoder",
        "spec-uneven", "sampler-spec-matrix",
    }


def test_every_builtin_checks_against_the_tiny_profile():
    results = dict(check(builtin_names(), tiny_profile()))
    assert not [n for n, r in results.items() if isinstance(r, ScenarioError)], results
    skipped = {n for n, r in results.items() if r.skipped}
    assert skipped == {"spec-decode", "mamba-align", "cross-attention", "pooling",
                       "sampler-spec-decode", "vision-encoder", "spec-uneven",
                       "sampler-spec-matrix"}


@pytest.mark.parametrize("pname", list(PROFILES))
def test_every_builtin_expands_or_skips_on_many_profiles(pname):
    prof = PROFILES[pname]
    for name, result in check(builtin_names(), prof):
        if pname in ("one_seq", "few_blocks") and isinstance(result, ScenarioError):
            continue  # a 1-seq or 3-block runner cannot hold most multi-request shapes
        assert not isinstance(result, ScenarioError), (pname, name, str(result))
        if result.skipped:
            continue
        assert result.steps, (pname, name)
        ids = {r.req_id for r in result.requests}
        assert all(r.startswith(f"{REQ_ID_PREFIX}") for r in ids)
        # every request sent is finished by the end
        sent = {r.req_id for st in result.steps for r in st.scheduled}
        finished = set().union(*(st.finished_req_ids for st in result.steps))
        assert sent <= finished, (pname, name, sent - finished)


def test_sampler_spec_matrix_sends_top_k_top_p_with_drafts_in_triton_classes():
    """On a speculator runner whose sampler takes top-k / top-p with drafts
    (the CUDA builds), every variant is spec-decoded at 1, 16 and 17
    requests, each row with all its drafts; on vLLM's CPU build it is skipped
    with the reason."""
    prof = profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2,
                   max_num_seqs=32, max_num_batched_tokens=2048, max_model_len=4096,
                   num_blocks=4096)
    plan = expand(load("sampler-spec-matrix"), prof)
    assert not plan.skipped
    by_name: dict[str, list[int]] = {}
    names = {r.req_id: r.name for r in plan.requests}
    for st in plan.steps:
        rows = [r for r in st.scheduled if names[r.req_id] not in ("lp", "plp")]
        spec = [r for r in rows if r.spec_token_ids]
        if spec:
            assert all(len(r.spec_token_ids) == 2 and r.num_scheduled_tokens == 3 for r in spec)
            by_name.setdefault(names[spec[0].req_id], []).append(len(spec))
    assert by_name == {v: [1, 16, 17] for v in
                       ("random", "topk", "topp", "topktopp", "penalties", "warmup")}
    top = {names[r.req_id]: r.sampling for r in plan.requests}
    assert dict(top["topktopp"]) == {"top_k": 5, "top_p": 0.9}
    assert top["warmup"] == "warmup" and top["random"] == "random"
    cpu = expand(load("sampler-spec-matrix"), prof.model_copy(update={"top_k_top_p_with_drafts": False}))
    assert cpu.skipped == ("needs spec_top_k_top_p: this vLLM build's sampler fails on top-k / "
                           "top-p requests with a speculator (vLLM's CPU build)")
    # without a speculator the need is moot but `speculator` skips it
    assert expand(load("sampler-spec-matrix"), profile()).skipped.startswith("needs speculator")


def test_builtins_that_need_features_run_where_the_feature_is():
    assert not expand(load("spec-decode"), PROFILES["spec"]).skipped
    assert not expand(load("spec-decode"), PROFILES["spec1"]).skipped
    assert not expand(load("mamba-align"), PROFILES["mamba"]).skipped
    assert not expand(load("cross-attention"), PROFILES["encdec"]).skipped
    assert not expand(load("pooling"), PROFILES["pooling"]).skipped


@pytest.mark.parametrize("pname", list(PROFILES))
def test_default_toml_is_vllms_default_plan(pname):
    prof = PROFILES[pname]
    plan = expand(load("default"), prof)
    ref = sequences.default_plan(prof)
    assert plan.name == "default"
    assert plan.steps == ref.steps and plan.requests == ref.requests
    assert plan.skipped == ref.skipped


def test_default_covers_one_and_many_requests_spec_and_pooling():
    n_reqs = {p: len(expand(load("default"), PROFILES[p]).requests)
              for p in ("plain", "spec", "one_seq", "pooling")}
    assert n_reqs["one_seq"] == 1 and n_reqs["plain"] == 4 + 2
    kinds = [s.kind for s in expand(load("default"), PROFILES["spec"]).steps]
    assert "mixed_decode" in kinds and "spec_decode" in kinds
    assert all(not s.sample for s in expand(load("default"), PROFILES["pooling"]).steps)


@pytest.mark.parametrize("need, pname, reason", [
    ("speculator", "plain", "needs speculator: runner has num_speculative_steps 0"),
    ("mamba_align", "plain", "needs mamba_align"),
    ("encoder_decoder", "plain", "needs encoder_decoder"),
    ("pooling", "plain", "needs pooling"),
    ("structured_output", "pooling", "needs structured_output"),
    ("prefix_caching", "no_caching", "needs prefix_caching: runner has enable_prefix_caching "
     "False (vLLM's scheduler sends no prefix hit)"),
])
def test_unmet_need_skips_not_fails(need, pname, reason):
    text = f'needs = ["{need}"]\n[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
    plan = expand(loads(text, "x.toml", "x"), PROFILES[pname])
    assert plan.skipped.startswith(reason)
    assert not plan.steps


def test_builtin_prefix_hit_is_skipped_without_prefix_caching():
    """The scheduler sends no hit with caching off: the built-in skips (so
    ``all`` runs on such an engine), known before the engine starts where the
    arguments turn caching off; a file's own hit there is an error."""
    from stepwarm.scenario.needs import unmet_before_engine

    plan = expand(load("prefix-hit"), PROFILES["no_caching"])
    assert plan.skipped.startswith("needs prefix_caching") and not plan.steps
    assert not expand(load("prefix-hit"), PROFILES["plain"]).skipped
    assert unmet_before_engine(["prefix_caching"], {"enable_prefix_caching": False}) == (
        "needs prefix_caching: enable_prefix_caching=false in the engine arguments")
    assert unmet_before_engine(["prefix_caching"], {}) == ""
    text = ('[requests.a]\nprompt = 40\nsampling = "greedy"\n[[steps]]\nkind = "prefix_hit"\nrequests = ["a"]\n'
            'cached = 16\n')
    with pytest.raises(ScenarioError, match="x.toml:[0-9]+: step 0 \\(prefix_hit\\), field 'cached': "
                       "request 'a': a prefix hit of 16 tokens, but prefix caching is off"):
        expand(loads(text, "x.toml", "x"), PROFILES["no_caching"])


def test_non_last_pp_rank_runs_the_same_steps_without_a_bitmask():
    """Every pipeline rank runs the same steps (lockstep); only the last one
    gets grammar bitmasks, as in vLLM's own warmup."""
    last = expand(load("structured-output"), PROFILES["plain"])
    other = expand(load("structured-output"), PROFILES["not_last_pp"])
    assert not other.skipped and len(other.steps) == len(last.steps) > 0
    assert [s.req_ids for s in other.steps] == [s.req_ids for s in last.steps]
    assert sum(len(s.grammar_req_ids) for s in last.steps) > 0
    assert all(s.grammar_req_ids == () for s in other.steps)
    assert other.lockstep_signature() == last.lockstep_signature()


@pytest.mark.parametrize("role, ran", [("both", {"chunked-prefill", "default"}),
                                       ("prefill", {"chunked-prefill", "default"}),
                                       ("decode", {"default"})])
def test_roles_skip_scenarios_not_for_the_worker_role(role, ran):
    prof = PROFILES["plain"].model_copy(update={"role": role})
    plans = {n: expand(load(n), prof) for n in ("chunked-prefill", "default")}
    assert {n for n, p in plans.items() if p.steps} == ran
    if role == "decode":
        assert plans["chunked-prefill"].skipped == "for roles prefill: this worker's role is decode"


def test_met_need_runs():
    text = ('needs = ["speculator"]\n[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\n'
            'requests = ["a"]\n[[steps]]\nkind = "spec_decode"\nrequests = ["a"]\n')
    plan = expand(loads(text, "x.toml", "x"), PROFILES["spec"])
    assert [len(r.spec_token_ids) for r in plan.steps[1].scheduled] == [2]
    assert plan.steps[-1].kind == "cleanup"


def test_sampling_scenario_skips_on_pooling_runner():
    assert expand(load("chunked-prefill"), PROFILES["pooling"]).skipped


def _plan(text: str, prof: RunnerProfile | None = None):
    return expand(loads(textwrap.dedent(text), "t.toml", "t"), prof or profile())


def test_request_ids_and_selectors():
    plan = _plan("""
        [requests.r]
        prompt = 5
        count = 3
        [requests.s]
        prompt = 4
        [[steps]]
        kind = "prefill"
        requests = ["r[1:]", "s", "r[0]", "r[1]"]
    """)
    assert plan.steps[0].req_ids == ("_stepwarm_t_r_1_", "_stepwarm_t_r_2_", "_stepwarm_t_s_",
                                     "_stepwarm_t_r_0_")


def test_bucketed_prompt_and_each():
    text = """
        [requests.p]
        prompt = { buckets = "max_num_batched_tokens" }
        [[steps]]
        kind = "prefill"
        requests = ["p"]
        each = true
    """
    # each prefilled request keeps running: five need max_num_seqs >= 5
    plan = _plan(text, profile(max_num_seqs=5))
    assert [s.total_num_scheduled_tokens for s in plan.steps[:-1]] == [1, 16, 17, 127, 128]
    assert plan.steps[-1].kind == "cleanup" and len(plan.steps[-1].finished_req_ids) == 5
    with pytest.raises(ScenarioError, match="5 requests would be running after this step but "
                                            "max_num_seqs is 4"):
        _plan(text, profile(max_num_seqs=4))


def test_bucketed_batch_and_tokens():
    plan = _plan("""
        [requests.d]
        prompt = 40
        count = "max_num_seqs"
        [[steps]]
        kind = "chunked_prefill"
        requests = ["d[0]"]
        tokens = { buckets = 17 }
        [[steps]]
        kind = "prefill"
        requests = ["d"]
        [[steps]]
        kind = "decode"
        requests = ["d"]
        batch = { buckets = "max_num_seqs" }
    """)
    assert [s.total_num_scheduled_tokens for s in plan.steps[:3]] == [1, 16, 17]
    assert [len(s.scheduled) for s in plan.steps[4:6]] == [1, 4]


def test_prefix_hit_step_starts_after_the_hit():
    plan = _plan("""
        [requests.h]
        prompt = "block_size(0) * 2 + 3"
        sampling = "greedy"
        [[steps]]
        kind = "prefix_hit"
        requests = ["h"]
        cached = "block_size(0) * 2"
    """)
    row = plan.steps[0].scheduled[0]
    assert row.new and row.num_computed_tokens == 32 and row.num_scheduled_tokens == 3
    assert [len(g) for g in row.block_ids] == [3] and row.samples


def test_prefix_hit_of_a_request_with_prompt_logprobs_is_a_plain_prefill():
    """The default "warmup" preset carries prompt_logprobs=1, so vLLM's
    KVCacheManager looks up no prefix cache for it
    (skip_reading_prefix_cache): in a prefix_hit step it is a whole-prompt
    prefill from 0, as the scheduler makes it, beside a greedy request that
    keeps its hit; a prefix_hit step of such requests alone is refused (a
    plain prefill under a prefix hit's name: a first-contact trial copied
    such an example)."""
    text = """
        [requests.h]
        prompt = "block_size(0) * 2 + 3"
        [requests.g]
        prompt = "block_size(0) * 2 + 3"
        sampling = "greedy"
        [[steps]]
        kind = "prefix_hit"
        requests = [%s]
        cached = "block_size(0) * 2"
    """
    with pytest.raises(ScenarioError, match=r"field 'requests': no request of this prefix_hit "
                       r"step reads the prefix cache \(SamplingParams.skip_reading_prefix_cache\):"
                       r" 'h' samples with 'warmup'"):
        _plan(text % '"h"')
    plan = _plan(text % '"h", "g"')
    assert plan.request("_stepwarm_t_h_").skip_reading_prefix_cache
    assert not plan.request("_stepwarm_t_g_").skip_reading_prefix_cache
    both = plan.steps[0]
    assert both.kind == "prefix_hit"
    assert [(r.req_id, r.num_computed_tokens, r.num_scheduled_tokens) for r in both.scheduled] == [
        ("_stepwarm_t_h_", 0, 35), ("_stepwarm_t_g_", 32, 3)]
    # g took blocks 1, 2 for its hit (nothing cached); h takes fresh ones, all zeroed
    assert both.scheduled[0].allocated == ((3, 4, 5),)


def test_preempt_and_chunked_resume():
    plan = _plan("""
        [requests.a]
        prompt = 20
        [[steps]]
        kind = "prefill"
        requests = ["a"]
        [[steps]]
        kind = "decode"
        requests = ["a"]
        [[steps]]
        kind = "preempt"
        requests = ["a"]
        [[steps]]
        kind = "resume"
        requests = ["a"]
        tokens = 10
        [[steps]]
        kind = "resume"
        requests = ["a"]
    """)
    pre, r1, r2 = plan.steps[2], plan.steps[3].scheduled[0], plan.steps[4].scheduled[0]
    assert pre.preempted_req_ids == {"_stepwarm_t_a_"} and not pre.scheduled
    assert r1.resumed and r1.num_computed_tokens == 0 and not r1.samples
    assert [len(g) for g in r1.block_ids] == [1]
    assert not r2.resumed and r2.num_computed_tokens == 10 and r2.num_scheduled_tokens == 12
    assert r2.samples


def test_mixed_decode_and_mixed_prefill_decode():
    plan = _plan("""
        [requests.r]
        prompt = 4
        count = 3
        [requests.p]
        prompt = 30
        [[steps]]
        kind = "prefill"
        requests = ["r"]
        [[steps]]
        kind = "mixed_decode"
        spec = ["r[0]"]
        non_spec = ["r[1:]"]
        [[steps]]
        kind = "mixed_prefill_decode"
        prefill = ["p"]
        tokens = 16
        decode = ["r"]
    """, PROFILES["spec"])
    assert [len(r.spec_token_ids) for r in plan.steps[1].scheduled] == [2, 0, 0]
    assert plan.steps[1].kind == "mixed_decode"
    assert plan.steps[2].total_num_scheduled_tokens == 16 + 3


def test_finish_default_finishes_all_live_and_no_auto_cleanup_needed():
    plan = _plan("""
        [requests.a]
        prompt = 4
        [[steps]]
        kind = "prefill"
        requests = ["a"]
        [[steps]]
        kind = "finish"
    """)
    assert [s.kind for s in plan.steps] == ["prefill", "finish"]


def test_encoder_default_on_encoder_decoder_runner():
    plan = expand(load("cross-attention"), PROFILES["encdec"])
    assert {r.encoder_len for r in plan.requests} == {48, 24}


def test_schema_is_the_model():
    schema = json_schema()
    assert schema["additionalProperties"] is False
    assert set(schema["properties"]) == {"description", "needs", "roles", "requires", "sequence", "requests",
                                       "steps"}
    kinds = {d["properties"]["kind"]["const"] for d in schema["$defs"].values()
             if "const" in d.get("properties", {}).get("kind", {})}
    assert kinds == {"prefill", "chunked_prefill", "prefix_hit", "decode", "spec_decode",
                     "mixed_decode", "mixed_prefill_decode", "preempt", "resume", "finish"}
    json.dumps(schema)


def test_sequence_plan_errors_become_scenario_errors():
    # vLLM's sequence on a runner too small for it: the PlanError is reported
    # as a ScenarioError naming the file and the sequence field.
    prof = profile(runner="v2", null_block_writes=True, num_blocks=3)
    with pytest.raises(ScenarioError) as e:
        plans_for(["default"], prof)
    assert "scenarios/default.toml:" in str(e.value) and "field 'sequence'" in str(e.value)


def test_tiny_profile_is_the_documented_one():
    p = tiny_profile()
    assert (p.max_model_len, p.max_num_seqs, p.max_num_batched_tokens) == (512, 8, 512)
    assert p.kv_cache_groups[0].block_size == 128 and p.num_blocks > 10_000


def test_readme_examples_are_valid():
    """Every ```toml block of scenarios/README.md that is a whole scenario loads
    and expands (against the profile its comment names, default tiny)."""
    readme = (Path(__file__).parents[2] / "scenarios" / "README.md").read_text()
    blocks = readme.split("```toml\n")[1:]
    assert len(blocks) >= 10
    n = 0
    for i, block in enumerate(blocks):
        text = block.split("```")[0]
        if "[[steps]]" not in text and "sequence" not in text:
            continue
        n += 1
        prof = PROFILES["tiny"]
        for need, pname in (("speculator", "spec"), ("mamba_align", "mamba"),
                            ("encoder_decoder", "encdec"), ("pooling", "pooling")):
            if f'"{need}"' in text:
                prof = PROFILES[pname]
        if '"images"' in text:
            from stepwarm.profile import ImageClass

            prof = profile(image_classes=(ImageClass(side=16, tokens=4, prompt_tokens=6),),
                           encoder_budget=512, max_images_per_prompt=1)
        plan = expand(loads(text, f"README block {i}", f"readme{i}"), prof)
        assert not plan.skipped and plan.steps, (i, text)
    assert n >= 10


@pytest.mark.parametrize("pname", list(PROFILES))
def test_profile_toml_round_trip(pname):
    import tomllib

    prof = PROFILES[pname]
    assert RunnerProfile.model_validate(tomllib.loads(prof.to_toml("x\ny"))) == prof


def test_spec_decode_builtin_samples_greedy_and_says_why():
    plan = expand(load("spec-decode"), PROFILES["spec"])
    assert plan.requests and {r.sampling for r in plan.requests} == {"greedy"}
    assert any(len(r.spec_token_ids) == 2 for s in plan.steps for r in s.scheduled)
    text = load("spec-decode").text
    assert 'sampling = "greedy"' in text and "rejection sampler" in text
    readme = (Path(__file__).parents[2] / "scenarios" / "README.md").read_text()
    assert "rejection sampler crashes on top-k/top-p" in readme


@pytest.mark.parametrize("name", ["mixed-prefill-decode", "chunked-prefill", "triton-buckets",
                                  "prefix-hit", "preempt-resume", "structured-output"])
def test_new_user_runners_expand_the_builtins(name):
    # the limits of the new-user report: these used to be hard errors
    small = profile(max_num_batched_tokens=128, max_num_seqs=3)
    plan = expand(load(name), small)
    assert not plan.skipped and plan.steps
    assert max(s.total_num_scheduled_tokens for s in plan.steps) <= 128
    assert max(len(s.scheduled) for s in plan.steps) <= 3
    short = profile(max_model_len=64, kv_cache_groups=(CacheSpec(kind="full_attention",
                                                                 block_size=16),))
    assert not expand(load(name), short).skipped


@pytest.mark.parametrize("name, reason", [
    ("chunked-prefill", "requires max_num_seqs >= 2: false on this runner (1 >= 2)"),
    ("mixed-prefill-decode", "requires max_num_seqs >= 2: false on this runner (1 >= 2)"),
    ("structured-output", "requires max_num_seqs >= 2: false on this runner (1 >= 2)"),
    ("preempt-resume", "requires max_num_seqs >= 2: false on this runner (1 >= 2)"),
])
def test_one_seq_runner_skips_multi_request_builtins_with_reason(name, reason):
    assert expand(load(name), PROFILES["one_seq"]).skipped == reason


def test_one_seq_runner_expands_single_request_builtins():
    for name in ("prefix-hit", "triton-buckets"):
        plan = expand(load(name), PROFILES["one_seq"])
        assert not plan.skipped and all(len(s.scheduled) <= 1 for s in plan.steps), name


@pytest.mark.parametrize("pname", ["tiny", "plain", "one_seq", "spec1"])
def test_triton_buckets_sweeps_the_bucket_classes_one_request_at_a_time(pname):
    from stepwarm.expressions import buckets

    prof = PROFILES[pname]
    plan = expand(load("triton-buckets"), prof)
    sweep = [s for s in plan.steps if s.kind == "prefill"][:-1]  # the last prefills d
    budget = min(prof.max_num_batched_tokens, prof.max_model_len - 1)
    assert sorted({s.total_num_scheduled_tokens for s in sweep}) == list(buckets(budget))
    assert all(len(s.scheduled) == 1 and s.scheduled[0].num_computed_tokens == 0
               for s in sweep)
    # each sweep request is finished by the step after its prefill
    for st, nxt in zip(sweep, [plan.steps[plan.steps.index(s) + 1] for s in sweep]):
        assert nxt.kind == "finish" and nxt.finished_req_ids == {st.scheduled[0].req_id}
    decodes = [len(s.scheduled) for s in plan.steps if s.kind == "decode"]
    assert decodes == sorted(set(buckets(prof.max_num_seqs)))


#: tiny-whisper's limits (max_model_len 448, Whisper's decoder limit).
WHISPER = profile(kv_cache_groups=(FULL, CacheSpec(kind="cross_attention", block_size=16)),
                  max_model_len=448, max_num_seqs=8, max_num_batched_tokens=1500,
                  vocab_size=512, is_encoder_decoder=True, max_encoder_len=1500,
                  decoder_start_token_id=3)


@pytest.mark.parametrize("name, request_name", [("mixed-prefill-decode", "long"),
                                                ("triton-buckets", "pmax")])
def test_the_longest_prompts_leave_room_for_the_sampled_token(name, request_name):
    # vLLM's front end refuses a generate prompt of max_model_len tokens
    # (InputProcessor._validate_prompt_len): the longest is 447 on Whisper.
    plan = expand(load(name), WHISPER)
    lens = {plan.display_name(r.req_id): r.prompt_len for r in plan.requests}
    assert lens[request_name] == 447 and max(lens.values()) == 447


@pytest.mark.parametrize("pname", ["tiny", "plain"])
def test_structured_output_bitmask_for_all_some_and_one_within_two_running(pname):
    plan = expand(load("structured-output"), PROFILES[pname])
    shapes = [(s.kind, len(s.scheduled), len(s.grammar_req_ids))
              for s in plan.steps if s.scheduled]
    assert shapes == [("prefill", 2, 1), ("decode", 2, 1), ("prefill", 1, 1),
                      ("decode", 2, 2), ("decode", 1, 1)]


def test_prefix_hit_hits_one_and_two_blocks_then_decodes():
    plan = expand(load("prefix-hit"), PROFILES["plain"])  # block 16, max_num_seqs 4
    hits = [[r.num_computed_tokens for r in s.scheduled] for s in plan.steps
            if s.kind == "prefix_hit"]
    assert hits == [[16, 16], [32], [16]]
    assert [len(s.scheduled) for s in plan.steps if s.kind == "decode"] == [2, 1, 1]
    one = expand(load("prefix-hit"), PROFILES["one_seq"])
    assert [[r.num_computed_tokens for r in s.scheduled] for s in one.steps
            if s.kind == "prefix_hit"] == [[16], [32], [16]]


def test_prefix_hit_skips_when_a_block_does_not_fit_max_model_len():
    prof = profile(max_model_len=64, kv_cache_groups=(CacheSpec(kind="full_attention",
                                                                block_size=128),))
    assert expand(load("prefix-hit"), prof).skipped == (
        "requires max_model_len >= lcm_block_size + 4: false on this runner (64 >= 132)")
    assert not expand(load("triton-buckets"), prof).skipped


def test_messages_name_requests_as_the_file_does():
    text = '[requests.long_1]\nprompt = 4\ncount = 2\n[requests.b]\nprompt = 3\n[[steps]]\nkind = "prefill"\nrequests = ["long_1", "b"]\n'
    plan = expand(loads(text, "x.toml", "x"), PROFILES["plain"])
    ids = [r.req_id for r in plan.requests]
    assert [plan.display_name(i) for i in ids] == ["long_1[0]", "long_1[1]", "b"]
    assert plan.with_display_names(f"KeyError: '{ids[1]}' (and {ids[2]}).") == (
        "KeyError: 'long_1[1]' (and b).")
    assert plan.display_name("other-request") == "other-request"
    default = expand(load("default"), PROFILES["plain"])
    assert [default.display_name(r.req_id) for r in default.requests][:2] == ["req[0]", "req[1]"]
    assert default.with_display_names(f"KeyError: '{default.requests[1].req_id}'") == (
        "KeyError: 'req[1]'")


def test_a_scenario_that_is_not_utf8_is_a_scenario_error(tmp_path):
    f = tmp_path / "latin1.toml"
    f.write_bytes(b'[requests.a]\nprompt = 24\n# caf\xe9\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    with pytest.raises(ScenarioError, match=r"latin1.toml:3: cannot read scenario file: not UTF-8 "
                                            r"\(byte 0xe9 at offset 30\); allowed: TOML in UTF-8"):
        load(str(f))


def test_vllm_sequence_ids_show_without_the_prefix():
    plan = expand(load("default"), PROFILES["plain"])
    assert plan.display_name("_stepwarm_mixed_decode_") == "mixed_decode"
    assert plan.with_display_names("finish _stepwarm_mixed_prefill_ and _stepwarm_3_") == (
        "finish mixed_prefill and req[3]")


@pytest.mark.parametrize("recached", [True, None])
def test_prefix_hits_on_one_mamba_state_wait_a_step_as_the_scheduler_makes_them(recached):
    """Two requests of one prefix_hit step whose hits end on the same Mamba
    align state: with vLLM 0.32's rule (``checkpoint_recached``) the first
    re-caches that state in the step, so ``MambaManager`` leaves the second
    waiting for the next step; stepwarm plans the same two steps, labelled.
    Without the rule (vLLM 0.26) both run in one step."""
    mamba = CacheSpec(kind="mamba", block_size=16, mamba_cache_mode="align",
                      checkpoint_recached=recached)
    p = profile(kv_cache_groups=(FULL, mamba), enable_prefix_caching=True, mamba_cache_mode="align")
    (plan,) = plans_for(["prefix-hit"], p)
    hits = [s for s in plan.steps if s.kind == "prefix_hit"]
    rows = [[(r.req_id.removeprefix(REQ_ID_PREFIX), r.num_computed_tokens, r.num_scheduled_tokens)
             for r in s.scheduled] for s in hits]
    first = ("prefix-hit_hit1_0_", 16, 5)
    second = ("prefix-hit_hit1_1_", 16, 5)
    if recached:
        assert rows[:2] == [[first], [second]]
        assert hits[1].label == ("prefix hit hit1[1] x rest (waited 1 step(s): "
                                 "a Mamba state cached in the step before)")
    else:
        assert rows[0] == [first, second]
    # hit2 (two blocks) and hit3 (one block, chunked) follow either way.
    assert [r[0][0] for r in rows[-2:]] == ["prefix-hit_hit2_", "prefix-hit_hit3_"]


def test_a_loaded_scenario_is_cached_and_expanding_leaves_it_as_read():
    # load() parses once by text (loads) and hands each caller a copy of the
    # model; expanding it must not change it either
    profiles = [tiny_profile(), tiny_profile().model_copy(update=dict(
        num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2))]
    for name in builtin_names():
        sc = load(name)
        again = load(name)
        assert again is not sc and again.model == sc.model and again.index is sc.index
        before = sc.model.model_dump()
        for p in profiles:
            try:
                expand(sc, p)
            except ScenarioError:
                pass
        assert sc.model.model_dump() == before, name


def test_a_loaded_scenario_is_the_callers_own_and_one_name_may_be_a_string():
    """A library user's trial: load() handed out the cached model (popping a
    step changed every later plan of that scenario), and plans_for("default")
    said one 'unknown scenario' per letter."""
    from stepwarm.profile import tiny_profile
    from stepwarm.scenario import load, plans_for

    steps = len(plans_for(["prefix-hit"], tiny_profile())[0].steps)
    load("prefix-hit").model.steps.pop()
    assert load("prefix-hit") is not load("prefix-hit")
    assert len(plans_for(["prefix-hit"], tiny_profile())[0].steps) == steps
    assert [p.name for p in plans_for("default", tiny_profile())] == ["default"]
