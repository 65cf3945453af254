"""Named regressions: every disagreement the properties found between
stepwarm and vLLM's ``KVCacheManager``, replayed with the right value
asserted (``@example(...).via(...)``), plus generated single-request
lifecycles on top."""

from __future__ import annotations

import re

import pytest
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from stepwarm import vllm_facts
from stepwarm.profile import CacheSpec
from tests.property.replay import Add, Step, replay, single_request_ops
from tests.property.strategies import KVConfig, kv_configs


def _cfg(*specs: CacheSpec, num_blocks: int = 1000, max_model_len: int = 1024,
         max_encoder_len: int = 0, lookahead: int = 0) -> KVConfig:
    return KVConfig(specs=specs, num_blocks=num_blocks, max_model_len=max_model_len,
                    num_lookahead_tokens=lookahead, num_speculative_steps=0,
                    max_encoder_len=max_encoder_len, enable_caching=False)


FULL16 = CacheSpec(kind="full_attention", block_size=16)

# stepwarm sized encoder-only groups like decoder attention (cdiv(20 + 4, 16)
# = 2); the scheduler has no such group and holds 0.
ENCODER_ONLY = (
    _cfg(FULL16, CacheSpec(kind="encoder_only_attention", block_size=16), lookahead=4),
    [Add("r0", 20), Step(prefill={"r0": 20})],
    {"r0": (2, 0)},
)
# stepwarm sized cross-attention by max_encoder_len (cdiv(600, 16) = 38) for
# a request whose encoder input is 17 tokens; vLLM allocates cdiv(17, 16) = 2.
CROSS_SHORT_ENCODER = (
    _cfg(CacheSpec(kind="cross_attention", block_size=16), FULL16, max_encoder_len=600),
    [Add("r0", 5, encoder_len=17), Step(prefill={"r0": 5}), Step(decode={"r0": 0})],
    {"r0": (2, 1)},
)
# ... and a request with no encoder input holds no cross-attention block (was 1).
CROSS_NO_ENCODER = (
    _cfg(CacheSpec(kind="cross_attention", block_size=1), max_model_len=2, max_encoder_len=1),
    [Add("r0", 1, encoder_len=0), Step(prefill={"r0": 1})],
    {"r0": (0,)},
)
# A step refused for lack of blocks freed the finished request's blocks (and
# kept blocks grown for earlier rows) although the step never happened.
REFUSED_STEP = (
    _cfg(CacheSpec(kind="full_attention", block_size=1), num_blocks=3, max_model_len=10),
    [Add("r0", 2), Add("r1", 3), Step(prefill={"r0": 2}),
     Step(finish=("r0",), prefill={"r1": 3})],
    {"r0": (2,)},
)


def _check(cfg: KVConfig, ops: list, expect: dict | None) -> None:
    r = replay(cfg, ops)
    for rid, counts in (expect or {}).items():
        assert r.builder.ledger.held_counts(rid) == counts
        assert r.oracle.held_counts(rid) == counts


@given(data=st.data(), cfg=kv_configs(), expect=st.none())
@example(data=None, cfg=ENCODER_ONLY[0], expect=(ENCODER_ONLY[1], ENCODER_ONLY[2])).via(
    "regression: encoder-only group holds 0 blocks")
@example(data=None, cfg=CROSS_SHORT_ENCODER[0],
         expect=(CROSS_SHORT_ENCODER[1], CROSS_SHORT_ENCODER[2])).via(
    "regression: cross-attention sized by the request's encoder input")
@example(data=None, cfg=CROSS_NO_ENCODER[0], expect=(CROSS_NO_ENCODER[1], CROSS_NO_ENCODER[2])).via(
    "regression: no encoder input, no cross-attention blocks")
@example(data=None, cfg=REFUSED_STEP[0], expect=(REFUSED_STEP[1], REFUSED_STEP[2])).via(
    "regression: a step refused for blocks changes nothing")
def test_lifecycle_matches_oracle(data, cfg: KVConfig, expect) -> None:
    if expect is not None:
        ops, counts = expect
        _check(cfg, ops, counts)
        return
    _check(cfg, data.draw(single_request_ops(cfg)), None)


# -- prefix hits: exact tables and new_block_ids_to_zero -----------------------
def _hit_cfg(*specs: CacheSpec, lookahead: int = 0) -> KVConfig:
    return KVConfig(specs=specs, num_blocks=50, max_model_len=64,
                    num_lookahead_tokens=lookahead, num_speculative_steps=1 if lookahead else 0,
                    max_encoder_len=0, enable_caching=True)


def _hit_pair(name: str, *specs: CacheSpec):
    """vLLM's ``KVCacheManager`` (an :class:`Oracle`) and a stepwarm
    ``PlanBuilder`` over the same :func:`_hit_cfg` of ``specs``."""
    from stepwarm.plan import PlanBuilder
    from tests.property.oracle import Oracle, vllm_spec

    cfg = _hit_cfg(*specs)
    o = Oracle(tuple(vllm_spec(s) for s in specs), cfg.num_blocks, cfg.max_model_len, 0, True)
    return o, PlanBuilder(cfg.profile(), name=name)


def _add(o, b, prompts: dict[str, int]) -> None:
    """Admit the same requests (req_id -> prompt tokens) on both sides."""
    from stepwarm.plan import PlannedRequest

    for rid, n in prompts.items():
        o.add(rid, n)
        b.add_request(PlannedRequest(rid, n))


def _prefill(o, b, rid: str, n: int, outputs: int) -> None:
    """One step that prefills ``n`` tokens of ``rid`` on both sides (vLLM
    must allocate it); ``outputs``: tokens sampled by it."""
    o.new_step()
    assert o.schedule(rid, n) is not None
    o.advance(rid, n, outputs)
    b.step("custom", rid, prefill={rid: n})


# With lookahead tokens, stepwarm's prefix_hit counted the block allocated
# for the lookahead as part of the cached hit, so it was missing from
# new_block_ids_to_zero: vLLM zeroes [4], stepwarm sent None.
LOOKAHEAD_HIT = (
    _hit_cfg(FULL16.model_copy(update={"block_size": 4}), lookahead=2),
    (9, 9),
    {"tables": ((1, 2, 4),), "zero": [4]},
)
# Mamba none/all after a hit: vLLM's table is [0, 0, hit, new, spec, spec]
# (only the last cached state is kept); stepwarm sent six real ids.
MAMBA_ALL_HIT = (
    _hit_cfg(FULL16.model_copy(update={"block_size": 4}),
             CacheSpec(kind="mamba", block_size=4, mamba_cache_mode="all", num_speculative_blocks=2)),
    (13, 13),
    {"tables": ((1, 2, 3, 11), (0, 0, 7, 12, 13, 14)), "zero": [11]},
)


def _refused_mamba_mode(cfg: KVConfig) -> bool:
    """Where the installed vLLM refuses ``cfg``'s Mamba mode with prefix
    caching (0.33: "none" and "all"): vLLM's ``KVCacheManager`` and stepwarm
    (``probe.unsupported``, before any step) both refuse it with vLLM's
    reason, and the example has nothing else to compare."""
    from stepwarm.probe import unsupported
    from tests.property.oracle import Oracle, vllm_spec

    why = unsupported(cfg.specs, cfg.enable_caching)
    if not why:
        return False
    mode = next(s.mamba_cache_mode for s in cfg.specs if s.kind == "mamba")
    reason = vllm_facts.mamba_modes_refused_with_caching()[mode]
    assert reason in why
    with pytest.raises((AssertionError, ValueError), match=re.escape(reason)):
        Oracle(tuple(vllm_spec(s) for s in cfg.specs), cfg.num_blocks, cfg.max_model_len, 0, True)
    event("Mamba mode refused with prefix caching by this vLLM")
    return True


def _hit_lifecycle(cfg: KVConfig, prompts: tuple[int, int], decodes: int = 0,
                   exact: bool | None = None) -> dict:
    """r0 prefills its prompt; r1 looks its prompt up (``get_computed_blocks``),
    takes the hit as a prefix_hit, prefills the rest and decodes. After each
    of r1's steps, its table and the step's new_block_ids_to_zero must equal
    vLLM's (``exact`` False: up to renumbering; None: exactly unless vLLM
    keys partial-tail entries, as property (e) compares them), and the free
    block counts too. Returns
    r1's last table and zero list."""
    from stepwarm.compile import to_scheduler_output
    from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest
    from tests.property.oracle import Oracle, vllm_spec
    from tests.property.test_tables import shape

    o = Oracle(tuple(vllm_spec(s) for s in cfg.specs), cfg.num_blocks, cfg.max_model_len,
               cfg.num_lookahead_tokens, cfg.enable_caching)
    if exact is None:
        exact = not o.partial_tail_entries()
    b = PlanBuilder(cfg.profile(), name="hit")
    a, h = prompts
    o.add("r0", a)
    b.add_request(PlannedRequest("r0", a))
    o.new_step()
    got = o.schedule("r0", a)
    try:
        b.step("custom", "r0", prefill={"r0": a})
    except PlanError as e:
        assert e.field == "blocks" and got is None, e  # refusal parity
        return {}
    assert got is not None, "vLLM refused a step stepwarm allocated"
    o.advance("r0", a, 1)
    o.take_new_block_ids()
    o.end_step()
    o.add("r1", h)
    b.add_request(PlannedRequest("r1", h))
    try:
        n = o.lookup("r1")
    except AssertionError as e:  # vLLM's own limits (e.g. no sub-block SWA hits)
        event(f"prefix lookup unsupported by vLLM: {str(e)[:60]}")
        return {}
    if n and all(n % s.block_size == 0 for s in cfg.specs):
        b.set_computed("r1", n)
    else:
        o.drop_hit("r1")
        n = 0
    last: dict = {}
    copied = False
    for i in range(1 + decodes):
        num = h - n if i == 0 else 1
        if b.num_tokens("r1") + (0 if i == 0 else 1) >= cfg.max_model_len:
            break
        o.new_step()
        cow = o.copy_pending("r1")
        got = o.schedule("r1", num)
        if got is None and cow:
            # vLLM reserved a copy-on-write target (a partial prompt tail it
            # keyed, vLLM 0.26's Mamba align): copies are not modelled.
            event("vLLM refused for a copy-on-write block: not modelled")
            return last
        try:
            step = (b.step("custom", "hit", prefill={"r1": num}) if i == 0
                    else b.step("custom", "decode", decode={"r1": 0}))
        except PlanError as e:
            assert e.field == "blocks" and got is None, e  # refusal parity
            return last
        assert got is not None, "vLLM refused a step stepwarm allocated"
        o.advance("r1", num, 1)
        zero = list(to_scheduler_output(step, b.build(), b.profile).new_block_ids_to_zero or [])
        theirs_zero = o.take_new_block_ids()
        copied = copied or bool(o.end_step())
        last = {"tables": b.ledger.held("r1"), "zero": zero}
        theirs = tuple(map(tuple, o.block_ids("r1")))
        if copied or not exact:  # vLLM's copy-on-write copies: ids not modelled
            event("compared up to renumbering")
            assert shape(last["tables"]) == shape(theirs)
            assert copied or len(zero) == len(theirs_zero)
        else:
            assert last["tables"] == theirs
            assert zero == theirs_zero
        assert b.ledger.num_free == o.num_free()
    return last


@settings(max_examples=max(10, settings().max_examples // 4))
@given(cfg=kv_configs(kinds=("full_attention", "sliding_window", "mamba")).filter(
           lambda c: c.enable_caching and c.max_model_len > 2),
       data=st.data(), expect=st.none())
@example(cfg=LOOKAHEAD_HIT[0], data=None, expect=LOOKAHEAD_HIT[1:]).via(
    "regression: lookahead block after a prefix hit is zeroed")
@example(cfg=MAMBA_ALL_HIT[0], data=None, expect=MAMBA_ALL_HIT[1:]).via(
    "regression: Mamba none/all table after a hit keeps only the last state")
def test_prefix_hit_tables_match_oracle(cfg: KVConfig, data, expect) -> None:
    if expect is not None:
        prompts, want = expect
        if _refused_mamba_mode(cfg):
            return
        assert _hit_lifecycle(cfg, prompts) == want
        return
    top = cfg.max_model_len - 1
    a = data.draw(st.integers(1, top), label="r0 prompt")
    h = data.draw(st.integers(1, top), label="r1 prompt")
    _hit_lifecycle(cfg, (a, h), decodes=data.draw(st.integers(0, 3), label="decodes"))


def test_regression_mamba_hit_on_a_state_cached_in_the_same_step() -> None:
    """Found by the long profile: a request whose prefix hit ends on a Mamba
    state that another request caches in the same step (same prompt blocks)
    cannot be allocated (``MambaManager.get_num_blocks_to_allocate`` returns
    more than the pool holds, in every cache mode); stepwarm allocated it."""
    from stepwarm.plan import PlanError

    refused = vllm_facts.mamba_modes_refused_with_caching()
    if "none" in refused:
        pytest.skip(f"vLLM {vllm_facts.version()} refuses mamba_cache_mode='none' with "
                    f"prefix caching: {refused['none']}")
    o, b = _hit_pair("same-step", FULL16.model_copy(update={"block_size": 2}),
                     CacheSpec(kind="mamba", block_size=2, mamba_cache_mode="none"))
    _add(o, b, {"r0": 8, "r3": 8, "r4": 8})
    _prefill(o, b, "r0", 8, 1)
    o.new_step()
    o.finish("r0")
    b.step("custom", "finish", finish=("r0",))
    hit = o.lookup("r4")
    assert hit == 6  # 3 of r0's cached blocks (at most prompt - 1 tokens)
    b.set_computed("r4", hit)
    o.new_step()
    assert o.schedule("r3", 8) is not None  # r3 caches the same prompt blocks ...
    assert o.schedule("r4", 2) is None  # ... so vLLM refuses r4's hit
    try:
        b.step("custom", "same step", prefill={"r3": 8, "r4": 2})
    except PlanError as e:
        assert e.field == "blocks" and "Mamba state cached in this same step" in str(e)
    else:
        raise AssertionError("stepwarm allocated a hit vLLM's MambaManager refuses")


def test_regression_hits_across_block_sizes_take_only_aligned_cache_entries() -> None:
    """Found by property (e): with groups of block sizes 2 and 4 the
    scheduler caches a prompt only up to a multiple of their LCM, 4 tokens
    (``HybridKVCacheCoordinator.cache_blocks``). stepwarm cached r0's
    2-token prompt block, handed it to r2's hit instead of r1's block, and
    after r1 finished had one free block more than vLLM's pool."""
    o, b = _hit_pair("aligned", FULL16.model_copy(update={"block_size": 2}),
                     FULL16.model_copy(update={"block_size": 4}))
    assert b.ledger.cache_alignment == 4
    _add(o, b, {"r0": 2, "r1": 5, "r2": 5})
    _prefill(o, b, "r0", 2, 1)
    _prefill(o, b, "r1", 5, 1)
    assert o.lookup("r2") == 4
    b.set_computed("r2", 4)
    o.new_step()
    o.finish("r1")
    assert o.schedule("r2", 1) is not None
    b.step("custom", "hit", prefill={"r2": 1}, finish=("r1",))
    # r0 holds [1], [2]; r1 held [3, 4, 5], [6, 7]: r2 hits r1's 3, 4 and
    # 6 and takes r1's freed tail blocks 7 and 5.
    assert o.block_ids("r2") == ([3, 4, 7], [6, 5])
    assert b.ledger.held("r2") == ((3, 4, 7), (6, 5))
    assert b.ledger.num_free == o.num_free() == 49 - 7


def test_regression_mamba_align_checkpoint_is_recached_each_step() -> None:
    """Found by the long profile on vLLM 0.32: a request's prompt checkpoint
    state (``prompt_len - 1`` rounded down to the hash block) is re-registered
    by ``MambaManager._cache_partial_tail_block`` in every step whose
    cacheable prefix ends there, so it counts as cached *in that step* again.
    r1 (5-token prompt) prefills 4 tokens, then its last one: its cacheable
    prefix is 4 again (LCM of block sizes 1 and 2 is 2), so r4's 4-token hit
    on r1's state waits a step in vLLM. stepwarm allocated it (its ledger
    marked only newly cached states). vLLM 0.26 marks new states only."""
    from stepwarm.plan import PlanError

    o, b = _hit_pair("checkpoint", CacheSpec(kind="mamba", block_size=1, mamba_cache_mode="align"),
                     CacheSpec(kind="mla_attention", block_size=2))
    recached = b.profile.kv_cache_groups[0].checkpoint_recached
    _add(o, b, {"r1": 5, "r4": 5})
    _prefill(o, b, "r1", 4, 0)
    assert o.lookup("r4") == 4
    b.set_computed("r4", 4)
    o.new_step()
    assert o.schedule("r1", 1) is not None
    vllm_allocates = o.schedule("r4", 1) is not None
    assert vllm_allocates is not bool(recached)
    try:
        b.step("custom", "hit", prefill={"r1": 1, "r4": 1})
    except PlanError as e:
        assert recached and e.field == "blocks" and "cached in this same step" in str(e), e
    else:
        assert not recached, "stepwarm allocated a hit vLLM's MambaManager refuses"
