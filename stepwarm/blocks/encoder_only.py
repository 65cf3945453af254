"""Encoder-only attention: runner-only groups the scheduler never allocates."""

from __future__ import annotations

from stepwarm.blocks.rule import ReservationContext, ReservationRule
from stepwarm.profile import CacheSpec


class RunnerOnlyRule(ReservationRule):
    """Encoder-only attention: 0 blocks.

    ``EncoderOnlyAttentionSpec`` groups are runner-only: the V1 runner appends
    them to its own ``KVCacheConfig`` after the scheduler's is built (and reads
    a zero block table for them), the V2 runner keeps them out of the config,
    and ``KVCacheSpecRegistry`` has no manager for the spec. The scheduler's
    ``KVCacheManager`` never allocates a block for them.
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        return 0
