"""Around a run on a vLLM worker: the kernel JIT monitor held back, the
worker's time inside its steps (:class:`WorkerClock`), the device synchronized.

The worker's and runner's own attributes are read in
:mod:`stepwarm.worker_view` only.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


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
