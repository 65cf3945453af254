"""Property (a): after every step, the blocks stepwarm holds per group for
every live request equal the length of vLLM's ``get_block_ids`` per group."""

from hypothesis.stateful import invariant

from tests.property.machine import Lifecycle


class HeldCounts(Lifecycle):
    @invariant()
    def held_counts_match_oracle(self) -> None:
        if self.builder is None:
            return
        for rid in self.live():
            sw = self.builder.ledger.held_counts(rid)
            orc = self.oracle.held_counts(rid)
            assert sw == orc, (
                f"{rid}: stepwarm holds {sw} blocks per group, vLLM's KVCacheManager "
                f"{orc} (specs {[s.kind for s in self.cfg.specs]}, "
                f"{self.computed[rid]} tokens computed)"
            )
        for rid, state in self.state.items():
            if state in ("preempted", "finished"):
                assert rid not in self.builder.ledger.live_requests(), (
                    f"{rid} is {state} but stepwarm's ledger still holds its blocks"
                )


TestHeldCounts = HeldCounts.TestCase
