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
(``CoverageReport.noise``). Each
run's worker time is kept per step (:attr:`RequestResult.first_steps`), so
an excess that stays can be traced to the step that paid it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepwarm.coverage.detectors import CompileEvent, Detectors, merge
from stepwarm.coverage.explain import side_effects, snapshot
from stepwarm.coverage.traffic import (
    Traffic,
    TrafficLimits,
    TrafficLine,
    make_sampling_params,
    prompts_for,
    server_sampling,
)
from stepwarm.runner import WorkerClock

#: Runs of a line after the second, when its first run looks like an outlier
#: without a compile: enough to see the device's spread between runs.
STEADY_RUNS = 3


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
                server: Mapping[str, Any] | None = None) -> RequestResult:
    """Run one line twice (see the module docstring) and what the detectors
    saw; with ``clock`` (attached to the worker), the worker's share of each
    run, step by step; with ``gate``, :data:`STEADY_RUNS` more runs of a
    line whose first run passes it without a compile; ``server``: the
    model's generation-config defaults a ``server_defaults`` line starts from
    (:func:`~stepwarm.coverage.traffic.server_sampling`).

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
    round_ = 0
    while round_ < 2 or (round_ < 2 + STEADY_RUNS and gate is not None and not result.compiled
                         and gate.passed(result.first_ms, result.second_ms)):
        prompts, priming = prompts_for(tl, round_, limits.vocab_size)
        try:
            llm.reset_prefix_cache()
            if priming is not None:
                _generate(llm, [priming], prime_params)
            if clock is not None:
                clock.take()
                clock.take_steps()
            before = snapshot()
            t0 = time.perf_counter()
            outs = _generate(llm, prompts, params)
            elapsed = (time.perf_counter() - t0) * 1e3
            effects = side_effects(before, snapshot())
            worker_ms = clock.take() if clock is not None else 0.0
            steps = clock.take_steps() if clock is not None else []
        except Exception as e:  # noqa: BLE001 - reported per request
            result.error = f"{type(e).__name__}: {e}"
            result.events += detectors.poll()
            break
        events = detectors.poll()
        result.events += events
        if round_ == 0:
            result.first_ms, result.first_worker_ms = elapsed, worker_ms
            result.compiles_first = merge(events)
            result.side_effects_first, result.first_steps = effects, steps
        elif round_ == 1:
            result.second_ms, result.second_worker_ms = elapsed, worker_ms
            result.compiles_second = merge(events)
            result.side_effects_second, result.second_steps = effects, steps
        else:  # a steady run: what it compiled still counts against the line
            result.steady_ms.append(round(elapsed, 2))
            for name, n in merge(events).items():
                result.compiles_second[name] = result.compiles_second.get(name, 0) + n
        if round_ < 2:  # the steady runs' tokens are not the line's
            result.tokens.append(sum(len(c.token_ids) for o in outs for c in o.outputs))
        round_ += 1
    return result


def replay(llm: Any, traffic: Traffic, limits: TrafficLimits, detectors: Detectors,
           on_request: Callable[[RequestResult], None] | None = None,
           worker: Any = None, gate: Gate | None = None) -> list[RequestResult]:
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

    Returns:
        One :class:`RequestResult` per line.
    """
    results = []
    clock = WorkerClock()
    server = server_sampling(llm) if any(tl.request.server_defaults for tl in traffic.lines) else {}
    with clock.attached(worker) if worker is not None else contextlib.nullcontext():
        for tl in traffic.lines:
            result = replay_line(llm, tl, limits, detectors,
                                 clock if worker is not None else None, gate, server)
            results.append(result)
            if on_request is not None:
                on_request(result)
    return results
