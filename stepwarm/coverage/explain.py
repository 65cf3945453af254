"""What a request's first run did besides compiling: the causes a first-call
outlier can have that no compile detector sees.

A :class:`Snapshot` is taken before and after each run of a traffic line (the
worker runs in this process under ``stepwarm coverage``); :func:`side_effects`
is the difference, each cause counted only when it happened:

- ``imports``: modules imported during the run (``sys.modules`` grew: a lazy
  import on first use), with the first few names;
- ``dynamo_frames`` / ``dynamo_graphs``: frames torch.compile compiled (a
  first compile, or a recompile after a guard failed: a new shape or Python
  int it specialized on) and graphs it built (``torch._dynamo.utils.counters``);
- ``reserved_mib`` / ``device_allocs``: the CUDA caching allocator growing
  (``torch.cuda.memory_reserved``, ``memory_stats()["num_device_alloc"]``:
  cudaMalloc calls, which the second run of the same shapes no longer makes);
- ``gc_collections`` / ``gc_ms``: garbage-collector passes per generation (a
  generation-2 pass over a large heap is tens of ms) and the time they took
  (``gc.callbacks``, while :func:`gc_clock` is on: :func:`replay
  <stepwarm.coverage.replay.replay>` turns it on);
- ``thread_cpu_ms``: the CPU time of the thread that ran the request (always
  there; the replay adds ``worker_cpu_ms``, its share inside the worker's
  calls): a run whose excess outside the worker came with as much more CPU
  time there did work; one without it waited;
- ``threads``: threads started (a lazily made worker pool);
- ``preempted`` / ``cpu_stall_ms``: the host's CPU taken by others: this
  process's threads switched out involuntarily (``getrusage``'s
  ``ru_nivcsw``), and the time runnable tasks waited for a CPU (Linux PSI,
  ``/proc/pressure/cpu`` ``some total``; where the kernel has it). A first
  run that every operator ran slower in (``stepwarm coverage --trace``:
  "every operator slower") while other processes held the cores
  (other engines compiling beside it) is contention, not a first-call cost:
  :data:`CONTENTION_RATIO` times the second run's, and
  :data:`CONTENTION_MIN_PREEMPTED` switches or :data:`CONTENTION_MIN_STALL_MS`
  ms more.

A flagged request whose first run shows none of these stays ``unexplained``
(the report says so): first cuBLAS / cuDNN handles, FlashInfer / DeepGEMM JIT
outside Triton's cache and driver-level work leave no trace here. It is
then traced to the worker step that paid the excess (:func:`slow_step`):
which step, how many tokens and requests, how much slower.
"""

from __future__ import annotations

import gc
import resource
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: Module names listed per run at most (the count is always whole).
MAX_NAMES = 5
#: A first run counts as contended when it was preempted (or stalled) this
#: many times more than the second run, and by at least the minimum below.
CONTENTION_RATIO = 2.0
CONTENTION_MIN_PREEMPTED = 50
CONTENTION_MIN_STALL_MS = 5.0
#: The collector's extra time explains an outlier from this many ms on.
GC_MIN_MS = 1.0
#: Linux's CPU pressure (PSI) file.
PSI_CPU = "/proc/pressure/cpu"


@dataclass(frozen=True)
class Snapshot:
    """Process state that a first run can change and a second usually does not."""

    modules: frozenset[str]
    dynamo_frames: int
    dynamo_graphs: int
    reserved_bytes: int
    device_allocs: int
    gc_collections: tuple[int, ...]
    threads: int
    #: ``ru_nivcsw`` of this process (all its threads).
    preempted: int = 0
    #: PSI ``some total`` of the CPU (µs; 0 where the kernel has none).
    cpu_stall_us: int = 0
    #: Nanoseconds the collector ran, while :func:`gc_clock` is on.
    gc_ns: int = 0
    #: The calling thread's CPU time (``time.thread_time_ns``).
    thread_cpu_ns: int = 0


#: Nanoseconds of collector passes counted by :func:`_gc_callback`, and when
#: the pass under way began.
_GC = {"ns": 0, "start": 0}


def _gc_callback(phase: str, info: dict[str, int]) -> None:
    now = time.perf_counter_ns()
    if phase == "start":
        _GC["start"] = now
    elif _GC["start"]:
        _GC["ns"] += now - _GC["start"]
        _GC["start"] = 0


@contextmanager
def gc_clock() -> Iterator[None]:
    """Count the collector's time (``gc.callbacks``) for the block: the
    snapshots taken in it carry it (``gc_ms`` of :func:`side_effects`)."""
    gc.callbacks.append(_gc_callback)
    try:
        yield
    finally:
        gc.callbacks.remove(_gc_callback)


def _cpu_stall_us() -> int:
    try:
        with open(PSI_CPU) as f:
            for line in f:
                if line.startswith("some"):
                    return int(line.rsplit("total=", 1)[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _dynamo_counts() -> tuple[int, int]:
    mod = sys.modules.get("torch._dynamo.utils")
    counters = getattr(mod, "counters", None)
    if counters is None:
        return 0, 0
    return int(counters["frames"].get("total", 0)), int(counters["stats"].get("unique_graphs", 0))


def _cuda_counts() -> tuple[int, int]:
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return 0, 0
    stats = torch.cuda.memory_stats()
    return int(torch.cuda.memory_reserved()), int(stats.get("num_device_alloc", 0))


def snapshot() -> Snapshot:
    """The process's state now (cheap: no collection, no device sync)."""
    frames, graphs = _dynamo_counts()
    reserved, allocs = _cuda_counts()
    return Snapshot(modules=frozenset(sys.modules), dynamo_frames=frames,
                    dynamo_graphs=graphs, reserved_bytes=reserved,
                    device_allocs=allocs,
                    gc_collections=tuple(s["collections"] for s in gc.get_stats()),
                    threads=threading.active_count(),
                    preempted=resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw,
                    cpu_stall_us=_cpu_stall_us(), gc_ns=_GC["ns"],
                    thread_cpu_ns=time.thread_time_ns())


def side_effects(before: Snapshot, after: Snapshot) -> dict[str, Any]:
    """What changed between two snapshots; only the causes that happened."""
    out: dict[str, Any] = {}
    new = sorted(after.modules - before.modules)
    if new:
        out["imports"] = len(new)
        out["imported"] = new[:MAX_NAMES]
    for key in ("dynamo_frames", "dynamo_graphs", "device_allocs", "threads", "preempted"):
        d = getattr(after, key) - getattr(before, key)
        if d > 0:
            out[key] = d
    grown = after.reserved_bytes - before.reserved_bytes
    if grown > 0:
        out["reserved_mib"] = round(grown / (1 << 20), 1)
    stall = after.cpu_stall_us - before.cpu_stall_us
    if stall > 0:
        out["cpu_stall_ms"] = round(stall / 1e3, 1)
    gc_ms = round((after.gc_ns - before.gc_ns) / 1e6, 1)
    if gc_ms > 0:
        out["gc_ms"] = gc_ms
    out["thread_cpu_ms"] = round((after.thread_cpu_ns - before.thread_cpu_ns) / 1e6, 1)
    gcs = [a - b for a, b in zip(after.gc_collections, before.gc_collections)]
    if any(gcs):
        out["gc_collections"] = gcs
    return out


def explanation(first: dict[str, Any], second: dict[str, Any], excess_ms: float = 0.0) -> str:
    """The causes the first run had and the second did not, as one phrase
    (``""``: none, the outlier is unexplained); the collector's time
    (``gc_ms``) counts where it grew by half of ``excess_ms`` (the first
    run's ms over the second's) and at least :data:`GC_MIN_MS`."""
    parts = []
    if first.get("imports", 0) > second.get("imports", 0):
        parts.append(f"{first['imports']} module(s) imported ({', '.join(first['imported'][:2])})")
    for key, what in (("dynamo_frames", "torch.compile frame compile(s)"),
                      ("dynamo_graphs", "torch.compile graph(s)"),
                      ("device_allocs", "cudaMalloc call(s)"),
                      ("threads", "thread(s) started")):
        if first.get(key, 0) > second.get(key, 0):
            parts.append(f"{first[key]} {what}")
    if first.get("reserved_mib", 0) > second.get("reserved_mib", 0):
        parts.append(f"allocator +{first['reserved_mib']:g} MiB")
    f_gc, s_gc = first.get("gc_collections", [0, 0, 0]), second.get("gc_collections", [0, 0, 0])
    if len(f_gc) > 2 and f_gc[2] > (s_gc[2] if len(s_gc) > 2 else 0):
        parts.append(f"{f_gc[2]} full gc pass(es)")
    elif excess_ms > 0:
        gc_ms = first.get("gc_ms", 0.0) - second.get("gc_ms", 0.0)
        if gc_ms >= max(GC_MIN_MS, excess_ms / 2):
            parts.append(f"garbage collector +{gc_ms:.1f} ms ({first.get('gc_ms', 0.0):g} ms, "
                         f"second run {second.get('gc_ms', 0.0):g} ms)")
    contended = contention(first, second)
    if contended:
        parts.append(contended)
    return "; ".join(parts)


def contention(first: dict[str, Any], second: dict[str, Any]) -> str:
    """``"host CPU contention: ..."`` when the first run lost the host's CPU
    to others well beyond the second (module docstring), else ``""``."""
    said = []
    p1, p2 = first.get("preempted", 0), second.get("preempted", 0)
    if p1 >= CONTENTION_RATIO * p2 and p1 - p2 >= CONTENTION_MIN_PREEMPTED:
        said.append(f"{p1} involuntary context switches (second run {p2})")
    s1, s2 = first.get("cpu_stall_ms", 0.0), second.get("cpu_stall_ms", 0.0)
    if s1 >= CONTENTION_RATIO * s2 and s1 - s2 >= CONTENTION_MIN_STALL_MS:
        said.append(f"tasks waited {s1:g} ms for a CPU (second run {s2:g})")
    return "host CPU contention: " + ", ".join(said) if said else ""


def slow_step(first: list[list[float]], second: list[list[float]]) -> str:
    """The worker step where the first run lost the most time against the
    second, as a phrase (``""`` when neither run has steps).

    Args:
        first, second: each run's steps, ``[tokens, requests, ms(, new)]`` per
            ``execute_model`` (:attr:`~stepwarm.coverage.replay.RequestResult.first_steps`).

    Returns:
        e.g. ``"step 1 of 5 (1450 tokens, 5 requests) +14.2 ms (all the
        worker's steps +15.0 ms)"`` (with ``", the first traffic step of that
        size"`` after the requests where the step says so); where the two
        runs were scheduled differently, the step counts and the time in
        their steps instead.
    """
    if not first or not second:
        return ""
    if [s[:2] for s in first] != [s[:2] for s in second]:
        return (f"scheduled differently: {len(first)} vs {len(second)} steps, "
                f"{sum(s[2] for s in first):.1f} vs {sum(s[2] for s in second):.1f} ms in them")
    i = max(range(len(first)), key=lambda k: first[k][2] - second[k][2])
    tokens, reqs, ms = first[i][:3]
    extra = sum(f[2] for f in first) - sum(s[2] for s in second)
    # [3]: 1 where no earlier traffic step had that many tokens (WorkerClock)
    new = ", the first traffic step of that size" if first[i][3:4] == [1] else ""
    return (f"step {i + 1} of {len(first)} ({int(tokens)} tokens, {int(reqs)} "
            f"request{'s' if reqs != 1 else ''}{new}) +{ms - second[i][2]:.1f} ms "
            f"(all the worker's steps {extra:+.1f} ms)")


def extra_steps(first: list[list[float]], second: list[list[float]], threshold: float) -> str:
    """``"scheduled differently: ..."`` when the first run took more worker
    steps than the second (a speculative drafter's acceptance or a chunk
    split that differed) and its steps were no slower on average (within
    ``threshold`` of the second's): its excess is the extra steps' time, not
    a first-call cost; ``""`` otherwise."""
    if not first or not second or len(first) <= len(second):
        return ""
    per_first = sum(s[2] for s in first) / len(first)
    per_second = sum(s[2] for s in second) / len(second)
    if per_first > threshold * per_second:
        return ""
    return (f"scheduled differently: {len(first)} vs {len(second)} steps, {per_first:.1f} vs "
            f"{per_second:.1f} ms a step: the extra steps' time, not a first-call cost")


def outside_cpu_ms(effects: dict[str, Any]) -> float:
    """The request thread's CPU time outside the worker's calls in a run
    (``thread_cpu_ms`` less ``worker_cpu_ms``, the step clock's share)."""
    return float(effects.get("thread_cpu_ms", 0.0)) - float(effects.get("worker_cpu_ms", 0.0))


def outside_worker(first_ms: float, second_ms: float, first_worker_ms: float | None,
                   second_worker_ms: float | None, thread_cpu_ms: float | None = None) -> str:
    """``"outside the worker +X ms of the E ms excess"`` when at least half of
    a first run's excess over the second was spent outside the worker's
    ``execute_model`` / ``sample_tokens`` (vLLM's scheduling, output
    processing and front end, where neither the step clock nor the profiler's
    device work looks), else ``""``; with ``thread_cpu_ms`` (how much more
    CPU time the request's thread had outside the worker in the first run,
    :func:`outside_cpu_ms`), whether that time went on work (at least half
    of it on the CPU) or on waiting."""
    if not first_worker_ms or not second_worker_ms:
        return ""
    excess = first_ms - second_ms
    outside = excess - (first_worker_ms - second_worker_ms)
    if excess <= 0 or outside < excess / 2:
        return ""
    said = f"outside the worker +{outside:.1f} ms of the {excess:.1f} ms excess"
    if thread_cpu_ms is None:
        return said
    how = "on the CPU" if thread_cpu_ms >= outside / 2 else "mostly waiting, off the CPU"
    return f"{said} ({how}: the thread's CPU time there {thread_cpu_ms:+.1f} ms)"
