"""vLLM's own warmup math (``vllm.v1.worker.gpu.warmup._reserved_block_count``)
against the oracle, so its disagreements are measured, not guessed.

The property: for a request carrying ``max_encoder_len`` encoder tokens (as
``warmup_kernels`` sends them), after each prefill chunk and decode,
``_reserved_block_count(computed tokens)`` equals the scheduler's block table
length in every scheduler-managed group.

The disagreements, pinned with their values:

- encoder-only groups: ``_reserved_block_count`` sizes them like decoder
  attention; the scheduler has no such group (0 blocks; no manager is even
  registered for ``EncoderOnlyAttentionSpec``). Latent in vLLM: the V2 runner
  keeps encoder-only layers out of its ``KVCacheConfig``.
- cross-attention for a request with no encoder input:
  ``run_mixed_prefill_decode_warmup`` sends its two requests with
  ``mm_features=[]`` but ``cdiv(max_encoder_len, block_size)`` cross-attention
  blocks each; the scheduler allocates ``cdiv(num_encoder_tokens, bs)`` = 0.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from tests.property.oracle import Oracle, vllm_spec
from tests.property.replay import single_request_ops
from tests.property.strategies import ALL_KINDS, KVConfig, kv_configs

try:
    from vllm.v1.worker.gpu.warmup import _reserved_block_count  # noqa: F401
except ImportError:
    import vllm

    pytestmark = pytest.mark.skip(
        reason=f"vLLM {vllm.__version__} has no vllm.v1.worker.gpu.warmup._reserved_block_count")

SCHEDULED_KINDS = tuple(k for k in ALL_KINDS if k != "encoder_only_attention")


def _vllm_count(n: int, spec, cfg: KVConfig) -> int:
    import inspect
    from types import SimpleNamespace

    from vllm.v1.worker.gpu.warmup import _reserved_block_count

    # vLLM 0.34 caps the count at the spec's block-table row
    # (max_num_blocks_per_req), which reads the config's DCP size
    extra = ({"vllm_config": SimpleNamespace(parallel_config=SimpleNamespace(
        decode_context_parallel_size=1))}
        if "vllm_config" in inspect.signature(_reserved_block_count).parameters else {})
    return _reserved_block_count(
        n, spec, num_lookahead_tokens=cfg.num_lookahead_tokens,
        max_model_len=cfg.max_model_len, max_encoder_len=cfg.max_encoder_len, **extra,
    )


def _unwraps_uniform_specs() -> bool:
    """Whether the installed ``_reserved_block_count`` reads a
    ``UniformTypeKVCacheSpecs`` group by its first spec (vLLM 0.29 on, and
    0.26 - 0.27 have no such spec kinds to miss). vLLM 0.28 counts a uniform
    group of cross-attention, ring or Mamba layers as full attention: its
    warmup reserves 2 blocks where ``KVCacheManager`` holds 1 (a uniform
    cross-attention group, a 1-token encoder input, 1-token blocks) - vLLM's
    disagreement with itself, not stepwarm's (stepwarm's tables are the
    manager's)."""
    import inspect

    from vllm.v1.worker.gpu import warmup

    source = inspect.getsource(warmup._reserved_block_count)
    return "UniformTypeKVCacheSpecs" in source or "CrossAttentionSpec" not in source


@given(data=st.data(), cfg=kv_configs(kinds=SCHEDULED_KINDS))
def test_reserved_block_count_matches_oracle(data, cfg: KVConfig) -> None:
    if not _unwraps_uniform_specs():
        assume(not any(s.uniform_type and s.kind in ("cross_attention", "circular_buffer", "mamba")
                       for s in cfg.specs))
    specs = tuple(vllm_spec(s) for s in cfg.specs)
    o = Oracle(specs, cfg.num_blocks, cfg.max_model_len, cfg.num_lookahead_tokens,
               cfg.enable_caching)
    ops = data.draw(single_request_ops(cfg))
    add, steps = ops[0], ops[1:]
    o.add(add.rid, add.prompt_len, add.encoder_len)
    computed = 0
    for op in steps:
        if op.finish:
            break
        n = op.prefill.get("r0") or (1 + op.decode["r0"])
        if o.schedule("r0", n) is None:
            return  # pool too small for this request: nothing to compare
        done = "r0" in op.decode or computed + n == add.prompt_len
        outs = n if "r0" in op.decode else int(done)
        o.advance("r0", n, outs)
        computed += n
        want = o.held_counts("r0")
        got = tuple(_vllm_count(computed, s, cfg) for s in specs)
        assert got == want, (
            f"vLLM _reserved_block_count {got} != KVCacheManager {want} at {computed} "
            f"tokens ({[s.kind for s in cfg.specs]})"
        )


def test_disagreement_encoder_only() -> None:
    from vllm.v1.kv_cache_interface import EncoderOnlyAttentionSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    spec = EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16)
    cfg = KVConfig(specs=(), num_blocks=100, max_model_len=512, num_lookahead_tokens=4,
                   num_speculative_steps=0, max_encoder_len=0, enable_caching=False)
    assert _vllm_count(20, spec, cfg) == 2  # cdiv(20 + 4, 16)
    assert KVCacheSpecRegistry.get_manager_class(spec) is None  # the scheduler: none


def test_disagreement_cross_attention_without_encoder_input() -> None:
    from stepwarm.profile import CacheSpec

    cross = CacheSpec(kind="cross_attention", block_size=16)
    cfg = KVConfig(specs=(cross,), num_blocks=1000, max_model_len=448, num_lookahead_tokens=0,
                   num_speculative_steps=0, max_encoder_len=1500, enable_caching=False)
    # What run_mixed_prefill_decode_warmup hands each of its requests:
    assert _vllm_count(2, vllm_spec(cross), cfg) == 94  # cdiv(1500, 16)
    # What the scheduler allocates for a request with no encoder input:
    o = Oracle((vllm_spec(cross),), 1000, 448)
    o.add("r0", 2, encoder_len=0)
    o.schedule("r0", 2)
    assert o.held_counts("r0") == (0,)
    # ... and with the full encoder input, they agree.
    o.add("r1", 2, encoder_len=1500)
    o.schedule("r1", 2)
    assert o.held_counts("r1") == (94,)


