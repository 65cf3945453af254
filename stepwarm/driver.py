"""Drive a plan through a vLLM worker's ``execute_model`` / ``sample_tokens`` loop.

Mirrors the loop of ``vllm.v1.worker.gpu.warmup.warmup_kernels``: the KV
connector is off for the run and restored afterwards, and a cleanup
``SchedulerOutput`` finishing every request sent so far is always executed,
also when a step raises, so the runner holds no stepwarm request afterwards.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from stepwarm.compile import (
    cleanup_output,
    encoder_cache_keys,
    prompt_token_ids,
    to_grammar_output,
    to_scheduler_output,
)
from stepwarm.encoder_inputs import RequestInputs, request_inputs
from stepwarm.plan import REQ_ID_PREFIX, Plan, PlannedStep
from stepwarm.profile import RunnerProfile, read_profile
from stepwarm.ranks import RankGroup
from stepwarm.runner import (
    discard_pending_step,
    encoder_cache_ids,
    kv_connector_disabled,
    live_request_ids,
    synchronize,
)


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
    #: Requests ``execute_model`` returned a pooler output for (pooling
    #: steps); None for steps that do not pool.
    pooled: list[str] | None = None


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
    #: Wall time of the whole run, cleanup included (ms).
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

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict of the report."""
        return asdict(self)


class RunnerBusyError(RuntimeError):
    """The runner holds requests stepwarm did not send; nothing was run."""


class StepFailed(RuntimeError):
    """A step raised on the worker. ``report`` holds the steps that ran and the
    cleanup outcome; ``step`` is the failing step's index."""

    def __init__(self, report: RunReport, step: int):
        super().__init__(report.error)
        self.report = report
        self.step = step


def _resolved(output: Any) -> Any:
    """A ``ModelRunnerOutput`` (``AsyncModelRunnerOutput`` waited for)."""
    return output.get_output() if hasattr(output, "get_output") else output


def _sampled_counts(output: Any) -> dict[str, int] | None:
    req_ids = getattr(output, "req_ids", None)
    sampled = getattr(output, "sampled_token_ids", None)
    if req_ids is None or sampled is None:
        return None
    return {rid: len(tokens) for rid, tokens in zip(req_ids, sampled)}


def _pooled(output: Any) -> list[str] | None:
    req_ids = getattr(output, "req_ids", None)
    pooler = getattr(output, "pooler_output", None)
    if req_ids is None or pooler is None:
        return None
    return [rid for rid, out in zip(req_ids, pooler) if out is not None]


def _result(step: PlannedStep, wall_ms: float, output: Any) -> StepResult:
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
        sampled=_sampled_counts(output) if step.sample else None,
        pooled=_pooled(output) if step.scheduled and not step.sample else None,
    )


class PeerStepFailed(RuntimeError):
    """Another tensor / pipeline parallel rank failed the step this rank ran;
    this rank stops at the same step (see :mod:`stepwarm.ranks`)."""


def _run_step(worker: Any, step: PlannedStep, plan: Plan, profile: RunnerProfile,
              params: dict[str, tuple[Any, Any]], sent: set[str],
              ranks: RankGroup | None,
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
        scheduler_output = to_scheduler_output(step, plan, profile, params, images)
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
                f"{len(failed)} other rank(s) (TP x PP slots {failed}) failed this step; "
                f"{ranks.label} stopped with them")
    if local is not None:
        raise local
    return output, wall_ms


def drive(
    worker: Any,
    plan: Plan,
    profile: RunnerProfile | None = None,
    *,
    on_step: Callable[[StepResult], None] | None = None,
    ranks: RankGroup | None = None,
) -> RunReport:
    """Run every step of ``plan`` on ``worker``; always clean up.

    For each step: ``worker.execute_model(scheduler_output)``, then, for
    sampling steps, ``worker.sample_tokens(grammar_output)``. Afterwards (and
    after a failure) a ``SchedulerOutput`` whose ``finished_req_ids`` holds
    every request sent and not yet finished is executed, the device is
    synchronized and the KV connector restored.

    Args:
        worker: a vLLM worker (``execute_model``, ``sample_tokens``,
            ``model_runner``).
        plan: the plan (built for ``profile``).
        profile: the worker's profile; read off the worker when None.
        on_step: called with each step's result as soon as it ran.
        ranks: the engine's tensor / pipeline parallel ranks; every rank
            calls ``drive`` with the same plan, and after each step they agree
            on which failed, so a failure on one stops all at the same step.

    Returns:
        The :class:`RunReport` (``ok`` True).

    Raises:
        RunnerBusyError: the runner already holds requests (stepwarm warms an
            idle runner); raised before any step.
        StepFailed: a step raised on this rank or another (then the cause is
            :class:`PeerStepFailed`); the runner was cleaned up first and
            ``error.report`` says which step and what vLLM said.
        RuntimeError: the runner still held stepwarm requests after cleanup.
    """
    profile = profile or read_profile(worker)
    report = RunReport(plan=plan.name, runner=profile.runner, model=profile.model,
                       skipped=plan.skipped)
    if not plan.steps:
        return report
    busy = sorted(live_request_ids(worker))
    if busy:
        raise RunnerBusyError(
            f"the runner holds {len(busy)} request(s) ({', '.join(busy[:4])}"
            f"{', ...' if len(busy) > 4 else ''}); stepwarm drives an idle runner "
            "(at start-up, before traffic), so nothing was run"
        )
    # Requests with images: processed by the model's processor before any step.
    images = {r.req_id: request_inputs(worker, r, profile.image_classes,
                                       prompt_token_ids(r, profile.vocab_size))
              for r in plan.requests if r.images}
    params: dict[str, tuple[Any, Any]] = {}
    sent: set[str] = set()
    failed_at: int | None = None
    cause: BaseException | None = None
    t_run = time.perf_counter()
    with kv_connector_disabled(worker):
        try:
            for step in plan.steps:
                failed_at = step.index
                output, wall_ms = _run_step(worker, step, plan, profile, params, sent, ranks,
                                            images)
                sent.difference_update(step.finished_req_ids)
                result = _result(step, wall_ms, output)
                report.steps.append(result)
                if on_step is not None:
                    on_step(result)
            failed_at = None
        except Exception as e:  # noqa: BLE001 - reported with the step, re-raised below
            step = plan.steps[failed_at] if failed_at is not None else None
            report.ok = False
            report.error = plan.with_display_names(
                f"step {failed_at} ({step.kind}: {step.label}) failed on the "
                f"{profile.runner} runner: {type(e).__name__}: {e}"
                if step is not None else f"{type(e).__name__}: {e}"
            )
            cause = e
        finally:
            discard_pending_step(worker)
            leftover = {r for r in live_request_ids(worker) if r.startswith(REQ_ID_PREFIX)}
            to_finish = sent | leftover
            cached = encoder_cache_keys(plan, [r.req_id for r in plan.requests])
            if to_finish or cached:
                worker.execute_model(cleanup_output(to_finish, cached))
                discard_pending_step(worker)
            report.cleanup_ran = True
            synchronize()
    report.wall_ms = (time.perf_counter() - t_run) * 1e3
    report.left_in_runner = sorted(
        r for r in live_request_ids(worker) | encoder_cache_ids(worker)
        if r.startswith(REQ_ID_PREFIX)
    )
    if failed_at is not None:
        raise StepFailed(report, failed_at) from cause
    if report.left_in_runner:
        report.ok = False
        report.error = f"the runner still holds {report.left_in_runner} after cleanup"
        raise RuntimeError(report.error)
    return report
