"""Replay a traffic file through vLLM's real scheduler, each request twice.

Each line of the traffic file becomes ``LLM.generate(prompts, SamplingParams)``
(its ``count`` requests in one call, scheduled by vLLM's scheduler as real
traffic is), run twice. Before each run the prefix cache is reset (and a
line's shared prefix primed), so both runs do the same work; the difference
between them is what the first request pays once: a JIT compile, a lazy
initialization. The detectors are polled after each run.

A line whose first run looks like an outlier without a compile (first /
second above the gate, see :class:`Gate`) is run :data:`STEADY_RUNS` more
times: a first run within the gate's ratio of one of the later runs was
noise (another process on the device, the collector), not a first-call cost
(``CoverageReport.noise``).

A first-call cost that stays after them gets one more question: is it a cost
of this line's shapes, which a warmup step could pay instead, or one that
steady traffic pays at every token count it has not seen (a GEMM's first
call at a new M, above the CUDA-graph sizes: docs/findings.md)? The
new-size control answers it: the same requests with one prompt token more
each (one less where that would not fit), run :data:`NEW_SIZE_RUNS` times
after the line. Its steps have token counts no step had, while every shape
class the line reached is warm by then; when its first run is as slow as the
line's first (:meth:`Gate.same_cost`), the line's excess is what any new size
costs, not a gap in warmup (``CoverageReport.new_size``). Each run's worker
time is kept per step (:attr:`RequestResult.first_steps`), so an excess that
stays can be traced to the step that paid it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepwarm.coverage.detectors import CompileEvent, Detectors, merge
from stepwarm.coverage.explain import gc_clock, side_effects, snapshot
from stepwarm.coverage.trace import Tracer
from stepwarm.coverage.traffic import (
    Traffic,
    TrafficLimits,
    TrafficLine,
    make_sampling_params,
    new_size_delta,
    prompts_for,
    server_sampling,
)
from stepwarm.runner import WorkerClock

#: Runs of a line after the second, when its first run looks like an outlier
#: without a compile: enough to see the device's spread between runs.
STEADY_RUNS = 3
#: Runs of the new-size control (the line with one prompt token more or less).
NEW_SIZE_RUNS = 2


@dataclass(frozen=True)
class Gate:
    """When a first run is an outlier: more than ``ratio`` times the second
    and more than ``min_excess_ms`` slower (the report's threshold and floor)."""

    ratio: float
    min_excess_ms: float

    def passed(self, first_ms: float, second_ms: float) -> bool:
        """Whether ``first_ms`` is an outlier against ``second_ms`` (never
        when ``second_ms`` is 0: no second run to compare with)."""
        return (second_ms > 0 and first_ms > self.ratio * second_ms
                and first_ms - second_ms > self.min_excess_ms)

    def noise(self, first_ms: float, later_ms: list[float]) -> bool:
        """Whether a first run that passed the gate against the first of
        ``later_ms`` was noise: within ``ratio`` of the slowest later run
        (the floor plays no part: a first run 1.9 times every later one is
        no noise because it is 9 ms)."""
        return (len(later_ms) > 1 and self.passed(first_ms, later_ms[0])
                and first_ms <= self.ratio * max(later_ms))

    def same_cost(self, first_ms: float, control_ms: list[float]) -> bool:
        """Whether a first-call cost is one every new size pays: the control
        (the same requests at a token count no step had, run after them,
        :data:`NEW_SIZE_RUNS` times) also passed the gate on its first run,
        and ``first_ms`` is within ``ratio`` of that run."""
        return (len(control_ms) > 1 and self.passed(control_ms[0], control_ms[1])
                and first_ms <= self.ratio * control_ms[0])


@dataclass
class RequestResult:
    """One traffic line, replayed twice."""

    line: int
    name: str
    #: Requests in the ``LLM.generate`` call.
    count: int
    prompt_len: int
    #: ``SamplingParams`` keyword arguments as sent.
    sampling: dict[str, Any]
    #: Wall time of the first and of the second ``LLM.generate`` (ms; the
    #: priming request of a prefix line not included).
    first_ms: float = 0.0
    second_ms: float = 0.0
    #: Of which inside the worker's ``execute_model`` / ``sample_tokens`` (ms).
    first_worker_ms: float = 0.0
    second_worker_ms: float = 0.0
    #: Compiles seen during the first / second run (kernel -> count, detectors merged).
    compiles_first: dict[str, int] = field(default_factory=dict)
    compiles_second: dict[str, int] = field(default_factory=dict)
    #: Every detector's events, both runs.
    events: list[CompileEvent] = field(default_factory=list)
    #: Tokens generated per run, all requests together.
    tokens: list[int] = field(default_factory=list)
    #: What ``LLM.generate`` raised, if it did.
    error: str | None = None
    #: When the first run began (seconds since the epoch).
    started_at: float = 0.0
    #: What each run did besides compiling (:func:`stepwarm.coverage.explain.side_effects`).
    side_effects_first: dict[str, Any] = field(default_factory=dict)
    side_effects_second: dict[str, Any] = field(default_factory=dict)
    #: The worker's steps in each run: ``[tokens, requests, ms, new]`` per
    #: ``execute_model`` (with its ``sample_tokens``), in order
    #: (:class:`~stepwarm.runner.WorkerClock`).
    first_steps: list[list[float]] = field(default_factory=list)
    second_steps: list[list[float]] = field(default_factory=list)
    #: Wall times of the runs after the second (ms; :data:`STEADY_RUNS` of
    #: them where the first run passed the gate without a compile, else none).
    steady_ms: list[float] = field(default_factory=list)
    #: The new-size control, where the steady runs did not call the first
    #: run noise: prompt tokens added to each request (+1, or -1 where +1
    #: would not fit), the control's wall times (ms, :data:`NEW_SIZE_RUNS`)
    #: and each run's worker steps (as :attr:`first_steps`).
    new_size_delta: int = 0
    new_size_ms: list[float] = field(default_factory=list)
    new_size_steps: list[list[list[float]]] = field(default_factory=list)
    #: The profiler's summary of the first and second run (``--trace``,
    #: :func:`stepwarm.coverage.trace.summarize`; empty without it).
    trace_first: dict[str, Any] = field(default_factory=dict)
    trace_second: dict[str, Any] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """First / second latency (1.0 when the second took no time)."""
        return self.first_ms / self.second_ms if self.second_ms > 0 else 1.0

    @property
    def excess_ms(self) -> float:
        """What the first run cost beyond the second (ms, >= 0)."""
        return max(0.0, self.first_ms - self.second_ms)

    @property
    def compiled(self) -> bool:
        """Whether any detector saw a compile during either run."""
        return bool(self.compiles_first or self.compiles_second)


def _generate(llm: Any, prompts: list[list[int]], params: Any) -> Any:
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def replay_line(llm: Any, tl: TrafficLine, limits: TrafficLimits,
                detectors: Detectors, clock: WorkerClock | None = None,
                gate: Gate | None = None,
                server: Mapping[str, Any] | None = None,
                tracer: Tracer | None = None) -> RequestResult:
    """Run one line twice (see the module docstring) and what the detectors
    saw; with ``clock`` (attached to the worker), the worker's share of each
    run, step by step; with ``gate``, :data:`STEADY_RUNS` more runs of a
    line whose first run passes it without a compile; ``server``: the
    model's generation-config defaults a ``server_defaults`` line starts from
    (:func:`~stepwarm.coverage.traffic.server_sampling`); with ``tracer``,
    every run profiled (:mod:`stepwarm.coverage.trace`), the first two kept.

    A run that raises is recorded in ``error``; the runs after it are skipped.
    """
    req = tl.request
    kwargs = req.sampling_kwargs(limits.max_logprobs, server)
    result = RequestResult(line=tl.line, name=tl.name, count=req.count,
                           prompt_len=req.prompt_len, sampling=kwargs)
    params = make_sampling_params(kwargs)
    prime_params = make_sampling_params({"max_tokens": 1, "temperature": 0.0, "detokenize": False})
    detectors.poll()  # anything left from before belongs to no request
    result.started_at = time.time()

    def run(round_: int, extra: int = 0) -> tuple[float, float, list[list[float]],
                                                   dict[str, Any], dict[str, int], int,
                                                   dict[str, Any]] | None:
        """One run: wall ms, worker ms, steps, side effects, compiles, tokens,
        profile (None when it raised: ``result.error`` says what)."""
        prompts, priming = prompts_for(tl, round_, limits.vocab_size, extra)
        try:
            llm.reset_prefix_cache()
            if priming is not None:
                _generate(llm, [priming], prime_params)
            if clock is not None:
                clock.take()
                clock.take_cpu()
                clock.take_steps()
            with tracer.run() if tracer is not None else contextlib.nullcontext({}) as trace:
                # the side effects' window is the timed one: the profiler's
                # start and its summary after the run (collector passes,
                # CPU waits of their own) are neither
                before = snapshot()
                t0 = time.perf_counter()
                outs = _generate(llm, prompts, params)
                elapsed = (time.perf_counter() - t0) * 1e3
                after = snapshot()
            effects = side_effects(before, after)
            worker_ms = clock.take() if clock is not None else 0.0
            if clock is not None:  # of the thread's CPU time, the worker's share
                effects["worker_cpu_ms"] = round(clock.take_cpu(), 1)
            steps = clock.take_steps() if clock is not None else []
        except Exception as e:  # noqa: BLE001 - reported per request
            result.error = f"{type(e).__name__}: {e}"
            result.events += detectors.poll()
            return None
        events = detectors.poll()
        result.events += events
        return (elapsed, worker_ms, steps, effects, merge(events),
                sum(len(c.token_ids) for o in outs for c in o.outputs), trace)

    def count_later(compiles: dict[str, int]) -> None:
        # what a later run compiled still counts against the line
        for name, n in compiles.items():
            result.compiles_second[name] = result.compiles_second.get(name, 0) + n

    def outlier() -> bool:
        return (gate is not None and not result.compiled
                and gate.passed(result.first_ms, result.second_ms))

    round_ = 0
    while round_ < 2 or (round_ < 2 + STEADY_RUNS and outlier()):
        got = run(round_)
        if got is None:
            return result
        elapsed, worker_ms, steps, effects, compiles, tokens, trace = got
        if round_ == 0:
            result.first_ms, result.first_worker_ms = elapsed, worker_ms
            result.compiles_first = compiles
            result.side_effects_first, result.first_steps = effects, steps
            result.trace_first = trace
        elif round_ == 1:
            result.second_ms, result.second_worker_ms = elapsed, worker_ms
            result.compiles_second = compiles
            result.side_effects_second, result.second_steps = effects, steps
            result.trace_second = trace
        else:  # a steady run
            result.steady_ms.append(round(elapsed, 2))
            count_later(compiles)
        if round_ < 2:  # the steady runs' tokens are not the line's
            result.tokens.append(tokens)
        round_ += 1
    delta = new_size_delta(tl, limits, int(kwargs.get("max_tokens") or 0))
    if (gate is None or not outlier() or not delta
            or gate.noise(result.first_ms, [result.second_ms, *result.steady_ms])):
        return result
    result.new_size_delta = delta
    for i in range(NEW_SIZE_RUNS):
        got = run(round_ + i, delta)
        if got is None:
            return result
        result.new_size_ms.append(round(got[0], 2))
        result.new_size_steps.append(got[2])
        count_later(got[4])
    return result


def replay(llm: Any, traffic: Traffic, limits: TrafficLimits, detectors: Detectors,
           on_request: Callable[[RequestResult], None] | None = None,
           worker: Any = None, gate: Gate | None = None,
           trace: bool = False) -> list[RequestResult]:
    """Replay every line of ``traffic`` in file order (:func:`replay_line`).

    Args:
        llm: the ``vllm.LLM``.
        worker: its worker, in this process: then each run's time inside the
            worker is measured too (:class:`~stepwarm.runner.WorkerClock`).
        traffic: a checked traffic file (:func:`~stepwarm.coverage.traffic.check_limits`).
        limits: the engine's limits (vocabulary, ``max_logprobs``).
        detectors: polled before and after each run.
        on_request: called with each line's result as soon as it ran.
        gate: when a line's first run is an outlier (:class:`Gate`): such a
            line gets :data:`STEADY_RUNS` more runs; None: every line runs twice.
        trace: profile every run (``stepwarm coverage --trace``,
            :mod:`stepwarm.coverage.trace`).

    Returns:
        One :class:`RequestResult` per line.
    """
    results = []
    clock = WorkerClock()
    server = server_sampling(llm) if any(tl.request.server_defaults for tl in traffic.lines) else {}
    tracer = Tracer() if trace else None
    if tracer is not None:
        tracer.prime()
    with (clock.attached(worker) if worker is not None else contextlib.nullcontext(),
          gc_clock()):
        for tl in traffic.lines:
            result = replay_line(llm, tl, limits, detectors,
                                 clock if worker is not None else None, gate, server, tracer)
            results.append(result)
            if on_request is not None:
                on_request(result)
    return results
