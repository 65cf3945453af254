"""stepwarm's plans of vLLM's warmup equal what vLLM's own warmup builds.

vLLM's real ``warmup_kernels`` and ``run_mixed_prefill_decode_warmup`` run
here against a runner object that only carries the facts they read, with
``execute_model`` / ``sample_tokens`` replaced by a recorder; their
``SchedulerOutput``s are compared field by field with the ones stepwarm
compiles from its plans.
"""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from stepwarm import vllm_facts
from stepwarm.compile import to_grammar_output, to_scheduler_output
from stepwarm.profile import WARMUP_DECODES_0_32, CacheSpec, RunnerProfile
from stepwarm.sequences import mixed_prefill_decode_plan, warmup_kernels_plan
from tests.helpers import make_profile

warmup = pytest.importorskip("vllm.v1.worker.gpu.warmup")
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)


def _vllm_spec(spec: CacheSpec) -> Any:
    common = dict(block_size=spec.block_size)
    attn = dict(num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
    if spec.kind == "full_attention":
        return FullAttentionSpec(**common, **attn)
    if spec.kind == "cross_attention":
        return CrossAttentionSpec(**common, **attn)
    if spec.kind == "sliding_window":
        return SlidingWindowSpec(**common, **attn, sliding_window=spec.sliding_window)
    if spec.kind == "mamba":
        return MambaSpec(**common, shapes=((4,),), dtypes=(torch.float32,),
                         mamba_cache_mode=spec.mamba_cache_mode,
                         num_speculative_blocks=spec.num_speculative_blocks)
    raise AssertionError(spec.kind)


def _runner(p: RunnerProfile) -> SimpleNamespace:
    """The facts vLLM's warmup functions read off a V2 GPUModelRunner."""
    groups = [KVCacheGroupSpec([f"layer{i}"], _vllm_spec(s)) for i, s in enumerate(p.kv_cache_groups)]
    spec_config = (SimpleNamespace(num_speculative_tokens=p.num_speculative_steps,
                                   max_num_new_slots_for_drafting=p.warmup_draft_slots)
                   if p.num_speculative_steps else None)
    return SimpleNamespace(
        vllm_config=SimpleNamespace(is_mm_encoder_only=False,
                                    num_lookahead_tokens=p.num_lookahead_tokens,
                                    speculative_config=spec_config,
                                    # vLLM 0.34: blocks per DCP rank
                                    parallel_config=SimpleNamespace(decode_context_parallel_size=1)),
        # vLLM 0.34: the token budget (_cap_num_warmup_reqs), the drafter,
        # an extensible cache
        max_num_tokens=p.max_num_batched_tokens, speculator=None, extensible_kv_cache=None,
        speculative_config=spec_config,
        num_speculative_steps=p.num_speculative_steps,
        decode_query_len=p.decode_query_len,
        is_pooling_model=False,
        is_encoder_decoder=p.is_encoder_decoder,
        is_encoder_only=False,  # read by vLLM 0.28's warmup_kernels
        kv_cache_config=KVCacheConfig(num_blocks=p.num_blocks, kv_cache_tensors=[],
                                      kv_cache_groups=groups),
        model_state=SimpleNamespace(max_encoder_len=p.max_encoder_len),
        scheduler_config=SimpleNamespace(max_num_seqs=p.max_num_seqs,
                                         max_num_batched_tokens=p.max_num_batched_tokens),
        max_model_len=p.max_model_len,
        max_num_reqs=p.max_num_seqs,
        block_tables=None,
        kv_block_zeroer=None,
        model_config=SimpleNamespace(get_vocab_size=lambda: p.vocab_size),
        is_last_pp_rank=p.is_last_pp_rank,
        kv_connector=SimpleNamespace(set_disabled=lambda disabled: None),
        adaptive_verification=None,
        rejection_sampler=None,
    )


#: What the installed vLLM's warmup does (read_profile copies the same facts).
WARMUP = vllm_facts.warmup_facts()


def _profile(**kw: Any) -> RunnerProfile:
    return make_profile(**{**dict(runner="v2", max_num_batched_tokens=64,
                                  grammar_rows_per_position=WARMUP.bitmask_rows_per_request > 1,
                                  warmup_greedy_pass=WARMUP.greedy_pass,
                                  mixed_warmup_drafts=WARMUP.mixed_drafts,
                                  warmup_decodes=WARMUP.decode_steps), **kw})


PROFILES = {
    "no-spec": _profile(),
    "spec-2": _profile(num_speculative_steps=2, decode_query_len=3, num_lookahead_tokens=2),
    "spec-one-request": _profile(num_speculative_steps=1, decode_query_len=2, max_num_seqs=1),
    "one-request": _profile(max_num_seqs=1),
    "block-capped": _profile(num_blocks=4, kv_cache_groups=(CacheSpec(kind="full_attention", block_size=2),)),
    "token-capped": _profile(max_num_batched_tokens=5, num_speculative_steps=1, decode_query_len=2),
    # a draft model's extra slot a request: vLLM 0.34 keeps it out of the
    # budget when it caps the requests (10 // (3 + 1) = 2, not 10 // 3 = 3)
    "draft-slot-capped": _profile(max_num_batched_tokens=10, max_num_seqs=8, num_speculative_steps=1,
                                  decode_query_len=2, num_lookahead_tokens=1,
                                  warmup_draft_slots=int(WARMUP.caps_draft_slots)),
    "hybrid": _profile(
        num_speculative_steps=3, decode_query_len=4, num_lookahead_tokens=3, max_model_len=28,
        kv_cache_groups=(
            CacheSpec(kind="full_attention", block_size=4),
            CacheSpec(kind="sliding_window", block_size=4, sliding_window=4),
            CacheSpec(kind="mamba", block_size=4, mamba_cache_mode="align", num_speculative_blocks=2),
        ),
    ),
    "not-last-pp-rank": _profile(is_last_pp_rank=False),
    # Whisper's kind: every request cross-attends to a dummy encoder input
    # vLLM registers and never encodes
    "encoder-decoder": _profile(
        is_encoder_decoder=True, max_encoder_len=40, encoder_budget=40,
        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=16),
                         CacheSpec(kind="cross_attention", block_size=16))),
}


def _record(fn, *args: Any, **kw: Any) -> list[Any]:
    calls: list[Any] = []
    fn(*args, lambda so: calls.append(so), lambda go: calls.append(go), **kw)
    return calls


def _norm_id(req_id: str) -> str:
    m = re.fullmatch(r"_(?:warmup|stepwarm|stepwarm_greedy)_(\d+)_", req_id)
    if m:
        return f"req{m.group(1)}"
    return req_id.replace("_v2_mixed_warmup_", "mixed_").replace("_stepwarm_mixed_", "mixed_").rstrip("_")


def _norm_blocks(block_ids: Any) -> Any:
    return None if block_ids is None else tuple(tuple(ids) for ids in block_ids)


def _normalize(obj: Any) -> Any:
    """The fields vLLM's warmup sets, with request ids made comparable.

    ``num_output_tokens`` is left out on purpose: vLLM's warmup reports 1 on
    every decode step, stepwarm the tokens actually sampled so far (what the
    scheduler reports), so the V1 runner does not truncate its outputs.
    """
    if obj is None:
        return None
    if isinstance(obj, GrammarOutput):
        return ("grammar", [_norm_id(r) for r in obj.structured_output_request_ids],
                obj.grammar_bitmask.shape, obj.grammar_bitmask.dtype.str,
                bool((obj.grammar_bitmask == -1).all()))
    assert isinstance(obj, SchedulerOutput)
    new = sorted(
        (_norm_id(r.req_id), tuple(r.prompt_token_ids), tuple(r.prefill_token_ids or ()),
         _norm_blocks(r.block_ids), r.num_computed_tokens,
         type(r.sampling_params).__name__,
         tuple((f.data is None, f.modality, f.mm_position.offset, f.mm_position.length)
               for f in r.mm_features),
         getattr(r.sampling_params, "temperature", None) == 0)
        for r in obj.scheduled_new_reqs
    )
    c = obj.scheduled_cached_reqs
    cached = sorted(
        (_norm_id(rid), n, _norm_blocks(b))
        for rid, n, b in zip(c.req_ids, c.num_computed_tokens, c.new_block_ids)
    )
    return (
        "step", new, cached,
        sorted((_norm_id(k), v) for k, v in obj.num_scheduled_tokens.items()),
        obj.total_num_scheduled_tokens,
        sorted((_norm_id(k), tuple(v)) for k, v in obj.scheduled_spec_decode_tokens.items()),
        sorted(_norm_id(r) for r in obj.finished_req_ids),
        sorted((_norm_id(k), tuple(v)) for k, v in obj.scheduled_encoder_inputs.items()),
        sorted(obj.free_encoder_mm_hashes),
        # The scheduler sets it; vLLM 0.26 - 0.31's warmup leaves it at 0.
        obj.num_spec_tokens_to_schedule if WARMUP.sets_num_spec_tokens_to_schedule else None,
    )


def _renumbered(calls: list[Any], profile: RunnerProfile) -> list[Any]:
    """``calls`` (normalized) with block ids renumbered in order of first
    appearance (0, the null block, kept), and Mamba align groups' tables
    reduced to their length.

    The one deliberate difference from vLLM's own warmup: stepwarm's tables
    are the scheduler's, where ``MambaManager`` puts null placeholders before
    the state block and ``SlidingWindowManager`` / chunked local attention
    null and free blocks that fell out of the window (reused by later
    requests); ``warmup_kernels`` hands out fresh real ids there. That shifts
    later ids, hence the renumbering; lengths and every other group's ids (up
    to the renumbering) must still agree.
    """
    masked = {g for g, s in enumerate(profile.kv_cache_groups)
              if s.kind in ("mamba", "sliding_window", "chunked_local_attention")
              or not WARMUP.reserves_lookahead}
    ids: dict[int, int] = {0: 0}

    def blocks(b: Any) -> Any:
        if b is None:
            return None
        return tuple(("len", len(g)) if i in masked else
                     tuple(ids.setdefault(x, len(ids)) for x in g) for i, g in enumerate(b))

    out = []
    for c in calls:
        if c is None or c[0] != "step":
            out.append(c)
            continue
        new = [r[:3] + (blocks(r[3]),) + r[4:] for r in c[1]]
        cached = [r[:2] + (blocks(r[2]),) for r in c[2]]
        out.append((c[0], new, cached) + c[3:])
        if c[6] and not c[1] and not c[2]:
            # A cleanup: vLLM 0.33's second (greedy) warmup pass hands out
            # fresh ids from 1 again; the scheduler's pool (stepwarm's
            # ledger) hands back the freed ones in its free-queue order.
            ids.clear()
            ids[0] = 0
    return out


def _lengths(calls: list[Any]) -> list[int]:
    """Every block-table length of ``_renumbered`` calls, in order."""
    out: list[int] = []

    def walk(x: Any) -> None:
        if isinstance(x, tuple) and len(x) == 2 and x[0] == "len":
            out.append(x[1])
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
    walk(calls)
    return out


def _no_lengths(calls: list[Any]) -> Any:
    if isinstance(calls, tuple) and len(calls) == 2 and calls[0] == "len":
        return "len"
    if isinstance(calls, (tuple, list)):
        return type(calls)(_no_lengths(c) for c in calls)
    return calls


def _held(calls: list[Any]) -> list[Any]:
    """``_renumbered`` calls (every table reduced to its length) with each
    cached request's ``new_block_ids`` replaced by the table it holds after
    the step, per group: its prefill table plus every delta so far."""
    held: dict[str, list[int]] = {}
    out = []
    for c in calls:
        if c is None or c[0] != "step":
            out.append(c)
            continue
        for r in c[1]:
            held[r[0]] = [n for _, n in r[3]]
        cached = []
        for rid, computed, delta in c[2]:
            if delta is not None:
                held[rid] = [n + d for n, (_, d) in zip(held[rid], delta)]
            cached.append((rid, computed, tuple(("len", n) for n in held[rid])))
        out.append((c[0], c[1], cached) + c[3:])
    return out


def _assert_same_steps(ours: list[Any], theirs: list[Any], profile: RunnerProfile) -> None:
    """``ours`` equals ``theirs`` call by call. Where the installed warmup
    does not reserve the scheduler's lookahead slots (vLLM 0.26 - 0.27,
    whose warmup tables cover the scheduled tokens only; 0.28's
    ``_reserved_block_count`` reserves "what ``KVCacheManager.allocate_slots``
    reserves"), stepwarm keeps the scheduler's tables: after every step each
    request's table is at least as long as vLLM's, and everything else is
    equal. Without lookahead or Mamba speculative blocks the two are equal
    call by call, new blocks and their lengths included. (With them, and
    several decode steps (0.27), a lookahead block arrives a step earlier in
    the scheduler's table than in the warmup's, so the step that hands it out
    differs: the tables held are compared, not the steps' new blocks.)"""
    assert len(ours) == len(theirs)
    if WARMUP.reserves_lookahead:
        for i, (a, b) in enumerate(zip(ours, theirs)):
            assert a == b, f"call {i} differs"
        return
    extra = profile.num_lookahead_tokens or any(s.num_speculative_blocks for s in profile.kv_cache_groups)
    if not extra:
        assert _no_lengths(ours) == _no_lengths(theirs)
        assert _lengths(ours) == _lengths(theirs)
        return
    ours, theirs = _held(ours), _held(theirs)
    assert _no_lengths(ours) == _no_lengths(theirs)
    mine, vllms = _lengths(ours), _lengths(theirs)
    assert len(mine) == len(vllms)
    assert all(a >= b for a, b in zip(mine, vllms))


def test_mamba_align_tables_have_the_schedulers_null_placeholders():
    """Where ``_renumbered`` masks vLLM's warmup: stepwarm's first Mamba
    align table is [null, state, speculative...] as ``MambaManager`` builds it."""
    profile = PROFILES["hybrid"]
    step = warmup_kernels_plan(profile).steps[0]
    mamba = step.scheduled[0].block_ids[2]
    assert mamba[0] == 0 and all(mamba[1:]) and len(mamba) == 4  # cdiv(5, 4) + 2


def test_encoder_decoder_warmup_is_one_prefill_that_encodes_nothing():
    """vLLM 0.26 - 0.33's warmup_kernels: each request carries a dummy
    encoder input without data, registered and never scheduled; the budget
    (40 tokens, one input) does not split the prefill."""
    plan = warmup_kernels_plan(PROFILES["encoder-decoder"])
    prefill = plan.steps[0]
    assert prefill.kind == "prefill" and len(prefill.scheduled) == len(plan.requests) > 1
    assert all(r.encoder_inputs == () for s in plan.steps for r in s.scheduled)
    assert all(r.encoder_cached and r.encoder_len == 40 for r in plan.requests)
    # cross-attention: cdiv(40, 16) = 3 blocks per request, at the prefill
    assert prefill.new_block_counts[1] == 3 * len(plan.requests)
    out = to_scheduler_output(prefill, plan, PROFILES["encoder-decoder"], {})
    assert out.scheduled_encoder_inputs == {}
    assert [(f.data, f.mm_position.length) for r in out.scheduled_new_reqs
            for f in r.mm_features] == [(None, 40)] * len(plan.requests)


def _ours(plan, profile: RunnerProfile) -> list[Any]:
    calls: list[Any] = []
    params: dict = {}
    for step in plan.steps:
        calls.append(to_scheduler_output(step, plan, profile, params))
        if step.sample:
            calls.append(to_grammar_output(step, profile))
    return calls


@pytest.fixture(autouse=True)
def _no_accelerator_sync(monkeypatch):
    # vLLM's warmup ends with torch.accelerator.synchronize(); there is none here.
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: None)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_warmup_kernels_plan_equals_vllm_warmup_kernels(name):
    profile = PROFILES[name]
    theirs = _renumbered(
        [_normalize(o) for o in _record(warmup.warmup_kernels, _runner(profile))], profile)
    ours = _renumbered([_normalize(o) for o in _ours(warmup_kernels_plan(profile), profile)],
                       profile)
    _assert_same_steps(ours, theirs, profile)


# Not "encoder-decoder": vLLM's mixed warmup gives its requests no encoder
# input but cross-attention blocks all the same (which cross-attention, with 0
# encoder tokens, does not read); stepwarm's carry neither.
@pytest.mark.parametrize("name", sorted(set(PROFILES) - {"encoder-decoder"}))
def test_mixed_prefill_decode_plan_equals_vllm(name):
    profile = PROFILES[name]
    num_tokens = min(16, profile.max_num_batched_tokens, profile.max_model_len)
    calls: list[Any] = []
    ran = warmup.run_mixed_prefill_decode_warmup(
        _runner(profile), calls.append, calls.append, num_tokens
    )
    plan = mixed_prefill_decode_plan(profile)
    assert ran == (not plan.skipped)
    # vLLM samples the mixed steps with no GrammarOutput (None).
    ours = _renumbered([_normalize(o) for o in _ours(plan, profile)], profile)
    _assert_same_steps(ours, _renumbered([_normalize(o) for o in calls], profile), profile)


def test_spec_profile_step_shapes():
    """Hand-checked: 2 drafts, 4 requests of 4 tokens, vLLM 0.27 - 0.33's
    decode steps (the profile's default ``warmup_decodes``)."""
    plan = warmup_kernels_plan(PROFILES["spec-2"].model_copy(
        update={"warmup_decodes": WARMUP_DECODES_0_32}))
    one_pass = [
        ("prefill", "prefill 4 x 4"),
        ("spec_decode", "decode all"),
        ("mixed_decode", "decode [0,1] spec+non-spec"),
        ("decode", "decode [0,1] non-spec"),
        ("spec_decode", "decode [0]"),
        ("decode", "decode [0] non-spec"),
        ("cleanup", "cleanup"),
    ]
    # vLLM 0.33 runs the pass again with SamplingParams(temperature=0).
    greedy = [(k, label + " (greedy)") for k, label in one_pass] if WARMUP.greedy_pass else []
    assert [(s.kind, s.label) for s in plan.steps] == one_pass + greedy
    tokens = [16, 12, 4, 2, 3, 1, 0]
    assert [s.total_num_scheduled_tokens for s in plan.steps] == tokens * (2 if greedy else 1)
    # block_size 16, lookahead 2: a 4-token prompt holds cdiv(6, 16) = 1 block.
    assert plan.steps[0].new_block_counts == (4,)


def test_warmup_past_max_model_len_is_refused_before_any_step():
    """vLLM's warmup decodes 5 x decode_query_len tokens past a 5-token prompt
    whatever max_model_len is; stepwarm refuses to plan past it."""
    from stepwarm.plan import PlanError

    profile = _profile(num_speculative_steps=3, decode_query_len=4, max_model_len=9)
    # Step 1 decodes 4 tokens after the prefill's sampled one: 5 + 1 + 4 > 9.
    with pytest.raises(PlanError, match=r"would reach 10 tokens \(prompt 5 \+ 5 sampled\), "
                       "beyond max_model_len 9") as info:
        warmup_kernels_plan(profile)
    assert info.value.step == 1 and info.value.field == "tokens"


def test_one_decode_warmup_step_shapes():
    """Hand-checked: vLLM 0.26's warmup (``warmup_decodes`` of one "decode
    all" step) with 2 drafts: prefill 4 x 4, one spec decode of 4 x 3
    tokens, cleanup; the blocks sized for that one decode step, so a
    7-block cache holds 2 requests (cdiv(4 + 3 + 2, 4) = 3 blocks each,
    (7 - 1) // 3 = 2; 0.27 - 0.33's five decode steps: cdiv(4 + 15 + 2, 4)
    = 6 blocks, 1 request)."""
    one = {k: ("all:S" if k.startswith("spec") else "all:N",) for k in WARMUP_DECODES_0_32}
    kv = (CacheSpec(kind="full_attention", block_size=4),)
    profile = PROFILES["spec-2"].model_copy(update={
        "warmup_decodes": one, "warmup_greedy_pass": False, "num_blocks": 7, "kv_cache_groups": kv})
    plan = warmup_kernels_plan(profile)
    assert [(s.kind, s.label, s.total_num_scheduled_tokens) for s in plan.steps] == [
        ("prefill", "prefill 2 x 4", 8), ("spec_decode", "decode all", 6), ("cleanup", "cleanup", 0)]
    later = warmup_kernels_plan(profile.model_copy(update={"warmup_decodes": WARMUP_DECODES_0_32}))
    assert later.steps[0].label == "prefill 1 x 4"
