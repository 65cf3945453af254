"""Thin adapters to a live vLLM worker: the only mutable vLLM state stepwarm touches.

Reads the V1 runner (``vllm/v1/worker/gpu_model_runner.py``, also the CPU
runner) and the V2 runner (``vllm/v1/worker/gpu/model_runner.py``) through
one interface: which requests the runner holds, how to drop a step that was
executed but never sampled, and how to switch the KV connector off for a run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from stepwarm.profile import runner_kind, runner_of


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


def encoder_cache_ids(worker: Any) -> set[str]:
    """Keys of the runner's multimodal encoder cache
    (``MultiModalFeatureSpec.identifier`` -> encoder output): V1
    ``runner.encoder_cache`` (a dict), V2 ``runner.encoder_cache.encoder_outputs``;
    empty where the runner has none."""
    cache = getattr(runner_of(worker), "encoder_cache", None)
    cache = getattr(cache, "encoder_outputs", cache)
    return set(cache) if isinstance(cache, dict) else set()


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
    latency the worker took, the rest being vLLM's front end and scheduler."""

    METHODS = ("execute_model", "sample_tokens")

    def __init__(self) -> None:
        self.ms = 0.0

    @contextmanager
    def attached(self, worker: Any) -> Iterator[WorkerClock]:
        """Time ``worker``'s calls for the block: instance attributes wrapping
        its methods (vLLM's executor calls them through the worker object),
        removed on exit."""
        import time

        def timed(fn: Any) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return fn(*args, **kwargs)
                finally:
                    self.ms += (time.perf_counter() - t0) * 1e3
            return call

        for name in self.METHODS:
            setattr(worker, name, timed(getattr(worker, name)))
        try:
            yield self
        finally:
            for name in self.METHODS:
                worker.__dict__.pop(name, None)

    def take(self) -> float:
        """Milliseconds counted since the last take."""
        ms, self.ms = self.ms, 0.0
        return ms


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
