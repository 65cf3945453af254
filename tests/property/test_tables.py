"""Property (e): block tables exactly as vLLM's scheduler builds them.

After every step of a lifecycle with prefix-cache hits (each waiting request
may look its prompt up with ``get_computed_blocks``; every prompt is the same
token sequence, so earlier requests' cached blocks hit, and stepwarm takes
the hit as a ``prefix_hit`` of the same length), per live request and group:

- the block table equals ``KVCacheManager.get_block_ids``, null placeholders
  in the same positions;
- the block ids a step sends (``NewRequestData.block_ids`` /
  ``CachedRequestData.new_block_ids``) equal what the scheduler sends;
- ``new_block_ids_to_zero`` equals ``KVCacheManager.take_new_block_ids()``;
- the pool's free block count equals ``BlockPool.get_num_free_blocks()``;
- refusal parity: stepwarm refuses a step iff vLLM's manager cannot allocate
  it (the other direction is asserted in the machine itself).

vLLM's copy-on-write copies for partial-block prefix caching (sub-block
hits, Mamba align partial tails; ``kv_cache_block_copies``) are not modelled:
from a step with such copies on, ids are compared up to renumbering and that
step's zeroing is not compared (an event counts them).

Ids are compared exactly, prefix caching on or off, unless vLLM keys
partial-tail entries: with prefix caching, when some cached group's block
size differs from the hash block size, vLLM also caches the block holding
the prompt's last hash boundary (``_cache_partial_tail_block``), which
then goes to the back of the free queue on free; stepwarm does not model
those entries, so there ids are compared up to renumbering: null
positions, lengths, counts, and which positions share a block. The event
"prefix caching: ids compared exactly" counts the examples compared exactly.
"""

from hypothesis import event
from hypothesis.stateful import invariant

from stepwarm.compile import to_scheduler_output
from tests.property.machine import Lifecycle
from tests.property.strategies import drafter_configs, mixed_block_size_configs, prefix_hit_configs


def shape(tables) -> tuple:
    """Tables with every non-null id replaced by its order of first
    appearance (0 stays 0): equal shapes mean equal tables up to renumbering."""
    seen: dict[int, int] = {0: 0}
    return tuple(tuple(seen.setdefault(i, len(seen)) for i in t) for t in tables)


class Tables(Lifecycle):
    @property
    def partial_entries(self) -> bool:
        """vLLM keys partial-tail entries stepwarm does not record
        (:meth:`Oracle.partial_tail_entries`): ids compared up to renumbering."""
        return self.oracle.partial_tail_entries()

    def _same(self, ours, theirs) -> bool:
        ours = tuple(tuple(t) for t in ours)
        theirs = tuple(tuple(t) for t in theirs)
        if self.cow_seen or self.partial_entries:
            return shape(ours) == shape(theirs)
        return ours == theirs

    @invariant()
    def tables_match_oracle(self) -> None:
        if self.builder is None:
            return
        if self.cfg.enable_caching:
            event("prefix caching: ids compared " + (
                "up to renumbering" if self.cow_seen or self.partial_entries else "exactly"))
        ledger = self.builder.ledger
        for rid in self.live():
            sw, orc = ledger.held(rid), self.oracle.block_ids(rid)
            assert self._same(sw, orc), (
                f"{rid}: stepwarm's block table {sw}, vLLM's {tuple(map(tuple, orc))} "
                f"(specs {[s.kind for s in self.cfg.specs]}, {self.computed[rid]} computed)")

    @invariant()
    def free_blocks_match_oracle(self) -> None:
        if self.builder is None:
            return
        assert self.builder.ledger.num_free == self.oracle.num_free(), (
            f"stepwarm's pool has {self.builder.ledger.num_free} free blocks, "
            f"vLLM's {self.oracle.num_free()}")

    @invariant()
    def step_block_ids_match_oracle(self) -> None:
        step = self.last_step
        if step is None:
            return
        for row in step.scheduled:
            if row.new or row.resumed:
                want = self.oracle.block_ids(row.req_id)
            else:
                want = self.oracle_new[row.req_id]
            assert self._same(row.block_ids, want), (
                f"{row.req_id}: stepwarm sends block ids {row.block_ids}, vLLM's "
                f"scheduler {tuple(map(tuple, want))}")

    @invariant()
    def zeroed_blocks_match_oracle(self) -> None:
        step = self.last_step
        if step is None:
            return
        out = to_scheduler_output(step, self.builder.build(), self.profile)
        ours = list(getattr(out, "new_block_ids_to_zero", None) or [])
        theirs = self.oracle_zero
        if self.copies:
            return  # vLLM zeroes its copy-on-write targets too: not modelled
        if self.partial_entries:
            assert len(ours) == len(theirs), (ours, theirs)
            return
        assert ours == theirs, (
            f"new_block_ids_to_zero: stepwarm {ours}, vLLM's scheduler {theirs}")

    @invariant()
    def refusal_parity(self) -> None:
        if self.last_refused:
            assert self.oracle_refused, (
                "stepwarm refused a step for blocks that vLLM's KVCacheManager allocates: "
                f"{self.refusal}")


TestTables = Tables.TestCase


class TablesAcrossBlockSizes(Tables):
    """Property (e) on configs whose groups differ in block size, with
    prefix caching (hybrid Mamba models among them): the cached prefix is a
    multiple of the groups' LCM, and a hit takes those entries only."""

    configs = mixed_block_size_configs()


TestTablesAcrossBlockSizes = TablesAcrossBlockSizes.TestCase


class TablesWithPrefixHits(Tables):
    """Property (e) where prefix hits are frequent: prefix caching on, block
    sizes 1-4, short ``max_model_len`` (every kind but cross-attention)."""

    configs = prefix_hit_configs()


TestTablesWithPrefixHits = TablesWithPrefixHits.TestCase


class TablesWithDrafters(Tables):
    """Property (e) with a model-based drafter's KV cache groups
    (:func:`~tests.property.strategies.drafter_configs`): the drafter's
    layers in a group of their own or in the target's, flagged
    ``is_eagle_group``; EAGLE's last-block drop, multi-module MTP's
    re-prefillable tail and (vLLM 0.33) hash lookahead tokens, against
    vLLM's ``KVCacheManager`` built with the same settings."""

    configs = drafter_configs()


TestTablesWithDrafters = TablesWithDrafters.TestCase
