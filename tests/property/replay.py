"""Replay a fixed lifecycle on stepwarm's PlanBuilder and on the oracle.

Used by the named regressions (``@example``) and the ``@given`` tests that
need a plain lifecycle rather than the state machine.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import strategies as st

from stepwarm.plan import PlanBuilder, PlanError, PlannedRequest
from tests.property.oracle import Oracle, vllm_spec
from tests.property.strategies import KVConfig


@dataclass(frozen=True)
class Add:
    rid: str
    prompt_len: int
    encoder_len: int = 0


@dataclass(frozen=True)
class Step:
    prefill: dict = field(default_factory=dict)
    decode: dict = field(default_factory=dict)
    resume: dict = field(default_factory=dict)
    finish: tuple = ()
    preempt: tuple = ()


@dataclass
class Replay:
    builder: PlanBuilder
    oracle: Oracle
    refused: list[int] = field(default_factory=list)


def replay(cfg: KVConfig, ops: list) -> Replay:
    """Run ``ops`` through a PlanBuilder and the oracle; assert after every
    step that both hold the same blocks per group for every live request
    (and that a refused step leaves stepwarm's ledger unchanged; replay stops
    there)."""
    b = PlanBuilder(cfg.profile(), name="replay")
    o = Oracle(tuple(vllm_spec(s) for s in cfg.specs), cfg.num_blocks, cfg.max_model_len,
               cfg.num_lookahead_tokens, cfg.enable_caching)
    r = Replay(b, o)
    live: set[str] = set()
    tokens: dict[str, list[int]] = {}  # rid -> [prompt, computed, outputs]
    for i, op in enumerate(ops):
        if isinstance(op, Add):
            b.add_request(PlannedRequest(op.rid, op.prompt_len, encoder_len=op.encoder_len))
            o.add(op.rid, op.prompt_len, op.encoder_len)
            tokens[op.rid] = [op.prompt_len, 0, 0]
            continue
        before = {rid: b.ledger.held(rid) for rid in b.ledger.live_requests()}
        try:
            step = b.step("custom", f"op {i}", prefill=op.prefill, decode=op.decode,
                          resume=op.resume, finish=op.finish, preempt=op.preempt)
        except PlanError as e:
            assert e.field == "blocks", e
            r.refused.append(i)
            assert {rid: b.ledger.held(rid) for rid in b.ledger.live_requests()} == before
            return r  # later ops assumed this step happened
        for rid in op.finish:
            o.finish(rid)
            live.discard(rid)
        for rid in op.preempt:
            o.preempt(rid)
            live.discard(rid)
            tokens[rid][1] = 0
        for row in step.scheduled:
            n = row.num_scheduled_tokens
            assert o.schedule(row.req_id, n) is not None
            p, c, out = tokens[row.req_id]
            outs = n if row.req_id in op.decode else int(c + n == p + out)
            o.advance(row.req_id, n, outs)
            tokens[row.req_id] = [p, c + n, out + outs]
            live.add(row.req_id)
        for rid in live:
            assert b.ledger.held_counts(rid) == o.held_counts(rid), (rid, i)
    return r


@st.composite
def single_request_ops(draw, cfg: KVConfig) -> list:
    """One request: prompt, prefill in chunks (one chunk with a Mamba align
    group), decodes of 1 or 1 + k tokens, finish."""
    mml = cfg.max_model_len
    prompt = draw(st.integers(1, mml - 1))
    enc = cfg.max_encoder_len if cfg.is_encoder_decoder else 0
    ops: list = [Add("r0", prompt, enc)]
    done = 0
    while done < prompt:
        n = prompt - done if cfg.mamba_align_block_size else draw(st.integers(1, prompt - done))
        ops.append(Step(prefill={"r0": n}))
        done += n
    num_tokens = prompt + 1
    for _ in range(draw(st.integers(0, 6))):
        if num_tokens >= mml:
            break
        k = draw(st.integers(0, max(0, min(cfg.num_speculative_steps, mml - num_tokens - 1))))
        ops.append(Step(decode={"r0": k}))
        num_tokens += 1 + k
    ops.append(Step(finish=("r0",)))
    return ops
