"""Exact, hand-computed block counts for every spec kind, and the ledger.

Each expected value is worked out in the comment next to it from vLLM's
``KVCacheManager.allocate_slots`` / ``SingleTypeKVCacheManager`` rules, and
is chosen so that a plausible wrong rule (lookahead ignored, no
``max_model_len`` cap, align mode capped, speculative blocks dropped,
cross-attention sized by decoder tokens, encoder-only holding blocks) gives a
different number.
"""

from __future__ import annotations

import random

import pytest

from stepwarm.blocks import (
    RULES,
    BlockLedger,
    OutOfBlocksError,
    ReservationContext,
    StepAllocation,
    cdiv,
    reserved_blocks,
    reserved_blocks_per_group,
)
from stepwarm.profile import CacheSpec, RunnerProfile
from stepwarm.sequences import max_warmup_requests
from tests.helpers import make_profile


def spec(kind: str, bs: int, **kw) -> CacheSpec:
    return CacheSpec(kind=kind, block_size=bs, **kw)


CTX = ReservationContext()  # no lookahead, no cap, no encoder


def test_cdiv() -> None:
    assert [cdiv(a, 4) for a in (0, 1, 4, 5, 8, 9)] == [0, 1, 1, 2, 2, 3]


def test_every_kind_has_a_rule() -> None:
    assert set(RULES) == {
        "full_attention", "mla_attention", "sliding_window", "chunked_local_attention",
        "circular_buffer", "mamba", "cross_attention", "encoder_only_attention",
    }


# -- token-range kinds ------------------------------------------------------
@pytest.mark.parametrize("kind,extra", [
    ("full_attention", {}),
    ("mla_attention", {}),
    ("sliding_window", {"sliding_window": 4}),
    ("chunked_local_attention", {"attention_chunk_size": 8}),
])
def test_token_range_kinds(kind: str, extra: dict) -> None:
    s = spec(kind, 16, **extra)
    assert reserved_blocks(16, s, CTX) == 1  # exactly one block
    assert reserved_blocks(17, s, CTX) == 2  # one token spills
    # Sliding window / chunked local keep out-of-window blocks as null
    # placeholders: the table is as long as full attention's.
    assert reserved_blocks(100, s, CTX) == 7  # cdiv(100, 16)


def test_non_power_of_two_block_size() -> None:
    assert reserved_blocks(100, spec("full_attention", 24), CTX) == 5  # cdiv(100, 24)
    assert reserved_blocks(1, spec("full_attention", 1), CTX) == 1
    assert reserved_blocks(255, spec("mla_attention", 256), CTX) == 1


def test_lookahead_is_reserved() -> None:
    ctx = ReservationContext(num_lookahead_tokens=3)
    # 14 tokens + 3 lookahead = 17 slots -> 2 blocks of 16 (1 without lookahead).
    assert reserved_blocks(14, spec("full_attention", 16), ctx) == 2
    assert reserved_blocks(13, spec("full_attention", 16), ctx) == 1  # 16 slots


def test_max_model_len_caps_lookahead() -> None:
    ctx = ReservationContext(num_lookahead_tokens=8, max_model_len=20)
    # min(18 + 8, 20) = 20 slots -> 5 blocks of 4 (7 uncapped).
    assert reserved_blocks(18, spec("full_attention", 4), ctx) == 5
    assert reserved_blocks(18, spec("sliding_window", 4, sliding_window=2), ctx) == 5


# -- circular buffer, cross-attention, encoder-only ---------------------------
def test_circular_buffer_one_ring_block() -> None:
    s = spec("circular_buffer", 16)
    ctx = ReservationContext(num_lookahead_tokens=8)
    assert [reserved_blocks(n, s, ctx) for n in (1, 16, 17, 1000)] == [1, 1, 1, 1]


def test_cross_attention_sized_by_encoder() -> None:
    s = spec("cross_attention", 16)
    ctx = ReservationContext(max_encoder_len=1500, num_lookahead_tokens=4)
    # cdiv(1500, 16) = 94, whatever the decoder length (not cdiv(n, 16)).
    assert [reserved_blocks(n, s, ctx) for n in (1, 17, 400)] == [94, 94, 94]
    assert reserved_blocks(5, s, ReservationContext()) == 0  # no encoder input


def test_encoder_only_holds_nothing() -> None:
    # Runner-only group: the scheduler's KVCacheManager has no such group.
    s = spec("encoder_only_attention", 16)
    ctx = ReservationContext(num_lookahead_tokens=4, max_model_len=512)
    assert reserved_blocks(100, s, ctx) == 0  # not cdiv(104, 16) = 7


# -- Mamba ----------------------------------------------------------------------
def test_mamba_none_and_all_like_attention_plus_speculative() -> None:
    ctx = ReservationContext(num_lookahead_tokens=3, max_model_len=1000)
    # cdiv(17 + 3, 16) + 2 = 4 (2 without spec blocks, 3 without lookahead).
    assert reserved_blocks(17, spec("mamba", 16, mamba_cache_mode="none", num_speculative_blocks=2), ctx) == 4
    assert reserved_blocks(17, spec("mamba", 16, mamba_cache_mode="all", num_speculative_blocks=2), ctx) == 4
    # cdiv(25 + 6, 10) = 4 with no spec blocks.
    ctx6 = ReservationContext(num_lookahead_tokens=6)
    assert reserved_blocks(25, spec("mamba", 10, mamba_cache_mode="all"), ctx6) == 4


def test_mamba_none_capped_at_max_model_len() -> None:
    ctx = ReservationContext(num_lookahead_tokens=8, max_model_len=20)
    # min(18 + 8, 20) = 20 -> 5 blocks of 4, + 1 speculative = 6.
    assert reserved_blocks(18, spec("mamba", 4, num_speculative_blocks=1), ctx) == 6


def test_mamba_align_no_lookahead_no_cap() -> None:
    s = spec("mamba", 4, mamba_cache_mode="align", num_speculative_blocks=1)
    ctx = ReservationContext(num_lookahead_tokens=8, max_model_len=100)
    # align: cdiv(9, 4) + 1 = 4; lookahead not reserved (none mode: cdiv(17, 4) + 1 = 6).
    assert reserved_blocks(9, s, ctx) == 4
    # align sizes from the uncapped token range: cdiv(30, 4) + 1 = 9 (capped: 6).
    assert reserved_blocks(30, s, ReservationContext(num_lookahead_tokens=8, max_model_len=20)) == 9


@pytest.mark.parametrize("k", [0, 1, 2, 3])
def test_mamba_speculative_blocks_every_mode(k: int) -> None:
    for mode in ("none", "all", "align"):
        s = spec("mamba", 16, mamba_cache_mode=mode, num_speculative_blocks=k)
        assert reserved_blocks(33, s, CTX) == 3 + k  # cdiv(33, 16) = 3


# -- uniform-type groups and mixes ----------------------------------------------
def test_uniform_type_reads_its_first_spec() -> None:
    from vllm.v1.kv_cache_interface import SlidingWindowSpec, UniformTypeKVCacheSpecs

    import torch

    from stepwarm.probe import cache_spec_from_vllm

    layers = {
        f"l{i}": SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8 * (i + 1),
                                   dtype=torch.float16, sliding_window=128)
        for i in range(2)
    }
    s = cache_spec_from_vllm(UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs=layers))
    assert (s.kind, s.block_size, s.sliding_window, s.uniform_type) == ("sliding_window", 16, 128, True)
    assert reserved_blocks(40, s, CTX) == 3  # cdiv(40, 16), as one group


def test_uniform_type_without_first_spec_as_in_vllm_0_26() -> None:
    """vLLM 0.26's UniformTypeKVCacheSpecs has kv_cache_specs and no first_spec."""
    from vllm.v1.kv_cache_interface import MambaSpec

    import torch

    from stepwarm.probe import cache_spec_from_vllm

    class UniformTypeKVCacheSpecs:  # the 0.26 shape: a dict of layer specs only
        def __init__(self, kv_cache_specs):
            self.kv_cache_specs = kv_cache_specs

    layers = {f"m{i}": MambaSpec(block_size=64, shapes=((4, 8),), dtypes=(torch.float16,),
                                 mamba_cache_mode="align", num_speculative_blocks=1)
              for i in range(2)}
    s = cache_spec_from_vllm(UniformTypeKVCacheSpecs(layers))
    assert (s.kind, s.block_size, s.mamba_cache_mode, s.num_speculative_blocks, s.uniform_type) == (
        "mamba", 64, "align", 1, True)


def test_hybrid_groups_per_group() -> None:
    specs = (
        spec("full_attention", 16),
        spec("sliding_window", 32, sliding_window=64),
        spec("mamba", 16, mamba_cache_mode="align", num_speculative_blocks=2),
        spec("cross_attention", 16),
        spec("circular_buffer", 8),
        spec("encoder_only_attention", 16),
    )
    ctx = ReservationContext(num_lookahead_tokens=4, max_model_len=4096, max_encoder_len=100)
    # 30 tokens: full cdiv(34,16)=3, SWA cdiv(34,32)=2, align cdiv(30,16)+2=4,
    # cross cdiv(100,16)=7, ring 1, encoder-only 0.
    assert reserved_blocks_per_group(30, specs, ctx) == (3, 2, 4, 7, 1, 0)


# -- ledger -------------------------------------------------------------------
def test_ledger_ids_start_at_1_and_are_distinct() -> None:
    led = BlockLedger((spec("full_attention", 4), spec("mla_attention", 8)), num_blocks=20)
    # 9 tokens: cdiv(9,4)=3 in group 0, cdiv(9,8)=2 in group 1; group order.
    assert led.grow("a", 9).appended == ((1, 2, 3), (4, 5))
    assert led.grow("b", 4).taken == ((6,), (7,))
    assert led.held("a") == ((1, 2, 3), (4, 5))
    assert led.held_counts("a") == (3, 2)
    assert led.num_held == 7 and led.num_free == 19 - 7
    assert led.live_requests() == ("a", "b")


def test_ledger_grow_deltas_and_never_shrinks() -> None:
    led = BlockLedger((spec("full_attention", 4),), num_blocks=20)
    assert led.grow("a", 4).appended == ((1,),)
    assert led.grow("a", 4).appended == ((),)  # nothing new
    assert led.grow("a", 9).appended == ((2, 3),)  # delta only
    assert led.grow("a", 1).appended == ((),)  # a smaller requirement keeps the table
    assert led.held_counts("a") == (3,)


def test_ledger_reuses_freed_ids_as_vllms_free_queue() -> None:
    """Freed uncached blocks go to the queue's head, the table's last block
    first (FreeKVCacheBlockQueue.prepend_n of reversed(blocks))."""
    led = BlockLedger((spec("full_attention", 4),), num_blocks=20)
    led.grow("a", 12)  # 1, 2, 3
    led.grow("b", 8)  # 4, 5
    assert led.free("a") == (3, 2, 1)
    assert led.free("zzz") == ()  # unknown: nothing
    assert led.grow("c", 8).appended == ((3, 2),)
    assert led.grow("d", 12).appended == ((1, 6, 7),)
    assert led.num_held == 7 and led.num_free == 12


def test_free_each_leaves_the_ledger_as_free_one_by_one() -> None:
    """free_each (a step's finished and preempted requests in one loop) ends
    where free() of each in turn ends: pool order, references, cache entries,
    tables; cached blocks (to the queue's tail) and uncached ones (its head),
    two groups, an unknown request."""
    def ledger() -> BlockLedger:
        led = BlockLedger((spec("full_attention", 4), spec("sliding_window", 4, sliding_window=4)),
                          num_blocks=60, enable_caching=True)
        for rid, n in (("a", 13), ("b", 9), ("c", 17), ("d", 5)):
            led.grow(rid, n)
            led.cache_prompt(rid, n - 1, n)
        return led

    one, each = ledger(), ledger()
    for rid in ("c", "zzz", "a", "d"):
        one.free(rid)
    each.free_each(("c", "zzz", "a", "d"))
    assert repr(each._save()) == repr(one._save())
    assert each.grow("f", 30).appended == one.grow("f", 30).appended


def test_ledger_out_of_blocks_hands_out_nothing() -> None:
    led = BlockLedger((spec("full_attention", 4),), num_blocks=4)  # 3 usable
    assert led.grow("a", 8).appended == ((1, 2),)
    with pytest.raises(OutOfBlocksError, match="needs 2 more"):
        led.grow("b", 8)
    assert led.live_requests() == ("a",)
    with pytest.raises(KeyError):
        led.held_counts("b")
    assert led.num_free == 1 and led.num_held == 2
    with pytest.raises(OutOfBlocksError):
        led.grow("a", 13)  # running request: +2 needed, 1 free
    assert led.held("a") == ((1, 2),) and led.num_free == 1
    assert led.grow("a", 12).appended == ((3,),)  # exactly num_blocks - 1 held
    assert led.num_free == 0


@pytest.mark.parametrize("appends", [False, True])
def test_freed_blocks_are_reused_first_or_after_the_fresh_ones_as_the_release_frees(appends) -> None:
    # vLLM 0.26 / 0.28 on: free_blocks prepends blocks without a cache entry
    # (last block of the table freed first, so reused first); 0.27 with
    # caching off appends them behind the never-used ids.
    for free in ("free", "free_each"):
        led = BlockLedger((spec("full_attention", 4),), num_blocks=8, uncached_frees_append=appends)
        assert led.grow("a", 12).appended == ((1, 2, 3),)
        getattr(led, free)(*(("a",) if free == "free" else (("a",),)))
        want = ((4, 5, 6, 7, 3),) if appends else ((3, 2, 1, 4, 5),)
        assert led.grow("b", 20).appended == want, free
    # with prefix caching on the rule is the cache's (no entry: prepended), on every release
    led = BlockLedger((spec("full_attention", 4),), num_blocks=8, enable_caching=True,
                      uncached_frees_append=True)
    led.grow("a", 2)
    led.free("a")
    assert led.grow("b", 2).appended == ((1,),)


def test_token_range_bound_is_never_below_the_need() -> None:
    # A token-range step skips the walk over its rows' tables
    # (_token_range_need) when the bound, read off their token counts alone,
    # fits the pool; so the bound must never be below the walk's count.
    rng = random.Random(0)
    for groups, lookahead in (((spec("full_attention", 16),), 0),
                              ((spec("full_attention", 16), spec("mla_attention", 7)), 3)):
        led = BlockLedger(groups, 100_000, ReservationContext(num_lookahead_tokens=lookahead,
                                                              max_model_len=300))
        for trial in range(50):
            rows = []
            for i in range(rng.randint(1, 20)):
                rid, held = f"r{trial}-{i}", rng.randint(0, 200)
                if held:
                    led.grow(rid, held)
                n = held + rng.randint(0, 150)
                rows.append(StepAllocation(rid, n, held, n, n))
            assert led._token_range_need(rows) <= led._token_range_bound(rows)


def test_a_step_the_bound_refuses_is_decided_by_the_need() -> None:
    # 10 usable blocks; a and b hold 4 each; growing both to 65 tokens
    # needs 2 (the 2 free), though the bound says 130 // 16 + 2 = 10.
    led = BlockLedger((spec("full_attention", 16),), num_blocks=11)
    led.grow("a", 64)
    led.grow("b", 64)
    rows = [StepAllocation(rid, 65, 64, 65, 65) for rid in ("a", "b")]
    assert led._token_range_bound(rows) == 10 > led.num_free == 2
    got = led.allocate_step((), rows)
    assert [g.appended for g in got] == [((9,),), ((10,),)] and led.num_free == 0
    with pytest.raises(OutOfBlocksError):
        led.allocate_step((), [StepAllocation("a", 81, 65, 81, 81)])
    assert led.held_counts("a") == (5,)


def test_ledger_remembers_encoder_len() -> None:
    led = BlockLedger((spec("cross_attention", 16), spec("full_attention", 16)), num_blocks=100,
                      ctx=ReservationContext(max_encoder_len=160))
    assert led.grow("x", 5, encoder_len=17).appended == ((1, 2), (3,))  # cdiv(17, 16) = 2
    assert led.grow("x", 20).appended == ((), (4,))  # no cross-attention growth
    led.free("x")  # queue head: 2, 1 (group 0 reversed), then 4, 3 in front
    assert led.grow("y", 5).appended == ((4, 3, 2, 1, 5, 6, 7, 8, 9, 10), (11,))
    assert led.grow("z", 5, encoder_len=0).appended == ((), (12,))  # no encoder input


def test_sliding_window_nulls_and_frees_blocks_out_of_the_window() -> None:
    """SlidingWindowManager.remove_skipped_blocks: with window 8 and block 4,
    after 13 computed tokens tokens 0..5 are skipped, so block 0 (tokens 0-3)
    becomes the null block and goes back to the pool; the table keeps its
    length."""
    led = BlockLedger((spec("sliding_window", 4, sliding_window=8),), num_blocks=10)
    assert led.grow("a", 13).appended == ((1, 2, 3, 4),)
    assert led.num_free == 5
    g = led.grow("a", 14, num_computed=13)  # skipped 13 - 8 + 1 = 6 tokens -> 1 block
    assert g.appended == ((),) and led.held("a") == ((0, 2, 3, 4),) and led.num_free == 6
    led.grow("a", 17, num_computed=16)  # skipped 9 -> 2 blocks; block 4 of 5 new
    # Block 1 (id 2) is freed too; freed ids come first, last freed first.
    assert led.held("a") == ((0, 0, 3, 4, 2),)
    assert led.free("a") == (2, 4, 3) and led.num_free == 9


def test_chunked_local_nulls_previous_chunks() -> None:
    led = BlockLedger((spec("chunked_local_attention", 2, attention_chunk_size=4),), num_blocks=10)
    led.grow("a", 6)  # 3 blocks
    led.grow("a", 7, num_computed=6)  # chunk 4..7 current: tokens 0-3 skipped
    assert led.held("a") == ((0, 0, 3, 2),)  # 2 freed last: reused first


def test_mamba_none_keeps_only_the_last_state() -> None:
    """MambaManager (none/all): get_num_skipped_tokens = computed - 1."""
    mamba = spec("mamba", 4, mamba_cache_mode="none", num_speculative_blocks=2)
    led = BlockLedger((mamba,), num_blocks=20)
    assert led.grow("a", 9).appended == ((1, 2, 3, 4, 5),)  # 3 + 2 speculative
    g = led.grow("a", 10, num_computed=9)  # tokens 0..7 skipped -> blocks 0, 1
    assert led.held("a") == ((0, 0, 3, 4, 5),) and g.taken == ((),)


def test_mamba_align_pads_nulls_and_frees_the_previous_state() -> None:
    """MambaManager in align mode (vLLM 0.32's KVCacheManager gives the same
    tables: [0, 1, 2] -> [0, 1, 2, 3] -> [0, 0, 2, 3, 4]): a null placeholder
    before the state block, one state block per step, the previous state
    block freed once behind the computed tokens."""
    mamba = spec("mamba", 4, mamba_cache_mode="align", num_speculative_blocks=1)
    led = BlockLedger((mamba,), num_blocks=20, enable_caching=True)
    assert led.grow("a", 8).appended == ((0, 1, 2),)  # null, state, speculative
    led.cache_prompt("a", 8)
    g = led.grow("a", 12, num_computed=8)
    assert led.held("a") == ((0, 1, 2, 3),) and g.appended == ((3,),) and g.taken == ((3,),)
    led.cache_prompt("a", 12)
    led.grow("a", 13, num_computed=12)  # state block 1 is behind: freed (cached: to the tail)
    assert led.held("a") == ((0, 0, 2, 3, 4),)


def test_prefix_hit_shares_cached_blocks_with_nulls_per_kind() -> None:
    full, swa = spec("full_attention", 4), spec("sliding_window", 4, sliding_window=4)
    mamba = spec("mamba", 4, mamba_cache_mode="all")
    led = BlockLedger((full, swa, mamba), num_blocks=40, enable_caching=True)
    led.grow("a", 13)
    led.cache_prompt("a", 13)  # 3 full blocks per group
    a = led.held("a")
    g = led.hit("b", 12)
    # full: all 3 cached blocks; window 4: tokens 0..8 skipped -> 2 nulls;
    # Mamba: only the last state.
    assert led.held("b") == (a[0][:3], (0, 0, a[1][2]), (0, 0, a[2][2]))
    assert g.taken == ((), (), ())
    led.free("a")
    assert set(a[0][:3]) <= set(led.held("b")[0])  # still held by b
    assert led.num_held == 3 + 1 + 1


# -- request-count cap ------------------------------------------------------------
def _profile(groups, **kw) -> RunnerProfile:
    return make_profile(**{**dict(runner="v2", kv_cache_groups=groups, num_blocks=11,
                                  max_model_len=4096, max_num_seqs=256,
                                  max_num_batched_tokens=8192, vocab_size=32000), **kw})


def test_max_warmup_requests_block_cap() -> None:
    full = (spec("full_attention", 16),)
    # per request cdiv(5, 16) = 1 block -> (11 - 1) // 1 = 10 requests.
    assert max_warmup_requests(_profile(full), 2, 5) == 10
    # lookahead 16: cdiv(21, 16) = 2 blocks -> 10 // 2 = 5.
    assert max_warmup_requests(_profile(full, num_lookahead_tokens=16), 2, 5) == 5
    # encoder-only groups cost nothing.
    eo = full + (spec("encoder_only_attention", 16),)
    assert max_warmup_requests(_profile(eo), 2, 5) == 10
    # + align Mamba with 2 spec blocks: 1 + (1 + 2) = 4 -> 10 // 4 = 2.
    mamba = full + (spec("mamba", 16, mamba_cache_mode="align", num_speculative_blocks=2),)
    assert max_warmup_requests(_profile(mamba), 2, 5) == 2
    # too few blocks for one request: still 1.
    assert max_warmup_requests(_profile(full, num_blocks=1), 2, 5) == 1
    # null-block writes (V2): no block cap -> max_num_seqs.
    assert max_warmup_requests(_profile(full, null_block_writes=True), 2, 5) == 256


def test_max_warmup_requests_token_and_seq_caps() -> None:
    full = (spec("full_attention", 16),)
    p = _profile(full, num_blocks=10_000, max_num_batched_tokens=8, decode_query_len=4)
    assert max_warmup_requests(p, 2, 5) == 2  # 8 // max(2, 4)
    p = _profile(full, num_blocks=10_000, max_num_seqs=3)
    assert max_warmup_requests(p, 2, 5) == 3


@pytest.mark.parametrize("num_blocks", [0, 1])
def test_a_runner_without_usable_blocks_says_so(num_blocks: int) -> None:
    led = BlockLedger((spec("full_attention", 4),), num_blocks=num_blocks)
    with pytest.raises(OutOfBlocksError, match=(
            rf"needs 1 block\(s\) for 3 tokens but the runner has no usable KV cache block "
            rf"\(num_blocks {num_blocks}; block 0 is the null block\)")):
        led.grow("a", 3)
    assert led.num_free == 0 and led.num_held == 0  # nothing handed out
