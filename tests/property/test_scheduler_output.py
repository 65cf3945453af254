"""Property (d): every ``SchedulerOutput`` stepwarm builds
(``stepwarm.compile.to_scheduler_output``) is self-consistent:
``total_num_scheduled_tokens == sum(num_scheduled_tokens)``, new and cached
requests are disjoint and are exactly the scheduled ones, spec tokens only
for scheduled requests (``1 + len(drafts)`` tokens each), finished ids only
for requests the runner holds, and each new request's ``block_ids`` is its
whole block table."""

from hypothesis.stateful import invariant

from stepwarm.compile import to_scheduler_output
from tests.property.machine import Lifecycle


class SchedulerOutputTotals(Lifecycle):
    @invariant()
    def scheduler_output_consistent(self) -> None:
        step = self.last_step
        if step is None:
            return
        if not hasattr(self, "_params"):
            self._params = {}
        out = to_scheduler_output(step, self.builder.build(), self.profile, self._params)
        scheduled = out.num_scheduled_tokens
        assert out.total_num_scheduled_tokens == sum(scheduled.values())
        assert all(n > 0 for n in scheduled.values())
        new_ids = [r.req_id for r in out.scheduled_new_reqs]
        cached_ids = list(out.scheduled_cached_reqs.req_ids)
        assert len(set(new_ids)) == len(new_ids) and len(set(cached_ids)) == len(cached_ids)
        assert not set(new_ids) & set(cached_ids)
        assert set(new_ids) | set(cached_ids) == set(scheduled)
        assert set(out.scheduled_spec_decode_tokens) <= set(scheduled)
        for rid, drafts in out.scheduled_spec_decode_tokens.items():
            assert drafts and scheduled[rid] == 1 + len(drafts)
            assert len(drafts) <= self.profile.num_speculative_steps
        # Finished: only requests the runner holds (sent, not finished).
        assert out.finished_req_ids <= self.known_before
        assert not out.finished_req_ids & set(scheduled)
        for r in out.scheduled_new_reqs:
            held = self.builder.ledger.held(r.req_id)
            assert tuple(tuple(ids) for ids in r.block_ids) == held
            assert len(r.block_ids) == len(self.cfg.specs)
        cached = out.scheduled_cached_reqs
        assert len(cached.new_block_ids) == len(cached.req_ids) == len(cached.num_computed_tokens)
        for rid, ids, computed in zip(cached.req_ids, cached.new_block_ids,
                                      cached.num_computed_tokens):
            assert computed + scheduled[rid] <= self.cfg.max_model_len
            if ids is not None:
                assert len(ids) == len(self.cfg.specs)


TestSchedulerOutputTotals = SchedulerOutputTotals.TestCase
