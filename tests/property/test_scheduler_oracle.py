"""vLLM's real ``Scheduler`` as the oracle (issue 41 item 1): random request
streams (arrivals over steps, prompts across block boundaries, every prompt a
prefix of the others, KV cache pressure with preemption and resumption,
chunked prefill under a small ``max_num_batched_tokens``, finishes and aborts)
run through vLLM's scheduler and stepwarm's planner, step by step
(:mod:`tests.property.scheduler_oracle`)."""

from __future__ import annotations

import pytest
from hypothesis import assume, event, given
from hypothesis import strategies as st

pytest.importorskip("vllm.v1.core.sched.scheduler")

from stepwarm.blocks import BlockLedger  # noqa: E402
from stepwarm.plan import PlanBuilder  # noqa: E402
from tests.property.scheduler_oracle import (  # noqa: E402
    Arrival, Config, Replay, Unmodelled, replay)


@st.composite
def streams(draw: st.DrawFn) -> tuple[Config, list[Arrival]]:
    bs = draw(st.sampled_from([2, 4, 8, 16]))
    max_model_len = draw(st.sampled_from([32, 64, 96]))
    # at least one whole request fits the pool (else vLLM preempts it forever)
    num_blocks = draw(st.integers(max_model_len // bs + 1, max_model_len // bs * 2 + 1))
    cfg = Config(
        block_size=bs, num_blocks=num_blocks,
        max_num_seqs=draw(st.integers(1, 4)),
        max_num_batched_tokens=draw(st.sampled_from([8, 16, 32, 64])),
        max_model_len=max_model_len,
        enable_caching=draw(st.sampled_from([True, True, True, False])),
    )
    arrivals = []
    for _ in range(draw(st.integers(1, 6))):
        prompt = draw(st.integers(1, max_model_len - 2))
        at = draw(st.integers(0, 6))
        abort = draw(st.none() | st.integers(at, at + 12))
        # (often to max_model_len: long decodes fill the pool, and preempt)
        room = max_model_len - prompt
        arrivals.append(Arrival(at, prompt, draw(st.integers(1, room) | st.just(room)), abort))
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
    theirs = [p[0] for p in r.pairs]
    if r.renumbered:
        event("block ids renumbered")
    if any(r.preempted for r in theirs):
        event("preempted")
    if any(r.resumed for r in theirs):
        event("resumed")
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
}


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_resumed_request_gets_its_prefix_hit(name: str) -> None:
    """vLLM's scheduler looks a resumed request up in the prefix cache
    (``num_computed_tokens == 0`` -> ``get_computed_blocks``) and recomputes
    only past its hit; stepwarm's planner does the same, block ids exact."""
    cfg, arrivals, expected = REGRESSIONS[name]
    got = _resumed(replay(cfg, arrivals))
    assert got == expected


def _no_lookup(self: PlanBuilder, req_id: str) -> int:
    return self.num_computed_tokens(req_id)


_lookup = BlockLedger.lookup


def _prompt_only(self: BlockLedger, req_id: str, prompt_len: int, num_tokens: int) -> int:
    return _lookup(self, req_id, prompt_len, min(num_tokens, prompt_len + 1))


@pytest.mark.parametrize(("mutant", "name"), [
    ((PlanBuilder, "resume_lookup", _no_lookup), "resumed prompt of one block"),
    ((PlanBuilder, "resume_lookup", _no_lookup), "150-token prompt resumed after a 128-token hit"),
    ((BlockLedger, "lookup", _prompt_only), "hit on the request's own sampled tokens"),
], ids=["no resume lookup", "no resume lookup (150 tokens)", "lookup of prompt blocks only"])
def test_wrong_resume_rule_is_caught(monkeypatch: pytest.MonkeyPatch, mutant: tuple,
                                     name: str) -> None:
    """Mutants of the resume rule: no lookup at all (the rule before issue
    41), and a lookup that ignores blocks holding the request's sampled
    tokens. The oracle names the resumed step's computed tokens."""
    monkeypatch.setattr(*mutant)
    cfg, arrivals, _ = REGRESSIONS[name]
    with pytest.raises(AssertionError, match=r"computed: vLLM \{'r\d': \d+\} stepwarm"):
        replay(cfg, arrivals)
