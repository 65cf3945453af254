"""stepwarm.expressions: the safe size parser and Triton buckets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepwarm.expressions import ExpressionError, buckets, evaluate

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
    ("max_model_len // (num_spec_steps - 2)", ["division by zero"]),
    ("5 % 0", ["division by zero"]),
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
