"""Replay a traffic file through vLLM's real scheduler, each request twice.

Each line of the traffic file becomes ``LLM.generate(prompts, SamplingParams)``
(its ``count`` requests in one call, scheduled by vLLM's scheduler as real
traffic is), run twice. Before each run the prefix cache is reset (and a
line's shared prefix primed), so both runs do the same work; the difference
between them is what the first request pays once: a JIT compile, a lazy
initialization. The detectors are polled after each run.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
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
)
from stepwarm.runner import WorkerClock


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
                detectors: Detectors, clock: WorkerClock | None = None) -> RequestResult:
    """Run one line twice (see the module docstring) and what the detectors
    saw; with ``clock`` (attached to the worker), the worker's share of each run.

    A run that raises is recorded in ``error``; the second run is then skipped.
    """
    req = tl.request
    kwargs = req.sampling_kwargs(limits.max_logprobs)
    result = RequestResult(line=tl.line, name=tl.name, count=req.count,
                           prompt_len=req.prompt_len, sampling=kwargs)
    params = make_sampling_params(kwargs)
    prime_params = make_sampling_params({"max_tokens": 1, "temperature": 0.0, "detokenize": False})
    detectors.poll()  # anything left from before belongs to no request
    result.started_at = time.time()
    for round_ in (0, 1):
        prompts, priming = prompts_for(tl, round_, limits.vocab_size)
        try:
            llm.reset_prefix_cache()
            if priming is not None:
                _generate(llm, [priming], prime_params)
            if clock is not None:
                clock.take()
            before = snapshot()
            t0 = time.perf_counter()
            outs = _generate(llm, prompts, params)
            elapsed = (time.perf_counter() - t0) * 1e3
            effects = side_effects(before, snapshot())
            worker_ms = clock.take() if clock is not None else 0.0
        except Exception as e:  # noqa: BLE001 - reported per request
            result.error = f"{type(e).__name__}: {e}"
            result.events += detectors.poll()
            break
        events = detectors.poll()
        result.events += events
        result.tokens.append(sum(len(c.token_ids) for o in outs for c in o.outputs))
        if round_ == 0:
            result.first_ms, result.first_worker_ms = elapsed, worker_ms
            result.compiles_first = merge(events)
            result.side_effects_first = effects
        else:
            result.second_ms, result.second_worker_ms = elapsed, worker_ms
            result.compiles_second = merge(events)
            result.side_effects_second = effects
    return result


def replay(llm: Any, traffic: Traffic, limits: TrafficLimits, detectors: Detectors,
           on_request: Callable[[RequestResult], None] | None = None,
           worker: Any = None) -> list[RequestResult]:
    """Replay every line of ``traffic`` in file order (:func:`replay_line`).

    Args:
        llm: the ``vllm.LLM``.
        worker: its worker, in this process: then each run's time inside the
            worker is measured too (:class:`~stepwarm.runner.WorkerClock`).
        traffic: a checked traffic file (:func:`~stepwarm.coverage.traffic.check_limits`).
        limits: the engine's limits (vocabulary, ``max_logprobs``).
        detectors: polled before and after each run.
        on_request: called with each line's result as soon as it ran.

    Returns:
        One :class:`RequestResult` per line.
    """
    results = []
    clock = WorkerClock()
    with clock.attached(worker) if worker is not None else contextlib.nullcontext():
        for tl in traffic.lines:
            result = replay_line(llm, tl, limits, detectors,
                                 clock if worker is not None else None)
            results.append(result)
            if on_request is not None:
                on_request(result)
    return results
