"""What every reservation rule shares: the runner-wide context, a request's
block table in one group, and the base rule (vLLM's
``SingleTypeKVCacheManager``, ``vllm/v1/core/single_type_kv_cache_manager.py``).

One subclass per KV cache spec kind lives in a module of its own
(:mod:`~stepwarm.blocks.full_attention`, :mod:`~stepwarm.blocks.sliding_window`,
…); :mod:`~stepwarm.blocks.rules` looks them up by kind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

from stepwarm.profile import CacheSpec, RunnerProfile


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative ints (``vllm.utils.math_utils.cdiv``)."""
    return -(-a // b)


@dataclass(frozen=True)
class ReservationContext:
    """Runner-wide facts every reservation rule reads (tokens)."""

    num_lookahead_tokens: int = 0
    max_model_len: int = 1 << 30
    max_encoder_len: int = 0

    @classmethod
    def of(cls, profile: RunnerProfile) -> ReservationContext:
        """The context of a runner profile."""
        return cls(
            num_lookahead_tokens=profile.num_lookahead_tokens,
            max_model_len=profile.max_model_len,
            max_encoder_len=profile.max_encoder_len,
        )


@dataclass(slots=True)
class GroupTable:
    """One request's block table in one KV cache group, as the scheduler's
    ``SingleTypeKVCacheManager.req_to_blocks`` holds it (0: the null block),
    plus the Mamba align-mode bookkeeping ``MambaManager`` keeps per request
    (``_allocated_block_reqs``, ``last_state_block_idx``,
    ``_num_retired_blocks``)."""

    ids: list[int] = field(default_factory=list)
    allocated: bool = False
    last_state_idx: int | None = None
    retired: int = 0

    def copy(self) -> GroupTable:
        """An independent copy (its own ``ids`` list)."""
        return GroupTable(list(self.ids), self.allocated, self.last_state_idx, self.retired)


class ReservationRule(ABC):
    """How one KV cache group's scheduler manager grows, trims and frees a
    request's block table (one subclass per manager; the defaults here are
    ``SingleTypeKVCacheManager``'s own)."""

    @abstractmethod
    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        """Block table length after the scheduler covered ``num_tokens``.

        Args:
            num_tokens: tokens computed plus scheduled for the request (no
                lookahead: the rule adds it where vLLM does).
            spec: the group's spec.
            ctx: lookahead, ``max_model_len`` and encoder length.

        Returns:
            Blocks (including any null-block placeholders the manager keeps
            in the request's block table).
        """

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        """``get_num_skipped_tokens``: leading tokens whose blocks the manager
        no longer needs once ``num_computed`` tokens are computed (their
        blocks become null placeholders and go back to the pool). 0 here."""
        return 0

    def to_allocate(self, table: GroupTable, num_tokens: int, spec: CacheSpec,
                    ctx: ReservationContext) -> int:
        """``get_num_blocks_to_allocate`` for a request whose table is
        ``table``: blocks the pool must hand out to reach ``num_tokens``."""
        return max(0, self.blocks(num_tokens, spec, ctx) - len(table.ids))

    def allocate(self, table: GroupTable, num_tokens: int, spec: CacheSpec,
                 ctx: ReservationContext, take) -> tuple[list[int], list[int]]:
        """``allocate_new_blocks``: grow ``table`` to cover ``num_tokens``.

        Args:
            take: ``take(n)`` -> ``n`` ids popped from the pool.

        Returns:
            ``(appended, taken)``: the ids appended to the table (what the
            scheduler sends as the request's new block ids; may include null
            placeholders) and the ids taken from the pool.
        """
        got = take(self.to_allocate(table, num_tokens, spec, ctx))
        table.ids.extend(got)
        return list(got), list(got)

    def remove_skipped(self, table: GroupTable, num_computed: int, spec: CacheSpec) -> list[int]:
        """``remove_skipped_blocks``: replace blocks of skipped tokens by the
        null block, walking back from the last skipped block and stopping at
        the first null one (``_remove_blocks_in_range``).

        Returns:
            The freed ids, in the order vLLM frees them (last block first).
        """
        skipped = self.skipped_tokens(num_computed, spec)
        if skipped <= 0:
            return []
        last = min(skipped // spec.block_size, len(table.ids))
        freed = []
        for i in range(last - 1, -1, -1):
            if table.ids[i] == 0:
                break
            freed.append(table.ids[i])
            table.ids[i] = 0
        return freed
