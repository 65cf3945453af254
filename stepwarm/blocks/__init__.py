"""Block reservation, cut like vLLM's ``vllm/v1/core``: a rule per KV cache
spec kind (``rule``, ``full_attention``, ``sliding_window``, ``chunked_local``,
``circular_buffer``, ``cross_attention``, ``encoder_only``, ``mamba``; looked
up by kind in ``rules``), the pool (``pool``), the prefix cache
(``prefix_cache``), what an allocation asks and gets (``allocation``), the
token-range fast path (``token_range``), and the ledger that coordinates the
groups (``ledger``). These are the names the rest
of stepwarm uses; docs/design.md draws the package.
"""

from stepwarm.blocks.allocation import Growth, OutOfBlocksError, StepAllocation
from stepwarm.blocks.chunked_local import ChunkedLocalRule
from stepwarm.blocks.full_attention import TokenRangeRule
from stepwarm.blocks.ledger import BlockLedger
from stepwarm.blocks.mamba import MambaRule
from stepwarm.blocks.prefix_cache import DrafterCaching, prefix_cache_alignment
from stepwarm.blocks.rule import ReservationContext, ReservationRule, cdiv
from stepwarm.blocks.rules import RULES, reserved_blocks, reserved_blocks_per_group
from stepwarm.blocks.sliding_window import SlidingWindowRule

__all__ = [
    "RULES", "BlockLedger", "ChunkedLocalRule", "DrafterCaching", "Growth", "MambaRule",
    "OutOfBlocksError", "ReservationContext", "ReservationRule", "SlidingWindowRule",
    "StepAllocation", "TokenRangeRule", "cdiv", "prefix_cache_alignment", "reserved_blocks",
    "reserved_blocks_per_group",
]
