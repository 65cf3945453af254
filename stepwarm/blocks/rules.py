"""The reservation rules by spec kind (vLLM's ``spec_manager_map`` in
``single_type_kv_cache_manager.py``), and the block counts they give.

``tests/property`` checks every rule against a real ``KVCacheManager`` driven
the way the scheduler drives it.
"""

from __future__ import annotations

from stepwarm.blocks.chunked_local import ChunkedLocalRule
from stepwarm.blocks.circular_buffer import CircularBufferRule
from stepwarm.blocks.cross_attention import CrossAttentionRule
from stepwarm.blocks.encoder_only import RunnerOnlyRule
from stepwarm.blocks.full_attention import TokenRangeRule
from stepwarm.blocks.mamba import MambaRule
from stepwarm.blocks.rule import ReservationContext, ReservationRule
from stepwarm.blocks.sliding_window import SlidingWindowRule
from stepwarm.profile import CacheSpec

#: Spec kind -> reservation rule. A new kind is one module, one class and one
#: entry here.
RULES: dict[str, ReservationRule] = {
    "full_attention": TokenRangeRule(),
    "mla_attention": TokenRangeRule(),
    "sliding_window": SlidingWindowRule(),
    "chunked_local_attention": ChunkedLocalRule(),
    "encoder_only_attention": RunnerOnlyRule(),
    "circular_buffer": CircularBufferRule(),
    "cross_attention": CrossAttentionRule(),
    "mamba": MambaRule(),
}


def reserved_blocks(num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
    """Blocks the scheduler holds in ``spec``'s group for a request of
    ``num_tokens`` tokens (computed + scheduled).

    Agrees with ``vllm.v1.worker.gpu.warmup._reserved_block_count`` except
    for encoder-only groups (0 here: the scheduler holds none; vLLM's warmup
    never sees such a group in its config) and that cross-attention reads
    ``ctx.max_encoder_len`` as the request's encoder length.

    Raises:
        KeyError: no rule for ``spec.kind``.
    """
    return RULES[spec.kind].blocks(num_tokens, spec, ctx)


def reserved_blocks_per_group(
    num_tokens: int, specs: tuple[CacheSpec, ...], ctx: ReservationContext
) -> tuple[int, ...]:
    """:func:`reserved_blocks` for every group, in group order."""
    return tuple(reserved_blocks(num_tokens, s, ctx) for s in specs)
