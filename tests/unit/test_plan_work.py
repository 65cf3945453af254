"""Planning work grows linearly in requests x steps (counted, not timed).

Request ids are a ``str`` subclass that counts its ``__eq__`` and ``__hash__``
calls: a list or tuple scan per row (``rid in finish``, ``r not in out``)
compares the id with every element (``__eq__`` on each, O(n) per row), a dict
or set lookup hashes it once and compares by identity. Timings belong to
``benchmarks/plan_speed.py``.
"""

from __future__ import annotations

from stepwarm.plan import PlanBuilder, PlannedRequest
from stepwarm.profile import CacheSpec
from tests.helpers import make_profile


class CountingId(str):
    eq = 0
    hashes = 0

    def __eq__(self, other: object) -> bool:
        CountingId.eq += 1
        return str.__eq__(self, other)

    def __hash__(self) -> int:
        CountingId.hashes += 1
        return str.__hash__(self)


def _plan_work(num_reqs: int, *, caching: bool, groups: int = 1) -> tuple[int, int, int]:
    """(eq calls, hash calls, steps) planning ``num_reqs`` requests: a prefill,
    7 decodes, a preemption of half of them, their resumption, and the
    cleanup that finishes every one."""
    spec = CacheSpec(kind="full_attention", block_size=16)
    profile = make_profile(max_num_seqs=num_reqs, max_num_batched_tokens=num_reqs * 40,
                           num_blocks=num_reqs * 8, kv_cache_groups=(spec,) * groups,
                           enable_prefix_caching=caching)
    ids = [CountingId(f"_stepwarm_r{i}_") for i in range(num_reqs)]
    CountingId.eq = CountingId.hashes = 0
    b = PlanBuilder(profile, name="work")
    for rid in ids:
        b.add_request(PlannedRequest(rid, 24))
    b.step("prefill", "prefill", prefill={rid: 24 for rid in ids})
    for _ in range(7):
        b.step("decode", "decode", decode={rid: 0 for rid in ids})
    half = tuple(ids[: num_reqs // 2])
    b.step("preempt", "preempt", preempt=half, decode={rid: 0 for rid in ids[num_reqs // 2:]})
    # (past each request's prefix hit, with caching: the scheduler looks it up)
    b.step("resume", "resume",
           resume={rid: b.num_tokens(rid) - b.resume_lookup(rid) for rid in half})
    b.cleanup()
    plan = b.build()
    assert plan.steps[-1].finished_req_ids == frozenset(ids)
    return CountingId.eq, CountingId.hashes, len(plan.steps)


def test_no_request_id_is_compared_with_a_list_per_row():
    for caching in (False, True):
        eq, hashes, steps = _plan_work(256, caching=caching)
        assert steps == 11
        rows = 256 * 10  # every scheduled or finished row
        # dict and set lookups compare by identity: no __eq__ at all; an O(n)
        # scan per row would make it ~ rows * 128
        assert eq <= rows, (caching, eq)
        assert hashes <= 40 * rows, (caching, hashes)


def test_planning_work_is_linear_in_requests():
    for caching, groups in ((False, 1), (True, 1), (True, 2)):
        small = _plan_work(128, caching=caching, groups=groups)
        large = _plan_work(512, caching=caching, groups=groups)
        assert small[2] == large[2] == 11
        for s, n in zip(small[:2], large[:2]):
            # 4x the requests: 4x the work (+ a constant), not 16x
            assert n <= 4 * s + 64, (caching, groups, small, large)


def test_the_collector_is_off_while_plans_are_built_and_as_it_was_after(monkeypatch):
    import gc
    import importlib

    from stepwarm.scenario import check, plans_for

    expand_mod = importlib.import_module("stepwarm.scenario.expand")

    seen: list[bool] = []
    real_expand = expand_mod.expand

    def spying_expand(scenario, profile):
        seen.append(gc.isenabled())
        return real_expand(scenario, profile)

    monkeypatch.setattr(expand_mod, "expand", spying_expand)
    profile = make_profile()
    assert gc.isenabled()
    (plan,) = plans_for(["default"], profile)
    assert plan.name == "default" and seen == [False] and gc.isenabled()
    gc.disable()
    try:
        check(["default", "chunked-prefill"], profile)
        assert seen == [False, False, False] and not gc.isenabled()  # left off: it was off
    finally:
        gc.enable()


def test_planned_request_init_takes_the_fields_in_order_with_their_defaults():
    import dataclasses
    import inspect

    params = list(inspect.signature(PlannedRequest).parameters.values())
    fields = dataclasses.fields(PlannedRequest)
    assert [p.name for p in params] == [f.name for f in fields]
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in fields]
    req = PlannedRequest("r", 3, "pool", True, 2, "greedy", (0,), True, "n", 1)
    assert dataclasses.astuple(req) == ("r", 3, "pool", True, 2, "greedy", (0,), True, "n", 1,
                                        False)
    assert dataclasses.replace(req, prompt_len=4).prompt_len == 4
    assert req == PlannedRequest("r", 3, "pool", True, 2, "greedy", (0,), True, "n", 1)
    assert hash(req) == hash(dataclasses.replace(req))


def _tracked_kept(num_reqs: int, decodes: int, collected: bool = False) -> int:
    """Objects the collector tracks that a plan of ``num_reqs`` requests (a
    prefill of 24 tokens, then ``decodes`` decodes) keeps, counted with the
    collector off (nothing is untracked meanwhile), or after one collection
    (``collected``: it untracks the plain tuples that hold no tracked object)."""
    import gc

    spec = CacheSpec(kind="full_attention", block_size=16)
    profile = make_profile(max_num_seqs=num_reqs, max_num_batched_tokens=num_reqs * 40,
                           num_blocks=num_reqs * 8, kv_cache_groups=(spec,),
                           enable_prefix_caching=True, max_model_len=512)
    ids = [f"_stepwarm_r{i}_" for i in range(num_reqs)]
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        b = PlanBuilder(profile, name="kept")
        for rid in ids:
            b.add_request(PlannedRequest(rid, 24))
        b.step("prefill", "prefill", prefill={rid: 24 for rid in ids})
        for _ in range(decodes):
            b.step("decode", "decode", decode={rid: 0 for rid in ids})
        if collected:
            gc.collect()
        return len(gc.get_objects()) - before
    finally:
        gc.enable()


def test_a_decode_that_takes_no_block_keeps_one_tracked_object_per_request():
    # Tokens 25..31 of 16-token blocks: decodes 4..7 take no block and cache
    # none, so the ledger's quick entries answer every row: the step keeps
    # one plain tuple per request (its row, made a ScheduledRequest when the
    # step is read) and a few objects of its own; the held pairs are shared
    # across steps. Planning's work grows with requests x steps, one object
    # a row; after one collection the rows are untracked (they hold ints,
    # the request id and the empty drafts tuple), so the collector's later
    # passes grow with the steps only.
    kept = []
    for num_reqs in (64, 256):
        extra = _tracked_kept(num_reqs, 7) - _tracked_kept(num_reqs, 3)
        assert 4 * num_reqs <= extra <= 4 * (num_reqs + 8), (num_reqs, extra)
        kept.append(_tracked_kept(num_reqs, 7, True) - _tracked_kept(num_reqs, 3, True))
    assert kept[0] == kept[1] <= 4 * 12, kept  # per step, whatever the requests


def test_the_collector_state_is_restored_when_a_step_is_refused():
    import gc

    import pytest

    from stepwarm.plan import PlanError, collector_paused

    b = PlanBuilder(make_profile(), name="refused")
    b.add_request(PlannedRequest("r", 4))
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            with pytest.raises(PlanError):
                b.step("decode", "decode", decode={"r": 0})  # never prefilled
            assert gc.isenabled() is enabled
            with pytest.raises(KeyError), collector_paused():
                assert not gc.isenabled()
                raise KeyError("inside")
            assert gc.isenabled() is enabled
        finally:
            gc.enable()
    b.step("prefill", "prefill", prefill={"r": 4})  # the refused step changed nothing
    assert b.num_computed_tokens("r") == 4


def test_rows_built_when_read_pickle_copy_and_compare_as_the_tuple():
    import copy
    import dataclasses
    import pickle

    from stepwarm.plan import ScheduledRequest

    def plan():
        spec = CacheSpec(kind="full_attention", block_size=16)
        b = PlanBuilder(make_profile(max_num_seqs=4, max_num_batched_tokens=160, num_blocks=64,
                                     kv_cache_groups=(spec,), enable_prefix_caching=True))
        for i in range(4):
            b.add_request(PlannedRequest(f"_stepwarm_r{i}_", 24))
        b.step("prefill", "prefill", prefill={f"_stepwarm_r{i}_": 24 for i in range(4)})
        for _ in range(3):
            b.step("decode", "decode", decode={f"_stepwarm_r{i}_": 0 for i in range(4)})
        return b.build()

    read = plan()
    rows = [st.scheduled for st in read.steps]
    assert all(type(r) is tuple and all(type(x) is ScheduledRequest for x in r) for r in rows)
    assert rows[3][0] == ScheduledRequest("_stepwarm_r0_", 26, 1, block_ids=((),), allocated=((),),
                                          num_output_tokens=3, samples=True)
    for fresh in (pickle.loads(pickle.dumps(plan())), copy.deepcopy(plan()), plan()):
        assert fresh == read and repr(fresh) == repr(read) and hash(fresh.steps[2]) == hash(
            read.steps[2])
    unread = plan()
    assert dataclasses.replace(unread.steps[3], index=9).scheduled == rows[3]
