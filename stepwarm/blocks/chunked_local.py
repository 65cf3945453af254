"""Chunked local attention (vLLM's ``ChunkedLocalAttentionManager``)."""

from __future__ import annotations

from stepwarm.blocks.full_attention import TokenRangeRule
from stepwarm.profile import CacheSpec


class ChunkedLocalRule(TokenRangeRule):
    """``ChunkedLocalAttentionManager``: sized like full attention, but tokens
    of the chunks before the current one are skipped
    (``get_num_skipped_tokens``: ``num_computed // chunk * chunk``): a token
    attends only within its own ``attention_chunk_size`` chunk.

    Example (chunks of 4 tokens, 2-token blocks, 9 tokens computed): the
    current chunk is tokens 8..11, so 8 tokens are skipped and blocks 0..3
    are null placeholders; the table keeps its length.
    """

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        return num_computed // spec.attention_chunk_size * spec.attention_chunk_size
