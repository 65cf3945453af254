"""Bad sampling tables, presets and sweeps: the exact message, naming the
file, the line and the field (``sampling.<field>`` inside a sampling table),
checked with vLLM's own ``SamplingParams`` before any step; no engine."""

from __future__ import annotations

import pytest

from tests.helpers import without_unchecked_note
from tests.unit.test_scenario_errors import bad, profile

SPEC = dict(num_speculative_steps=2)
A = '[requests.a]\nprompt = 10\n'
STEP = '\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'

#: name -> (file text, profile overrides, line, field, message after the file name)
CASES = {
    "logprobs_over_max": (
        A + 'sampling = { logprobs = 21 }\n' + STEP,
        {}, 3, 'sampling.logprobs',
        ":3: request 'a', field 'sampling.logprobs': vLLM's SamplingParams refuses { logprobs = 21 }: Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)"),
    "prompt_logprobs_sweep": (
        A + '\n[requests.a.sampling]\ntemperature = 0.0\nprompt_logprobs = { values = [1, "max_logprobs + 1"] }\n' + STEP,
        {}, 6, 'sampling.prompt_logprobs',
        ":6: request 'a', field 'sampling.prompt_logprobs': vLLM's SamplingParams refuses { prompt_logprobs = 21, temperature = 0.0 }: Requested prompt logprobs of 21, which is greater than max allowed: 20 (parameter=prompt_logprobs, value=21); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)"),
    "top_p": (
        A + '\n[requests.a.sampling]\ntop_p = 2.0\n' + STEP,
        {}, 5, 'sampling.top_p',
        ":5: request 'a', field 'sampling.top_p': vLLM's SamplingParams refuses { top_p = 2.0 }: top_p must be in (0, 1], got 2.0. (parameter=top_p, value=2.0); allowed: what vLLM accepts on any runner"),
    "temperature_neg": (
        A + 'sampling = { temperature = -1 }\n' + STEP,
        {}, 3, 'sampling.temperature',
        ":3: request 'a', field 'sampling.temperature': vLLM's SamplingParams refuses { temperature = -1.0 }: temperature must be non-negative, got -1.0. (parameter=temperature, value=-1.0); allowed: what vLLM accepts on any runner"),
    "unknown_key": (
        A + 'sampling = { topk = 3 }\n' + STEP,
        {}, 3, 'sampling.topk',
        ":3: request 'a', field 'sampling.topk': unknown key 'sampling.topk' (did you mean 'top_k'?); allowed keys: allowed_token_ids, bad_words, frequency_penalty, logit_bias, logprobs, min_p, min_tokens, presence_penalty, prompt_logprobs, repetition_penalty, seed, stop_token_ids, temperature, top_k, top_p"),
    "wrong_type": (
        A + '\n[requests.a.sampling]\ntemperature = "hot"\n' + STEP,
        {}, 5, 'sampling.temperature',
        ":5: request 'a', field 'sampling.temperature': got string 'hot'; allowed: a number or { values = [<number>, ...] }"),
    "bad_preset": (
        A + 'sampling = "beam"\n' + STEP,
        {}, 3, 'sampling',
        ':3: request \'a\', field \'sampling\': wrong type or value \'beam\'; allowed: \'warmup\', \'greedy\', \'random\' or \'seeded\' (A preset: "warmup" (SamplingParams.for_sampler_warmup(): every sampler feature, prompt_logprobs 1 included, so vLLM reads no prefix cache for it), "greedy" (temperature 0), "random" (temperature 1, nothing else: the plain random path) or "seeded" (temperature 1, seed 0: per-request generators); or a table of SamplingParams fields ({ top_k = 5, temperature = 0.8 }), whose swept fields declare one request per combination.)'),
    "bias_key": (
        A + 'sampling = { logit_bias = { x = 1.0 } }\n' + STEP,
        {}, 3, 'sampling.logit_bias',
        ":3: request 'a', field 'sampling.logit_bias': logit_bias key 'x' is not a token id; allowed: integer token ids as keys, e.g. { 0 = -1.0 } (got { x = 1.0 })"),
    "bias_vocab": (
        A + 'sampling = { logit_bias = { 100 = 1.0 } }\n' + STEP,
        {}, 3, 'sampling.logit_bias',
        ":3: request 'a', field 'sampling.logit_bias': vLLM's SamplingParams refuses { logit_bias = { 100 = 1.0 } }: token_id(s) [100] in logit_bias contain out-of-vocab token ids. Vocabulary size: 100 (parameter=logit_bias, value=[100]); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)"),
    "stop_vocab": (
        A + '\n[requests.a.sampling]\nmin_tokens = 2\nstop_token_ids = [100]\n' + STEP,
        {}, 6, 'sampling.stop_token_ids',
        ":6: request 'a', field 'sampling.stop_token_ids': vLLM's SamplingParams refuses { min_tokens = 2, stop_token_ids = [100] }: token_id(s) [100] in stop_token_ids contain out-of-vocab token ids. Vocabulary size: 100 (parameter=stop_token_ids, value=[100]); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)"),
    "bad_words_vocab": (
        A + 'sampling = { bad_words = [[1], [2, 100]] }\n' + STEP,
        {}, 3, 'sampling.bad_words',
        ":3: request 'a', field 'sampling.bad_words': vLLM's SamplingParams refuses { bad_words = [[1], [2, 100]] }: token id(s) [100] in bad_words are out of the vocabulary (vocab_size 100); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)"),
    "allowed_empty": (
        A + 'sampling = { allowed_token_ids = [] }\n' + STEP,
        {}, 3, 'sampling.allowed_token_ids',
        ":3: request 'a', field 'sampling.allowed_token_ids': vLLM's SamplingParams refuses { allowed_token_ids = [] }: allowed_token_ids is not None and empty! (parameter=allowed_token_ids, value=[]); allowed: what vLLM accepts on any runner"),
    "min_tokens_neg": (
        A + 'sampling = { min_tokens = -1 }\n' + STEP,
        {}, 3, 'sampling.min_tokens',
        ":3: request 'a', field 'sampling.min_tokens': vLLM's SamplingParams refuses { min_tokens = -1 }: min_tokens must be greater than or equal to 0, got -1; allowed: what vLLM accepts on any runner"),
    "min_p_spec": (
        A + 'sampling = { min_p = 0.1 }\n' + STEP,
        SPEC, 3, 'sampling.min_p',
        ":3: request 'a', field 'sampling.min_p': vLLM's SamplingParams refuses { min_p = 0.1 }: The min_p and logit_bias sampling parameters are not yet supported with speculative decoding. (this runner has a speculator: num_speculative_steps 2); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 2)"),
    "bias_spec": (
        A + '\n[requests.a.sampling]\ntop_k = 5\nlogit_bias = { 1 = 0.5 }\n' + STEP,
        SPEC, 6, 'sampling.logit_bias',
        ":6: request 'a', field 'sampling.logit_bias': vLLM's SamplingParams refuses { logit_bias = { 1 = 0.5 }, top_k = 5 }: The min_p and logit_bias sampling parameters are not yet supported with speculative decoding. (this runner has a speculator: num_speculative_steps 2); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 2)"),
    "sampling_range_step": (
        A + 'sampling = { top_k = { range = [1, 8], step = 0 } }\n' + STEP,
        {}, 3, 'sampling.top_k',
        ":3: request 'a', field 'sampling.top_k': range [1, 8] step 0 is empty or backwards (start 1, stop 8, step 0); allowed: start <= stop and step >= 1"),
    "range_too_long": (
        '[requests.a]\nprompt = { range = [1, "max_model_len * 20"] }\n' + STEP,
        {}, 2, 'prompt',
        ":2: request 'a', field 'prompt': range [1, 'max_model_len * 20'] step 1 makes 5120 values (start 1, stop 5120); allowed: at most 4096 per sweep (a larger step, or a narrower range)"),
    "range_backwards": (
        '[requests.a]\nprompt = { range = [20, 10] }\n' + STEP,
        {}, 2, 'prompt',
        ":2: request 'a', field 'prompt': range [20, 10] step 1 is empty or backwards (start 20, stop 10, step 1); allowed: start <= stop and step >= 1"),
    "two_forms": (
        '[requests.a]\nprompt = { range = [1, 2], values = [1] }\n' + STEP,
        {}, 2, 'prompt',
        ':2: request \'a\', field \'prompt\': got table with keys [\'range\', \'values\']; allowed: { buckets = "<limit>" } with an optional min = <expression>, { range = [<start>, <stop>] } with an optional step = <expression>, { values = [<expression>, ...] }, or { pow2_classes = [<lo>, <hi>] } with an optional offset = <expression>'),
    "range_extra": (
        '[requests.a]\nprompt = { range = [1, 2], stride = 1 }\n' + STEP,
        {}, 2, 'prompt',
        ":2: request 'a', field 'prompt': unknown key 'stride' in a range sweep; allowed keys: range, step (got { range = [1, 2], stride = 1 })"),
    "values_zero_batch": (
        A + 'count = 2\n' + STEP + 'batch = { values = [0, 2] }\n',
        {}, 8, 'batch',
        ":8: step 0 (prefill), field 'batch': values [0, 2]: value 0 is out of range; allowed: 1..2"),
    "batch_range_too_big": (
        A + 'count = 2\n' + STEP + 'batch = { range = [1, 3] }\n',
        {}, 8, 'batch',
        ":8: step 0 (prefill), field 'batch': range [1, 3] step 1: value 3 is out of range; allowed: 1..2"),
    "count_with_range": (
        '[requests.a]\nprompt = { range = [1, 3] }\ncount = 2\n' + STEP,
        {}, 3, 'count',
        ":3: request 'a', field 'count': count cannot be combined with a swept prompt (the sweep sets the count); allowed: count or a prompt sweep, not both"),
    "pow2_classes_backwards": (
        A + 'sampling = { temperature = 0.0, logprobs = { pow2_classes = ["max_logprobs", 1], offset = 1 } }\n' + STEP,
        {}, 3, 'sampling.logprobs',
        ":3: request 'a', field 'sampling.logprobs': pow2_classes [20, 1] is backwards (lo 20 > hi 1); allowed: lo <= hi"),
    "pow2_classes_negative_offset": (
        A + 'count = 2\n' + STEP + 'batch = { pow2_classes = [1, 2], offset = -1 }\n',
        {}, 8, 'batch',
        ":8: step 0 (prefill), field 'batch': pow2_classes offset -1 is negative; allowed: offset >= 0"),
    "pow2_classes_negative_lo": (
        A + STEP + 'tokens = { pow2_classes = [-3, 4], offset = 1 }\n',
        {}, 7, 'tokens',
        ":7: step 0 (prefill), field 'tokens': pow2_classes [-3, 4] offset 1: lo + offset = -2 is negative; allowed: lo + offset >= 0"),
    "pow2_classes_value_out_of_range": (
        A + 'count = 2\n' + STEP + 'batch = { pow2_classes = [1, 4] }\n',
        {}, 8, 'batch',
        ":8: step 0 (prefill), field 'batch': pow2_classes [1, 4] offset 0: value 4 is out of range; allowed: 1..2"),
    "pow2_classes_one_bound": (
        '[requests.a]\nprompt = { pow2_classes = [4] }\n' + STEP,
        {}, 2, 'prompt',
        ':2: request \'a\', field \'prompt\': pow2_classes sweep, pow2_classes: List should have at least 2 items after validation, not 1 (got [4]); allowed: { buckets = "<limit>" } with an optional min = <expression>, { range = [<start>, <stop>] } with an optional step = <expression>, { values = [<expression>, ...] }, or { pow2_classes = [<lo>, <hi>] } with an optional offset = <expression>'),
    "pow2_classes_triton_int_not_bool": (
        '[requests.a]\nprompt = { pow2_classes = [1, 8], triton_int = "yes" }\n' + STEP,
        {}, 2, 'prompt',
        ":2: request 'a', field 'prompt': pow2_classes sweep, triton_int: got 'yes'; allowed: true or false"),
    "buckets_limit_below_the_default_min": (
        A + STEP + 'batch = { buckets = "0 * max_num_seqs" }\n',
        {}, 7, 'batch',
        ":7: step 0 (prefill), field 'batch': buckets '0 * max_num_seqs' min 1: min 1 is above the limit 0 (min defaults to 1); allowed: min <= buckets"),
    "buckets_limit_a_list": (
        '[requests.a]\nprompt = { buckets = [1, 2] }\n' + STEP,
        {}, 2, 'prompt',
        ':2: request \'a\', field \'prompt\': buckets sweep, buckets: got array [1, 2]; allowed: an integer, or an expression string over runner facts such as "max_num_batched_tokens // 2" or "block_size(0) * 2"'),
    "values_with_a_bool": (
        '[requests.a]\nprompt = { values = [1, true] }\n' + STEP,
        {}, 2, 'prompt',
        ':2: request \'a\', field \'prompt\': values sweep, values.1: got boolean true; allowed: an integer, or an expression string over runner facts such as "max_num_batched_tokens // 2" or "block_size(0) * 2"'),
    "pow2_classes_unknown_key": (
        '[requests.a]\nprompt = { pow2_classes = [1, 8], ofset = 1 }\n' + STEP,
        {}, 2, 'prompt',
        ":2: request 'a', field 'prompt': unknown key 'ofset' in a pow2_classes sweep; allowed keys: pow2_classes, offset, triton_int (got { pow2_classes = [1, 8], ofset = 1 })"),
    "pow2_classes_past_max_logprobs": (
        A + 'sampling = { temperature = 0.0, logprobs = { pow2_classes = [1, "max_logprobs + 5"], offset = 1 } }\n' + STEP,
        {}, 3, 'sampling.logprobs',
        ":3: request 'a', field 'sampling.logprobs': vLLM's SamplingParams refuses { logprobs = 25, temperature = 0.0 }: Requested sample logprobs of 25, which is greater than max allowed: 20 (parameter=logprobs, value=25); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)"),
    "finish_previous_without_each": (
        A + STEP + 'finish_previous = true\n',
        {}, 7, 'finish_previous',
        ":7: step 0 (prefill), field 'finish_previous': finish_previous = true without each = true; allowed: finish_previous = true only with each = true (one step per request)"),
    "pool_sampling": (
        A + 'kind = "pool"\nsampling = "greedy"\n' + STEP,
        {"is_pooling_model": True}, 4, 'sampling',
        ':4: request \'a\', field \'sampling\': sampling on a kind = "pool" request; allowed: no sampling key on pooling requests (PoolingParams)'),
    "hit_prompt_logprobs": (
        '[requests.a]\nprompt = 40\nsampling = { prompt_logprobs = 1 }\n\n[[steps]]\nkind = "prefix_hit"\nrequests = ["a"]\ncached = 16\n',
        {}, 8, 'cached',
        ":8: step 0 (prefix_hit), field 'cached': request 'a' asks for prompt_logprobs, and vLLM never serves such a request from the prefix cache (SamplingParams.skip_reading_prefix_cache); allowed: prefix hits of requests without prompt_logprobs"),
    "mixed_hit_prompt_logprobs": (
        '[requests.d]\nprompt = 4\nsampling = "greedy"\n\n[requests.a]\nprompt = 40\nsampling = { prompt_logprobs = 1 }\n\n[[steps]]\nkind = "prefill"\nrequests = ["d"]\n\n[[steps]]\nkind = "mixed_prefill_decode"\ndecode = ["d"]\nprefill = ["a"]\ncached = 16\n',
        {}, 17, 'cached',
        ":17: step 1 (mixed_prefill_decode), field 'cached': request 'a' asks for prompt_logprobs, and vLLM never serves such a request from the prefix cache (SamplingParams.skip_reading_prefix_cache); allowed: prefix hits of requests without prompt_logprobs"),
    "hit_warmup_preset_alone": (
        '[requests.h]\nprompt = 100\n\n[[steps]]\nkind = "prefix_hit"\nrequests = ["h"]\ncached = 32\n',
        {}, 6, 'requests',
        ":6: step 0 (prefix_hit), field 'requests': no request of this prefix_hit step reads the prefix cache (SamplingParams.skip_reading_prefix_cache): 'h' samples with 'warmup', a preset that asks for prompt logprobs (the default 'warmup' is SamplingParams.for_sampler_warmup()), so vLLM's scheduler would send a plain prefill; allowed: requests that read the prefix cache, e.g. sampling = \"greedy\""),
    "hit_warmup_preset_past_its_prompt": (
        '[requests.h]\nprompt = 100\n\n[[steps]]\nkind = "prefix_hit"\nrequests = ["h"]\ncached = 256\n',
        {}, 7, 'cached',
        ":7: step 0 (prefix_hit), field 'cached': request 'h': prefix hit of 256 tokens must be shorter than its prompt (prompt_len 100); allowed: 16..96 in steps of lcm_block_size = 16"),
    "repeat_prefill": (
        A + STEP + 'repeat = 2\n',
        {}, 7, 'repeat',
        ":7: step 0 (prefill), field 'repeat': request 'a' already finished its prefill (10 tokens computed); decode it instead (expanded plan step 1); allowed: prefill a waiting request, or continue a running request's chunked prefill"),
    "repeat_zero": (
        A + STEP + 'tokens = 5\nrepeat = 0\n',
        {}, 8, 'repeat',
        ":8: step 0 (prefill), field 'repeat': repeat 0 is out of range; allowed: 1..4096"),
    "float_values": (
        A + 'sampling = { temperature = { values = ["x"] } }\n' + STEP,
        {}, 3, 'sampling.temperature',
        ":3: request 'a', field 'sampling.temperature': Input should be a valid number, unable to parse string as a number (got 'x'); allowed: 0: greedy; > 0 random (Gumbel-max / exponential sampling)."),
}


def _vllm_refuses_out_of_vocab_stop_ids() -> bool:
    """Whether the installed ``SamplingParams.verify`` refuses a stop token
    id outside the vocabulary (vLLM 0.30+; 0.26 accepts it)."""
    from vllm import SamplingParams

    from stepwarm.scenario.sampling import _ModelFacts

    try:
        SamplingParams(stop_token_ids=[100]).verify(_ModelFacts(profile()), None, None, None)
    except Exception:  # noqa: BLE001 - VLLMValidationError or ValueError
        return True
    return False


#: Where vLLM accepts them, stepwarm refuses out-of-vocabulary stop ids itself.
STOP_VOCAB_STEPWARM = (
    ":6: request 'a', field 'sampling.stop_token_ids': vLLM's SamplingParams refuses { min_tokens = 2, stop_token_ids = [100] }: token id(s) [100] in stop_token_ids are out of the vocabulary (vocab_size 100; they index the logits); allowed: what vLLM accepts on this runner (max_logprobs 20, vocab_size 100, num_speculative_steps 0)")


@pytest.mark.parametrize("name", list(CASES))
def test_bad_sampling_or_sweep_names_file_line_field(tmp_path, name):
    text, kw, line, field, message = CASES[name]
    if name == "stop_vocab" and not _vllm_refuses_out_of_vocab_stop_ids():
        message = STOP_VOCAB_STEPWARM
    e = bad(tmp_path, text, profile(**kw))
    assert (e.line, e.field) == (line, field)
    # (a request that fails leaves its steps unchecked: the last line says
    # so, test_a_failed_request_names_the_steps_left_unchecked)
    assert without_unchecked_note(str(e)) == f"{tmp_path / 'bad.toml'}{message}"


def test_logprobs_with_a_speculator_are_accepted_as_vllms_defaults_accept_them():
    """vLLM 0.28's ``SamplingParams._validate_spec_decode`` reads the
    speculator's ``enable_adaptive_verification`` (logprobs refused with
    DSpark's confidence-based verification); ``SpeculativeConfig`` leaves it
    off by default, and stepwarm's stand-in reads it as off on every release
    (it was a bare ``object()``: every speculator request refused on 0.28,
    "'object' object has no attribute 'enable_adaptive_verification'"). The
    check that needs the speculator still refuses (``min_p_spec`` above)."""
    import dataclasses

    from vllm.config import SpeculativeConfig

    from stepwarm.scenario.sampling import refusal

    fields = {f.name: f for f in dataclasses.fields(SpeculativeConfig)}
    if "enable_adaptive_verification" in fields:
        assert fields["enable_adaptive_verification"].default is False
    spec = profile(**SPEC)
    assert refusal((("logprobs", 1), ("temperature", 0.0)), spec) is None
    assert refusal((("top_k", 5), ("top_p", 0.9)), spec) is None
    assert refusal((("min_p", 0.1),), spec) == (
        "min_p", "The min_p and logit_bias sampling parameters are not yet supported with "
        "speculative decoding. (this runner has a speculator: num_speculative_steps 2)")


def test_top_k_beside_a_speculator_on_a_sampler_that_fails_on_it_is_refused_at_check(tmp_path):
    """Fresh trial (issue 42), defect 13: on vLLM's CPU build (its rejection
    sampler fails on top-k / top-p beside drafts) a scenario with a top-k
    request and no ``spec_top_k_top_p`` need passed ``check`` and failed in
    ``run`` with a raw torch error. Now ``check`` names the request's field."""
    from stepwarm.scenario.sampling import refusal

    cpu = profile(**SPEC, top_k_top_p_with_drafts=False)
    why = ("this vLLM build's sampler fails on top-k / top-p requests with a speculator "
           "(vLLM's CPU build); allowed here: greedy or temperature sampling, or needs = "
           "[\"spec_top_k_top_p\"] (the scenario is then skipped on such runners)")
    assert refusal((("temperature", 0.8), ("top_k", 5)), cpu) == (
        "top_k", f"top_k = 5 beside this runner's speculator: {why}")
    assert refusal((("top_p", 0.9),), cpu) == (
        "top_p", f"top_p = 0.9 beside this runner's speculator: {why}")
    assert refusal((("temperature", 0.8), ("top_k", 0), ("top_p", 1.0)), cpu) is None
    assert refusal((("top_k", 5),), profile(**SPEC)) is None  # a GPU build takes it
    e = bad(tmp_path, """
        [requests.a]
        prompt = 5
        sampling = { temperature = 0.8, top_k = 5 }
        [[steps]]
        kind = "prefill"
        requests = ["a"]
        """, cpu)
    assert (e.line, e.field) == (3, "sampling.top_k")
    assert "top_k = 5 beside this runner's speculator" in str(e)
