"""Where the calling thread was while a traffic run took its time outside the
worker (``stepwarm coverage --trace``): a sampling of its Python stack.

The step clock (:class:`~stepwarm.runner.WorkerClock`) and the profiler see
the worker's ``execute_model`` / ``sample_tokens``; a first run can also
lose its time around them, in vLLM's input processing, scheduler, output
processing or front end, where neither looks. :class:`StackSampler` runs a
thread beside the run that reads the calling thread's stack
(``sys._current_frames``) every :data:`INTERVAL_S` and charges the time since
its previous look to where the stack was then, so a stretch the thread held
the interpreter without letting the sampler in (a long C call) is still
counted, at its end. A sample whose stack passes through the worker's
``execute_model`` / ``sample_tokens`` is the worker's and not kept, nor one
in coverage's own snapshots of the run.

A site is ``module.function`` of the innermost frame, after the innermost
vLLM / stepwarm frame where that is a different one
(``vllm.v1.engine.output_processor.process_outputs > threading.wait``): what
the thread was doing and for which part of vLLM. :func:`stacks_explanation` names the
sites that took more time in the first run than in the second; the phrase
only attributes (it never calls an outlier explained).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

#: Seconds between two looks at the stack.
INTERVAL_S = 0.001
#: Sites kept per run (by time): enough that a site a first run names is
#: rarely cut from the second run's list (which would count it as 0 there).
MAX_SITES = 40
#: Sites named in a phrase at most.
MAX_NAMED = 3
#: Methods whose frames mark the worker's own time (the step clock's).
WORKER_METHODS = ("execute_model", "sample_tokens")
#: Packages whose frames say which part of vLLM (or stepwarm) a site is in.
OURS = ("vllm", "stepwarm")
#: Where ``stepwarm coverage`` measures a run: a sample whose stack passes
#: through it (the snapshots the replay takes inside the sampled block) is
#: the measurement's, not the request's, and is not kept.
MEASURING = ("stepwarm.coverage.explain", "snapshot")


def _module(frame: FrameType) -> str:
    return str(frame.f_globals.get("__name__", "?"))


def _skipped(module: str, function: str) -> bool:
    """Whether a frame makes its stack's sample not the request's outside
    the worker: a worker's ``execute_model`` / ``sample_tokens`` (a method of
    that name in a vLLM ``worker`` module), or coverage's own snapshot
    (:data:`MEASURING`)."""
    return ((module, function) == MEASURING
            or (function in WORKER_METHODS and module.startswith("vllm.") and ".worker" in module))


def site(frame: FrameType) -> str | None:
    """``module.function`` of ``frame``, after the innermost vLLM / stepwarm
    frame at or above it when that is another one (module docstring); None
    where the stack passes through the worker's calls or coverage's own
    snapshot (:func:`_skipped`). One walk up the stack."""
    ours: FrameType | None = None
    f: FrameType | None = frame
    while f is not None:
        module = _module(f)
        if _skipped(module, f.f_code.co_name):
            return None
        if ours is None and module.split(".", 1)[0] in OURS:
            ours = f
        f = f.f_back
    inner = f"{_module(frame)}.{frame.f_code.co_name}"
    if ours is None or ours is frame:
        return inner
    return f"{_module(ours)}.{ours.f_code.co_name} > {inner}"


class StackSampler:
    """Samples one thread's stack while :meth:`run` is active (module docstring)."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_s = interval_s

    @contextmanager
    def run(self) -> Iterator[dict[str, Any]]:
        """Sample the calling thread for the block; the dict it yields is
        filled when the block ends: ``{"outside_ms": ms, "samples": n,
        "sites": {site: ms}}`` (the :data:`MAX_SITES` sites with the most
        time outside the worker)."""
        target = threading.get_ident()
        sites: dict[str, float] = {}
        counts = [0]
        stop = threading.Event()

        def sample() -> None:
            last = time.perf_counter()
            while not stop.wait(self.interval_s):
                frame = sys._current_frames().get(target)
                now = time.perf_counter()
                if stop.is_set():  # the thread is ending the block (joining this one)
                    break
                key = site(frame) if frame is not None else None
                if key is not None:
                    sites[key] = sites.get(key, 0.0) + (now - last) * 1e3
                    counts[0] += 1
                last = now
                del frame

        out: dict[str, Any] = {}
        thread = threading.Thread(target=sample, name="stepwarm-stacks", daemon=True)
        thread.start()
        try:
            yield out
        finally:
            stop.set()
            thread.join()
            top = sorted(sites, key=lambda k: -sites[k])[:MAX_SITES]
            out.update({"outside_ms": round(sum(sites.values()), 1), "samples": counts[0],
                        "sites": {k: round(sites[k], 1) for k in top}})


def stacks_explanation(first: dict[str, Any] | None, second: dict[str, Any] | None,
                       excess_ms: float) -> str:
    """The sites outside the worker that took more time in the first run
    than in the second, as a phrase (``""``: not sampled, or none grew by
    1 ms and a fifth of ``excess_ms``).

    E.g. ``"sampled outside the worker: vllm.v1.engine.processor.process_inputs
    +41.0 ms, ... (71.2 ms in all, second run 9.8 ms)"``.
    """
    if not first or not second or "sites" not in first or "sites" not in second:
        return ""
    floor = max(1.0, excess_ms / 5)
    a, b = first["sites"], second["sites"]
    grown = sorted(((ms - b.get(k, 0.0), k) for k, ms in a.items()), reverse=True)
    named = [f"{k} +{ms:.1f} ms" for ms, k in grown[:MAX_NAMED] if ms >= floor]
    if not named:
        return ""
    return (f"sampled outside the worker: {', '.join(named)} ({first['outside_ms']:.1f} ms "
            f"in all, second run {second['outside_ms']:.1f} ms)")
