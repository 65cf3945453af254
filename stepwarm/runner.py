"""Thin adapters to a live vLLM worker: the only mutable vLLM state stepwarm touches.

Reads the V1 runner (``vllm/v1/worker/gpu_model_runner.py``, also the CPU
runner) and the V2 runner (``vllm/v1/worker/gpu/model_runner.py``) through
one interface: which requests the runner holds, how to drop a step that was
executed but never sampled, and how to switch the KV connector off for a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal


def runner_of(worker: Any) -> Any:
    """The model runner behind a vLLM worker (``worker.model_runner``)."""
    return getattr(worker, "model_runner", worker)


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


def request_tables(worker: Any, prefix: str = "") -> dict[str, set[str]]:
    """Per-request tables of the runner -> the ids in them starting with
    ``prefix`` (tables holding none left out).

    Reads :data:`V1_TABLES` or :data:`V2_TABLES` (attributes a version lacks
    are skipped); entries marked "scan" are searched for any dict/set/list
    of strings (speculator, model-specific and layer-specific states).
    """
    runner = runner_of(worker)
    tables = V2_TABLES if runner_kind(runner) == "v2" else V1_TABLES
    out: dict[str, set[str]] = {}
    for path, how in tables.items():
        value = _resolve(runner, path)
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


def live_request_ids(worker: Any) -> set[str]:
    """Request ids the runner holds state for.

    V1: ``runner.requests`` keys plus ``runner.input_batch.req_ids``; V2:
    ``runner.req_states.req_id_to_index`` keys.
    """
    runner = runner_of(worker)
    if runner_kind(runner) == "v2":
        return set(runner.req_states.req_id_to_index)
    ids = set(getattr(runner, "requests", {}))
    batch = getattr(runner, "input_batch", None)
    if batch is not None:
        ids.update(r for r in batch.req_ids if r is not None)
    return ids


def drop_finished_state(worker: Any, scheduler_output: Any) -> None:
    """After a cleanup step that schedules no tokens: let vLLM drop the
    per-request state it only drops inside a forward pass.

    V1: ``execute_model`` returns before ``preprocess_mamba`` when nothing
    is scheduled, so ``runner.mamba_state_idx`` keeps the finished requests;
    this runs vLLM's own ``mamba_utils.cleanup_mamba_state_idx`` with the
    cleanup's ``SchedulerOutput``, as the next scheduled step would. A no-op
    where the runner or vLLM has no such state.
    """
    runner = runner_of(worker)
    state = getattr(runner, "mamba_state_idx", None)
    if not state:
        return
    try:
        from vllm.v1.worker.mamba_utils import cleanup_mamba_state_idx
    except ImportError:  # a vLLM without it: drop the finished ids directly
        for req_id in scheduler_output.finished_req_ids:
            state.pop(req_id, None)
        return
    cleanup_mamba_state_idx(scheduler_output, state)


def allowed_token_mask(worker: Any) -> bool:
    """Whether the V1 input batch holds its allowed-token masks
    (``input_batch.allowed_token_ids_mask`` and ``..._cpu_tensor``, each
    ``max_num_reqs x vocab_size`` bools). False on the V2 runner, which keeps
    allowed ids per request instead."""
    batch = getattr(runner_of(worker), "input_batch", None)
    return getattr(batch, "allowed_token_ids_mask_cpu_tensor", None) is not None


def release_allowed_token_mask(worker: Any) -> bool:
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
    batch = getattr(runner_of(worker), "input_batch", None)
    if getattr(batch, "allowed_token_ids_mask_cpu_tensor", None) is None or \
            getattr(batch, "has_allowed_token_ids", None):
        return False
    batch.allowed_token_ids_mask = None
    batch.allowed_token_ids_mask_cpu_tensor = None
    return True


def discard_pending_step(worker: Any) -> bool:
    """Drop the state ``execute_model`` left for a ``sample_tokens`` call that
    will not come (``runner.execute_model_state``), so the next
    ``execute_model`` is accepted. Returns whether there was one."""
    runner = runner_of(worker)
    if getattr(runner, "execute_model_state", None) is None:
        return False
    runner.execute_model_state = None
    return True


@contextmanager
def kv_connector_disabled(worker: Any) -> Iterator[None]:
    """Run the block with the runner's KV connector off; restore it on exit,
    also when the block raises.

    V2: ``runner.kv_connector.set_disabled(True)`` then ``(False)``, as
    vLLM's ``warmup_kernels`` does. V1: the runner asks the process-wide
    ``vllm.distributed.kv_transfer.kv_transfer_state`` whether a connector
    exists, so the agent is taken out of it for the block and put back.
    """
    runner = runner_of(worker)
    if runner_kind(runner) == "v2":
        connector = runner.kv_connector
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


@contextmanager
def kv_blocks_backed(worker: Any, num_blocks: int) -> Iterator[None]:
    """Run the block with the KV cache's first ``num_blocks`` blocks backed
    by memory, where the runner's cache commits memory as it grows (vLLM
    0.34's extensible KV cache: after ``compile_or_warm_up_model`` only its
    null block is backed, until the engine commits the measured size, as
    vLLM's own warmups do with ``ensure_kv_cache_blocks``); on exit, also
    when the block raises, shrink it back to what was committed before, so
    the engine's sizing finds it as vLLM left it. A no-op on other runners
    (no ``extensible_kv_cache``) or when the blocks are backed already."""
    cache = getattr(runner_of(worker), "extensible_kv_cache", None)
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
def eplb_recording_suppressed(worker: Any) -> Iterator[None]:
    """Run the block with EPLB's expert-load recording and rebalancing steps
    off, where the installed vLLM suppresses them around its own warmup: the
    V2 runner's ``EPLBController.suppress()`` (vLLM 0.33's
    ``Worker.compile_or_warm_up_model`` wraps its warmup in it). A no-op on
    runners without it (V1, vLLM <= 0.32)."""
    suppress = getattr(getattr(runner_of(worker), "eplb", None), "suppress", None)
    if suppress is None:
        yield
        return
    with suppress():
        yield


def kv_connector_active(worker: Any) -> bool:
    """Whether the runner would use its KV connector now (V2: connector not
    disabled; V1: an agent is registered)."""
    runner = runner_of(worker)
    if runner_kind(runner) == "v2":
        return not getattr(runner.kv_connector, "_disabled", False)
    from vllm.distributed.kv_transfer import kv_transfer_state

    return kv_transfer_state._KV_CONNECTOR_AGENT is not None


@contextmanager
def jit_monitor_deferred() -> Iterator[None]:
    """Hold vLLM's kernel JIT monitor back until the block ends.

    ``Worker.compile_or_warm_up_model`` switches the monitor on
    (``vllm.utils.jit_monitor.activate``) once its own warmup is done; after
    that, with ``--jit-monitor-mode error``, any Triton compile raises. Inside
    the block that call is recorded instead, and replayed with the same
    arguments when the block exits (also when it raises), so the compiles
    stepwarm causes at start-up are warmup, and every compile after
    start-up is still caught. A no-op on vLLM builds without the monitor.
    """
    try:
        from vllm.utils import jit_monitor
    except ImportError:
        yield
        return
    original = jit_monitor.activate
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    jit_monitor.activate = lambda *args, **kwargs: calls.append((args, kwargs))
    try:
        yield
    finally:
        jit_monitor.activate = original
        for args, kwargs in calls:
            original(*args, **kwargs)


class WorkerClock:
    """Wall time spent inside the worker's ``execute_model`` and
    ``sample_tokens`` (ms), while :meth:`attached`: what of a request's
    latency the worker took, the rest being vLLM's front end and scheduler.

    It also keeps each step apart (:attr:`steps`): ``[tokens, requests, ms,
    new]`` per ``execute_model`` call (``SchedulerOutput.total_num_scheduled_tokens``,
    the requests it scheduled, its time and that of the ``sample_tokens`` call
    after it, and 1 when no step before it while attached had that many
    tokens, else 0), so a slow first run can be traced to the step that was
    slow: a GEMM at a token count cuBLAS has not seen picks and loads its
    kernel on that first call (``docs/findings.md``)."""

    METHODS = ("execute_model", "sample_tokens")

    def __init__(self) -> None:
        self.ms = 0.0
        #: CPU time of the calling thread inside those calls (ms, ``time.thread_time``).
        self.cpu_ms = 0.0
        self.steps: list[list[float]] = []
        self._token_counts: set[int] = set()

    @contextmanager
    def attached(self, worker: Any) -> Iterator[WorkerClock]:
        """Time ``worker``'s calls for the block: instance attributes wrapping
        its methods (vLLM's executor calls them through the worker object),
        removed on exit."""
        import time

        def timed(name: str, fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                t0, c0 = time.perf_counter(), time.thread_time()
                try:
                    return fn(*args, **kwargs)
                finally:
                    ms = (time.perf_counter() - t0) * 1e3
                    self.ms += ms
                    self.cpu_ms += (time.thread_time() - c0) * 1e3
                    self._count_step(name, args, ms)
            return call

        for name in self.METHODS:
            setattr(worker, name, timed(name, getattr(worker, name)))
        try:
            yield self
        finally:
            for name in self.METHODS:
                worker.__dict__.pop(name, None)

    def _count_step(self, method: str, args: tuple[Any, ...], ms: float) -> None:
        out = args[0] if args else None
        if method == "execute_model" or not self.steps:
            sched = getattr(out, "num_scheduled_tokens", None) or {}
            tokens = int(getattr(out, "total_num_scheduled_tokens", 0) or 0)
            new = tokens not in self._token_counts
            self._token_counts.add(tokens)
            self.steps.append([tokens, len(sched), ms, int(new)])
        else:  # sample_tokens: the step's second half
            self.steps[-1][2] += ms

    def take(self) -> float:
        """Milliseconds counted since the last take (the steps are kept
        until :meth:`take_steps`, the CPU time until :meth:`take_cpu`)."""
        ms, self.ms = self.ms, 0.0
        return ms

    def take_cpu(self) -> float:
        """CPU milliseconds of the calling thread in the worker's calls since
        the last take."""
        ms, self.cpu_ms = self.cpu_ms, 0.0
        return ms

    def take_steps(self) -> list[list[float]]:
        """The steps counted since the last take, ``[tokens, requests, ms,
        new]`` each, ms rounded to 0.01."""
        steps, self.steps = self.steps, []
        return [[t, n, round(ms, 2), new] for t, n, ms, new in steps]


def jit_monitor_engine_args() -> dict[str, Any]:
    """``{"jit_monitor_verbose": True}`` (vLLM's JIT monitor logs every
    compile, not only a kernel's first) where vLLM's ``EngineArgs`` has the
    field (vLLM >= 0.26), else ``{}``."""
    from vllm.engine.arg_utils import EngineArgs

    fields = getattr(EngineArgs, "__dataclass_fields__", {})
    return {"jit_monitor_verbose": True} if "jit_monitor_verbose" in fields else {}


def synchronize() -> None:
    """Wait for the device (``torch.accelerator.synchronize``; no-op on CPU
    builds without an accelerator)."""
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        acc.synchronize()
