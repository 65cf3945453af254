"""Cross-attention of encoder-decoder models (vLLM's ``CrossAttentionManager``)."""

from __future__ import annotations

from stepwarm.blocks.rule import ReservationContext, ReservationRule, cdiv
from stepwarm.profile import CacheSpec


class CrossAttentionRule(ReservationRule):
    """``CrossAttentionManager``: blocks cover the encoder sequence only
    (``cdiv(encoder_len, block_size)``), whatever the decoder length.

    The scheduler passes ``num_encoder_tokens`` (the request's encoder input
    length) to ``allocate_slots`` on the allocation that schedules the encoder
    input; ``ctx.max_encoder_len`` is that length here (the runner's maximum
    unless :meth:`~stepwarm.blocks.ledger.BlockLedger.grow` is given the
    request's own ``encoder_len``; a request with no encoder input holds 0
    blocks).

    Example (16-token blocks): a 1,500-token audio encoder input holds
    ``cdiv(1500, 16)`` = 94 blocks at the first decoder token and at the
    400th alike.
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        return cdiv(ctx.max_encoder_len, spec.block_size)
