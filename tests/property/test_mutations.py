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

import dataclasses

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from stepwarm import blocks
from stepwarm.blocks import ledger as ledger_module
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
    # Killed by a held count that differs, or by the refusal parity the same
    # machine checks (a mutant that counts too few blocks finds room where
    # vLLM's manager refuses: on 0.34.0's sources the first example drawn
    # since resumed requests are looked up, a Mamba group with 2 speculative
    # blocks in a pool of 2).
    with pytest.raises(AssertionError,
                       match="stepwarm holds|that stepwarm's ledger found room for"):
        run_state_machine_as_test(HeldCounts, settings=run)


def test_correct_rules_pass_the_same_run() -> None:
    """The same run with stepwarm's rules finds nothing (the mutants fail
    because of the mutation, not the harness)."""
    run = settings(max_examples=200, phases=[Phase.generate], derandomize=True,
                   database=None, deadline=None, stateful_step_count=20)
    run_state_machine_as_test(HeldCounts, settings=run)


# -- property (e): exact tables, zeroing, free blocks ------------------------------
class KeepsWindowBlocks(blocks.SlidingWindowRule):
    """Out-of-window blocks neither nulled nor freed (stepwarm before)."""

    def skipped_tokens(self, num_computed, spec):
        return 0


class KeepsEveryChunk(blocks.ChunkedLocalRule):
    def skipped_tokens(self, num_computed, spec):
        return 0


class KeepsEveryMambaState(MambaRule):
    def skipped_tokens(self, num_computed, spec):
        return 0


class AlignWithoutNullPadding(MambaRule):
    """Align mode handing out real ids for the whole range (stepwarm before)."""

    def to_allocate(self, table, num_tokens, spec, ctx):
        return max(0, self.blocks(num_tokens, spec, ctx) - len(table.ids))

    def allocate(self, table, num_tokens, spec, ctx, take):
        return ReservationRule.allocate(self, table, num_tokens, spec, ctx, take)


def _hit_with_lookahead(self, req_id, num_tokens, encoder_len=None, prompt_len=None):
    """The old prefix hit: the hit grown like a step, lookahead block included
    and counted as cached."""
    g = self.grow(req_id, num_tokens, encoder_len)
    return blocks.Growth(g.appended, tuple(() for _ in g.taken))


def _unaligned_cache_entries(specs, enable_caching):
    """Every full prompt block cached, whatever the groups' LCM (stepwarm
    before): hits take entries vLLM never made."""
    return 1


def _zero_row_major(self, group):
    return self.zeroes_new_blocks  # every group zeroed, whatever vLLM records


TABLE_MUTANTS = {
    "window blocks kept": ({"sliding_window": KeepsWindowBlocks()}, None, ("sliding_window",)),
    "local chunks kept": ({"chunked_local_attention": KeepsEveryChunk()}, None,
                          ("chunked_local_attention",)),
    "Mamba states kept": ({"mamba": KeepsEveryMambaState()}, None, ("mamba",)),
    "align mode without null placeholders": ({"mamba": AlignWithoutNullPadding()}, None,
                                             ("mamba",)),
    "prefix hit counts the lookahead block": ({}, ("hit", _hit_with_lookahead),
                                              ("full_attention",)),
    "every group zeroed": ({}, ("zeroes_group", _zero_row_major),
                           ("full_attention", "sliding_window", "mamba", "cross_attention")),
    "cache entries not aligned to the groups' LCM": (
        {}, ("prefix_cache_alignment", _unaligned_cache_entries), "mixed block sizes"),
}


@pytest.mark.parametrize("name", list(TABLE_MUTANTS))
def test_property_e_kills_mutant(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepwarm.profile import RunnerProfile
    from tests.property.strategies import kv_configs, mixed_block_size_configs
    from tests.property.test_tables import Tables

    rules, method, kinds = TABLE_MUTANTS[name]
    for kind, rule in rules.items():
        monkeypatch.setitem(blocks.RULES, kind, rule)
    if method is not None:
        # (the ledger reads prefix_cache_alignment where it imported it)
        owner = {"hit": blocks.BlockLedger, "prefix_cache_alignment": ledger_module}.get(
            method[0], RunnerProfile)
        monkeypatch.setattr(owner, method[0], method[1])

    class Narrow(Tables):
        configs = (mixed_block_size_configs() if kinds == "mixed block sizes"
                   else kv_configs(kinds=kinds))

    run = settings(
        max_examples=1500, phases=[Phase.generate], derandomize=True, database=None,
        deadline=None, stateful_step_count=20, report_multiple_bugs=False,
    )
    with pytest.raises(AssertionError):
        run_state_machine_as_test(Narrow, settings=run)


# --- Drafter rules (property (e) on drafter KV groups) ------------------------

def _drafter_without(field: str):
    """``DrafterCaching.of`` with one drafter rule dropped."""
    right = blocks.DrafterCaching.of

    def of(profile):
        return dataclasses.replace(right(profile), **{field: type(getattr(right(profile), field))()})
    return staticmethod(of)


#: name -> (the DrafterCaching field the mutant drops, drafter_configs arguments).
DRAFTER_MUTANTS = {
    "hash lookahead ignored": ("hash_lookahead_tokens",
                               {"methods": ("eagle", "mtp"), "hash_lookahead": True}),
    "multi-module MTP's re-prefillable tail cached": ("reprefill_tokens", {"methods": ("mtp",)}),
    "EAGLE group caches like the target's": ("eagle_groups", {"methods": ("eagle", "mtp")}),
}


def _drafter_run(configs):
    from tests.property.test_tables import Tables

    class Narrow(Tables):
        pass

    Narrow.configs = configs
    run = settings(
        max_examples=1500, phases=[Phase.generate], derandomize=True, database=None,
        deadline=None, stateful_step_count=20, report_multiple_bugs=False,
    )
    run_state_machine_as_test(Narrow, settings=run)


@pytest.mark.parametrize("name", list(DRAFTER_MUTANTS))
def test_property_e_kills_drafter_mutant(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from stepwarm import vllm_facts
    from tests.property.strategies import drafter_configs

    field, kwargs = DRAFTER_MUTANTS[name]
    if kwargs.get("hash_lookahead") and not vllm_facts.hash_lookahead_tokens_hashed():
        pytest.skip("the installed vLLM hashes no lookahead tokens (num_hash_lookahead_tokens: 0.33)")
    if field == "reprefill_tokens" and not vllm_facts.manager_takes_prefill_lookahead():
        pytest.skip(f"vLLM {vllm_facts.version()}'s KVCacheManager takes no num_prefill_lookahead: "
                    "it keeps no re-prefillable tail (num_reprefillable_tokens: 0.28)")
    monkeypatch.setattr(blocks.DrafterCaching, "of", _drafter_without(field))
    with pytest.raises(AssertionError, match="stepwarm|new_block_ids_to_zero"):
        _drafter_run(drafter_configs(**kwargs))
