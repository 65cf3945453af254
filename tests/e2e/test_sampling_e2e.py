"""Sampling tables, presets and sweeps through the CPU worker (tiny Llama, V1
runner): the worker really computes what the scenario asked for (logprobs of
the requested width, prompt logprobs, per-request generators, penalties'
output tokens, masks), read off its output and its input batch."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from stepwarm.driver import drive
from stepwarm.plan import REQ_ID_PREFIX
from stepwarm.scenario import plans_for

pytestmark = pytest.mark.e2e

SCENARIO = """
description = "every sampling field and sweep form"

[requests.lp]
prompt = 8
sampling = { temperature = 0.0, logprobs = { values = [1, 5, "max_logprobs"] } }

[requests.plp]
prompt = 9
sampling = { temperature = 0.7, prompt_logprobs = { range = [1, "max_logprobs"], step = 19 } }

[requests.full]
prompt = 6

[requests.full.sampling]
temperature = 0.9
top_p = 0.9
top_k = 5
min_p = 0.1
seed = 7
presence_penalty = 0.5
frequency_penalty = 0.5
repetition_penalty = 1.2
min_tokens = 3
stop_token_ids = [5]
bad_words = [[0], [1, 2]]
allowed_token_ids = [0, 1, 2, 3, 4, 5, 6, 7]
logit_bias = { 0 = -1.0, 7 = 0.5 }

[requests.presets]
prompt = 4
count = 1
sampling = "seeded"

[requests.rnd]
prompt = 4
sampling = "random"

[requests.sw]
prompt = { range = [16, 48], step = 16 }

[requests.hit]
prompt = { values = ["lcm_block_size + 5"] }
sampling = "greedy"

# 0-2: one logprobs width per step
[[steps]]
kind = "prefill"
requests = ["lp"]
each = true

[[steps]]
kind = "finish"
requests = ["lp"]

# 4-5: prompt logprobs 1 and 20
[[steps]]
kind = "prefill"
requests = ["plp"]
each = true

[[steps]]
kind = "finish"
requests = ["plp"]

# 7: every SamplingParams field in one request, with two presets beside it
[[steps]]
kind = "prefill"
requests = ["full", "presets", "rnd"]

# 8-9: decode batch sweep 1, 3
[[steps]]
kind = "decode"
requests = ["full", "presets", "rnd"]
batch = { values = [1, 3] }

[[steps]]
kind = "finish"
requests = ["full", "presets", "rnd"]

# 11-12: prefill 8 tokens of each of 16/32/48, twice (repeat)
[[steps]]
kind = "prefill"
requests = ["sw"]
tokens = 8
repeat = 2

# 13: sw[0] (16 tokens, done) decoded beside a prefix hit
[[steps]]
kind = "mixed_prefill_decode"
decode = ["sw[0]"]
prefill = ["hit"]
cached = "lcm_block_size"

# 14-15: the rest of sw[1], sw[2] in chunks of 8 then the rest
[[steps]]
kind = "chunked_prefill"
requests = ["sw[1:]"]
tokens = { values = [8] }

[[steps]]
kind = "prefill"
requests = ["sw[1:]"]
"""


@pytest.fixture(scope="module")
def run(engine, profile, tmp_path_factory):
    f = Path(tmp_path_factory.mktemp("sampling")) / "sampling.toml"
    f.write_text(textwrap.dedent(SCENARIO))
    (plan,) = plans_for([str(f)], profile)
    batch = engine.worker.model_runner.input_batch
    seen: dict[int, dict] = {}

    def on_step(result):  # the runner's state while the requests are live
        full = f"{REQ_ID_PREFIX}sampling_full_"
        idx = batch.req_id_to_index.get(full)
        if idx is None:
            return
        procs = {type(p).__name__: p for p in batch.logitsprocs.all}
        seen[result.index] = {
            "top_k": full in batch.top_k_reqs, "top_p": full in batch.top_p_reqs,
            "penalties": (full in batch.frequency_penalties_reqs,
                          full in batch.presence_penalties_reqs,
                          full in batch.repetition_penalties_reqs),
            "generator": idx in batch.generators,
            "bad_words": batch.bad_words_token_ids.get(idx),
            "allowed": full in batch.has_allowed_token_ids,
            "mask": batch.allowed_token_ids_mask_cpu_tensor is not None,
            "bias": procs["LogitBiasLogitsProcessor"].biases.get(idx),
            "min_p": float(procs["MinPLogitsProcessor"].min_p_cpu[idx]),
            "min_tokens": procs["MinTokensLogitsProcessor"].min_toks.get(idx, (None,))[0],
            "output_tokens": list(batch.req_output_token_ids[idx] or []),
            # (a request not scheduled in a step leaves the V1 input batch)
            "seeded": batch.req_id_to_index.get(f"{REQ_ID_PREFIX}sampling_presets_")
            in batch.generators,
            "random_unseeded": batch.req_id_to_index.get(f"{REQ_ID_PREFIX}sampling_rnd_")
            not in batch.generators,
        }

    report = drive(engine.view, plan, profile, on_step=on_step)
    return plan, report, seen


def test_the_scenario_runs_and_leaves_nothing(engine, run):
    plan, report, _ = run
    assert report.ok and len(report.steps) == len(plan.steps) == 17
    assert not [r for r in engine.view.live_request_ids() if r.startswith(REQ_ID_PREFIX)]


def test_logprobs_of_each_requested_width(run):
    _, report, _ = run
    # logprobs 1, 5, max_logprobs (20): the sampled token's column + k
    assert [report.steps[i].logprobs_width for i in (0, 1, 2)] == [2, 6, 21]
    assert report.steps[7].logprobs_width is None  # no request asked


def test_prompt_logprobs_rows_and_width(run):
    _, report, _ = run
    lp1, lp20 = report.steps[4].prompt_logprobs, report.steps[5].prompt_logprobs
    # 9-token prompt: 8 scored rows; columns prompt_logprobs + 1
    assert list(lp1.values()) == [[8, 2]] and list(lp20.values()) == [[8, 21]]
    assert report.steps[7].prompt_logprobs is None


def test_every_sampling_field_reaches_the_input_batch(run):
    _, report, seen = run
    state = seen[7]
    assert state["top_k"] and state["top_p"] and state["penalties"] == (True, True, True)
    assert state["generator"] and state["seeded"] and state["random_unseeded"]
    assert state["bad_words"] == [[0], [1, 2]] and state["allowed"]
    assert state["bias"] == {0: -1.0, 7: 0.5}
    assert state["min_p"] == pytest.approx(0.1) and state["min_tokens"] == 3
    # penalties see the output tokens: one after the prefill, two after a decode
    assert len(state["output_tokens"]) == 1 and len(seen[8]["output_tokens"]) == 2
    # allowed_token_ids, bad_words [0] and min_tokens (stop token 5) hold
    assert len(seen[9]["output_tokens"]) == 3
    assert set(seen[9]["output_tokens"]) <= {1, 2, 3, 4, 6, 7}
    assert report.steps[8].num_reqs == 1 and report.steps[9].num_reqs == 3


def test_sweeps_repeat_and_a_prefix_hit_beside_a_decode(run, profile):
    plan, report, _ = run
    steps = report.steps
    assert [s.num_scheduled_tokens for s in steps[11:16]] == [24, 24, 1 + 5, 16, (32 - 24) + (48 - 24)]
    mixed = plan.steps[13]
    hit = next(r for r in mixed.scheduled if r.req_id.endswith("hit_0_"))
    assert hit.new and hit.num_computed_tokens == 128 and hit.num_scheduled_tokens == 5
    assert steps[13].sampled == {hit.req_id: 1, f"{REQ_ID_PREFIX}sampling_sw_0_": 1}


def test_the_allowed_token_mask_is_freed_after_the_run(engine, run):
    # allocated by the warmup request (vLLM allocates it lazily and never
    # frees it; every request dropped later would fill a vocab_size row)
    _, _, seen = run
    assert seen[7]["mask"] and seen[9]["mask"]
    batch = engine.worker.model_runner.input_batch
    assert batch.allowed_token_ids_mask_cpu_tensor is None and batch.allowed_token_ids_mask is None
    assert not engine.view.allowed_token_mask()


ONE_GREEDY = """
description = "one greedy request"
requests = { g = { prompt = 3, sampling = "greedy" } }
steps = [{ kind = "prefill", requests = ["g"] }, { kind = "finish", requests = ["g"] }]
"""

def test_a_mask_the_runner_held_before_the_run_is_kept(engine, profile, run, tmp_path):
    # a mask left by an earlier request with allowed_token_ids (vLLM's own
    # add_request / remove_request), then a run with no such request
    from vllm import SamplingParams
    from vllm.v1.worker.gpu_input_batch import CachedRequestState

    batch = engine.worker.model_runner.input_batch
    assert batch.allowed_token_ids_mask_cpu_tensor is None
    req = CachedRequestState(
        req_id="not-stepwarm", prompt_token_ids=[1, 2], mm_features=[],
        sampling_params=SamplingParams(allowed_token_ids=[1, 2]), generator=None,
        block_ids=([],), num_computed_tokens=0, output_token_ids=[])
    batch.add_request(req)
    batch.remove_request("not-stepwarm")
    batch.condense()
    batch.refresh_metadata()
    mask = batch.allowed_token_ids_mask_cpu_tensor
    assert mask is not None and tuple(mask.shape) == (profile.max_num_seqs, profile.vocab_size)
    f = tmp_path / "one.toml"
    f.write_text(textwrap.dedent(ONE_GREEDY))
    (plan,) = plans_for([str(f)], profile)
    try:
        assert drive(engine.view, plan, profile).ok
        assert batch.allowed_token_ids_mask_cpu_tensor is mask
    finally:
        assert engine.view.release_allowed_token_mask()
    assert batch.allowed_token_ids_mask_cpu_tensor is None
