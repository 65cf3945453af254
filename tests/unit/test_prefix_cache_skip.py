"""Which requests read no prefix cache: stepwarm's rule against vLLM's own
``SamplingParams`` / ``PoolingParams`` (``skip_reading_prefix_cache``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stepwarm.compile import PRESET_ARGS, sampling_params
from stepwarm.profile import tiny_profile
from stepwarm.scenario.sampling import (
    POOLING_TASKS_SKIPPING_PREFIX_CACHE,
    pooling_skips_prefix_cache,
    skips_prefix_cache,
)


@pytest.mark.parametrize("sampling", ["warmup", *PRESET_ARGS,
                                      (("prompt_logprobs", 0),), (("logprobs", 3),)])
def test_sampling_presets_and_tables_skip_the_prefix_cache_as_vllm_sets_it(sampling):
    params = sampling_params(sampling, tiny_profile())
    assert params.skip_reading_prefix_cache is skips_prefix_cache(sampling)
    assert skips_prefix_cache(sampling) is (params.prompt_logprobs is not None)


def test_the_warmup_preset_says_it_carries_prompt_logprobs():
    assert skips_prefix_cache("warmup") and sampling_params("warmup", tiny_profile()).prompt_logprobs == 1


@pytest.mark.parametrize("task", ["embed", "classify", "token_embed", "token_classify", None])
def test_pooling_tasks_skip_the_prefix_cache_as_vllm_sets_it(task):
    from vllm.pooling_params import PoolingParams

    params = PoolingParams(task=task)
    if task is not None:  # what PoolingParams.verify does with the model's pooler config
        params._merge_default_parameters(SimpleNamespace(pooler_config=SimpleNamespace(tok_pooling_type="ALL")))
    assert bool(params.skip_reading_prefix_cache) is pooling_skips_prefix_cache(task)
    assert POOLING_TASKS_SKIPPING_PREFIX_CACHE >= {"token_embed", "token_classify"}
