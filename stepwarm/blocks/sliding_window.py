"""Sliding-window attention (vLLM's ``SlidingWindowManager``)."""

from __future__ import annotations

from stepwarm.blocks.full_attention import TokenRangeRule
from stepwarm.profile import CacheSpec


class SlidingWindowRule(TokenRangeRule):
    """``SlidingWindowManager``: sized like full attention, but tokens before
    the window of the next token are skipped
    (``get_num_skipped_tokens``: ``num_computed - sliding_window + 1``): the
    next token attends to the last ``sliding_window`` tokens only, so blocks
    wholly before them become null placeholders and go back to the pool.

    Example (``sliding_window`` 4, 2-token blocks, 7 tokens computed; the
    next token, 7, reads tokens 4..7)::

        tokens   0 1 | 2 3 | 4 5 | 6 7
        table    [0] | [0] | [b] | [b]     skipped = 7 - 4 + 1 = 4 tokens
                                           -> blocks 0 and 1 null (freed last first)
    """

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        return max(0, num_computed - spec.sliding_window + 1)
