"""Only hits the scheduler makes: vLLM's own scheduler, driven through
``LLM.generate``, gives a request with prompt logprobs no prefix-cache hit
(``skip_reading_prefix_cache``), and stepwarm plans the same requests the same
way (``num_computed_tokens`` of the first step = vLLM's ``num_cached_tokens``).

A small engine of its own (no KV connector, whose external hits would count
too), in a fresh process: one engine per process (a second in-process engine's
shutdown tears down the session engine's parallel groups)."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import script_result

pytestmark = pytest.mark.e2e

SCRIPT = '''
import json, os, sys
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
from vllm import SamplingParams
from stepwarm.engine import start_engine
from stepwarm.probe import read_profile
from stepwarm.scenario import expand, load

def cached(llm, prompt, params):
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return out.num_cached_tokens, out

if __name__ == "__main__":
    eng = start_engine(enable_prefix_caching=True)
    try:
        llm = eng.llm
        profile = read_profile(eng.view)
        block = profile.kv_cache_groups[0].block_size
        prompt = [(7 * i) % 97 + 3 for i in range(2 * block + 5)]
        greedy = SamplingParams(temperature=0.0, max_tokens=1)
        res = {"prefix_caching": profile.enable_prefix_caching, "block": block,
               "prompt_len": len(prompt)}
        cached(llm, prompt, greedy)  # fills the prefix cache with the prompt's 2 full blocks
        res["hit"] = cached(llm, prompt, greedy)[0]
        no_hit, out = cached(llm, prompt, SamplingParams(temperature=0.0, max_tokens=1,
                                                         prompt_logprobs=1))
        res["no_hit"] = no_hit
        res["prompt_logprobs_rows"] = len(out.prompt_logprobs)
        warm = SamplingParams.for_sampler_warmup()
        warm.max_tokens = 2
        res["warm_hit"] = cached(llm, prompt, warm)[0]
        res["again"] = cached(llm, prompt, greedy)[0]  # the cache still holds the blocks
        # stepwarm's plan of the same requests in one prefix_hit step: the
        # greedy one after a 2-block hit, the "warmup" one
        # (for_sampler_warmup(): prompt_logprobs=1) from 0, as vLLM's
        # scheduler made them above; a prefix_hit step of the "warmup" one
        # alone is refused (it would be a plain prefill under a hit's name).
        f = sys.argv[1]
        head = f"""
[requests.g]
prompt = {len(prompt)}
sampling = "greedy"
[requests.w]
prompt = {len(prompt)}
[[steps]]
kind = "prefix_hit"
cached = {2 * block}
"""
        with open(f, "w") as fh:
            fh.write(head + 'requests = ["g", "w"]\\n')
        plan = expand(load(f), profile)
        res["planned"] = [[s.kind, [r.num_computed_tokens for r in s.scheduled]]
                          for s in plan.steps if s.scheduled]
        with open(f, "w") as fh:
            fh.write(head + 'requests = ["w"]\\n')
        try:
            expand(load(f), profile)
            res["alone"] = "planned"
        except Exception as e:
            res["alone"] = str(e)
    finally:
        eng.shutdown()
    print("RESULT " + json.dumps(res))
'''


def test_prompt_logprobs_requests_get_no_prefix_hit_in_vllm_nor_in_the_plan(tmp_path):
    r = script_result(tmp_path, SCRIPT.replace("sys.argv[1]", repr(str(tmp_path / "skip.toml"))))
    block = r["block"]
    assert r["prefix_caching"]
    assert r["hit"] == 2 * block
    assert r["no_hit"] == 0
    assert r["prompt_logprobs_rows"] == r["prompt_len"]  # every position computed: none from cache
    assert r["warm_hit"] == 0
    assert r["again"] == 2 * block
    assert r["planned"] == [["prefix_hit", [r["hit"], r["warm_hit"]]]]
    assert "no request of this prefix_hit step reads the prefix cache" in r["alone"], r["alone"]
