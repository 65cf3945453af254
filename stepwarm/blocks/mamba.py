"""Mamba state groups (vLLM's ``MambaManager``)."""

from __future__ import annotations

from stepwarm.blocks.rule import ReservationContext, ReservationRule, cdiv
from stepwarm.profile import CacheSpec


class MambaRule(ReservationRule):
    """``MambaManager``: the token range plus ``num_speculative_blocks``
    running-state blocks, in every cache mode. Only the state after the last
    computed token is needed (``get_num_skipped_tokens`` = ``num_computed -
    1``: "Mamba only need to keep the state of the last computed token"):
    earlier blocks become null placeholders.

    None/all modes size like attention (lookahead, ``max_model_len`` cap).
    Align mode sizes from the uncapped token range without lookahead, hands
    out at most one state block per step (plus the speculative blocks on the
    first), pads the skipped part with null blocks, moves the speculative
    blocks to the end of the table as it grows, and frees the previous
    step's state block once it is behind the computed tokens
    (``MambaManager.allocate_new_blocks`` / ``remove_skipped_blocks``: "We
    always save the running state at the last (1 + num_speculative_blocks)
    block").

    Example (align mode, 4-token blocks, no speculative blocks; a request
    computes 10 tokens, then 4, then 1)::

        after 10 tokens   [0, 0, a]       null padding, one state block
        after 14 tokens   [0, 0, a, b]    one new state block per step
        after 15 tokens   [0, 0, 0, b]    a is behind the computed tokens: freed
    """

    def blocks(self, num_tokens: int, spec: CacheSpec, ctx: ReservationContext) -> int:
        if spec.mamba_cache_mode == "align":
            return cdiv(num_tokens, spec.block_size) + spec.num_speculative_blocks
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size) + spec.num_speculative_blocks

    def skipped_tokens(self, num_computed: int, spec: CacheSpec) -> int:
        return num_computed - 1

    def to_allocate(self, table, num_tokens, spec, ctx) -> int:
        new = self.blocks(num_tokens, spec, ctx) - len(table.ids)
        if spec.mamba_cache_mode != "align" or new <= 0:
            return max(0, new)
        return min(new, 1 if table.allocated else 1 + spec.num_speculative_blocks)

    def allocate(self, table, num_tokens, spec, ctx, take):
        if spec.mamba_cache_mode != "align":
            return super().allocate(table, num_tokens, spec, ctx, take)
        ids, spec_blocks = table.ids, spec.num_speculative_blocks
        need = self.blocks(num_tokens, spec, ctx)
        if need <= len(ids):
            table.allocated = True
            return [], []
        prev = len(ids)
        if table.allocated:
            table.last_state_idx = prev - 1 - spec_blocks
        elif prev > 0:  # "a new request hits the prefix cache, the last block saves the hit state"
            table.last_state_idx = prev - 1
        skipped = need - spec_blocks - 1
        if prev < skipped:
            ids.extend([0] * (skipped - prev))
        if table.allocated:
            self._relocate_speculative_blocks(ids, prev, spec_blocks, skipped)
        got = take(max(need - len(ids), 0))
        appended = ids[prev:] + list(got)
        ids.extend(got)
        table.allocated = True
        return appended, list(got)

    @staticmethod
    def _relocate_speculative_blocks(ids: list[int], prev: int, spec_blocks: int,
                                     skipped: int) -> None:
        """``_relocate_speculative_block``: the speculative blocks at the end
        of a ``prev``-block table move to its new end, a null block left where
        each was (only those before the ``skipped`` padding's end)."""
        for i in range(prev - spec_blocks, prev):
            if i >= skipped:
                break
            ids.append(ids[i])
            ids[i] = 0

    def remove_skipped(self, table, num_computed, spec):
        if spec.mamba_cache_mode != "align":
            return super().remove_skipped(table, num_computed, spec)
        ids, freed = table.ids, []
        skipped = self.skipped_tokens(num_computed, spec)
        if skipped > 0:
            first = table.retired
            last = min(skipped // spec.block_size, len(ids))
            if first < last:
                for i in range(last - 1, first - 1, -1):
                    if ids[i]:
                        freed.append(ids[i])
                        ids[i] = 0
                table.retired = last
        idx = table.last_state_idx
        if idx is not None and idx < cdiv(num_computed, spec.block_size) - 1 and ids[idx]:
            freed.append(ids[idx])
            ids[idx] = 0
        return freed


