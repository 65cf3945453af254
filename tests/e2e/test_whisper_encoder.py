"""Whisper's encoder runs on stepwarm's steps: requests carry the dummy audio
as processed by the model's own processor, the runner's encoder cache holds
an input's output during the step that schedules the request's first tokens
and drops it the step after (vLLM's EncoderDecoderCacheManager), and the
greedy tokens equal ``LLM.generate``'s on the same audio (seeded random
weights; a mixed prefill + decode step included). One CPU engine, in a fresh
process.
"""

from __future__ import annotations

import textwrap

import pytest

from tests.e2e.helpers import script_result

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from stepwarm.compile import prompt_token_ids
    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.plan import PlanBuilder, PlannedRequest
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for
    from stepwarm.zoo import ZOO, write_model
    from stepwarm import verify as V

    if __name__ == "__main__":
        engine = start_engine(write_model("tiny-whisper", weights_seed=0), load_format="auto",
                              **ZOO["tiny-whisper"].engine_args)
        llm, worker = engine.llm, engine.view
        profile = read_profile(worker)
        runner = worker.runner
        x = PlannedRequest("_stepwarm_x_", 2, encoder_len=profile.max_encoder_len,
                           sampling="greedy")
        y = PlannedRequest("_stepwarm_y_", 2, encoder_len=profile.max_encoder_len,
                           sampling="greedy")
        b = PlanBuilder(profile)
        b.add_request(x)
        b.add_request(y)
        b.step("prefill", "x", prefill={x.req_id: 2})
        b.step("mixed_prefill_decode", "y + decode x", prefill={y.req_id: 2},
               decode={x.req_id: 0})
        b.step("decode", "both", decode={x.req_id: 0, y.req_id: 0})
        b.cleanup()
        plan = b.build()
        steps = []
        report = drive(worker, plan, profile, on_step=lambda r: steps.append(
            {"cache": sorted(runner.encoder_cache), "sampled": r.sampled_token_ids,
             "features": {rid: [(f.modality, f.data is not None, f.mm_position.length)
                                for f in st.mm_features]
                          for rid, st in sorted(runner.requests.items())
                          if rid.startswith("_stepwarm_")}}))
        after = sorted(runner.encoder_cache)
        ids = prompt_token_ids(x, profile)
        sp = SamplingParams(temperature=0.0, max_tokens=3, ignore_eos=True, detokenize=False)
        ref = llm.generate([V.reference_prompt(worker, x, ids)], sp, use_tqdm=False)[0]
        V._release_finished(llm, worker)
        silent = llm.generate([TokensPrompt(prompt_token_ids=ids)], sp, use_tqdm=False)[0]
        V._release_finished(llm, worker)
        plans = plans_for(["mixed-prefill-decode", "cross-attention", "prefix-hit"], profile)
        verified = {p.name: V.verify(llm, worker, p, profile) for p in plans}
        print("RESULT " + json.dumps({
            "budget": profile.encoder_budget, "steps": steps,
            "prefix_caching": profile.enable_prefix_caching,
            "skipped": {p.name: p.skipped for p in plans},
            "after": after, "left": report.left_in_runner,
            "reference": list(ref.outputs[0].token_ids),
            "reference_prompt": list(ref.prompt_token_ids),
            "no_audio": list(silent.outputs[0].token_ids), "sent": ids,
            "verify": {n: [r.ok, r.checked, [d.request for d in r.differences],
                           r.not_compared] for n, r in verified.items()},
        }))
    """
)


@pytest.fixture(scope="module")
def whisper(tmp_path_factory):
    return script_result(tmp_path_factory.mktemp("whisper"), SCRIPT)


def test_the_encoder_output_lives_one_step_and_nothing_is_left(whisper):
    # vLLM's encoder budget at max_num_batched_tokens 1500: one 1500-token input per step
    assert whisper["budget"] == 1500
    assert [s["cache"] for s in whisper["steps"]] == [
        ["_stepwarm_x_encoder"],   # x's encoder ran with its first tokens
        ["_stepwarm_y_encoder"],   # y's ran; x's dropped (free_encoder_mm_hashes)
        [],                        # y's dropped the step after
        [],                        # cleanup
    ]
    assert whisper["after"] == [] and whisper["left"] == []
    # the runner holds each request's processed audio: 1500 encoder tokens
    assert whisper["steps"][1]["features"] == {
        "_stepwarm_x_": [["audio", True, 1500]], "_stepwarm_y_": [["audio", True, 1500]]}


def test_stepwarm_tokens_equal_the_scheduler_path_on_the_same_audio(whisper):
    ref = whisper["reference"]
    assert whisper["reference_prompt"] == whisper["sent"]
    x = [s["sampled"].get("_stepwarm_x_") for s in whisper["steps"][:3]]
    y = [s["sampled"].get("_stepwarm_y_") for s in whisper["steps"][1:3]]
    assert x == [ref[:1], ref[1:2], ref[2:3]]
    assert y == [ref[:1], ref[1:2]]
    # the audio matters: without it the same decoder prompt samples otherwise
    assert whisper["no_audio"][0] != ref[0]


def test_mixed_prefill_decode_verifies_equal_with_audio(whisper):
    ok, checked, differ, skipped = whisper["verify"]["mixed-prefill-decode"]
    assert differ == [] and ok and skipped == {}
    assert sum(checked.values()) == 9 and len(checked) == 5


def test_cross_attention_compares_the_requests_with_audio(whisper):
    # 'short' declares a 750-token encoder input; Whisper's processor pads
    # every audio to 1500 tokens, so it carries none and is not compared
    ok, checked, differ, skipped = whisper["verify"]["cross-attention"]
    assert differ == [] and ok
    assert sorted(checked) == ["full[0]", "full[1]", "full[2]", "full[3]"]
    assert skipped == {"short": "a 750-token encoder input, not the processor's audio length"}


def test_a_prefix_hit_reads_the_cross_attention_its_fill_wrote(whisper):
    # the hit request's encoder does not run (vLLM skips it once tokens are
    # computed); the fill step, with the same audio, wrote its cross blocks.
    # Where vLLM caches no prefix for the encoder-decoder model, its
    # scheduler sends no hit: prefix-hit is skipped, nothing verified.
    if not whisper["prefix_caching"]:
        assert whisper["skipped"]["prefix-hit"] == (
            "needs prefix_caching: runner has enable_prefix_caching False (vLLM's scheduler "
            "sends no prefix hit)")
        return
    ok, checked, differ, skipped = whisper["verify"]["prefix-hit"]
    assert differ == [] and ok and skipped == {}
    assert sorted(checked) == ["hit1[0]", "hit1[1]", "hit2", "hit3"]
