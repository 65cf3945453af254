"""stepwarm.expressions: the safe size parser and Triton buckets."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepwarm.expressions import ExpressionError, buckets, evaluate
from tests.helpers import make_profile

FACTS = {"decode_query_len": 3, "max_num_batched_tokens": 512, "max_model_len": 1024,
         "num_spec_steps": 2, "max_num_seqs": 8}


@pytest.mark.parametrize("expr, value", [
    (7, 7),
    ("7", 7),
    ("decode_query_len + 1", 4),
    ("max_num_batched_tokens // 2", 256),
    ("block_size(0) * 2", 32),
    ("block_size(1) - 1", 63),
    ("min(max_num_seqs, 4) + max(1, 2, 3)", 7),
    ("-(2 - 5) % 2", 1),
    ("(max_model_len - decode_query_len) // 16 * 16", 1008),
    ("  max_num_seqs  ", 8),
])
def test_evaluates(expr, value):
    assert evaluate(expr, FACTS, (16, 64)) == value


@pytest.mark.parametrize("expr, words", [
    ("max_num_seq + 1", ["unknown fact 'max_num_seq'", "did you mean 'max_num_seqs'", "allowed facts"]),
    ("max_model_len // (num_spec_steps - 2)",
     ["division by zero (num_spec_steps - 2 is 0 on this runner)"]),
    ("5 % 0", ["division by zero; allowed"]),
    ("max_model_len / 2", ["'/' is not allowed", "//"]),
    ("__import__('os')", ["not allowed"]),
    ("max_model_len.bit_length()", ["not allowed"]),
    ("2 ** 10", ["not allowed"]),
    ("1.5", ["not an integer"]),
    ("'a'", ["not an integer"]),
    ("block_size(2)", ["allowed: 0..1"]),
    ("block_size()", ["one argument"]),
    ("max_model_len +", ["not a valid expression", "allowed"]),
    ("", ["empty expression"]),
    ("x" * 300, ["longer than"]),
    ("[1, 2]", ["not allowed"]),
    ("lambda: 1", ["not allowed"]),
    ("min(x=1)", ["not allowed"]),
])
def test_rejects(expr, words):
    with pytest.raises(ExpressionError) as e:
        evaluate(expr, FACTS, (16, 64))
    for w in words:
        assert w in str(e.value)


def test_rejects_bool_and_float():
    for v in (True, 1.0, None, [1]):
        with pytest.raises(ExpressionError):
            evaluate(v, FACTS)  # type: ignore[arg-type]


@pytest.mark.parametrize("limit, low, want", [
    (512, 1, (1, 16, 17, 511, 512)),
    (511, 1, (1, 16, 17, 496, 511)),
    (40, 1, (1, 16, 17, 32, 40)),
    (16, 1, (1, 15, 16)),
    (8, 1, (1, 8)),
    (1, 1, (1,)),
    (8, 2, (8,)),
    (512, 17, (17, 511, 512)),
])
def test_buckets(limit, low, want):
    assert buckets(limit, low) == want


@given(st.integers(1, 100_000), st.integers(1, 100))
def test_buckets_cover_the_classes_within_limits(limit, low):
    if low > limit:
        with pytest.raises(ExpressionError):
            buckets(limit, low)
        return
    got = buckets(limit, low)
    assert got == tuple(sorted(set(got))) and all(low <= v <= limit for v in got)
    assert len(got) <= 5
    classes = {"one" if v == 1 else "m16" if v % 16 == 0 else "neither" for v in got}
    # every class that has a member in low..limit is represented
    if low == 1:
        assert "one" in classes
    if limit // 16 * 16 >= max(low, 16):
        assert "m16" in classes
    if any(v != 1 and v % 16 for v in range(max(low, 2), min(limit, low + 40) + 1)) and limit > 1:
        assert "neither" in classes


# -- requires conditions and the KV cache functions ---------------------------

from stepwarm.expressions import evaluate_condition, facts_of, functions_of  # noqa: E402
from stepwarm.profile import CacheSpec, RunnerProfile  # noqa: E402


@pytest.mark.parametrize("text, ok, shown", [
    ("max_num_seqs >= 2", True, "8 >= 2"),
    ("max_num_seqs < 2", False, "8 < 2"),
    ("2 <= max_num_seqs <= 4", False, "2 <= 8 <= 4"),
    ("min(max_num_seqs, 4) == 4", True, "4 == 4"),
    ("block_size(1) != 64", False, "64 != 64"),
])
def test_condition(text, ok, shown):
    assert evaluate_condition(text, FACTS, (16, 64)) == (ok, shown)


@pytest.mark.parametrize("text, words", [
    ("max_num_seqs", ["is not a comparison", "< <= > >= == !=", "max_num_seqs >= 2"]),
    ("max_num_seqs > = 2", ["is not a comparison (invalid syntax)", "allowed"]),
    ("max_num_seqs in 2", ["operator In is not allowed", "allowed: < <= > >= == !="]),
    ("max_num_seq >= 2", ["unknown fact 'max_num_seq'", "did you mean 'max_num_seqs'"]),
    ("max_num_seqs >= 2 and 1", ["is not a comparison"]),
])
def test_condition_rejects(text, words):
    with pytest.raises(ExpressionError) as e:
        evaluate_condition(text, FACTS, (16, 64))
    for w in words:
        assert w in str(e.value), str(e.value)


def test_comparison_is_not_a_size():
    with pytest.raises(ExpressionError) as e:
        evaluate("max_num_seqs >= 2", FACTS)
    assert "a comparison is not a size" in str(e.value) and "only in requires" in str(e.value)


def _prof(**kw) -> RunnerProfile:
    return make_profile(**{**dict(num_blocks=41, max_model_len=512, max_num_seqs=8,
                                  max_num_batched_tokens=20), **kw})


def test_kv_functions_count_blocks_like_the_ledger():
    fn = functions_of(_prof())
    # 40 usable blocks of 16 tokens: 20 requests of 32 tokens, 13 of 33
    assert fn["kv_seqs"](32) == 20 and fn["kv_seqs"](33) == 13
    assert fn["kv_tokens"](1) == 512  # capped by max_model_len
    assert fn["kv_tokens"](5) == 8 * 16 and fn["kv_tokens"](41) == 0
    # lookahead slots count too
    la = functions_of(_prof(num_lookahead_tokens=2, num_speculative_steps=2, decode_query_len=3))
    assert la["kv_seqs"](32) == 13 and la["kv_tokens"](5) == 8 * 16 - 2
    # a hybrid model holds blocks in every group
    hy = functions_of(_prof(kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16),
                                             CacheSpec(kind="full_attention", block_size=16))))
    assert hy["kv_seqs"](32) == 10
    assert evaluate("kv_seqs(32) + kv_tokens(5)", facts_of(_prof()), (16,),
                    functions_of(_prof())) == 20 + 128


def test_kv_functions_reject_bad_arguments_and_need_a_profile():
    facts, fn = facts_of(_prof()), functions_of(_prof())
    for expr, word in (("kv_seqs(0)", "tokens must be >= 1"), ("kv_tokens(0)", "requests must be >= 1"),
                       ("kv_seqs(1, 2)", "takes one argument"), ("kv_sqs(1)", "'kv_sqs' is not allowed")):
        with pytest.raises(ExpressionError) as e:
            evaluate(expr, facts, (16,), fn)
        assert word in str(e.value), str(e.value)
    with pytest.raises(ExpressionError) as e:
        evaluate("kv_seqs(4)", facts, (16,))
    assert "needs a runner profile" in str(e.value)


def test_max_decode_seqs_is_capped_by_the_token_budget():
    assert facts_of(_prof())["max_decode_seqs"] == 8
    assert facts_of(_prof(num_speculative_steps=2, decode_query_len=3))["max_decode_seqs"] == 6


def test_prefill_chunk_align_is_the_mamba_align_block_within_the_budget():
    full = CacheSpec(kind="full_attention", block_size=16)
    def mamba(mode, bs=64):
        return CacheSpec(kind="mamba", block_size=bs, mamba_cache_mode=mode)
    assert facts_of(_prof())["prefill_chunk_align"] == 1
    assert facts_of(_prof(kv_cache_groups=(full, mamba("align")), max_num_batched_tokens=64,
                          mamba_cache_mode="align"))["prefill_chunk_align"] == 64
    # a block wider than the token budget: sub-block chunks are scheduled
    assert facts_of(_prof(kv_cache_groups=(full, mamba("align")), max_num_batched_tokens=63,
                          mamba_cache_mode="align"))["prefill_chunk_align"] == 1
    # other Mamba cache modes do not align chunks
    for mode in ("none", "all"):
        assert facts_of(_prof(kv_cache_groups=(full, mamba(mode)), max_num_batched_tokens=512,
                              mamba_cache_mode=mode))["prefill_chunk_align"] == 1


def test_the_names_checked_before_a_runner_are_the_facts_of_any_runner():
    from stepwarm.expressions import FACT_NAMES, check_names, facts_of
    from tests.helpers import make_profile

    assert sorted(facts_of(make_profile())) == sorted(FACT_NAMES)
    # names and form: checked; values: the runner's (no division by zero said here)
    for ok in ("max_num_seqs // (num_kv_groups - 1)", "block_size(7) * 2", "kv_seqs(16)",
               "min(max_model_len, 4096) - 1", "-3"):
        check_names(ok)
    for bad, said in (("twenty", "unknown fact 'twenty'"),
                      ("max_num_seqs ** 2", "operator Pow is not allowed"),
                      ("max_num_seqs / 2", "'/' is not allowed"),
                      ("open(1)", "function 'open' is not allowed"),
                      ("max_num_seqs >= 2", "a comparison is not a size"),
                      ("max_num_seqs.real", "Attribute is not allowed"),
                      ("", "empty expression")):
        with pytest.raises(ExpressionError, match=re.escape(said)):
            check_names(bad)
