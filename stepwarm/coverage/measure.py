"""One coverage measurement: start the engine (stepwarm's start-up hook on or
off), attribute start-up compiles, replay the traffic, build the report.

The scenarios run the way ``vllm serve`` runs them: ``STEPWARM_SCENARIOS`` is
set and stepwarm's ``vllm.general_plugins`` entry (:func:`stepwarm.hook.register`)
wraps the worker's ``compile_or_warm_up_model``; nothing calls the driver
directly. Start-up compiles are attributed through the step times in the
reports the hook leaves on the worker (``worker.stepwarm_reports``).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from stepwarm.blocks import prefix_cache_alignment
from stepwarm.coverage.detectors import Detectors
from stepwarm.coverage.replay import Gate, RequestResult, replay
from stepwarm.coverage.report import (
    DEFAULT_THRESHOLDS,
    CoverageReport,
    group_startup,
    request_dict,
)
from stepwarm.coverage.startup import attribute
from stepwarm.coverage.traffic import (
    Traffic,
    TrafficLimits,
    check_limits,
    fitting,
    prefix_notes,
)
from stepwarm.driver import RunReport
from stepwarm.settings import ENV_SCENARIOS

#: The phase from the engine's start until vLLM logs its first one.
IMPORT_PHASE = "importing vLLM"

def enable_hook(scenarios: list[str] | None) -> None:
    """Switch stepwarm's start-up hook on for ``scenarios`` (None: off, the
    baseline), as ``STEPWARM_SCENARIOS=...`` does for ``vllm serve``.
    ``register()`` is the plugin vLLM also loads from the entry point (a
    second call is a no-op); calling it here covers a source tree that is
    not pip-installed."""
    if not scenarios:
        os.environ.pop(ENV_SCENARIOS, None)
        return
    os.environ[ENV_SCENARIOS] = ",".join(scenarios)
    from stepwarm.hook import register

    register()


def engine_limits(profile: Any) -> TrafficLimits:
    """The limits traffic is checked against, from the runner profile:
    ``max_model_len``, ``vocab_size`` and ``max_logprobs``."""
    return TrafficLimits(max_model_len=profile.max_model_len, vocab_size=profile.vocab_size,
                         max_logprobs=profile.max_logprobs)


def _device() -> str:
    from stepwarm.engine import on_cpu_build

    return "cpu" if on_cpu_build() else "gpu"


def measure(
    traffic: Traffic,
    scenarios: list[str] | None,
    start_engine: Callable[[Callable[[str], None]], Any],
    detectors: Detectors,
    *,
    threshold: float | None = None,
    min_excess_ms: float | None = None,
    on_started: Callable[[CoverageReport, Traffic], None] | None = None,
    on_request: Callable[[RequestResult], None] | None = None,
    cache: str = "fresh",
    trace: bool = False,
) -> CoverageReport:
    """Start the engine, then replay ``traffic``; the report of both.

    Args:
        traffic: a traffic file, checked for format (its engine limits are
            checked here, before any request).
        scenarios: what the start-up hook runs; None or [] for the baseline
            (vLLM's own warmup alone).
        start_engine: starts the engine (an :class:`~stepwarm.engine.Engine`),
            calling its argument with each start-up phase's name as it begins.
        detectors: started before anything imported vLLM
            (:meth:`~stepwarm.coverage.detectors.Detectors.start`); the caller stops them.
        threshold, min_excess_ms: the ratio gate; the device's
            :data:`~stepwarm.coverage.report.DEFAULT_THRESHOLDS` when None.
        on_started: called with the report once start-up is attributed, and
            the traffic that will be replayed (``if_fits`` lines too long for
            the engine left out: :func:`~stepwarm.coverage.traffic.fitting`).
        on_request: called with each request's result as it ran.
        cache: ``fresh`` or ``warm`` (:attr:`CoverageReport.cache`: the
            detectors watch caches a fresh run filled, a restart).
        trace: profile every traffic run (:mod:`stepwarm.coverage.trace`).

    Raises:
        stepwarm.coverage.traffic.TrafficError: a line the engine would refuse
            (nothing was replayed).
    """
    from stepwarm.probe import read_profile

    enable_hook(scenarios)
    t0 = time.time()
    phases: list[tuple[str, float]] = [(IMPORT_PHASE, t0)]
    engine = start_engine(lambda name: phases.append((name, time.time())))
    startup_s = time.time() - t0
    startup_events = detectors.poll()
    reports: list[RunReport] = list(getattr(engine.worker, "stepwarm_reports", None) or [])
    gemm = getattr(engine.worker, "stepwarm_gemm", None)
    gemm_s = getattr(gemm, "wall_ms", 0.0) / 1e3
    gemm_calls = [gemm.calls_run, gemm.calls_total] if getattr(gemm, "calls_total", 0) else []
    wait_s = getattr(getattr(engine.worker, "stepwarm_deferred", None), "waited_s", 0.0)
    sampler_jit = getattr(engine.worker, "stepwarm_sampler_jit", None)
    window = getattr(sampler_jit, "window", None)
    jit_s = getattr(sampler_jit, "wall_s", 0.0) if window else 0.0
    profile = read_profile(engine.view)
    device = _device()
    default_ratio, default_floor = DEFAULT_THRESHOLDS[device]
    rep = CoverageReport(
        mode="stepwarm" if scenarios else "baseline", scenarios=list(scenarios or []),
        traffic=os.path.basename(traffic.source), vllm_version=profile.vllm_version,
        runner=profile.runner, model=profile.model, device=device,
        # vLLM's CPU build disables Triton: only the cache scan sees anything there.
        detectors=detectors.available if device == "gpu" else [detectors.scan.name],
        cache=cache,
        threshold=default_ratio if threshold is None else threshold,
        min_excess_ms=default_floor if min_excess_ms is None else min_excess_ms,
        startup_s=round(startup_s, 3),
        stepwarm_s=round(sum(r.wall_ms for r in reports) / 1e3 + gemm_s + wait_s + jit_s, 3),
        gemm_s=round(gemm_s, 3), gemm_calls=gemm_calls, compile_wait_s=round(wait_s, 3),
        phases=[[name, round(at - t0, 3)] for name, at in phases],
        startup_compiles=group_startup(
            attribute(startup_events, phases, reports, [window] if window else []), t0),
        scenario_runs=[_scenario_run(r, t0) for r in reports],
    )
    limits = engine_limits(profile)
    check_limits(traffic, limits)
    traffic, left_out = fitting(traffic, limits)
    rep.notes = left_out + prefix_notes(traffic, profile.enable_prefix_caching,
                                        prefix_cache_alignment(profile.kv_cache_groups,
                                                               profile.enable_prefix_caching))
    if on_started is not None:
        on_started(rep, traffic)
    t_traffic = time.time()
    gate = Gate(rep.threshold, rep.min_excess_ms) if rep.threshold is not None else None
    results = replay(engine.llm, traffic, limits, detectors, on_request, worker=engine.worker,
                     gate=gate, trace=trace)
    rep.requests = [request_dict(r, t0) for r in results]
    errors = {r.trace_first.get("error") for r in results if r.trace_first.get("error")}
    rep.notes += [f"--trace: the profiler failed ({e}): the runs from then on were not profiled"
                  for e in sorted(errors)]
    rep.traffic_s = [round(t_traffic - t0, 3), round(time.time() - t0, 3)]
    return rep


def _scenario_run(r: RunReport, t0: float) -> dict[str, Any]:
    return {"plan": r.plan, "ok": r.ok, "skipped": r.skipped, "wall_ms": round(r.wall_ms, 2),
            "idle_steps_skipped": r.idle_steps_skipped,
            "start_s": round(r.started_at - t0, 3) if r.started_at else None,
            "end_s": round(r.ended_at - t0, 3) if r.ended_at else None,
            "steps": [[s.index, f"{s.kind}: {s.label}", round(s.started_at - t0, 3),
                       round(s.ended_at - t0, 3)] for s in r.steps]}
