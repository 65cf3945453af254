"""One test per version fact of :mod:`stepwarm.vllm_facts`, run on every
release of the matrix (``nox -s compat``): each probed fact agrees with what
the installed vLLM does on an input other than the probe's own."""

from __future__ import annotations

import dataclasses
import json
import logging

import pytest
import torch

from stepwarm import vllm_facts
from stepwarm.probe import installed_facts, unsupported
from stepwarm.profile import CacheSpec, tiny_profile
from stepwarm.scenario import ScenarioError, plans_for


@pytest.fixture(autouse=True)
def _no_accelerator_sync(monkeypatch):
    monkeypatch.setattr(torch.accelerator, "synchronize", lambda *a, **k: None)


def test_warmup_facts_hold_for_another_speculator_and_batch():
    """Passes, greedy pass, bitmask rows and num_spec_tokens_to_schedule as
    vLLM's warmup_kernels sends them with 3 drafts and 3 requests."""
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

    facts = vllm_facts.warmup_facts()
    assert facts is not None
    calls = vllm_facts.record_warmup(vllm_facts._recording_runner(num_spec=3, num_reqs=3))
    prefills = [c for c in calls if isinstance(c, SchedulerOutput) and c.scheduled_new_reqs]
    assert len(prefills) == facts.passes
    assert facts.greedy_pass == any(r.sampling_params.temperature == 0
                                    for p in prefills[1:] for r in p.scheduled_new_reqs)
    grammar = [c for c in calls if isinstance(c, GrammarOutput)]
    assert [g.grammar_bitmask.shape[0] for g in grammar] == (
        [3 * (4 if facts.bitmask_rows_per_request > 1 else 1)] * facts.passes)
    spec = [c for c in calls if isinstance(c, SchedulerOutput) and c.scheduled_spec_decode_tokens]
    assert {c.num_spec_tokens_to_schedule for c in spec} == (
        {3} if facts.sets_num_spec_tokens_to_schedule else {0})
    # The decode steps (probed with 1 draft) are the same with 3 drafts.
    assert vllm_facts.decode_steps(calls) == facts.decode_steps["spec3"]
    decodes = [c for c in calls[calls.index(prefills[0]) + 1:]
               if isinstance(c, SchedulerOutput) and c.scheduled_cached_reqs.req_ids]
    assert len(decodes) == len(facts.decode_steps["spec3"]) * facts.passes
    assert all(len(c.scheduled_spec_decode_tokens.get(r, [0] * 3)) == 3
               for c in decodes for r in c.scheduled_cached_reqs.req_ids)


def test_lookahead_reservation_holds_for_three_drafts():
    """reserves_lookahead (probed with 1 draft, block size 1) as vLLM's
    warmup_kernels sizes a 5-token prompt with 3 drafts in blocks of 2:
    cdiv(5 + 3, 2) = 4 blocks with the lookahead slots, cdiv(5, 2) = 3 without."""
    from vllm.v1.core.sched.output import SchedulerOutput

    facts = vllm_facts.warmup_facts()
    assert facts is not None
    calls = vllm_facts.record_warmup(vllm_facts._recording_runner(num_spec=3, block_size=2))
    prefill = next(c for c in calls if isinstance(c, SchedulerOutput) and c.scheduled_new_reqs)
    assert {len(r.block_ids[0]) for r in prefill.scheduled_new_reqs} == (
        {4} if facts.reserves_lookahead else {3})


def test_warmup_without_speculator_is_one_pass_one_row():
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

    calls = vllm_facts.record_warmup(vllm_facts._recording_runner(num_spec=0, num_reqs=2))
    assert sum(isinstance(c, SchedulerOutput) and bool(c.scheduled_new_reqs) for c in calls) == 1
    (grammar,) = [c for c in calls if isinstance(c, GrammarOutput)]
    assert grammar.grammar_bitmask.shape[0] == 2


@pytest.mark.parametrize("mode", ["none", "all", "align"])
def test_mamba_mode_refusal_is_the_managers(mode):
    """A mode is refused with prefix caching exactly where vLLM's
    KVCacheManager refuses it (0.33: none and all), with vLLM's reason;
    stepwarm then refuses the profile before any step with that reason."""
    from tests.property.oracle import Oracle, vllm_spec

    specs = (CacheSpec(kind="full_attention", block_size=4),
             CacheSpec(kind="mamba", block_size=4, mamba_cache_mode=mode))
    refused = vllm_facts.mamba_modes_refused_with_caching()
    assert "align" not in refused
    try:
        Oracle(tuple(vllm_spec(s) for s in specs), 64, 32, 0, True)
    except (AssertionError, ValueError) as e:
        assert refused.get(mode) == str(e)
    else:
        assert mode not in refused
    why = unsupported(specs, enable_caching=True)
    assert (why != "") == (mode in refused)
    if why:
        assert refused[mode] in why and "\n" not in why
        profile = tiny_profile().model_copy(update={"kv_cache_groups": specs, "unsupported": why})
        with pytest.raises(ScenarioError, match="cannot run on this runner"):
            plans_for(["default"], profile)
    assert unsupported(specs, enable_caching=False) == ""


def test_zeroed_groups_are_the_managers():
    """records_new_block_ids reads the manager vLLM builds (None where this
    release's get_manager_for_kv_cache_spec takes no needs_kv_cache_zeroing)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float32)
    mamba = MambaSpec(block_size=4, shapes=((4,),), dtypes=(torch.float32,))
    got = (vllm_facts.records_new_block_ids(full), vllm_facts.records_new_block_ids(mamba))
    assert got in ((True, False), (None, None))


def test_fine_grained_hits_are_the_registrys():
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float32)
    try:
        from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry
    except ImportError:
        assert vllm_facts.fine_grained_hits(full) is None
        return
    try:
        manager = KVCacheSpecRegistry.get_manager_class(full, None)
    except TypeError:
        # vLLM 0.26 - 0.29: get_manager_class(spec) takes no role. 0.26 and
        # 0.27's coordinator does not ask the managers (the fact stays None:
        # stepwarm's rule there, partial hits do not ask the other managers,
        # although the managers carry the attribute); 0.28 and 0.29's does.
        import inspect

        from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

        asks = "supports_fine_grained_hash_lookup" in inspect.getsource(
            HybridKVCacheCoordinator.__init__)
        manager = KVCacheSpecRegistry.get_manager_class(full)
        assert vllm_facts.fine_grained_hits(full) == (
            bool(manager.supports_fine_grained_hash_lookup) if asks else None)
        return
    flag = getattr(manager, "supports_fine_grained_hash_lookup", None)
    assert vllm_facts.fine_grained_hits(full) == (None if flag is None else bool(flag))


def test_every_required_step_field_is_known():
    assert vllm_facts.unknown_required_fields() == []


def test_unknown_required_field_is_a_one_line_refusal_before_step_1():
    """A release whose SchedulerOutput gains a required field stepwarm does
    not know: one line naming it, and no plan (never a TypeError mid-step)."""
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

    @dataclasses.dataclass
    class NewerSchedulerOutput(SchedulerOutput):
        routing_plan: list[int] = dataclasses.field(kw_only=True)

    classes = {"SchedulerOutput": NewerSchedulerOutput, "NewRequestData": NewRequestData}
    assert vllm_facts.unknown_required_fields(classes) == ["SchedulerOutput.routing_plan"]
    with pytest.raises(vllm_facts.VllmFactsError) as e:
        vllm_facts.check_step_fields(classes)
    msg = str(e.value)
    assert "\n" not in msg and "SchedulerOutput.routing_plan" in msg
    assert f"vLLM {vllm_facts.version()}" in msg
    profile = tiny_profile().model_copy(update={"unsupported": msg})
    with pytest.raises(ScenarioError) as refused:
        plans_for(["default"], profile)
    assert "SchedulerOutput.routing_plan" in str(refused.value)


def test_unknown_release_logs_one_line_with_the_facts(monkeypatch, caplog):
    monkeypatch.setattr(vllm_facts, "version", lambda: "0.99.0")
    vllm_facts.log_if_unchecked.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="stepwarm"):
            assert vllm_facts.log_if_unchecked() is True
    finally:
        vllm_facts.log_if_unchecked.cache_clear()
    (rec,) = [r for r in caplog.records if "0.99.0" in r.getMessage()]
    line = rec.getMessage()
    assert "\n" not in line and "not in stepwarm's matrix" in line and "bitmask_rows_per_request" in line


def test_installed_release_is_in_the_matrix():
    release = vllm_facts.version().split("+")[0]
    assert release in vllm_facts.CHECKED_RELEASES
    from tests.compat.release import RELEASES

    assert tuple(RELEASES) == vllm_facts.CHECKED_RELEASES


def test_installed_facts_follow_the_runner_kind():
    facts = vllm_facts.warmup_facts()
    groups = (CacheSpec(kind="full_attention", block_size=16),)
    v2, v1 = installed_facts("v2", groups, True), installed_facts("v1", groups, True)
    assert v2["grammar_rows_per_position"] == (facts.bitmask_rows_per_request > 1)
    assert v1["grammar_rows_per_position"] is False
    assert v1["warmup_greedy_pass"] == v2["warmup_greedy_pass"] == facts.greedy_pass


def test_checkpoint_rule_is_the_managers():
    """The probe answers by what vLLM's KVCacheManager does (True on 0.32,
    False on 0.26 / 0.30 / 0.33), and cache_spec_from_vllm carries it on
    Mamba groups only."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    from stepwarm.probe import cache_spec_from_vllm

    recached = vllm_facts.checkpoint_recached()
    assert recached in (True, False)
    mamba = MambaSpec(block_size=4, shapes=((4,),), dtypes=(torch.float32,),
                      mamba_cache_mode="align")
    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float32)
    assert cache_spec_from_vllm(mamba).checkpoint_recached is recached
    assert cache_spec_from_vllm(full).checkpoint_recached is None


def _speculative_config(method: str, k: int, mtp_layers: int = 1, no_drop: bool = False):
    """A stand-in carrying what the installed vLLM's ``SpeculativeConfig``
    methods read, with those methods (the release's own) bound to it."""
    from types import SimpleNamespace

    from vllm.config import SpeculativeConfig

    # n_predict: vLLM 0.34's num_mtp_modules() reads the draft config's
    spec = SimpleNamespace(method=method, num_speculative_tokens=k, disable_eagle_block_drop=no_drop,
                           index_share_for_mtp_iteration=None, custom_method=None,
                           draft_model_config=SimpleNamespace(
                               hf_config=SimpleNamespace(num_nextn_predict_layers=mtp_layers,
                                                         n_predict=mtp_layers,
                                                         model_type="deepseek_mtp")))
    for name in ("use_eagle", "use_eagle_block_drop", "needs_eagle_block_drop", "use_dflash",
                 "use_dspark", "use_multi_module_mtp", "num_mtp_modules", "use_ngram"):
        fn = getattr(SpeculativeConfig, name, None)
        if fn is not None:
            setattr(spec, name, fn.__get__(spec))
    # vLLM 0.34: each speculator's own config answers (speculator_config)
    prop = getattr(SpeculativeConfig, "speculator_config", None)
    if isinstance(prop, property):
        spec.speculator_config = prop.fget(spec)
    return spec


@pytest.mark.parametrize("method,k,layers,expected", [
    ("mtp", 3, 3, 3), ("mtp", 3, 1, 1), ("eagle", 2, 1, 1), ("ngram", 2, 1, 0)])
def test_prefill_lookahead_is_the_schedulers(method, k, layers, expected):
    """``num_prefill_lookahead`` as ``Scheduler.__init__`` gives it to
    ``KVCacheManager``: ``VllmConfig.num_prefill_lookahead_tokens`` (0.31 on;
    the same value derived where only the manager takes it, 0.28 - 0.30), 0
    where the manager takes none (0.26, 0.27)."""
    from types import SimpleNamespace

    from vllm.config import VllmConfig

    spec = _speculative_config(method, k, layers)
    cfg = SimpleNamespace(speculative_config=spec, num_speculative_tokens=k)
    got = vllm_facts.prefill_lookahead_tokens(cfg)
    assert got == (expected if vllm_facts.manager_takes_prefill_lookahead() else 0)
    prop = getattr(VllmConfig, "num_prefill_lookahead_tokens", None)
    if isinstance(prop, property):  # vLLM's own rule, on the same stand-in
        assert prop.fget(cfg) == got


def test_eagle_block_drop_is_the_schedulers():
    """``use_eagle`` as ``Scheduler.__init__`` gives it to ``KVCacheManager``:
    ``use_eagle_block_drop()`` (0.30 on: off with ``disable_eagle_block_drop``),
    ``use_eagle()`` where the config has no such method (0.26 - 0.29)."""
    from vllm.config import SpeculativeConfig

    assert vllm_facts.eagle_block_drop(_speculative_config("eagle", 1)) is True
    assert vllm_facts.eagle_block_drop(_speculative_config("mtp", 2, 2)) is True
    assert vllm_facts.eagle_block_drop(_speculative_config("ngram", 2)) is False
    assert vllm_facts.eagle_block_drop(_speculative_config("eagle", 1, no_drop=True)) is (
        not hasattr(SpeculativeConfig, "use_eagle_block_drop"))


def test_eagle_groups_are_the_coordinators_with_a_uniform_type_drafter_group():
    """A drafter group of its own whose worker spec is a
    ``UniformTypeKVCacheSpecs`` equal (first layer) to a target group's spec:
    the scheduler's ``HybridKVCacheCoordinator`` puts both in one spec group
    and drops the last hit block in both (``generate_scheduler_kv_cache_config``
    gives the scheduler the first layer's spec). ``eagle_groups`` read it
    through ``first_spec``, which vLLM 0.26 - 0.28 lack: the target group was
    left out there (a 1-block difference in the property suite's drafter
    tables on 0.26 - 0.28)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MLAAttentionSpec, UniformTypeKVCacheSpecs

    from stepwarm.drafter import eagle_groups
    from tests.property.oracle import Oracle

    full = dict(block_size=2, num_kv_heads=1, head_size=8, dtype=torch.float16)
    specs = (MLAAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16),
             FullAttentionSpec(**full),
             UniformTypeKVCacheSpecs(block_size=2, kv_cache_specs={"d0": FullAttentionSpec(**full)}))
    oracle = Oracle(specs, num_blocks=64, max_model_len=32, num_lookahead_tokens=1,
                    enable_caching=True, drafter_groups=(2,), use_eagle=True)
    vllms = tuple(i for i, m in enumerate(oracle.manager.coordinator.single_type_managers)
                  if m.use_eagle)
    assert vllms == (1, 2)
    assert eagle_groups(list(specs), {2}, True) == vllms


def test_uncached_frees_append_is_the_pools_own_order():
    """Read off a real ``BlockPool`` with caching off: the installed vLLM
    (0.32) prepends freed blocks (reused first); 0.27 appends them
    (docs/version-matrix.md)."""
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(8, False, 16)
    a = pool.get_new_blocks(3)
    pool.free_blocks(a)
    reused = pool.get_new_blocks(1)[0].block_id in {b.block_id for b in a}
    assert vllm_facts.uncached_frees_append() is (not reused)
    expected = {"0.27.0": True, "0.27.1": True}.get(vllm_facts.version(), False)
    assert vllm_facts.uncached_frees_append() is expected


def test_moe_kernel_tuning_read_off_the_model_config(tuned_moe_folder) -> None:
    """The recording header's ``moe``: the tiny DeepSeek-V3 (4 routed experts,
    2 per token, expert width 128) has no tuned fused MoE file for this device
    (vLLM falls back to its default tiles: ``[]``); a tuned file in
    ``VLLM_TUNED_CONFIG_FOLDER`` for the shape on this rank gives its token
    counts in the file's order and each one's BLOCK_SIZE_M (with tensor
    parallelism the width is split, with expert parallelism the experts); a
    data parallel engine's MoE sees several ranks' tokens: none; a dense model
    has none."""
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig
    from vllm.model_executor.layers.fused_moe import fused_moe

    from stepwarm.zoo import write_model

    mc = ModelConfig(model=str(write_model("tiny-deepseek-v3-mtp")), skip_tokenizer_init=True,
                     max_model_len=256)
    assert vllm_facts.moe_kernel_tuning(VllmConfig(model_config=mc)) == {
        "top_k": 2, "experts": 4, "align_experts": 4, "tuned_sizes": [], "tuned_block_m": []}
    for tp, ep, (experts, width), sizes in ((2, False, (4, 64), ["64", "1", "8"]),
                                            (2, True, (2, 128), ["16", "2"])):
        (tuned_moe_folder / fused_moe.get_config_file_name(experts, width, None)).write_text(
            json.dumps({k: {"BLOCK_SIZE_M": 4 * int(k), "BLOCK_SIZE_N": 32,
                            "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1} for k in sizes}))
        vc = VllmConfig(model_config=mc)
        vc.parallel_config = ParallelConfig(tensor_parallel_size=tp,
                                            enable_expert_parallel=ep)
        assert vllm_facts.moe_kernel_tuning(vc) == {
            "top_k": 2, "experts": experts, "align_experts": 4,
            "tuned_sizes": [int(k) for k in sizes],
            "tuned_block_m": [4 * int(k) for k in sizes]}
    vc = VllmConfig(model_config=mc)
    vc.parallel_config = ParallelConfig(data_parallel_size=2)
    assert vllm_facts.moe_kernel_tuning(vc) is None
    llama = ModelConfig(model=str(write_model("tiny-llama")), skip_tokenizer_init=True,
                        max_model_len=256)
    assert vllm_facts.moe_kernel_tuning(VllmConfig(model_config=llama)) is None


def test_max_prefill_tokens_is_the_schedulers_chunk_limit() -> None:
    """``_mamba_block_aligned_split``'s ``max_prefill_tokens``, read off a real
    ``SchedulerConfig``: the budget, ``max_num_scheduled_tokens`` where set
    (vLLM 0.27 sets it to the budget less a draft model's slots), less a
    ``long_prefill_token_threshold``."""
    from vllm.config import SchedulerConfig

    def config(**kw):
        return SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                               is_encoder_decoder=False, enable_chunked_prefill=True, **kw)

    assert vllm_facts.max_prefill_tokens(config()) == 64
    assert vllm_facts.max_prefill_tokens(config(long_prefill_token_threshold=16)) == 16
    capped = config()
    capped.max_num_scheduled_tokens = 60
    assert vllm_facts.max_prefill_tokens(capped) == 60
