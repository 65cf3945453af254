"""Compile the sampler's Triton kernel variants in threads while the steps go on.

Every engine measured on the H200 spent most of stepwarm's start-up in nine
Triton compiles of two sampler kernels (``_topk_topp_kernel`` per top-k /
top-p / both and request-count class, ``_topk_log_softmax_kernel`` per
power-of-two logprobs class), 2-3 s each, one after another: the scenario
step that first reaches a variant waits for its compile. Triton (3.4 and
later: ``triton.runtime._async_compile``) compiles in threads with the GIL
released in its MLIR, LLVM and ``ptxas`` stages.

Under :func:`deferred_compiles`, the launch of a kernel of
:data:`stepwarm.vllm_facts.DEFERRABLE_TRITON_KERNELS` whose variant is not
compiled yet is skipped (Triton's ``jit_cache_hook`` returns True), and the
variant is compiled in a thread pool (``JITFunction.preload`` with the hook's
specialization data, Triton's API for compiling a recorded variant): it lands
in Triton's in-memory and on-disk caches as if the launch had compiled it.
Leaving the context waits for every compile, so none outlives it and the
first request finds them all. Inside an outer :func:`deferred_compiles` (the
plugin holds one around all its scenarios and the GEMMs, :mod:`stepwarm.hook`),
an inner one (each scenario's, :func:`stepwarm.driver.drive`) records its own
steps' compiles but leaves them to the outer pool and does not wait: a
scenario's compiles go on while the next scenarios run, and only the end of
the start-up warmup waits for what is left (on the H200, the sampler
scenario's last compile, top-k with top-p, took 7-10 s alone).

Only kernels whose skipped launch leaves values, never indices, are listed:
top-k / top-p masks logits in place (skipped: unmasked logits, still a valid
draw) and the top-k log-softmax writes logprob values into a fresh tensor
(skipped: values stepwarm discards). A step that skips them still runs
everything else it warms. Kernels whose output later layers route on
(:data:`stepwarm.vllm_facts.DEFERRABLE_ZEROED_KERNELS`: fused MoE, whose
output the next layer's router reads) are deferred only inside their
launcher, wrapped for the context's life in every loaded module that holds
it: after a launch the hook skipped, the wrapper zeroes the launcher's
output, so the step goes on with zeros, never uninitialized memory (an eager
MoE prefill's variants then compile side by side instead of one step after
another). Not used where outputs are compared (``--verify``).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

logger = logging.getLogger("vllm.stepwarm")

#: The name of every compile thread begins with it.
THREAD_PREFIX = "stepwarm-compile"

#: Most threads one worker uses (several ranks on one host share its cores).
MAX_THREADS = 8


@dataclass
class DeferredCompile:
    """One variant compiled in a thread: which kernel and variant (Triton's
    key), the step whose launch was skipped, and how long the compile took
    (None: it failed)."""

    kernel: str
    step: int | None
    key: str = ""
    seconds: float | None = None
    error: str | None = None


@dataclass
class DeferredCompiles:
    """What :func:`deferred_compiles` compiled in threads (empty when off)."""

    compiles: list[DeferredCompile] = field(default_factory=list)
    #: Seconds the context waited at its exit for compiles still running.
    waited_s: float = 0.0


def default_threads(local_ranks: int = 1) -> int:
    """Threads per worker: the cores this process may use, shared by the
    ranks on this host, at most :data:`MAX_THREADS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(MAX_THREADS, cores // max(1, local_ranks)))


class _Deferrer:
    """The ``jit_cache_hook`` and its pool; :attr:`step` is the step running."""

    def __init__(self, kernels: frozenset[str], threads: int, previous: Any, runtime: Any,
                 zeroed: frozenset[str] = frozenset()):
        self.kernels = kernels | zeroed
        #: Kernels deferred only inside their wrapped launcher (:class:`_Launcher`).
        self.zeroed = zeroed
        self.previous = previous
        self.runtime = runtime
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix=THREAD_PREFIX)
        #: (device, Triton key) of every variant submitted.
        self.pending: set[tuple[Any, str]] = set()
        self.result = DeferredCompiles()
        self.step: int | None = None
        self.local = threading.local()
        #: Inner contexts open now (the innermost last): each records its own compiles.
        self.scopes: list[_Scope] = []

    def hook(self, *, key: Any, repr: Any, fn: Any, compile: dict[str, Any],
             is_manual_warmup: bool, already_compiled: bool) -> Any:
        if self.previous is not None:
            answer = self.previous(key=key, repr=repr, fn=fn, compile=compile,
                                   is_manual_warmup=is_manual_warmup,
                                   already_compiled=already_compiled)
            if answer:
                return answer
        if getattr(self.local, "compiling", False) or is_manual_warmup:
            return None  # this pool's own compile, or someone's warmup()
        scope = self.scopes[-1] if self.scopes else None
        if scope is not None and not scope.defer:
            return None  # an inner context with threads 0 (--verify): compiled in the step
        name = f"{fn.module}:{fn.name}"
        if name not in self.kernels:
            return None
        if name in self.zeroed and not getattr(self.local, "launching", 0):
            return None  # not through the wrapped launcher: nothing would zero its output
        self.local.skipped = True
        device = compile.get("device")
        pending_key = (device, str(key))
        if pending_key not in self.pending:
            self.pending.add(pending_key)
            record = DeferredCompile(kernel=fn.name, step=(scope or self).step, key=str(key))
            self.result.compiles.append(record)
            if scope is not None:
                scope.result.compiles.append(record)
            self.pool.submit(self._compile, fn.jit_function, compile["specialization_data"],
                             device, record)
        return True  # skip this launch: the variant compiles in the pool

    def _compile(self, jit_function: Any, data: str, device: Any, record: DeferredCompile) -> None:
        self.local.compiling = True
        t0 = time.perf_counter()
        try:
            if isinstance(device, int):
                import torch

                if torch.cuda.is_available():
                    torch.cuda.set_device(device)
            jit_function.preload(data)
            record.seconds = time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - reported; the first launch compiles it again
            record.error = f"{type(e).__name__}: {e}"

    def wait(self) -> None:
        t0 = time.perf_counter()
        self.pool.shutdown(wait=True)
        self.result.waited_s = time.perf_counter() - t0
        for record in self.result.compiles:
            if record.error is not None:
                logger.warning("stepwarm: compiling %s in a thread failed (its first launch "
                               "compiles it instead): %s", record.kernel, record.error)


class _Launcher:
    """A launcher of a zeroed kernel (``module.name``), wrapped while a
    :func:`deferred_compiles` is open: in every loaded module that holds it
    (vLLM's callers import it by name), the wrapper marks its calls for the
    hook and zeroes ``output`` after one whose launch the hook skipped."""

    def __init__(self, module: str, name: str, output: str, local: threading.local):
        self.module, self.name, self.output, self.local = module, name, output, local
        self.original: Any = None
        self.replaced: list[Any] = []  # the modules whose attribute was replaced

    def install(self) -> bool:
        """Wrap it where it is loaded; False (nothing changed) where its
        module is not loaded or it has no ``output`` parameter."""
        home = sys.modules.get(self.module)
        original = vars(home).get(self.name) if home is not None else None
        if original is None:
            return False
        try:
            signature = inspect.signature(original)
        except (TypeError, ValueError):
            return False
        if self.output not in signature.parameters:
            return False
        self.original = original
        local, output = self.local, self.output

        @functools.wraps(original)
        def launcher(*args: Any, **kwargs: Any) -> Any:
            local.launching = getattr(local, "launching", 0) + 1
            local.skipped = False
            try:
                result = original(*args, **kwargs)
                skipped = local.skipped
            finally:
                local.launching -= 1
            if skipped:  # the kernel wrote nothing: zeros, not whatever was there
                signature.bind(*args, **kwargs).arguments[output].zero_()
            return result

        for module in list(sys.modules.values()):
            # its own namespace only: a lazy module's getattr would import
            namespace = getattr(module, "__dict__", None)
            if isinstance(namespace, dict) and namespace.get(self.name) is original:
                setattr(module, self.name, launcher)
                self.replaced.append(module)
        return True

    def restore(self) -> None:
        for module in self.replaced:
            setattr(module, self.name, self.original)
        self.replaced = []


def _wrap_launchers(zeroed: dict[str, tuple[str, str, str]],
                    local: threading.local) -> tuple[frozenset[str], list[_Launcher]]:
    """The zeroed kernels whose launcher is loaded, and the wrapped launchers."""
    kernels, launchers = set(), []
    for kernel, (module, name, output) in zeroed.items():
        launcher = _Launcher(module, name, output, local)
        if launcher.install():
            kernels.add(kernel)
            launchers.append(launcher)
    return frozenset(kernels), launchers


def _triton_runtime() -> Any:
    """``triton.knobs.runtime`` where Triton can compile in threads and has
    the hook and ``preload`` this needs; else None."""
    try:
        import triton
        import triton.runtime._async_compile  # noqa: F401 - thread-safe compiles (Triton >= 3.4)
        from triton.runtime.jit import JITFunction
    except ImportError:
        return None
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or not hasattr(runtime, "jit_cache_hook") \
            or not hasattr(JITFunction, "preload"):
        return None
    return runtime


@contextlib.contextmanager
def deferred_compiles(threads: int, kernels: frozenset[str] | None = None, *,
                      runtime: Any = None,
                      zeroed: dict[str, tuple[str, str, str]] | None = None) -> Iterator[Any]:
    """Within it, first launches of ``kernels`` (default
    :data:`~stepwarm.vllm_facts.DEFERRABLE_TRITON_KERNELS`) and, inside their
    wrapped launchers, of ``zeroed`` (default, with default ``kernels``:
    :data:`~stepwarm.vllm_facts.DEFERRABLE_ZEROED_KERNELS`) compile in
    ``threads`` threads instead of the caller's; on exit, every compile has
    finished and Triton's hook and the launchers are as they were.

    Yields an object whose ``step`` attribute the caller sets to the index of
    the step it runs (for the report) and whose ``result`` is the
    :class:`DeferredCompiles`. With ``threads`` 0, or without a Triton that
    compiles in threads, nothing changes and ``result`` stays empty.
    ``runtime``: the object holding ``jit_cache_hook`` (default
    ``triton.knobs.runtime``).

    Inside an outer one (same runtime and kernels), it neither installs a
    hook nor waits: its steps' compiles go to the outer pool, its ``result``
    lists them (``seconds`` None while one still runs) and ``waited_s`` stays
    0; with ``threads`` 0 its steps compile their own launches.
    """
    outer = _active
    if outer is not None and (runtime is None or runtime is outer.runtime) \
            and (kernels is None or kernels in (outer.kernels, outer.kernels - outer.zeroed)):
        scope = _Scope(defer=threads > 0)
        outer.scopes.append(scope)
        try:
            yield scope
        finally:
            outer.scopes.remove(scope)
        return
    if threads <= 0:
        runtime = None
    elif runtime is None:
        runtime = _triton_runtime()
    if runtime is None:
        off = _Off()
        yield off
        return
    if kernels is None:
        from stepwarm.vllm_facts import DEFERRABLE_TRITON_KERNELS, DEFERRABLE_ZEROED_KERNELS

        kernels = DEFERRABLE_TRITON_KERNELS
        zeroed = DEFERRABLE_ZEROED_KERNELS if zeroed is None else zeroed
    local = threading.local()
    wrapped, launchers = _wrap_launchers(zeroed or {}, local)
    deferrer = _Deferrer(kernels, threads, runtime.jit_cache_hook, runtime, wrapped)
    deferrer.local = local
    runtime.jit_cache_hook = deferrer.hook
    _set_active(deferrer)
    try:
        yield deferrer
    finally:
        _set_active(None)
        runtime.jit_cache_hook = deferrer.previous
        for launcher in launchers:
            launcher.restore()
        deferrer.wait()


#: The outermost :func:`deferred_compiles` open now in this process (None: none).
_active: _Deferrer | None = None


def _set_active(deferrer: _Deferrer | None) -> None:
    global _active
    _active = deferrer


def in_compile_thread() -> bool:
    """Whether the caller runs in a thread of a :func:`deferred_compiles` pool."""
    return threading.current_thread().name.startswith(THREAD_PREFIX)


class _Scope:
    """What an inner :func:`deferred_compiles` yields: the step its caller
    runs and the compiles its steps asked for (the outer pool compiles them;
    their ``seconds`` are set when they end). ``defer`` False (threads 0):
    its steps compile their own launches."""

    def __init__(self, defer: bool) -> None:
        self.defer = defer
        self.step: int | None = None
        self.result = DeferredCompiles()


class _Off:
    """What :func:`deferred_compiles` yields when off."""

    def __init__(self) -> None:
        self.step: int | None = None
        self.result = DeferredCompiles()
