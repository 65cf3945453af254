"""Named regressions: every disagreement the properties found between
stepwarm and vLLM's ``KVCacheManager``, replayed with the right value
asserted (``@example(...).via(...)``), plus generated single-request
lifecycles on top."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

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
