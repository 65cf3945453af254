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

from tests.property.scheduler_oracle import Arrival, Config, Unmodelled, replay  # noqa: E402


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
        arrivals.append(Arrival(at, prompt, draw(st.integers(1, max_model_len - prompt)), abort))
    return cfg, arrivals


@pytest.mark.xfail(strict=True, reason="issue 41: a resumed request gets no prefix lookup")
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


@pytest.mark.xfail(strict=True, reason="issue 41: a resumed request gets no prefix lookup")
def test_resumed_request_gets_its_prefix_hit() -> None:
    """A 150-token prompt preempted under KV cache pressure and resumed: vLLM's
    scheduler looks the resumed request up in the prefix cache
    (``num_computed_tokens == 0``) and finds its own prompt blocks still
    cached, so it recomputes only past them, in the first block it kept."""
    cfg = Config(block_size=16, num_blocks=13)
    pairs = replay(cfg, [Arrival(0, 150, 30), Arrival(2, 30, 30)]).pairs
    resumed = [(theirs, mine) for theirs, mine in pairs if theirs.resumed]
    assert [t.index for t, _ in resumed] == [32]
    theirs, mine = resumed[0]
    assert theirs.computed == mine.computed == {"r1": 16}
    assert theirs.tokens == mine.tokens == {"r1": 42}
    assert theirs.blocks == mine.blocks == {"r1": ((1, 11, 12),)}
