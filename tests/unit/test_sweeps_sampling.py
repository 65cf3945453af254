"""Sweep forms, sampling tables and presets, and the ``all`` set, without an
engine (the real ``SamplingParams`` where one is built)."""

from __future__ import annotations

import textwrap
from types import SimpleNamespace

import pytest

from stepwarm.compile import sampling_params
from stepwarm.probe import _max_logprobs
from stepwarm.scenario import builtin_names, json_schema, loads, resolve_names
from stepwarm.scenario.expand import expand
from stepwarm.scenario import plans_for
from stepwarm.scenario.sweeps import (
    Buckets,
    Pow2Classes,
    Range,
    Values,
    next_power_of_2,
    pow2_class_values,
    sweep_values,
)
from tests.unit.test_scenario_errors import profile


def _plan(text: str, **kw):
    return expand(loads(textwrap.dedent(text), "t.toml", "t"), profile(**kw))


def test_sweep_values_of_each_form():
    ident = lambda e, what: int(e)  # noqa: E731
    assert sweep_values(Range(range=[16, 64], step=16), ident) == [16, 32, 48, 64]
    assert sweep_values(Range(range=[1, 10], step=4), ident) == [1, 5, 9]
    assert sweep_values(Values(values=[5, 1, 5]), ident) == [5, 1]
    assert sweep_values(Buckets(buckets=40), ident) == [1, 16, 17, 32, 40]
    assert sweep_values(Pow2Classes(pow2_classes=[1, 20], offset=1), ident) == [1, 3, 7, 15, 20]
    assert sweep_values(Pow2Classes(pow2_classes=[1, 20]), ident) == [1, 2, 4, 8, 16, 20]


def test_pow2_classes_are_one_value_per_class_the_largest_of_each():
    # _topk_log_softmax_kernel: TOPK_BLOCK_SIZE = next_power_of_2(k + 1)
    assert [next_power_of_2(n) for n in (0, 1, 2, 3, 4, 5, 17, 1024, 1025)] == [
        1, 1, 2, 4, 4, 8, 32, 1024, 2048]
    assert pow2_class_values(0, 20, 1) == [0, 1, 3, 7, 15, 20]  # k = 0: block 1
    assert pow2_class_values(0, 0, 1) == [0]
    assert pow2_class_values(5, 5, 1) == [5]
    assert pow2_class_values(3, 9, 1) == [3, 7, 9]
    assert pow2_class_values(1, 1024, 1)[-3:] == [511, 1023, 1024]
    for lo, hi, offset in ((0, 300, 1), (1, 20, 0), (2, 77, 3), (16, 16, 0), (1, 4096, 1)):
        got = pow2_class_values(lo, hi, offset)
        classes = [next_power_of_2(v + offset) for v in got]
        # every class of lo..hi once, ascending, each by its largest member
        assert classes == sorted({next_power_of_2(v + offset) for v in range(lo, hi + 1)})
        assert all(v == hi or next_power_of_2(v + 1 + offset) > c for v, c in zip(got, classes))
        assert got[-1] == hi and got[0] >= lo


def _sampled_width(plan, step, prof):
    """The largest logprobs (or prompt_logprobs) among the rows a step samples
    (or scores): what vLLM's samplers compute the step at."""
    def arg(rid, name):  # the SamplingParams the worker gets (presets too)
        return getattr(sampling_params(plan.request(rid).sampling, prof), name)
    lp = [arg(r.req_id, "logprobs") for r in step.scheduled if r.samples]
    plp = [arg(r.req_id, "prompt_logprobs") for r in step.scheduled]
    return (max((k for k in lp if k is not None), default=None),
            max((k for k in plp if k is not None), default=None))


def _variant(k: int) -> tuple[int, str]:
    """What Triton compiles _topk_log_softmax_kernel for at logprobs k: its
    block and the specialization of its integer argument topk = k + 1."""
    n = k + 1
    return next_power_of_2(n), "one" if n == 1 else "div16" if n % 16 == 0 else "plain"


def test_pow2_classes_bound_errors_are_all_named_at_once():
    from stepwarm.expressions import ExpressionError

    with pytest.raises(ExpressionError) as e:
        pow2_class_values(20, 1, -1)
    assert str(e.value) == ("pow2_classes [20, 1] is backwards (lo 20 > hi 1); allowed: lo <= hi; "
                            "pow2_classes offset -1 is negative; allowed: offset >= 0")


def test_pow2_classes_with_triton_int_add_each_integer_kind_of_a_class():
    assert pow2_class_values(1, 20, 1, triton_int=True) == [1, 3, 7, 14, 15, 20]
    assert pow2_class_values(0, 20, 1, triton_int=True) == [0, 1, 3, 7, 14, 15, 20]
    assert pow2_class_values(1, 64, 1, triton_int=True)[-5:] == [30, 31, 62, 63, 64]
    assert pow2_class_values(1, 64, 0, triton_int=True)[-4:] == [31, 32, 63, 64]
    for lo, hi, offset in ((0, 300, 1), (1, 20, 0), (2, 77, 3), (16, 16, 0), (1, 1100, 1)):
        got = pow2_class_values(lo, hi, offset, triton_int=True)
        kinds = [next_power_of_2(v + offset) for v in got], [_variant(v + offset - 1) for v in got]
        # every (block, integer kind) of lo..hi once, ascending
        assert sorted(kinds[1]) == sorted({_variant(v + offset - 1) for v in range(lo, hi + 1)})
        assert len(kinds[1]) == len(set(kinds[1]))
        assert got == sorted(set(got)) and got[-1] == hi and got[0] >= lo
    ident = lambda e, what: int(e)  # noqa: E731
    sweep = Pow2Classes(pow2_classes=[1, 20], offset=1, triton_int=True)
    assert sweep_values(sweep, ident) == [1, 3, 7, 14, 15, 20]


def test_sampler_matrix_warms_every_logprobs_class_up_to_max_logprobs():
    for max_logprobs in (0, 1, 20, 100):
        prof = profile(max_logprobs=max_logprobs)
        (plan,) = plans_for(["sampler-matrix"], prof)
        # the kernel's variants: TOPK_BLOCK_SIZE and Triton's kind of topk = k + 1
        want = sorted({_variant(k) for k in range(min(1, max_logprobs), max_logprobs + 1)})
        ours = {r.req_id for r in plan.requests if r.name in ("lp", "plp")}
        lp_steps = [s for s in plan.steps if any(r.req_id in ours for r in s.scheduled)]
        # the lp / plp steps: each class once as the step's largest k, in
        # both paths (sampled-token logprobs, prompt logprobs)
        widths = [_sampled_width(plan, s, prof) for s in lp_steps]
        sampled = [_variant(w) for w, _ in widths if w is not None]
        scored = [_variant(w) for _, w in widths if w is not None]
        assert sorted(sampled) == want and sorted(scored) == want, (max_logprobs, sampled, scored)
        assert len(set(sampled)) == len(sampled)  # each variant once
        # one request per class and path, each prefilled alone
        assert len(lp_steps) == 2 * len(want)
        assert all(len(s.scheduled) == 1 for s in lp_steps)
    # max_logprobs 20: blocks 2, 4, 8, 16, 16, 32 (k = 1, 3, 7, 14, 15, 20:
    # topk 15 and 16 compile apart); the requests before a class's step are
    # finished in it (one slot)
    (plan,) = plans_for(["sampler-matrix"], profile(max_logprobs=20))
    lp = [dict(r.sampling).get("logprobs") for r in plan.requests if r.name == "lp"]
    plp = [dict(r.sampling).get("prompt_logprobs") for r in plan.requests if r.name == "plp"]
    assert lp == plp == [1, 3, 7, 14, 15, 20]
    firsts = [s for s in plan.steps if s.scheduled and s.scheduled[0].req_id in {
        r.req_id for r in plan.requests if r.name in ("lp", "plp")}]
    assert [len(s.finished_req_ids) for s in firsts] == [0] + [1] * 11
    assert max(len(s.held_blocks) for s in firsts) == 1


def test_range_values_and_repeat_expand_to_steps():
    plan = _plan("""
        [requests.p]
        prompt = { range = ["block_size(0)", "3 * block_size(0)"], step = "block_size(0)" }

        [[steps]]
        kind = "prefill"
        requests = ["p"]
        tokens = 4
        repeat = 2
        batch = { values = [1, 3] }
    """)
    assert [r.prompt_len for r in plan.requests] == [16, 32, 48]
    # batch 1 (4 tokens) then 3 (4 each), the whole step twice, each chunk
    # continuing the last
    assert [s.total_num_scheduled_tokens for s in plan.steps[:-1]] == [4, 12, 4, 12]
    assert [r.num_computed_tokens for r in plan.steps[3].scheduled] == [12, 4, 4]


def test_sampling_sweeps_declare_one_request_per_combination():
    plan = _plan("""
        [requests.s]
        prompt = 4
        count = 2
        sampling = { temperature = { values = [0.0, 0.5] }, logprobs = { values = [1, "max_logprobs"] } }

        [[steps]]
        kind = "prefill"
        requests = ["s[0]"]
    """)
    assert [r.sampling for r in plan.requests] == [
        (("logprobs", 1), ("temperature", 0.0))] * 2 + [
        (("logprobs", 20), ("temperature", 0.0))] * 2 + [
        (("logprobs", 1), ("temperature", 0.5))] * 2 + [
        (("logprobs", 20), ("temperature", 0.5))] * 2


def test_sampling_params_built_for_the_worker():
    prof = profile()
    table = (("bad_words", ((0,), (1, 2))), ("logit_bias", ((0, -1.0), (7, 0.5))),
             ("min_tokens", 20), ("seed", 3), ("stop_token_ids", (5,)), ("top_k", 5))
    p = sampling_params(table, prof)
    assert p.bad_words_token_ids == [[0], [1, 2]] and p.logit_bias == {0: -1.0, 7: 0.5}
    assert (p.min_tokens, p.max_tokens, p.seed, p.top_k) == (20, 20, 3, 5)
    assert p.all_stop_token_ids == {5} and p.sampling_type.name == "RANDOM_SEED"
    assert sampling_params("greedy", prof).sampling_type.name == "GREEDY"
    assert sampling_params("random", prof).sampling_type.name == "RANDOM"
    assert sampling_params("seeded", prof).seed == 0
    warm = sampling_params("warmup", profile(num_speculative_steps=1))
    assert (warm.min_p, warm.logit_bias) == (0.0, None)  # V1 with a speculator


def test_max_logprobs_is_read_and_minus_one_is_the_vocabulary():
    cfg = SimpleNamespace(max_logprobs=-1, get_vocab_size=lambda: 512)
    assert _max_logprobs(cfg) == 512
    assert _max_logprobs(SimpleNamespace(max_logprobs=7, get_vocab_size=lambda: 512)) == 7


def test_the_all_set_is_every_builtin_default_first():
    names = resolve_names(["all", "default", "x.toml"])
    assert names[:4] == ["default", "sampler-matrix", "sampler-spec-decode", "sampler-spec-matrix"]
    assert sorted(names[:-1]) == builtin_names() and names[-1] == "x.toml"


def test_schema_shows_sampling_and_sweeps():
    defs = json_schema()["$defs"]
    assert {"SamplingTable", "Range", "Values", "Buckets", "FloatValues"} <= set(defs)
    assert set(defs["SamplingTable"]["properties"]) == {
        "temperature", "top_p", "top_k", "min_p", "seed", "logprobs", "prompt_logprobs",
        "presence_penalty", "frequency_penalty", "repetition_penalty", "min_tokens",
        "stop_token_ids", "bad_words", "allowed_token_ids", "logit_bias"}
    assert "cached" in defs["MixedPrefillDecodeStep"]["properties"]
    assert "repeat" in defs["PrefillStep"]["properties"]


def test_spec_tokens_sweeps_make_a_step_per_draft_count():
    """spec_tokens = { values = [0, 1, 2] }: a plain decode (0 drafts), then
    1 and 2 drafts per request, each its own step, labelled with the count."""
    plan = _plan("""
        [requests.a]
        prompt = 8
        count = 2

        [[steps]]
        kind = "prefill"
        requests = ["a"]

        [[steps]]
        kind = "decode"
        requests = ["a"]
        spec_tokens = { values = [0, 1, 2] }

        [[steps]]
        kind = "mixed_decode"
        spec = ["a[0]"]
        non_spec = ["a[1]"]
        spec_tokens = { range = [1, "num_spec_steps"] }
    """, num_speculative_steps=2)
    steps = [(s.kind, s.label, s.total_num_scheduled_tokens,
              sum(len(r.spec_token_ids) for r in s.scheduled)) for s in plan.steps[1:-1]]
    assert steps == [
        ("decode", "decode a[0],a[1]", 2, 0),
        ("spec_decode", "spec decode a[0],a[1] +1 draft", 4, 2),
        ("spec_decode", "spec decode a[0],a[1] +2 drafts", 6, 4),
        ("mixed_decode", "mixed decode a[0] +1 draft / a[1]", 3, 1),
        ("mixed_decode", "mixed decode a[0] +2 drafts / a[1]", 4, 2),
    ]


def test_a_spec_tokens_sweep_past_the_speculator_names_the_field(tmp_path):
    from tests.unit.test_scenario_errors import PREFILL_A, assert_parts, bad

    e = bad(tmp_path, PREFILL_A + """
        [[steps]]
        kind = "spec_decode"
        requests = ["a"]
        spec_tokens = { values = [1, 3] }
    """, profile(num_speculative_steps=2))
    assert_parts(e, 11, 1, "spec_tokens", "3 draft tokens exceed num_speculative_steps 2",
                 "0..num_spec_steps = 2")


def test_schema_bounds_each_size_fields_integer_form():
    """An editor reading the schema flags ``prompt = -5`` and ``count = 0`` as
    ``check`` does (the fifth new-user trial: the schema had no minimums)."""
    defs = json_schema()["$defs"]

    def integer(model, field):
        return next(f for f in defs[model]["properties"][field]["anyOf"] if f.get("type") == "integer")

    assert integer("RequestSpec", "prompt") == {"type": "integer", "minimum": 1}
    assert integer("RequestSpec", "count") == {"type": "integer", "minimum": 1, "maximum": 4096}
    assert integer("PrefillStep", "repeat") == {"type": "integer", "minimum": 1, "maximum": 4096}
    assert integer("PrefillStep", "tokens") == {"type": "integer", "minimum": 1}
    assert integer("MixedPrefillDecodeStep", "spec_tokens") == {"type": "integer", "minimum": 0}
