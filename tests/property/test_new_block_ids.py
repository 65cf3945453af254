"""Property (b): the block ids stepwarm sends in a step (``NewRequestData.block_ids``
for new and resumed requests, ``CachedRequestData.new_block_ids`` for running
ones) are, per group, as many as vLLM's ``KVCacheManager`` added for that
request in the same step; summed over the step they match too."""

from hypothesis.stateful import invariant

from tests.property.machine import Lifecycle


class NewBlockIds(Lifecycle):
    @invariant()
    def deltas_match_oracle(self) -> None:
        step = self.last_step
        if step is None:
            return
        want_total = [0] * len(self.cfg.specs)
        for row in step.scheduled:
            rid = row.req_id
            after = self.oracle.held_counts(rid)
            before = self.before[rid].oracle
            if row.new or row.resumed:
                want = after  # the whole table goes out
            else:
                want = tuple(len(ids) for ids in self.oracle_new[rid])
                # The scheduler's new_block_ids extend the table exactly.
                assert want == tuple(a - b for a, b in zip(after, before))
            got = row.new_block_counts
            assert got == want, (
                f"{rid} ({'new' if row.new else 'resumed' if row.resumed else 'running'}, "
                f"{row.num_scheduled_tokens} tokens after {row.num_computed_tokens}): "
                f"stepwarm sends {got} block ids per group, vLLM's scheduler {want} "
                f"(specs {[s.kind for s in self.cfg.specs]})"
            )
            want_total = [t + w for t, w in zip(want_total, want)]
        if step.scheduled:
            assert step.new_block_counts == tuple(want_total)


TestNewBlockIds = NewBlockIds.TestCase
