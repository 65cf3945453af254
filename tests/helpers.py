"""Shared test helpers (no vLLM import)."""

from __future__ import annotations

from typing import Any

from stepwarm.profile import CacheSpec, RunnerProfile

#: One full-attention KV cache group of 16-token blocks.
FULL16 = CacheSpec(kind="full_attention", block_size=16)


def make_profile(**overrides: Any) -> RunnerProfile:
    """A RunnerProfile for tests without an engine: a V1 runner with one
    full-attention group of 16-token blocks, 1000 blocks, ``max_model_len`` 256,
    4 sequences, a 128-token step budget and a vocabulary of 100; any field
    given replaces its default."""
    fields: dict[str, Any] = dict(
        runner="v1", kv_cache_groups=(FULL16,), num_blocks=1000, max_model_len=256,
        max_num_seqs=4, max_num_batched_tokens=128, vocab_size=100)
    return RunnerProfile(**{**fields, **overrides})
