"""Drive a plan through a vLLM worker's ``execute_model`` / ``sample_tokens`` loop.

Mirrors the loop of ``vllm.v1.worker.gpu.warmup.warmup_kernels``: the KV
connector is off for the run and restored afterwards, and a cleanup
``SchedulerOutput`` finishing every request sent so far is always executed,
also when a step raises, so the runner holds no stepwarm request afterwards.
"""

from __future__ import annotations

import contextlib
import time
import traceback as tb
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from stepwarm.compile import (
    OutputHistory,
    cleanup_output,
    encoder_cache_keys,
    prompt_token_ids,
    to_grammar_output,
    to_scheduler_output,
)
from stepwarm.deferred_compile import DeferredCompile, deferred_compiles
from stepwarm.encoder_inputs import RequestInputs, RunProcessor, audio_inputs, request_inputs
from stepwarm.memory import MemoryReport, free_text, measured
from stepwarm.plan import REQ_ID_PREFIX, Plan, PlannedStep
from stepwarm.profile import RunnerProfile
from stepwarm.ranks import RankGroup
from stepwarm.runner import synchronize
from stepwarm.watchdog import StepWatch

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView


@dataclass
class StepResult:
    """What one step did on the worker."""

    index: int
    kind: str
    label: str
    #: Requests scheduled (new + cached).
    num_reqs: int
    #: ``total_num_scheduled_tokens`` (tokens).
    num_scheduled_tokens: int
    #: Draft tokens scheduled, all requests together.
    num_spec_tokens: int
    #: Blocks handed out in this step, per group.
    new_blocks: list[int]
    #: Blocks each scheduled request holds after the step, per group.
    held_blocks: dict[str, list[int]]
    #: Wall time of execute_model + sample_tokens (ms).
    wall_ms: float
    #: req_id -> number of tokens ``sample_tokens`` returned for it (sampling
    #: steps); None for steps that do not sample.
    sampled: dict[str, int] | None = None
    #: req_id -> the token ids ``sample_tokens`` returned for it (sampling
    #: steps; what :mod:`stepwarm.verify` compares); None for other steps.
    sampled_token_ids: dict[str, list[int]] | None = None
    #: Requests ``execute_model`` returned a pooler output for (pooling
    #: steps); None for steps that do not pool.
    pooled: list[str] | None = None
    #: Columns of the sampled-token logprobs ``sample_tokens`` returned:
    #: the step's largest ``logprobs`` + 1 (the sampled token's own); None
    #: when no request asked for logprobs.
    logprobs_width: int | None = None
    #: req_id -> [rows, columns] of the prompt logprobs ``execute_model``
    #: returned for this step's prompt chunk (columns: ``prompt_logprobs`` + 1).
    prompt_logprobs: dict[str, list[int]] | None = None
    #: When the step was built and sent, and when its output was back
    #: (seconds since the epoch, ``time.time()``): what a compile seen at a
    #: given time is attributed to (``stepwarm coverage``).
    started_at: float = 0.0
    ended_at: float = 0.0
    #: req_id -> drafts the worker rejected in this step (rows that carried
    #: drafts and sampled fewer than ``1 + drafts`` tokens).
    rejected: dict[str, int] | None = None
    #: req_id -> tokens this step's row went out below the plan's
    #: ``num_computed_tokens`` (the drafts its request had rejected before:
    #: the row follows acceptance as ``update_from_output`` does).
    followed: dict[str, int] | None = None
    #: Rows that differ from what vLLM's scheduler would send after the
    #: rejections, one line each (block ids stay the plan's; resumed rows
    #: restart from the plan's token count).
    diverged: list[str] | None = None


@dataclass
class RunReport:
    """A whole run: one :class:`StepResult` per step that ran, plus the outcome."""

    plan: str
    runner: str
    model: str
    steps: list[StepResult] = field(default_factory=list)
    ok: bool = True
    #: One paragraph: which step failed and what vLLM said.
    error: str | None = None
    skipped: str = ""
    #: Wall time of the whole run (ms): its inputs prepared (images, audio),
    #: its steps, the cleanup, and the wait for compiles done in threads.
    wall_ms: float = 0.0
    #: Whether the cleanup step ran (always True unless the worker is gone).
    cleanup_ran: bool = False
    #: stepwarm request ids (and encoder-cache keys of stepwarm images) the
    #: runner still held after cleanup (should be []).
    left_in_runner: list[str] = field(default_factory=list)
    #: The worker that ran it: rank in vLLM's world group, and its tensor /
    #: pipeline parallel ranks (all 0 on a single-process engine).
    rank: int = 0
    tp_rank: int = 0
    pp_rank: int = 0
    #: When the run started and ended, cleanup included (seconds since the
    #: epoch, ``time.time()``; 0 when nothing ran).
    started_at: float = 0.0
    ended_at: float = 0.0
    #: Memory before, after and at the peak of the run (None when nothing ran).
    memory: MemoryReport | None = None
    #: The step that failed (``index``, ``kind``, ``label``; ``steps`` holds
    #: those that ran to the end), or None.
    failed_step: dict[str, Any] | None = None
    #: The failed step's traceback (``traceback.format_exception``), or None.
    traceback: str | None = None
    #: Whose code raised it: ``vllm``, ``stepwarm``, ``torch`` or ``other``
    #: (the module of the traceback's innermost frame; :func:`raised_by`).
    raised_by: str | None = None
    #: Sampler kernel variants compiled in threads (:mod:`stepwarm.deferred_compile`),
    #: each with the step whose launch it skipped; the ms the run waited for
    #: them after its last step (included in ``wall_ms``).
    deferred_compiles: list[DeferredCompile] = field(default_factory=list)
    deferred_wait_ms: float = 0.0
    #: Steps of the plan left out because their segments compiled nothing at
    #: the last start (``STEPWARM_SKIP_IDLE``, :mod:`stepwarm.idle_record`).
    idle_steps_skipped: int = 0

    @property
    def status(self) -> str:
        """``passed`` (every step ran), ``failed`` (a step raised) or
        ``skipped`` (nothing ran: the runner cannot run it, ``skipped`` says why)."""
        return "skipped" if self.skipped else "passed" if self.ok else "failed"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the report, with its :attr:`status`; ``ok`` is
        null for a skipped scenario (it did not run: neither passed nor failed)."""
        return {"status": self.status, **asdict(self),
                **({"ok": None} if self.skipped else {})}


class RunnerBusyError(RuntimeError):
    """The runner holds requests stepwarm did not send; nothing was run."""


class StepFailed(RuntimeError):
    """A step raised on the worker. ``report`` holds the steps that ran and the
    cleanup outcome; ``step`` is the failing step's index."""

    def __init__(self, report: RunReport, step: int):
        super().__init__(report.error)
        self.report = report
        self.step = step


#: Top-level packages naming whose code a frame is in.
_OWNERS = ("stepwarm", "vllm", "torch")


def raised_by(error: BaseException) -> str:
    """Whose code raised ``error``: ``vllm``, ``stepwarm``, ``torch`` or
    ``other``, from the module of the traceback's innermost frame (its
    globals' ``__name__``, e.g. ``vllm.v1.worker.gpu_model_runner``), not
    its file's path: a checkout in a folder named ``stepwarm`` is not
    stepwarm's code."""
    last = error.__traceback__
    if last is None:
        return "other"
    while last.tb_next is not None:
        last = last.tb_next
    package = str(last.tb_frame.f_globals.get("__name__", "")).partition(".")[0]
    return package if package in _OWNERS else "other"


def held_by_runner(worker: WorkerView) -> list[str]:
    """Every stepwarm request id the runner still holds, as ``id (table)``,
    in every per-request table (``worker_view.V1_TABLES`` / ``V2_TABLES``),
    not only requests and the input batch: ``[]`` after a cleanup."""
    return sorted(f"{r} ({table})" for table, ids in worker.request_tables(REQ_ID_PREFIX).items()
                  for r in ids)


def _oom_text(e: BaseException) -> str:
    """One paragraph for an out-of-memory step, after cleanup."""
    return (f"it ran out of device memory ({type(e).__name__}); the runner was cleaned up and "
            f"{free_text()} now. vLLM sized the KV cache before stepwarm ran, so the step "
            "needed memory vLLM's profiling did not see (sampler workspaces, autotune or "
            "kernel scratch): lower gpu_memory_utilization (or kv_cache_memory_bytes), or "
            "the scenario's batch." + (f" vLLM said: {str(e).splitlines()[0]}" if str(e) else ""))


def _resolved(output: Any) -> Any:
    """A ``ModelRunnerOutput`` (``AsyncModelRunnerOutput`` waited for)."""
    return output.get_output() if hasattr(output, "get_output") else output


def _sampled_tokens(output: Any) -> dict[str, list[int]] | None:
    """req_id -> sampled token ids of a ``ModelRunnerOutput`` (None when it
    carries none: a non-last pipeline rank, a pooling step)."""
    req_ids = getattr(output, "req_ids", None)
    sampled = getattr(output, "sampled_token_ids", None)
    if req_ids is None or sampled is None:
        return None
    return {rid: [int(t) for t in tokens] for rid, tokens in zip(req_ids, sampled)}


def _pooler_outputs(output: Any) -> dict[str, Any] | None:
    """req_id -> pooler output (a tensor) of the requests ``execute_model``
    pooled; None when the output has no pooler outputs."""
    req_ids = getattr(output, "req_ids", None)
    pooler = getattr(output, "pooler_output", None)
    if req_ids is None or pooler is None:
        return None
    return {rid: out for rid, out in zip(req_ids, pooler) if out is not None}


def _shape(arr: Any) -> list[int]:
    shape = getattr(arr, "shape", None)
    if shape is not None:
        return [int(n) for n in shape]
    return [len(arr), len(arr[0]) if len(arr) else 0]


def _logprobs_width(output: Any) -> int | None:
    """Columns of ``ModelRunnerOutput.logprobs`` (``LogprobsLists``), or None."""
    lists = getattr(output, "logprobs", None)
    ids = getattr(lists, "logprob_token_ids", None)
    return None if ids is None else _shape(ids)[-1]


def _prompt_logprobs(output: Any) -> dict[str, list[int]] | None:
    """req_id -> [rows, columns] of ``ModelRunnerOutput.prompt_logprobs_dict``."""
    found = getattr(output, "prompt_logprobs_dict", None) or {}
    out = {rid: _shape(t.logprob_token_ids) for rid, t in found.items() if t is not None}
    return out or None


def _result(step: PlannedStep, wall_ms: float, output: Any, pooled: dict[str, Any] | None,
            ) -> StepResult:
    tokens = _sampled_tokens(output) if step.sample else None
    return StepResult(
        index=step.index,
        kind=step.kind,
        label=step.label,
        num_reqs=len(step.scheduled),
        num_scheduled_tokens=step.total_num_scheduled_tokens,
        num_spec_tokens=sum(len(r.spec_token_ids) for r in step.scheduled),
        new_blocks=list(step.new_block_counts),
        held_blocks={rid: list(c) for rid, c in step.held_blocks},
        wall_ms=wall_ms,
        sampled=None if tokens is None else {rid: len(t) for rid, t in tokens.items()},
        sampled_token_ids=tokens,
        pooled=None if pooled is None else list(pooled),
        logprobs_width=_logprobs_width(output) if step.sample else None,
        prompt_logprobs=_prompt_logprobs(output),
    )


@contextlib.contextmanager
def _nothing() -> Any:
    yield


def _follow_acceptance(step: PlannedStep, result: StepResult, tokens: OutputHistory) -> None:
    """Read what the worker accepted (per row with drafts: sampled tokens - 1)
    into ``tokens.rejected`` and ``result.rejected``, and record on the
    result which rows went out lowered (``followed``) and which differ from
    the scheduler's (``diverged``)."""
    followed = {r.req_id: tokens.lag(r.req_id) for r in step.scheduled
                if not (r.new or r.resumed) and tokens.lag(r.req_id)}
    diverged = [f"{r.req_id}: resumed after {tokens.lag(r.req_id)} rejected draft(s), "
                "from the plan's token count" for r in step.scheduled
                if r.resumed and tokens.lag(r.req_id)]
    if followed:
        diverged.append(f"block ids as planned for {', '.join(sorted(followed))} (the scheduler "
                        "allocates a rejected draft's slots again in a later step)")
    for r in step.scheduled:
        if r.resumed:  # a resumed row restarts from the plan's token count
            tokens.rejected.pop(r.req_id, None)
    rejected: dict[str, int] = {}
    sampled = result.sampled_token_ids or {}
    for r in step.scheduled:
        if r.num_drafts_verified and r.req_id in sampled and sampled[r.req_id]:
            n = r.num_drafts_verified - (len(sampled[r.req_id]) - 1)
            if n > 0:
                rejected[r.req_id] = n
                tokens.rejected[r.req_id] = tokens.rejected.get(r.req_id, 0) + n
    result.rejected = rejected or None
    result.followed = followed or None
    result.diverged = diverged or None


def _is_oom(e: BaseException | None) -> bool:
    import torch

    return isinstance(e, torch.OutOfMemoryError)


def _empty_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


class PeerStepFailed(RuntimeError):
    """Another tensor / pipeline parallel rank failed the step this rank ran;
    this rank stops at the same step (see :mod:`stepwarm.ranks`)."""


def _run_step(worker: WorkerView, step: PlannedStep, plan: Plan, profile: RunnerProfile,
              params: dict[str, tuple[Any, Any]], sent: set[str],
              ranks: RankGroup | None, tokens: OutputHistory,
              images: dict[str, RequestInputs] | None = None) -> tuple[Any, float]:
    """``execute_model`` (+ ``sample_tokens``) of one step; with several
    ranks, then the device sync and the agreement on who failed.

    Returns:
        (the resolved ``ModelRunnerOutput``, wall ms).

    Raises:
        Whatever the step raised on this rank; :class:`PeerStepFailed` when it
        passed here but failed on another rank.
    """
    local: Exception | None = None
    output, wall_ms = None, 0.0
    try:
        scheduler_output = to_scheduler_output(step, plan, profile, params, tokens, images)
        grammar_output = to_grammar_output(step, profile) if step.sample else None
        sent.update(step.req_ids)
        t0 = time.perf_counter()
        output = worker.execute_model(scheduler_output)
        if step.sample:
            output = worker.sample_tokens(grammar_output)
        output = _resolved(output)
        if ranks is not None and ranks.size > 1:
            # A rank blocked in a collective stays here, before the agreement.
            synchronize()
        wall_ms = (time.perf_counter() - t0) * 1e3
    except Exception as e:  # noqa: BLE001 - re-raised after the agreement
        local = e
    if ranks is not None and ranks.size > 1:
        what = f"the end of step {step.index}" + (
            f" (this rank failed it: {type(local).__name__}: {local})" if local else "")
        failed = ranks.failed_ranks(local is not None, what)
        if local is None and failed:
            raise PeerStepFailed(
                f"{len(failed)} other rank(s) ({ranks.grid} slots {failed}) failed this step; "
                f"{ranks.label} stopped with them")
    if local is not None:
        raise local
    return output, wall_ms


def _step_of(plan: Plan, index: int | None) -> PlannedStep | None:
    """The step of ``plan`` with ``index`` (a plan of some segments keeps
    its steps' indices: :meth:`~stepwarm.plan.Plan.only`)."""
    return next((st for st in plan.steps if st.index == index), None)


def drive(
    worker: WorkerView | Any,
    plan: Plan,
    profile: RunnerProfile,
    *,
    on_step: Callable[[StepResult], None] | None = None,
    ranks: RankGroup | None = None,
    tokens: OutputHistory | None = None,
    watch: StepWatch | None = None,
    on_step_start: Callable[[PlannedStep, str], None] | None = None,
    on_running: Callable[[str, float], None] | None = None,
    compile_threads: int = 0,
    on_step_ran: Callable[[PlannedStep], None] | None = None,
) -> RunReport:
    """Run every step of ``plan`` on ``worker``; always clean up.

    For each step: ``worker.execute_model(scheduler_output)``, then, for
    sampling steps, ``worker.sample_tokens(grammar_output)``. Afterwards (and
    after a failure) a ``SchedulerOutput`` whose ``finished_req_ids`` holds
    every request sent and not yet finished is executed, the device is
    synchronized and the KV connector restored.

    Args:
        worker: the vLLM worker, or its :class:`~stepwarm.worker_view.WorkerView`
            (a caller that drives several plans builds it once).
        plan: the plan (built for ``profile``).
        profile: the worker's profile (:func:`stepwarm.probe.read_profile`).
        on_step: called with each step's result as soon as it ran.
        ranks: the engine's tensor / pipeline parallel ranks; every rank
            calls ``drive`` with the same plan, and after each step they agree
            on which failed, so a failure on one stops all at the same step.
        tokens: the token history to compile steps with; the driver appends
            each step's sampled tokens to ``tokens.sampled``, so a resumed
            request carries its real outputs. Give one with ``expected``
            outputs to draw drafts from them (:mod:`stepwarm.verify`); None:
            a fresh one.
        watch: the watchdog around each step (:mod:`stepwarm.watchdog`);
            None: none.
        on_step_start: called before each step with the step and its name
            as the watchdog logs it (``<plan> step i/N (<kind>, <label>)``).
        on_running: called by the watchdog while a step runs past
            ``watch.warn_s`` (from its thread), with that name and the seconds.
        on_step_ran: called with the step as soon as its ``execute_model``
            (+ ``sample_tokens``) returned, before its result is read
            (``bench`` records its end event there).
        compile_threads: threads that compile the sampler's Triton kernel
            variants while the steps go on (:mod:`stepwarm.deferred_compile`;
            the run waits for them before it returns); 0: each compiles in
            the step that first launches it. Leave 0 where outputs matter.

    Returns:
        The :class:`RunReport` (``ok`` True), with ``memory`` filled in.

    Raises:
        RunnerBusyError: the runner already holds requests (stepwarm warms an
            idle runner); raised before any step.
        StepFailed: a step raised on this rank or another (then the cause is
            :class:`PeerStepFailed`); the runner was cleaned up first and
            ``error.report`` says which step and what vLLM said.
        RuntimeError: the runner still held stepwarm requests after cleanup.
    """
    from stepwarm.worker_view import WorkerView

    worker = WorkerView.of(worker)  # vLLM's worker or its view
    tokens = tokens if tokens is not None else OutputHistory()
    if not profile.is_last_pp_rank or (ranks is not None and ranks.pp_size > 1):
        # A non-last pipeline rank sees no sampled tokens: every rank keeps
        # the plan's rows, so all send the same steps.
        tokens.follow_acceptance = False
    report = RunReport(plan=plan.name, runner=profile.runner, model=profile.model,
                       skipped=plan.skipped)
    if not plan.steps:
        return report
    busy = sorted(worker.live_request_ids())
    if busy:
        raise RunnerBusyError(
            f"the runner holds {len(busy)} request(s) ({', '.join(busy[:4])}"
            f"{', ...' if len(busy) > 4 else ''}); stepwarm drives an idle runner "
            "(at start-up, before traffic), so nothing was run"
        )
    t_run = time.perf_counter()
    report.started_at = time.time()
    # Requests with images: processed by the model's processor before any step.
    shared = RunProcessor(worker)  # made once, and the dummy audio processed once
    images = {r.req_id: request_inputs(shared, r, profile.image_classes,
                                       prompt_token_ids(r, profile))
              for r in plan.requests if r.images}
    # Encoder-decoder requests: the dummy audio (their encoder runs with the
    # step that schedules their first tokens); an encoder_cached one carries
    # a feature without data, as vLLM's warmup_kernels sends.
    audio = {r.req_id: audio_inputs(shared, r, prompt_token_ids(r, profile))
             for r in plan.requests if r.encodes_audio}
    images.update((rid, inputs) for rid, inputs in audio.items() if inputs is not None)
    mask_before = worker.allowed_token_mask()
    params: dict[str, tuple[Any, Any]] = {}
    sent: set[str] = set()
    failed_at: int | None = None
    cause: BaseException | None = None
    with deferred_compiles(compile_threads) as deferred, worker.kv_connector_disabled(), \
            worker.eplb_recording_suppressed(), worker.kv_blocks_backed(1 + plan.max_block_id), \
            measured() as report.memory:
        try:
            for step in plan.steps:
                failed_at = step.index
                deferred.step = step.index
                started_at = time.time()
                what = plan.with_display_names(
                    f"{plan.name} step {step.index}/{len(plan.steps) + plan.left_out} "
                    f"({step.kind}, {step.label})")
                if on_step_start is not None:
                    on_step_start(step, what)
                with watch.watching(what, on_running) if watch else _nothing():
                    output, wall_ms = _run_step(worker, step, plan, profile, params, sent,
                                                ranks, tokens, images)
                if on_step_ran is not None:
                    on_step_ran(step)
                sent.difference_update(step.finished_req_ids)
                pooled = (_pooler_outputs(output) if step.scheduled and not step.sample
                          else None)
                result = _result(step, wall_ms, output, pooled)
                result.started_at, result.ended_at = started_at, time.time()
                _follow_acceptance(step, result, tokens)
                tokens.pooled.update(pooled or {})
                for rid, ids in (result.sampled_token_ids or {}).items():
                    tokens.sampled.setdefault(rid, []).extend(ids)
                report.steps.append(result)
                if on_step is not None:
                    on_step(result)
            failed_at = None
        except Exception as e:  # noqa: BLE001 - reported with the step, re-raised below
            step = _step_of(plan, failed_at)
            report.ok = False
            report.error = plan.with_display_names(
                f"step {failed_at} ({step.kind}: {step.label}) failed on the "
                f"{profile.runner} runner: {type(e).__name__}: {e}"
                if step is not None else f"{type(e).__name__}: {e}"
            )
            report.traceback = "".join(tb.format_exception(e))
            report.raised_by = raised_by(e)
            if step is not None:
                report.failed_step = {"index": failed_at, "kind": step.kind,
                                      "label": plan.with_display_names(step.label)}
            cause = e
        finally:
            worker.discard_pending_step()
            leftover = {r for r in worker.live_request_ids() if r.startswith(REQ_ID_PREFIX)}
            # Ids only other tables still hold (e.g. Mamba state indices of
            # requests a plan step finished without scheduling any token).
            stale = {r for ids in worker.request_tables(REQ_ID_PREFIX).values() for r in ids}
            to_finish = sent | leftover | stale
            cached = encoder_cache_keys(plan, [r.req_id for r in plan.requests])
            if to_finish or cached:
                out = cleanup_output(to_finish, cached)
                worker.execute_model(out)
                worker.discard_pending_step()
                worker.drop_finished_state(out)
            if not mask_before:  # allocated by a warmup request: freed as vLLM starts
                worker.release_allowed_token_mask()
            report.cleanup_ran = True
            synchronize()
            if _is_oom(cause):
                _empty_cache()
                failed = _step_of(plan, failed_at)
                report.error = plan.with_display_names(
                    f"step {failed_at} ({failed.kind}: {failed.label}) failed on the "
                    f"{profile.runner} runner: ") + _oom_text(cause)
    report.deferred_compiles = deferred.result.compiles
    report.deferred_wait_ms = deferred.result.waited_s * 1e3
    report.wall_ms = (time.perf_counter() - t_run) * 1e3
    report.ended_at = time.time()
    report.left_in_runner = held_by_runner(worker)
    if failed_at is not None:
        raise StepFailed(report, failed_at) from cause
    if report.left_in_runner:
        report.ok = False
        report.error = f"the runner still holds {report.left_in_runner} after cleanup"
        raise RuntimeError(report.error)
    return report
