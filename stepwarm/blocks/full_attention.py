"""Full and MLA attention: the token-range rule (vLLM's ``FullAttentionManager``)."""

from __future__ import annotations

from stepwarm.blocks.rule import ReservationContext, ReservationRule, cdiv
from stepwarm.profile import CacheSpec


class TokenRangeRule(ReservationRule):
    """Full and MLA attention (``FullAttentionManager``).

    Mirrors ``SingleTypeKVCacheManager.get_num_blocks_to_allocate``: the block
    table covers ``min(num_tokens + num_lookahead_tokens, max_model_len)``
    tokens (the lookahead slots of speculative decoding are allocated ahead,
    but never past the model's length). Subclasses for windowed attention
    replace blocks that fell out of the window with the null block (and free
    them) but keep the table length.

    Example (16-token blocks, 3 lookahead tokens, ``max_model_len`` 40): 30
    tokens hold ``cdiv(min(33, 40), 16)`` = 3 blocks; 14 tokens hold
    ``cdiv(17, 16)`` = 2 (one only for the lookahead).
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size)
