"""Property (c): block ids are a valid allocation. No id repeats within a
request; across requests only prefix-cache hits share blocks; block 0 (the
null block) appears only as a placeholder, the total
held never exceeds ``num_blocks - 1`` (held + free == ``num_blocks - 1``),
every id a step sends is held by its request afterwards, and a step refused
for lack of blocks changes nothing."""

from hypothesis.stateful import invariant

from tests.property.machine import Lifecycle


class BlockIds(Lifecycle):
    @invariant()
    def ids_distinct_nonzero_within_pool(self) -> None:
        if self.builder is None:
            return
        ledger = self.builder.ledger
        seen: dict[int, str] = {}
        for rid in ledger.live_requests():
            mine: set[int] = set()
            for g, ids in enumerate(ledger.held(rid)):
                for i in ids:
                    if i == 0:
                        continue  # a null placeholder
                    assert 0 < i < self.cfg.num_blocks, f"{rid} holds id {i} >= num_blocks"
                    assert i not in mine, f"{rid} holds block {i} twice"
                    mine.add(i)
                    # Only a prefix hit shares blocks between requests.
                    assert i not in seen or self.cfg.enable_caching, (
                        f"block {i} held by {seen[i]} and {rid}")
                    seen[i] = rid
        assert len(seen) == ledger.num_held <= self.cfg.num_blocks - 1
        assert ledger.num_held + ledger.num_free == max(0, self.cfg.num_blocks - 1)
        assert set(ledger.live_requests()) == set(self.live())

    @invariant()
    def step_ids_are_held(self) -> None:
        step = self.last_step
        if step is None:
            return
        for row in step.scheduled:
            held = self.builder.ledger.held(row.req_id)
            for g, ids in enumerate(row.block_ids):
                if row.new or row.resumed:
                    assert tuple(ids) == held[g]
                else:
                    assert tuple(ids) == held[g][len(held[g]) - len(ids):]

    @invariant()
    def refused_step_changes_nothing(self) -> None:
        if not self.last_refused:
            return
        free, held = self.refused_ledger_before
        ledger = self.builder.ledger
        assert ledger.num_free == free
        assert {r: ledger.held(r) for r in ledger.live_requests()} == held


TestBlockIds = BlockIds.TestCase
