"""Which part of start-up compiled each kernel: a vLLM phase, or a stepwarm scenario's step.

Start-up is cut at the engine's phases (the times stepwarm's console saw
vLLM's log say "loading the model", "vLLM's own warmup", ...) and at the
step boundaries of every scenario the start-up hook ran
(:class:`~stepwarm.driver.StepResult` ``started_at`` / ``ended_at``, carried
by the reports the hook leaves on the worker). A compile seen at time ``t``
belongs to the step whose window holds ``t``, else to the scenario's cleanup
when ``t`` falls inside the scenario, else to the last vLLM phase begun by
``t``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from stepwarm.coverage.detectors import SLACK_S, CompileEvent, variant_text
from stepwarm.driver import RunReport

#: How far apart (s) two detectors' events of one compile done in a thread
#: may be (the Triton hook's, and the cache file's coarse mtime).
DEFERRED_SLACK_S = 0.5
#: The phase of compiles seen before vLLM logged any phase.
START = "vLLM start-up"


@dataclass(frozen=True)
class Where:
    """The part of start-up a compile happened in."""

    #: ``vllm`` or ``stepwarm``.
    owner: str
    #: vLLM's phase, or the scenario's name.
    phase: str
    #: The scenario's step index (None: a vLLM phase, or the scenario's cleanup).
    step: int | None = None
    #: ``kind: label`` of the step, or ``cleanup``.
    label: str = ""

    def __str__(self) -> str:
        if self.owner == "vllm":
            return self.phase
        return f"{self.phase} step {self.step} ({self.label})" if self.step is not None \
            else f"{self.phase} {self.label}".rstrip()


def attribute(events: Iterable[CompileEvent], phases: Sequence[tuple[str, float]],
              reports: Sequence[RunReport],
              windows: Sequence[tuple[str, float, float]] = ()) -> list[tuple[CompileEvent, Where]]:
    """Attribute each start-up compile to a vLLM phase or a stepwarm step.

    Args:
        events: compiles seen during start-up.
        phases: ``(phase, time.time() when it began)``, in order.
        reports: the scenarios' reports (steps with ``started_at`` / ``ended_at``).
        windows: other parts of stepwarm's start-up, ``(label, began, ended)``
            (:attr:`stepwarm.sampler_jit.SamplerJit.window`).

    Returns:
        ``(event, where)`` per event, in the events' order.
    """
    # A variant compiled in a thread (stepwarm.deferred_compile) belongs to
    # the step whose launch it skipped, not to the step running when it ended.
    deferred = {variant_text(d.key): (r, d.step) for r in reports
                for d in r.deferred_compiles if d.key and d.step is not None}
    events = list(events)
    asked = {i: deferred[e.variant] for i, e in enumerate(events)
             if e.kind == "triton" and e.variant in deferred}
    # A detector that tells no variant (the cache scan) saw the same compile
    # end at the same moment: it follows the nearest variant of that name.
    for i, e in enumerate(events):
        if i in asked or e.variant:
            continue
        near = min((j for j in asked if events[j].name == e.name),
                   key=lambda j: abs(events[j].at - e.at), default=None)
        if near is not None and abs(events[near].at - e.at) <= DEFERRED_SLACK_S:
            asked[i] = asked[near]
    return [(e, _step_where(*asked[i]) if i in asked else _where(e.at, phases, reports, windows))
            for i, e in enumerate(events)]


def _step_where(report: RunReport, index: int) -> Where:
    step = next((s for s in report.steps if s.index == index), None)
    return Where("stepwarm", report.plan, index,
                 f"{step.kind}: {step.label}" if step is not None else "")


def _where(t: float, phases: Sequence[tuple[str, float]], reports: Sequence[RunReport],
           windows: Sequence[tuple[str, float, float]] = ()) -> Where:
    for r in reports:
        for s in r.steps:
            if s.started_at - SLACK_S <= t <= s.ended_at + SLACK_S:
                return Where("stepwarm", r.plan, s.index, f"{s.kind}: {s.label}")
    for r in reports:
        if r.started_at and r.started_at - SLACK_S <= t <= r.ended_at + SLACK_S:
            return Where("stepwarm", r.plan, None, "cleanup")
    for label, began, ended in windows:
        if began - SLACK_S <= t <= ended + SLACK_S:
            return Where("stepwarm", label)
    phase = START
    for name, begun in phases:
        if begun <= t:
            phase = name
    return Where("vllm", phase)
