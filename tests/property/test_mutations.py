"""The properties bite: property (a) (held blocks per group == vLLM's
``KVCacheManager``) run against deliberately wrong block math finds a
counterexample for every mutant.

Each mutant replaces one entry of :data:`stepwarm.blocks.RULES` for the
duration of one run of :class:`~tests.property.test_held_counts.HeldCounts`
(generation only, no shrinking, derandomized), which must fail with the
held-count assertion.

"Align mode capped at max_model_len" is run as align mode sized like the
capped attention range (``cdiv(min(n + lookahead, max_model_len), bs)``): a
bare ``min(n, max_model_len)`` cap is an equivalent mutant, because the
scheduler never lets ``n`` (computed + scheduled) reach ``max_model_len``
in align mode's uncapped path (``num_tokens_main_model <= max_model_len - 1``
for decodes, ``<= prompt_len < max_model_len`` for prefills).
"""

from __future__ import annotations

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from stepwarm import blocks
from stepwarm.blocks import MambaRule, ReservationRule, TokenRangeRule, cdiv
from tests.property.test_held_counts import HeldCounts


class NoLookaheadTokens(TokenRangeRule):
    def blocks(self, num_tokens, spec, ctx):
        return cdiv(min(num_tokens, ctx.max_model_len), spec.block_size)


class NoLookaheadMamba(MambaRule):
    def blocks(self, num_tokens, spec, ctx):
        if spec.mamba_cache_mode == "align":
            return super().blocks(num_tokens, spec, ctx)
        return cdiv(min(num_tokens, ctx.max_model_len), spec.block_size) + spec.num_speculative_blocks


class AlignCapped(MambaRule):
    def blocks(self, num_tokens, spec, ctx):
        if spec.mamba_cache_mode != "align":
            return super().blocks(num_tokens, spec, ctx)
        covered = min(num_tokens + ctx.num_lookahead_tokens, ctx.max_model_len)
        return cdiv(covered, spec.block_size) + spec.num_speculative_blocks


class NoSpeculativeBlocks(MambaRule):
    def blocks(self, num_tokens, spec, ctx):
        return super().blocks(num_tokens, spec, ctx) - spec.num_speculative_blocks


class CrossByDecoderTokens(ReservationRule):
    def blocks(self, num_tokens, spec, ctx):
        return cdiv(num_tokens, spec.block_size)


class NoMaxModelLenCap(TokenRangeRule):
    def blocks(self, num_tokens, spec, ctx):
        return cdiv(num_tokens + ctx.num_lookahead_tokens, spec.block_size)


ATTENTION = ("full_attention", "mla_attention", "sliding_window", "chunked_local_attention")

MUTANTS = {
    "lookahead ignored": {
        **{k: NoLookaheadTokens() for k in ATTENTION}, "mamba": NoLookaheadMamba(),
    },
    "align mode capped at max_model_len": {"mamba": AlignCapped()},
    "speculative blocks dropped": {"mamba": NoSpeculativeBlocks()},
    "cross-attention sized by decoder tokens": {"cross_attention": CrossByDecoderTokens()},
    "encoder-only sized like decoder attention": {"encoder_only_attention": TokenRangeRule()},
    "max_model_len cap ignored": {k: NoMaxModelLenCap() for k in ATTENTION},
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_property_a_kills_mutant(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for kind, rule in MUTANTS[name].items():
        monkeypatch.setitem(blocks.RULES, kind, rule)
    run = settings(
        max_examples=2000, phases=[Phase.generate], derandomize=True, database=None,
        deadline=None, stateful_step_count=20, report_multiple_bugs=False,
    )
    with pytest.raises(AssertionError, match="stepwarm holds"):
        run_state_machine_as_test(HeldCounts, settings=run)


def test_correct_rules_pass_the_same_run() -> None:
    """The same run with stepwarm's rules finds nothing (the mutants fail
    because of the mutation, not the harness)."""
    run = settings(max_examples=200, phases=[Phase.generate], derandomize=True,
                   database=None, deadline=None, stateful_step_count=20)
    run_state_machine_as_test(HeldCounts, settings=run)
