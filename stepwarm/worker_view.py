"""The vLLM worker as stepwarm sees it: :class:`WorkerView`.

One object, built once per run (and once per plugin start) from the worker,
and the only place that reads a vLLM worker's and its model runner's
attributes: the V1 runner (``vllm/v1/worker/gpu_model_runner.py``, also the
CPU runner) and the V2 runner (``vllm/v1/worker/gpu/model_runner.py``)
behind one interface. The probe reads its facts here, the encoder inputs
their processor, the driver its steps and the runner state it cleans up
(which requests the runner holds, a step executed but never sampled, the KV
connector switched off for a run). Facts that differ between vLLM releases
(rather than between runners) are probed by behaviour in
:mod:`stepwarm.vllm_facts`; a vLLM rename of a runner attribute lands here.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

from stepwarm import vllm_facts


def runner_kind(runner: Any) -> Literal["v1", "v2"]:
    """"v2" for ``vllm.v1.worker.gpu.model_runner.GPUModelRunner``, else "v1"."""
    v2 = any(c.__module__ == "vllm.v1.worker.gpu.model_runner" for c in type(runner).__mro__)
    return "v2" if v2 else "v1"


#: Every per-request table of the V1 runner (``gpu_model_runner.py``, also
#: the CPU runner), as ``attribute path -> how its request ids are read``:
#: "keys" (dict keys / set or list members) or "values" (a dict of sets).
#: Encoder caches are keyed by ``mm_hash``, which for stepwarm's dummy
#: encoder inputs is ``<req_id>encoder``.
V1_TABLES: dict[str, str] = {
    "requests": "keys",
    "num_prompt_logprobs": "keys",
    "mamba_state_idx": "keys",
    "encoder_cache": "keys",
    "encoder_timing_registry": "keys",
    "input_batch.req_ids": "keys",
    "input_batch.req_id_to_index": "keys",
    "input_batch.prev_req_id_to_index": "keys",
    "input_batch.greedy_reqs": "keys",
    "input_batch.random_reqs": "keys",
    "input_batch.top_p_reqs": "keys",
    "input_batch.top_k_reqs": "keys",
    "input_batch.frequency_penalties_reqs": "keys",
    "input_batch.presence_penalties_reqs": "keys",
    "input_batch.repetition_penalties_reqs": "keys",
    "input_batch.has_allowed_token_ids": "keys",
    "input_batch.thinking_token_budget_reqs": "keys",
    "input_batch.num_logprobs": "keys",
    "input_batch.logprob_token_ids": "keys",
    "input_batch.pooling_params": "keys",
    "input_batch.pooling_states": "keys",
    "input_batch.lora_id_to_request_ids": "values",
    "late_interaction_runner": "scan",
    "drafter": "scan",
}

#: Every per-request table of the V2 runner (``vllm/v1/worker/gpu/``).
V2_TABLES: dict[str, str] = {
    "req_states.req_id_to_index": "keys",
    "req_states.index_to_req_id": "values",
    "encoder_cache.mm_features": "keys",
    "encoder_cache.encoder_outputs": "keys",
    "prompt_logprobs_worker.in_progress_prompt_logprobs": "keys",
    "lora_state.lora_requests": "keys",
    "model_state": "scan",
    "structured_outputs_worker": "scan",
    "speculator": "scan",
    "sampler": "scan",
    "pp_handler": "scan",
}


def _resolve(obj: Any, path: str) -> Any:
    for name in path.split("."):
        obj = getattr(obj, name, None)
        if obj is None:
            return None
    return obj


def _ids_in(value: Any, how: str) -> set[str]:
    """Request ids (strings) a table holds."""
    if how == "values" and isinstance(value, dict):
        out: set[str] = set()
        for v in value.values():
            out |= _ids_in(v, "keys") if isinstance(v, (set, list, tuple, dict)) else (
                {v} if isinstance(v, str) else set())
        return out
    if isinstance(value, (dict, set, frozenset, list, tuple)):
        return {k for k in value if isinstance(k, str)}
    return set()


def _scan(obj: Any) -> dict[str, set[str]]:
    """Dict / set / list attributes of ``obj`` (and of its attributes one
    level down) that hold strings: tables the lists above do not name, in
    helpers whose layout differs across versions."""
    found: dict[str, set[str]] = {}
    if obj is None or not hasattr(obj, "__dict__"):
        return found
    for name, value in vars(obj).items():
        ids = _ids_in(value, "keys")
        if ids:
            found[name] = ids
        elif hasattr(value, "__dict__") and type(value).__module__.startswith("vllm"):
            for sub, v in vars(value).items():
                ids = _ids_in(v, "keys")
                if ids:
                    found[f"{name}.{sub}"] = ids
    return found


def is_last_pp_rank(runner: Any) -> bool:
    """Whether ``runner`` is on the last pipeline-parallel rank (the one that
    computes logits and samples; True without distributed state)."""
    if hasattr(runner, "is_last_pp_rank"):
        return bool(runner.is_last_pp_rank)
    try:
        from vllm.distributed.parallel_state import get_pp_group

        return bool(get_pp_group().is_last_rank)
    except Exception:  # pragma: no cover - no distributed state at all
        return True


class WorkerView:
    """A live vLLM worker (or a bare model runner) and its model runner, read
    through one interface.

    Build it once per run (:meth:`of`) and hand it on: the facts are read off
    the worker as they are asked for, the model's multimodal processor is made
    once (:attr:`mm_processor`).
    """

    def __init__(self, worker: Any):
        #: The vLLM worker (``execute_model``, ``sample_tokens``, ``model_runner``).
        self.worker = worker
        #: Its model runner (``worker.model_runner``; the worker itself when
        #: it is a runner).
        self.runner = getattr(worker, "model_runner", worker)
        #: "v1" or "v2" (:func:`runner_kind`).
        self.kind: Literal["v1", "v2"] = runner_kind(self.runner)

    @classmethod
    def of(cls, worker: Any) -> WorkerView:
        """``worker`` itself when it is a view already, else a view of it."""
        return worker if isinstance(worker, WorkerView) else cls(worker)

    # --- The step -------------------------------------------------------------

    def execute_model(self, scheduler_output: Any) -> Any:
        """The worker's ``execute_model(scheduler_output)``."""
        return self.worker.execute_model(scheduler_output)

    def sample_tokens(self, grammar_output: Any) -> Any:
        """The worker's ``sample_tokens(grammar_output)``."""
        return self.worker.sample_tokens(grammar_output)

    # --- Facts (what the probe records) -----------------------------------------

    @property
    def vllm_config(self) -> Any:
        """The worker's ``VllmConfig`` (its own, else its runner's: the same
        object on vLLM's workers)."""
        return getattr(self.worker, "vllm_config", None) or self.runner.vllm_config

    @property
    def kv_cache_config(self) -> Any:
        """The runner's ``KVCacheConfig``; None before ``initialize_kv_cache``."""
        return getattr(self.runner, "kv_cache_config", None)

    @property
    def num_speculative_steps(self) -> int:
        """Drafts per request and step (V1 ``num_spec_tokens``, V2
        ``num_speculative_steps``)."""
        if self.kind == "v2":
            return int(self.runner.num_speculative_steps)
        return int(getattr(self.runner, "num_spec_tokens", 0))

    @property
    def decode_query_len(self) -> int:
        """Tokens of a uniform decode row (V1 ``uniform_decode_query_len``,
        V2 ``decode_query_len``)."""
        if self.kind == "v2":
            return int(self.runner.decode_query_len)
        return int(getattr(self.runner, "uniform_decode_query_len", 1 + self.num_speculative_steps))

    @property
    def max_encoder_len(self) -> int:
        """An encoder-decoder model's encoder tokens (V1 ``max_encoder_len``,
        V2 ``model_state.max_encoder_len``); 0 for other models."""
        holder = self.runner.model_state if self.kind == "v2" else self.runner
        return int(getattr(holder, "max_encoder_len", 0) or 0)

    @property
    def null_block_writes(self) -> bool:
        """Whether the V2 runner's block tables redirect writes of padded rows
        to the null block (``block_tables.redirect_writes_to_null_block``)."""
        if self.kind != "v2":
            return False
        block_tables = getattr(self.runner, "block_tables", None)
        return bool(block_tables is not None
                    and getattr(block_tables, "redirect_writes_to_null_block", False))

    @property
    def is_pooling_model(self) -> bool:
        """The runner's ``is_pooling_model``."""
        return bool(self.runner.is_pooling_model)

    def supported_tasks(self) -> Any:
        """The runner's ``get_supported_tasks()``."""
        return self.runner.get_supported_tasks()

    @property
    def max_model_len(self) -> int:
        """The runner's ``max_model_len`` (tokens)."""
        return int(self.runner.max_model_len)

    @property
    def is_last_pp_rank(self) -> bool:
        """:func:`is_last_pp_rank` of the runner."""
        return is_last_pp_rank(self.runner)

    @property
    def model(self) -> Any:
        """The runner's model (``runner.model``, else ``runner.get_model()``);
        None before it is loaded."""
        model = getattr(self.runner, "model", None)
        if model is None and hasattr(self.runner, "get_model"):
            model = self.runner.get_model()
        return model

    def usable_kv_blocks(self) -> int:
        """:func:`stepwarm.vllm_facts.usable_kv_blocks` of the runner and its
        ``kv_cache_config``."""
        return vllm_facts.usable_kv_blocks(self.runner, self.kv_cache_config)

    @property
    def mm_budget(self) -> Any:
        """The V1 runner's ``MultiModalBudget`` (``runner.mm_budget``); None on
        the V2 runner and for a model without one."""
        return getattr(self.runner, "mm_budget", None)

    @functools.cached_property
    def mm_processor(self) -> Any:
        """The model's multimodal processor, made once: the runner's
        (``runner.mm_budget.processor`` on the V1 runner), else one made by
        ``MULTIMODAL_REGISTRY.create_processor`` (the V2 runner has none of
        its own); None for a model without one."""
        budget = self.mm_budget
        if budget is not None and getattr(budget, "processor", None) is not None:
            return budget.processor
        model_config = self.vllm_config.model_config
        if not getattr(model_config, "is_multimodal_model", False):
            return None
        try:
            from vllm.multimodal import MULTIMODAL_REGISTRY

            return MULTIMODAL_REGISTRY.create_processor(model_config)
        except Exception:  # noqa: BLE001 - no processor: no image classes
            return None

    def draft_layer_names(self) -> set[str]:
        """The drafter's attention layer names (V1 ``runner.drafter.
        _draft_attn_layer_names``, V2 ``runner.speculator.draft_attn_layer_names``);
        empty for model-free drafters and without one."""
        for holder, attr in (("drafter", "_draft_attn_layer_names"),
                             ("speculator", "draft_attn_layer_names")):
            names = getattr(getattr(self.runner, holder, None), attr, None)
            if names:
                return set(names)
        return set()

    # --- Runner state (what the driver leaves as it found) --------------------

    def request_tables(self, prefix: str = "") -> dict[str, set[str]]:
        """Per-request tables of the runner -> the ids in them starting with
        ``prefix`` (tables holding none left out).

        Reads :data:`V1_TABLES` or :data:`V2_TABLES` (attributes a version lacks
        are skipped); entries marked "scan" are searched for any dict/set/list
        of strings (speculator, model-specific and layer-specific states).
        """
        tables = V2_TABLES if self.kind == "v2" else V1_TABLES
        out: dict[str, set[str]] = {}
        for path, how in tables.items():
            value = _resolve(self.runner, path)
            if how == "scan":
                for sub, ids in _scan(value).items():
                    ids = {i for i in ids if i.startswith(prefix)}
                    if ids:
                        out[f"{path}.{sub}"] = ids
                continue
            ids = {i for i in _ids_in(value, how) if i.startswith(prefix)}
            if ids:
                out[path] = ids
        return out

    def live_request_ids(self) -> set[str]:
        """Request ids the runner holds state for.

        V1: ``runner.requests`` keys plus ``runner.input_batch.req_ids``; V2:
        ``runner.req_states.req_id_to_index`` keys.
        """
        runner = self.runner
        if self.kind == "v2":
            return set(runner.req_states.req_id_to_index)
        ids = set(getattr(runner, "requests", {}))
        batch = getattr(runner, "input_batch", None)
        if batch is not None:
            ids.update(r for r in batch.req_ids if r is not None)
        return ids

    def drop_finished_state(self, scheduler_output: Any) -> None:
        """After a cleanup step that schedules no tokens: let vLLM drop the
        per-request state it only drops inside a forward pass.

        V1: ``execute_model`` returns before ``preprocess_mamba`` when nothing
        is scheduled, so ``runner.mamba_state_idx`` keeps the finished requests;
        this runs vLLM's own ``mamba_utils.cleanup_mamba_state_idx`` with the
        cleanup's ``SchedulerOutput``, as the next scheduled step would. A no-op
        where the runner or vLLM has no such state.
        """
        state = getattr(self.runner, "mamba_state_idx", None)
        if not state:
            return
        try:
            from vllm.v1.worker.mamba_utils import cleanup_mamba_state_idx
        except ImportError:  # a vLLM without it: drop the finished ids directly
            for req_id in scheduler_output.finished_req_ids:
                state.pop(req_id, None)
            return
        cleanup_mamba_state_idx(scheduler_output, state)

    def allowed_token_mask(self) -> bool:
        """Whether the V1 input batch holds its allowed-token masks
        (``input_batch.allowed_token_ids_mask`` and ``..._cpu_tensor``, each
        ``max_num_reqs x vocab_size`` bools). False on the V2 runner, which keeps
        allowed ids per request instead."""
        batch = getattr(self.runner, "input_batch", None)
        return getattr(batch, "allowed_token_ids_mask_cpu_tensor", None) is not None

    def release_allowed_token_mask(self) -> bool:
        """Free the V1 input batch's allowed-token masks when no request it
        holds has ``allowed_token_ids``, putting the batch back as vLLM starts it.

        ``InputBatch.add_request`` allocates both masks the first time a request
        with ``allowed_token_ids`` arrives and nothing frees them; from then on
        every request the batch drops (finished, or running but not scheduled)
        runs ``allowed_token_ids_mask_cpu_tensor[row].fill_(False)``
        (``remove_request``), and every row ``condense`` moves copies one: a
        ``vocab_size``-long CPU op, an OpenMP parallel region over torch's
        threads in the engine-core process. At 1,024 requests and a 100k-150k
        vocabulary on an H200 host that was ~8 ms a request (docs/findings.md).
        The next request with ``allowed_token_ids`` allocates them again, as it
        would have without stepwarm.

        Returns:
            Whether they were freed (False: none held, or a request uses them).
        """
        batch = getattr(self.runner, "input_batch", None)
        if getattr(batch, "allowed_token_ids_mask_cpu_tensor", None) is None or \
                getattr(batch, "has_allowed_token_ids", None):
            return False
        batch.allowed_token_ids_mask = None
        batch.allowed_token_ids_mask_cpu_tensor = None
        return True

    def discard_pending_step(self) -> bool:
        """Drop the state ``execute_model`` left for a ``sample_tokens`` call that
        will not come (``runner.execute_model_state``), so the next
        ``execute_model`` is accepted. Returns whether there was one."""
        if getattr(self.runner, "execute_model_state", None) is None:
            return False
        self.runner.execute_model_state = None
        return True

    @contextmanager
    def kv_connector_disabled(self) -> Iterator[None]:
        """Run the block with the runner's KV connector off; restore it on exit,
        also when the block raises.

        V2: ``runner.kv_connector.set_disabled(True)`` then ``(False)``, as
        vLLM's ``warmup_kernels`` does. V1: the runner asks the process-wide
        ``vllm.distributed.kv_transfer.kv_transfer_state`` whether a connector
        exists, so the agent is taken out of it for the block and put back.
        """
        if self.kind == "v2":
            connector = self.runner.kv_connector
            connector.set_disabled(True)
            try:
                yield
            finally:
                connector.set_disabled(False)
            return
        from vllm.distributed.kv_transfer import kv_transfer_state

        agent = kv_transfer_state._KV_CONNECTOR_AGENT
        kv_transfer_state._KV_CONNECTOR_AGENT = None
        try:
            yield
        finally:
            kv_transfer_state._KV_CONNECTOR_AGENT = agent

    def kv_connector_active(self) -> bool:
        """Whether the runner would use its KV connector now (V2: connector not
        disabled; V1: an agent is registered)."""
        if self.kind == "v2":
            return not getattr(self.runner.kv_connector, "_disabled", False)
        from vllm.distributed.kv_transfer import kv_transfer_state

        return kv_transfer_state._KV_CONNECTOR_AGENT is not None

    @contextmanager
    def kv_blocks_backed(self, num_blocks: int) -> Iterator[None]:
        """Run the block with the KV cache's first ``num_blocks`` blocks backed
        by memory, where the runner's cache commits memory as it grows (vLLM
        0.34's extensible KV cache: after ``compile_or_warm_up_model`` only its
        null block is backed, until the engine commits the measured size, as
        vLLM's own warmups do with ``ensure_kv_cache_blocks``); on exit, also
        when the block raises, shrink it back to what was committed before, so
        the engine's sizing finds it as vLLM left it. A no-op on other runners
        (no ``extensible_kv_cache``) or when the blocks are backed already."""
        cache = getattr(self.runner, "extensible_kv_cache", None)
        before = getattr(cache, "num_committed_blocks", 0)
        if cache is None or num_blocks <= before:
            yield
            return
        cache.commit(num_blocks)
        try:
            yield
        finally:
            cache.commit(before, shrink=True)

    @contextmanager
    def eplb_recording_suppressed(self) -> Iterator[None]:
        """Run the block with EPLB's expert-load recording and rebalancing steps
        off, where the installed vLLM suppresses them around its own warmup: the
        V2 runner's ``EPLBController.suppress()`` (vLLM 0.33's
        ``Worker.compile_or_warm_up_model`` wraps its warmup in it). A no-op on
        runners without it (V1, vLLM <= 0.32)."""
        suppress = getattr(getattr(self.runner, "eplb", None), "suppress", None)
        if suppress is None:
            yield
            return
        with suppress():
            yield
