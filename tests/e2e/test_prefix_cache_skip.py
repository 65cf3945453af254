"""Only hits the scheduler makes: vLLM's own scheduler, driven through
``LLM.generate``, gives a request with prompt logprobs no prefix-cache hit
(``skip_reading_prefix_cache``), and stepwarm plans the same requests the same
way (``num_computed_tokens`` of the first step = vLLM's ``num_cached_tokens``).

A small engine of its own (no KV connector, whose external hits would count
too); run under the engine lock."""

from __future__ import annotations

import os

import pytest

from stepwarm.engine import start_engine
from stepwarm.probe import read_profile
from stepwarm.scenario import expand, load


@pytest.fixture(scope="module")
def plain_engine():
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    eng = start_engine(enable_prefix_caching=True)
    yield eng
    eng.shutdown()


def _cached(llm, prompt: list[int], params) -> tuple[int, object]:
    (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
    return out.num_cached_tokens, out


def test_prompt_logprobs_requests_get_no_prefix_hit_in_vllm_nor_in_the_plan(plain_engine, tmp_path):
    from vllm import SamplingParams

    llm = plain_engine.llm
    profile = read_profile(plain_engine.worker)
    assert profile.enable_prefix_caching
    block = profile.kv_cache_groups[0].block_size
    prompt = [(7 * i) % 97 + 3 for i in range(2 * block + 5)]
    greedy = SamplingParams(temperature=0.0, max_tokens=1)
    _cached(llm, prompt, greedy)  # fills the prefix cache with the prompt's 2 full blocks
    hit, _ = _cached(llm, prompt, greedy)
    assert hit == 2 * block
    no_hit, out = _cached(llm, prompt, SamplingParams(temperature=0.0, max_tokens=1,
                                                        prompt_logprobs=1))
    assert no_hit == 0
    assert len(out.prompt_logprobs) == len(prompt)  # every position computed: none from cache
    warm = SamplingParams.for_sampler_warmup()
    warm.max_tokens = 2
    warm_hit, _ = _cached(llm, prompt, warm)
    assert warm_hit == 0
    again, _ = _cached(llm, prompt, greedy)  # the cache still holds the blocks
    assert again == 2 * block

    # stepwarm's plan of the same requests: the greedy one after a 2-block
    # hit, the "warmup" one (for_sampler_warmup(): prompt_logprobs=1) a plain
    # prefill, as vLLM's scheduler made them above.
    f = tmp_path / "skip.toml"
    f.write_text(f"""
[requests.g]
prompt = {len(prompt)}
sampling = "greedy"
[requests.w]
prompt = {len(prompt)}
[[steps]]
kind = "prefix_hit"
requests = ["g"]
cached = {2 * block}
[[steps]]
kind = "finish"
requests = ["g"]
[[steps]]
kind = "prefix_hit"
requests = ["w"]
cached = {2 * block}
""")
    plan = expand(load(str(f)), profile)
    firsts = [s for s in plan.steps if s.scheduled]
    assert [(s.kind, s.scheduled[0].num_computed_tokens) for s in firsts] == [
        ("prefix_hit", hit), ("prefill", warm_hit)]
