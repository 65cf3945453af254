"""Circular-buffer groups (vLLM's ``CircularBufferManager``)."""

from __future__ import annotations

from stepwarm.blocks.rule import ReservationContext, ReservationRule
from stepwarm.profile import CacheSpec


class CircularBufferRule(ReservationRule):
    """``CircularBufferManager``: one ring block for the request's lifetime,
    whatever its length (``_claim_ring_block``: "Claims the ring's single
    block per request; prefix caching disabled")."""

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        return 1
