"""What the profiler saw in a traffic run: where a first run's extra time went
when nothing compiled (``stepwarm coverage --trace``).

The other detectors see compiles, imports, allocator growth, collector
passes. What they cannot see happens below Python: the first replay of a
CUDA graph, a kernel whose module the driver loads on its first launch (CUDA
lazy loading), a first cuBLAS / cuDNN call at a shape class, a custom op's
first call. ``torch.profiler`` records each of these as an operator or a
CUDA runtime / driver call with its own time. With ``--trace`` every run of a
traffic line is profiled (CPU operators and CUDA calls; kernels on the
device where there is one) and reduced to a :func:`summarize` dict; a flagged
line's two summaries are then compared by :func:`trace_explanation`: the
names that took more time in the first run, with the slowest single call
and, for a launch, the kernel it launched.

A profiled run is slower than an unprofiled one (a few ms per step); both
runs of a line are profiled, so the comparison holds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

from stepwarm.coverage.stacks import StackSampler

logger = logging.getLogger("vllm.stepwarm")

#: Names kept per run (by time): enough for any diff worth naming.
MAX_NAMES = 60
#: Characters kept of a name (a kernel's C++ template name runs to thousands).
NAME_CHARS = 160
#: Kernels first launched in a run, listed at most (the count is whole).
MAX_NEW_KERNELS = 8
#: A single CUDA runtime / driver call at least this long (us) is kept with
#: what it launched.
SLOW_CALL_US = 1000.0
#: Calls that wait for the device: their time is the device's, not theirs.
WAITS = ("Synchronize", "cudaEventQuery", "cudaStreamWaitEvent", "cuStreamWaitEvent")
#: A name counts in the run-wide slowdown once it took this long in the second run (us)...
SCALE_MIN_US = 50.0
#: ...and the slowdown is taken over at least this many names (else none is assumed).
SCALE_MIN_NAMES = 5
#: A run-wide slowdown this large is said in the phrase.
UNIFORM_SLOWDOWN = 1.2
#: A run-wide slowdown explains an outlier (the host ran the same calls
#: slower, :func:`host_slowdown`) when three names in four grew at least this
#: much: the slowdown spread over the run, not held by a few names.
HOST_QUARTILE = 1.15
#: CUPTI's records of CUDA loading a module or function on first use (lazy loading).
MODULE_LOADS = ("Module Loading", "Function Loading")
#: Calls that launch work on the device (their slow first call loads a module).
LAUNCHES = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cuGraphLaunch",
            "cudaLaunchCooperativeKernel")


def _us(ns: float) -> float:
    return ns / 1e3


@dataclass
class Tracer:
    """Profiles runs, one :meth:`run` each, and remembers which kernels the
    runs before launched (a kernel new to this process's traffic is named in
    the run that first launched it)."""

    #: Kernel names launched by the runs profiled so far.
    seen_kernels: set[str] = field(default_factory=set)
    #: Why profiling is off ("" while it works).
    broken: str = ""
    #: Samples the calling thread's stack in every run.
    sampler: StackSampler = field(default_factory=StackSampler)

    def prime(self) -> None:
        """Start and stop the profiler once, so its own set-up (CUPTI's) is
        not charged to the first traffic run; logs a warning when it cannot
        run (every run's summary then carries the ``error``)."""
        with self.run() as _:
            pass
        if self.broken:
            logger.warning("stepwarm coverage --trace: the profiler does not run here (%s); "
                           "no run is profiled", self.broken)

    @contextmanager
    def run(self) -> Iterator[dict[str, Any]]:
        """Profile the block; the dict it yields is filled with
        :func:`summarize`'s summary when the block ends (left empty, with an
        ``error``, when the profiler cannot run), and under ``stacks`` where
        the calling thread was outside the worker
        (:class:`~stepwarm.coverage.stacks.StackSampler`)."""
        with self._profiled() as out:
            with self.sampler.run() as stacks:
                yield out
        out["stacks"] = stacks

    @contextmanager
    def _profiled(self) -> Iterator[dict[str, Any]]:
        out: dict[str, Any] = {}
        if self.broken:
            out["error"] = self.broken
            yield out
            return
        try:
            import torch.profiler as tp

            activities = [a for a in (tp.ProfilerActivity.CPU, tp.ProfilerActivity.CUDA)
                          if a in tp.supported_activities()]
            prof = tp.profile(activities=activities)
            with _stderr_muted():
                prof.__enter__()
        except Exception as e:  # noqa: BLE001 - tracing must never break coverage
            self.broken = f"{type(e).__name__}: {e}"
            out["error"] = self.broken
            yield out
            return
        try:
            yield out
        finally:
            try:
                with _stderr_muted():
                    prof.__exit__(None, None, None)
                out.update(summarize(_events(prof), self.seen_kernels))
            except Exception as e:  # noqa: BLE001
                self.broken = f"{type(e).__name__}: {e}"
                out["error"] = self.broken
                logger.warning("stepwarm coverage --trace: the profiler failed (%s); "
                               "the runs after this one are not profiled", self.broken)


@contextmanager
def _stderr_muted() -> Iterator[None]:
    """File descriptor 2 to /dev/null while the profiler starts or stops:
    Kineto writes a ``profiler_start`` / ``profiler_stop`` line to it each
    time, two per traffic run, that no log level silences. An exception
    raised meanwhile still reaches the caller."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):  # no descriptor 2 to mute
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@dataclass(frozen=True)
class Event:
    """One profiled event, as :func:`summarize` needs it."""

    name: str
    #: ``cpu`` (an operator or a CUDA runtime / driver call) or ``device`` (a
    #: kernel, a copy); ``link-cpu`` / ``link-device``: a Kineto record kept
    #: only for its correlation (what a slow call launched).
    where: str
    #: Time in it, without its children (us; a device event's duration).
    self_us: float
    #: A CPU call's correlation id, or the id of the call that launched a device event (0: none).
    correlation: int = 0


def _events(prof: Any) -> list[Event]:
    """The profile's events: CPU operators and CUDA calls with their self
    time (torch's event tree), device events with their duration; each CPU
    event's CUDA correlation id, and each device event's launcher's, from
    Kineto's raw records where they are there."""
    out = []
    for e in prof.events():
        if getattr(e, "is_user_annotation", False):
            continue  # record_function ranges: the whole run, not a cause
        device = "CPU" not in str(e.device_type)
        out.append(Event(name=e.name, where="device" if device else "cpu",
                         self_us=float(e.time_range.elapsed_us() if device
                                       else e.self_cpu_time_total)))
    links = []
    try:
        for k in prof.profiler.kineto_results.events():
            device = "CPU" not in str(k.device_type())
            corr = k.linked_correlation_id() if device else k.correlation_id()
            if corr:
                links.append(Event(name=k.name(), where="link-device" if device else "link-cpu",
                                   self_us=_us(k.duration_ns()), correlation=int(corr)))
    except Exception:  # noqa: BLE001 - the links only name what a slow launch launched
        links = []
    return out + links


def summarize(events: list[Event], seen_kernels: set[str]) -> dict[str, Any]:
    """One run's profile as plain data.

    Args:
        events: the run's events (:class:`Event`; ``link-cpu`` / ``link-device``
            ones carry only the correlation between a call and what it launched).
        seen_kernels: kernels earlier runs launched; this run's are added.

    Returns:
        ``{"cpu": {name: [calls, self_us, max_us]}, "device": {name: [count, us]},
        "new_kernels": [count, [names...]], "slow_calls": [[name, us, launched], ...]}``;
        each map keeps the :data:`MAX_NAMES` names with the most time.
    """
    cpu: dict[str, list[float]] = {}
    device: dict[str, list[float]] = {}
    launched: dict[int, str] = {}
    calls: list[Event] = []
    for e in events:
        e = replace(e, name=e.name[:NAME_CHARS]) if len(e.name) > NAME_CHARS else e
        if e.where == "cpu":
            s = cpu.setdefault(e.name, [0, 0.0, 0.0])
            s[0] += 1
            s[1] += e.self_us
            s[2] = max(s[2], e.self_us)
        elif e.where == "device":
            d = device.setdefault(e.name, [0, 0.0])
            d[0] += 1
            d[1] += e.self_us
        elif e.where == "link-device":
            launched.setdefault(e.correlation, e.name)
        elif e.where == "link-cpu" and e.name.startswith("cu") and e.self_us >= SLOW_CALL_US:
            calls.append(e)
    new = sorted(set(device) - seen_kernels)
    seen_kernels.update(device)

    def top(m: dict[str, list[float]], key: int) -> dict[str, list[float]]:
        names = sorted(m, key=lambda n: -m[n][key])[:MAX_NAMES]
        return {n: [int(m[n][0])] + [round(v, 1) for v in m[n][1:]] for n in names}

    calls.sort(key=lambda e: -e.self_us)
    return {"cpu": top(cpu, 1), "device": top(device, 1),
            "new_kernels": [len(new), new[:MAX_NEW_KERNELS]],
            "slow_calls": [[e.name, round(e.self_us, 1), launched.get(e.correlation, "")]
                           for e in calls[:MAX_NEW_KERNELS]]}


def _is(name: str, kinds: tuple[str, ...]) -> bool:
    return any(k in name for k in kinds)


def _ratios(first: dict[str, list[float]], second: dict[str, list[float]],
            per_call: bool = False) -> list[float]:
    """first / second self time, sorted, of the names with the same calls in
    both and at least :data:`SCALE_MIN_US` in the second, those waiting for
    the device left out; ``per_call``: of every name called in both, time
    per call (two runs scheduled differently, :func:`slowdown`)."""
    return sorted((a[1] / a[0]) / (b[1] / b[0]) if per_call else a[1] / b[1]
                  for name, a in first.items()
                  if (b := second.get(name)) is not None and not _is(name, WAITS)
                  and (a[0] == b[0] or (per_call and a[0] > 0 and b[0] > 0))
                  and b[1] >= SCALE_MIN_US)


def slowdown(first: dict[str, list[float]], second: dict[str, list[float]],
             per_call: bool = False) -> tuple[float, int]:
    """How much slower the first run ran every name: the median of
    first / second self time over the names with the same calls in both and
    at least :data:`SCALE_MIN_US` in the second (calls that wait for the
    device left out), and how many names that is; 1.0 (no slowdown) with
    fewer than :data:`SCALE_MIN_NAMES` of them or a median under 1.

    ``per_call``: the runs took different worker steps (a drafter's
    acceptance, a chunk split), so no name has the same calls in both:
    compare each name's time per call instead (EAGLE on V1, s21: 13 against
    12 steps, every name x1.5 a call)."""
    ratios = _ratios(first, second, per_call)
    if len(ratios) < SCALE_MIN_NAMES:
        return 1.0, len(ratios)
    mid = len(ratios) // 2
    median = ratios[mid] if len(ratios) % 2 else (ratios[mid - 1] + ratios[mid]) / 2
    return max(1.0, median), len(ratios)


def _waits_ms(cpu: dict[str, list[float]]) -> float:
    return sum(v[1] for name, v in cpu.items() if _is(name, WAITS)) / 1e3


def _host_parts(first: dict[str, Any], second: dict[str, Any], excess_ms: float,
                first_worker_ms: float, named_cpu_ms: float = 0.0,
                per_call: bool = False) -> tuple[list[str], float]:
    """:func:`host_slowdown`'s two parts, each phrase with its time, and the
    time together. ``named_cpu_ms``: CPU time already named beyond the
    run-wide slowdown (:func:`trace_explanation`), left out of the CPU part;
    ``per_call``: as :func:`slowdown`."""
    parts, total = [], 0.0
    scale, names = slowdown(first["cpu"], second["cpu"], per_call)
    ratios = _ratios(first["cpu"], second["cpu"], per_call)
    if scale >= UNIFORM_SLOWDOWN and names >= SCALE_MIN_NAMES:
        quartile = ratios[len(ratios) // 4]
        base = first_worker_ms - _waits_ms(first["cpu"]) - named_cpu_ms
        slower = max(0.0, base) * (scale - 1) / scale
        if quartile >= HOST_QUARTILE and slower >= 0.5:
            total += slower
            parts.append(f"every operator slower{' a call' if per_call else ''}, median "
                         f"x{scale:.2f} over {names} names, three in four at least "
                         f"x{quartile:.2f}: +{slower:.1f} ms")
    kernels = (sum(v[1] for v in first.get("device", {}).values())
               - sum(v[1] for v in second.get("device", {}).values())) / 1e3
    waited = _waits_ms(first["cpu"]) - _waits_ms(second["cpu"]) - max(0.0, kernels)
    if waited >= max(1.0, excess_ms / 5):
        total += waited
        parts.append(f"waited for the device +{waited:.1f} ms beyond this run's kernels "
                     f"({kernels:+.1f} ms)")
    return parts, total


def host_slowdown(first: dict[str, Any], second: dict[str, Any], excess_ms: float,
                  first_worker_ms: float | None, per_call: bool = False) -> str:
    """The phrase for a first run that ran the same work slower and nothing
    more, on a CPU or a device other work shared (``""`` when it did not).

    Two parts, each said when it happened:

    - **CPU**: every operator slower by the run-wide median (at least
      :data:`UNIFORM_SLOWDOWN`), three names in four by at least
      :data:`HOST_QUARTILE`: the same operators with the same call counts,
      view and bookkeeping ones (``aten::slice``, ``aten::as_strided``)
      among them, taking a fixed factor longer is the CPU running slower
      (other work on its cores, an SMT sibling, a lower clock). Its time:
      that slowdown over the worker's first-run time less its waits for
      the device.
    - **device**: the waits for the device (:data:`WAITS`) grew beyond what
      the run's own kernels grew: the device ran another process's work.

    Said when no name grew beyond the run-wide slowdown (a first call of a
    shape concentrates in a few names: a compile, a module load, an
    allocation, which :func:`trace_explanation` names) and the two parts
    together are at least half of ``excess_ms``; kernels first launched in
    the run are listed beside it. ``per_call``: as :func:`slowdown`.
    """
    if not first_worker_ms or not first.get("cpu") or not second.get("cpu"):
        return ""
    parts, total = _host_parts(first, second, excess_ms, first_worker_ms, per_call=per_call)
    if not parts or total < excess_ms / 2:
        return ""
    new = first.get("new_kernels", [0, []])
    also = f"; {new[0]} kernel(s) first launched in traffic" if new[0] else ""
    return (f"host: {'; '.join(parts)}, of the {excess_ms:.1f} ms excess (the same work run "
            f"slower beside other work on the CPU or device, not a first call){also}")


def trace_explanation(first: dict[str, Any] | None, second: dict[str, Any] | None,
                      excess_ms: float, first_worker_ms: float | None = None,
                      per_call: bool = False) -> tuple[str, bool]:
    """Where the first run's extra time went, by the two runs' profiles.

    A first run can be slower everywhere (a cold process, a busy host): every
    name's time is first scaled by that run-wide slowdown (:func:`slowdown`),
    and a name is named for what it grew beyond it. The CPU names
    (operators, CUDA calls) whose self time grew the most, those waiting for
    the device left out (the device's time shows as the kernels' instead),
    then the kernels whose device time grew: each at least 1 ms and a fifth
    of ``excess_ms``, three at most. Where they cover less than half of
    ``excess_ms`` and the rest ran slower by the run-wide slowdown
    (:func:`host_slowdown`'s parts, over the worker's time less what was
    named), both together are counted: s19's Qwen3-Next paid 9.6 ms in
    ``aten::mm`` (six cuBLAS kernels first launched) and 19.9 ms in every
    operator running x1.61 slower, of a 30.2 ms excess. In each such line
    of runs s9-s19 the slowdown came with cuBLAS kernels first launched in
    the step: it is part of that first call's cost, not said to be other
    work's (as :func:`host_slowdown` says of a slowdown alone).

    Args:
        first, second: the runs' :func:`summarize` dicts (None / empty: not profiled).
        excess_ms: first minus second run (ms).
        first_worker_ms: the worker's time in the first run's steps (ms), for
            :func:`host_slowdown`; None: not known, never said.
        per_call: the runs took different worker steps: names are compared
            by time per call (:func:`slowdown`), a name's expected time being
            the second run's scaled by the first run's calls.

    Returns:
        The phrase (``""``: nothing to name) and whether the named time
        covers at least half of ``excess_ms`` (then it explains the outlier).
        E.g. ``("profiler: cudaGraphLaunch +12.1 ms (slowest call 12.3 ms)", True)``.
    """
    if not first or not second or "cpu" not in first or "cpu" not in second:
        return "", False
    floor = max(1.0, excess_ms / 5)
    grown: list[tuple[float, str]] = []
    scales = {}
    for where in ("cpu", "device"):
        a, b = first.get(where, {}), second.get(where, {})
        scales[where] = slowdown(a, b, per_call)
        scale = scales[where][0]
        for name, stats in a.items():
            if where == "cpu" and _is(name, WAITS):
                continue
            calls = stats[0] / b[name][0] if per_call and name in b and b[name][0] else 1.0
            ms = (stats[1] - (b[name][1] * scale * calls if name in b else 0.0)) / 1e3
            if ms >= floor:
                grown.append((ms, f"{name}{' (on the device)' if where == 'device' else ''}"))
    grown.sort(reverse=True)
    grown = grown[:3]
    scale, names = scales["cpu"]
    uniform = (f"every operator slower{' a call' if per_call else ''}, median x{scale:.2f} "
               f"over {names} names" if scale >= UNIFORM_SLOWDOWN else "")
    if not grown:
        host = host_slowdown(first, second, excess_ms, first_worker_ms, per_call)
        if host:
            return f"profiler: {host}", True
        return (f"profiler: no single cause; {uniform}", False) if uniform else ("", False)
    slow = {c[0]: c for c in first.get("slow_calls", [])}
    parts = []
    for ms, label in grown:
        stats = first.get("cpu", {}).get(label)
        text = f"{label} +{ms:.1f} ms"
        if stats is not None and stats[0] > 1:
            text += f" (slowest of {stats[0]} calls {stats[2] / 1e3:.1f} ms)"
        call = slow.get(label)
        if call is not None and _is(label, LAUNCHES) and call[2]:
            text += f", launching {call[2][:80]}"
        if _is(label, MODULE_LOADS):
            text += " (CUDA lazy loading: a kernel's module loaded at its first launch)"
        parts.append(text)
    new = first.get("new_kernels", [0, []])
    if new[0]:
        parts.append(f"{new[0]} kernel(s) first launched in traffic ({', '.join(n[:60] for n in new[1][:2])})")
    if uniform:
        parts.append(f"beyond {uniform}")
    named = sum(ms for ms, _ in grown)
    if named < excess_ms / 2 and first_worker_ms and uniform:
        # the named first-call costs and the same work run slower beside them
        cpu_named = sum(ms for ms, label in grown if not label.endswith("(on the device)"))
        host, slower = _host_parts(first, second, excess_ms, first_worker_ms, cpu_named,
                                   per_call)
        if host and named + slower >= excess_ms / 2:
            parts[-1] = (f"and the rest: {'; '.join(host)}; {named + slower:.1f} of the "
                         f"{excess_ms:.1f} ms excess together")
            named += slower
    return "profiler: " + "; ".join(parts), named >= excess_ms / 2
