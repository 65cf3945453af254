"""Step-level latency of a scenario: each step as the scheduler sends it, timed.

``stepwarm bench SCENARIO`` plans the scenario once against the worker's
profile and drives the whole plan ``warmup + repeat`` times
(:func:`stepwarm.driver.drive`: every repeat ends with the cleanup step, so the
runner holds no request between repeats and each repeat sends the same
``SchedulerOutput`` shapes). Per step it keeps the host time of
``execute_model`` + ``sample_tokens`` (``perf_counter``) and, on CUDA, the device
time between two CUDA events recorded around the step (the end event waited
for). The repeats' shapes (requests, scheduled tokens, drafts per step) are
checked equal: a plan that drifted would compare different work.

Two configurations are compared in one run (:func:`interleave`): each is a
child process (``python -m stepwarm bench ... --child``) holding its own engine
and plan, told over stdin to run one round of repeats at a time, A and B in
turn, so drift on the host or device falls on both. Per step the ratio of the
medians (B / A) gets a bootstrap confidence interval (:func:`compare`);
``--gate PCT`` fails when a step's whole interval lies above ``1 + PCT/100``
(:func:`gate`): slower beyond the noise.

Pure statistics and the report need no engine; :func:`measure` needs a worker.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

#: Spread (p90 - p10) / p50 above which a step's samples are too noisy to compare.
WIDE_SPREAD = 0.25
#: Pairs' ratios further apart than this (over the ratio) are said: drift
#: between processes (a child's allocations, clocks, core) that rounds within
#: one pair cannot cancel.
PROCESS_DRIFT = 0.05
#: A step whose median time is below this (ms) on both sides is at the timer's
#: resolution: a step that schedules no tokens launches no kernels, and CUDA
#: events around nothing read about 1.3 microseconds (s28, an H100). Its
#: ratio is not computed (:attr:`Ratio.idle`): not gated, no drift.
TIMER_FLOOR_MS = 0.01
#: Bootstrap resamples for a ratio's confidence interval, and its level.
BOOTSTRAP = 2000
CONFIDENCE = 0.95


@dataclass
class StepSamples:
    """One planned step's shape and its measured times (ms), one per repeat."""

    index: int
    kind: str
    label: str
    num_reqs: int
    num_tokens: int
    num_spec_tokens: int
    host_ms: list[float] = field(default_factory=list)
    #: CUDA event time (None off CUDA).
    device_ms: list[float] | None = None
    #: The longest sequence the step attends over: a scheduled request's
    #: computed + scheduled tokens, the largest (a sweep's context axis).
    context_tokens: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_reqs, self.num_tokens, self.num_spec_tokens)

    def times(self) -> list[float]:
        """The times compared: the device's where measured, else the host's."""
        return self.device_ms if self.device_ms else self.host_ms


@dataclass
class BenchReport:
    """A scenario benchmarked on one configuration."""

    scenario: str
    repeat: int
    warmup: int
    steps: list[StepSamples]
    #: device, vLLM, torch, attention backend, runner, model.
    setup: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"scenario": self.scenario, "repeat": self.repeat, "warmup": self.warmup,
                "setup": self.setup, "steps": [dict(asdict(s), stats=stats(s.times()),
                                                    tokens_per_s=tokens_per_s(s))
                                               for s in self.steps]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BenchReport:
        steps = [StepSamples(**{k: v for k, v in s.items() if k not in ("stats", "tokens_per_s")})
                 for s in d["steps"]]
        return cls(d["scenario"], d["repeat"], d["warmup"], steps, d.get("setup", {}))


class ShapeDrift(RuntimeError):
    """A repeat sent another shape than the first at some step."""


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation between ranks
    (NumPy's default): ``percentile([1, 2, 3, 4], 50) == 2.5``."""
    if not values:
        raise ValueError("no samples")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats(values: Sequence[float]) -> dict[str, float]:
    """p50 / p90 / p99, min, and the spread ``(p90 - p10) / p50``."""
    p50 = percentile(values, 50)
    return {"p50": p50, "p90": percentile(values, 90), "p99": percentile(values, 99),
            "min": min(values),
            "spread": (percentile(values, 90) - percentile(values, 10)) / p50 if p50 else 0.0}


def tokens_per_s(step: StepSamples) -> float:
    """Scheduled tokens a second at the step's median time."""
    p50 = percentile(step.times(), 50)
    return step.num_tokens / (p50 / 1e3) if p50 > 0 else 0.0


@dataclass
class Ratio:
    """Step ``index``'s median time under B over A, with a bootstrap interval."""

    index: int
    label: str
    ratio: float
    low: float
    high: float
    #: Either side's spread is above :data:`WIDE_SPREAD`.
    noisy: bool
    #: ``median(B) / median(A)`` within each pair of child processes
    #: (``--processes``), in the order they ran; one value for one pair.
    per_process: list[float] = field(default_factory=list)
    #: Both medians below :data:`TIMER_FLOOR_MS`: nothing to compare (the
    #: ratio is 1.0 and the interval [1, 1], kept for the JSON's shape).
    idle: bool = False

    @property
    def drift(self) -> float:
        """How far the pairs' ratios lie apart, over the ratio: ``(max - min) /
        ratio`` (0 for one pair). Above :data:`PROCESS_DRIFT` a second run
        of the same command may not land within its interval."""
        if len(self.per_process) < 2 or not self.ratio or self.idle:
            return 0.0
        return (max(self.per_process) - min(self.per_process)) / self.ratio


def plan_shapes(plan: Any) -> list[list[int]]:
    """Each planned step's (requests, scheduled tokens, draft tokens): what a
    repeat must send again, and what two configurations must both plan."""
    return [[len(step.scheduled), sum(r.num_scheduled_tokens for r in step.scheduled),
             sum(len(r.spec_token_ids) for r in step.scheduled)] for step in plan.steps]


def same_plans(a: Sequence[Sequence[int]] | None, b: Sequence[Sequence[int]] | None) -> None:
    """Raise :class:`ShapeDrift` naming the first step where A's and B's
    plans differ (before either is measured).

    Raises:
        ShapeDrift: another step count, or a step of another shape.
    """
    if a is None or b is None or [list(x) for x in a] == [list(x) for x in b]:
        return
    if len(a) != len(b):
        raise ShapeDrift(f"the two configurations planned different steps: A {len(a)} steps, "
                         f"B {len(b)}: their times do not compare")
    i = next(i for i, (x, y) in enumerate(zip(a, b)) if list(x) != list(y))
    raise ShapeDrift(f"the two configurations planned different steps: step {i} is "
                     f"{tuple(a[i])} in A, {tuple(b[i])} in B (requests, tokens, drafts): "
                     "their times do not compare")


def compare(a: BenchReport, b: BenchReport, seed: int = 0) -> list[Ratio]:
    """Per step, ``median(B) / median(A)`` and its ``CONFIDENCE`` interval
    (each side resampled with replacement :data:`BOOTSTRAP` times, seeded):
    :func:`compare_pairs` of one pair of processes.

    Raises:
        ShapeDrift: the two plans differ (another step count or shape).
    """
    return compare_pairs([(a, b)], seed)


def compare_pairs(pairs: Sequence[tuple[BenchReport, BenchReport]], seed: int = 0
                  ) -> list[Ratio]:
    """Per step, over several pairs of child processes (``--processes``), the
    geometric mean of each pair's ``median(B) / median(A)`` (so it lies between
    the pairs' own ratios: medians pooled over processes of other speeds
    need not), and its ``CONFIDENCE`` interval by a two-level bootstrap
    (seeded): the pairs are resampled with replacement, then each chosen
    pair's samples, so the interval holds the drift between processes as
    well as the noise within one. Each pair's own ratio is kept
    (:attr:`Ratio.per_process`). With one pair: ``median(B) / median(A)``.

    Raises:
        ShapeDrift: two plans differ (another step count or shape), or the
            two measured different times (``setup["time"]``: a B of
            ``--against-python`` whose stepwarm counts the host's preparation).
    """
    kinds = {str(rep.setup.get("time")) for pair in pairs for rep in pair}
    if len(kinds) > 1:
        raise ShapeDrift(f"the two configurations measured different times ({'; '.join(sorted(kinds))}; "
                         "'None': a stepwarm that does not say): their times do not compare")
    shapes = [s.shape for s in pairs[0][0].steps]
    if any([s.shape for s in rep.steps] != shapes for pair in pairs for rep in pair):
        raise ShapeDrift("the two configurations planned different steps "
                         "(requests, tokens, drafts per step): their times do not compare")
    rng = random.Random(seed)
    tail = (1 - CONFIDENCE) / 2 * 100
    out = []
    for i, step in enumerate(pairs[0][0].steps):
        ta = [a.steps[i].times() for a, _ in pairs]
        tb = [b.steps[i].times() for _, b in pairs]
        if max(percentile(ts, 50) for ts in (*ta, *tb)) < TIMER_FLOOR_MS:
            out.append(Ratio(step.index, step.label, 1.0, 1.0, 1.0, False, idle=True))
            continue
        ratios = []
        for _ in range(BOOTSTRAP):
            chosen = [rng.randrange(len(pairs)) for _ in pairs] if len(pairs) > 1 else [0]
            ratios.append(_mean_ratio([
                percentile(rng.choices(tb[k], k=len(tb[k])), 50)
                / percentile(rng.choices(ta[k], k=len(ta[k])), 50) for k in chosen]))
        ratios.sort()
        per_pair = [percentile(b, 50) / percentile(a, 50) for a, b in zip(ta, tb)]
        out.append(Ratio(
            step.index, step.label, _mean_ratio(per_pair),
            percentile(ratios, tail), percentile(ratios, 100 - tail),
            any(stats(t)["spread"] > WIDE_SPREAD for t in (*ta, *tb)), per_pair))
    return out


def _mean_ratio(ratios: Sequence[float]) -> float:
    """The geometric mean of ``ratios`` (one: itself); a ratio of 0 (a
    median of 0) gives 0."""
    if len(ratios) == 1:
        return ratios[0]
    if min(ratios) <= 0:
        return 0.0
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def gate(ratios: Sequence[Ratio], pct: float) -> list[Ratio]:
    """The steps slower beyond the noise: the whole interval above ``1 + pct/100``."""
    return [r for r in ratios if not r.idle and r.low > 1 + pct / 100]


def merge(rounds: Sequence[BenchReport]) -> BenchReport:
    """Several rounds of one configuration as one report (samples concatenated)."""
    first = rounds[0]
    steps = [StepSamples(s.index, s.kind, s.label, s.num_reqs, s.num_tokens, s.num_spec_tokens,
                         [t for r in rounds for t in r.steps[i].host_ms],
                         None if s.device_ms is None else
                         [t for r in rounds for t in (r.steps[i].device_ms or [])],
                         s.context_tokens)
             for i, s in enumerate(first.steps)]
    return BenchReport(first.scenario, sum(r.repeat for r in rounds), first.warmup, steps,
                       first.setup)


# --- On a worker ------------------------------------------------------------

def measure(worker: WorkerView, plan: Any, profile: Any, repeat: int, warmup: int = 1,
            *, cuda: bool | None = None,
            on_repeat: Callable[[int], None] | None = None,
            host_seen: dict[int, float] | None = None) -> BenchReport:
    """Drive ``plan`` ``warmup + repeat`` times on ``worker``; keep the last
    ``repeat``. Every repeat ends with the driver's cleanup (the runner holds
    no stepwarm request after it, also after a failure, which is raised).
    With ``repeat == 0`` (warming only) the report has no steps.

    On a GPU a measured step's device time is the GPU's work: a sleep queued
    before its start event (:func:`hide_host_ms` of its host time in the last
    warm-up repeat, kept in ``host_seen`` across calls) lets the host queue the
    step first, so the runner's input preparation is not counted.

    Raises:
        stepwarm.driver.StepFailed: a step failed (the runner was cleaned up).
        ShapeDrift: a repeat sent another shape than the first.
    """
    from stepwarm.driver import drive
    from stepwarm.random_state import random_state_kept

    if cuda is None:
        cuda = _on_cuda()
    steps: dict[int, StepSamples] = {}
    starts: dict[int, Any] = {}
    ends: dict[int, Any] = {}
    began: dict[int, float] = {}
    if host_seen is None:  # each step's host time in the last warm-up repeat
        host_seen = {}
    cycles_per_ms = _sleep_cycles_per_ms() if cuda else 0.0
    measuring = [False]

    def started(step: Any, what: str) -> None:
        if cuda:
            import torch

            if measuring[0]:
                # The GPU sleeps while the host builds and launches the step, so
                # the start event fires once the step's kernels are queued: the
                # device time is the GPU's work, not the runner's input preparation.
                torch.cuda._sleep(int(hide_host_ms(host_seen.get(step.index)) * cycles_per_ms))
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            starts[step.index] = event
            began[step.index] = time.perf_counter()

    def ran(step: Any) -> None:
        """The end event as soon as the step returned (not after the driver
        read its result: the GPU would idle meanwhile), and, in a warm-up
        repeat, the host time from the start event (the step's
        ``SchedulerOutput`` built, launched, read back) the sleep must cover."""
        if cuda and step.index in starts:
            import torch

            end = torch.cuda.Event(enable_timing=True)
            end.record()
            ends[step.index] = end
            if not measuring[0]:
                host_seen[step.index] = (time.perf_counter() - began.pop(step.index)) * 1e3

    for r in range(warmup + repeat):
        keep = measuring[0] = r >= warmup
        seen: list[tuple[int, tuple[int, int, int]]] = []

        def done(result: Any, keep: bool = keep, seen: list = seen) -> None:
            shape = (result.num_reqs, result.num_scheduled_tokens, result.num_spec_tokens)
            seen.append((result.index, shape))
            device = None
            if cuda and result.index in ends:
                end = ends.pop(result.index)
                end.synchronize()
                device = starts.pop(result.index).elapsed_time(end)
            if not keep:
                return
            s = steps.setdefault(result.index, StepSamples(
                result.index, result.kind, result.label, *shape,
                device_ms=[] if cuda else None,
                context_tokens=context_tokens(plan.steps[result.index])))
            if s.shape != shape:
                raise ShapeDrift(f"step {result.index} ({result.kind}: {result.label}) sent "
                                 f"{shape} (requests, tokens, drafts), the first repeat {s.shape}")
            s.host_ms.append(result.wall_ms)
            if s.device_ms is not None and device is not None:
                s.device_ms.append(device)

        with random_state_kept():  # as the plugin's warmup: serving draws what it would
            drive(worker, plan, profile, on_step=done, on_step_start=started, on_step_ran=ran)
        if on_repeat is not None:
            on_repeat(r)
    return BenchReport(plan.name, repeat, warmup, [steps[i] for i in sorted(steps)],
                       setup(worker, profile))


#: The queued sleep before a measured step's start event (:func:`measure`):
#: this much longer than the step's host time in the last warm-up repeat, plus
#: a margin, at most :data:`HIDE_HOST_MAX_MS`; without a warm-up, the default.
HIDE_HOST_FACTOR = 1.25
HIDE_HOST_MARGIN_MS = 0.5
HIDE_HOST_DEFAULT_MS = 50.0
HIDE_HOST_MAX_MS = 500.0


def hide_host_ms(host_ms: float | None) -> float:
    """How long the GPU sleeps before a measured step whose host time in the
    last warm-up repeat was ``host_ms`` (from its start event to its return:
    the ``SchedulerOutput`` built, the step launched and read back; None: no
    warm-up): long enough that the host has queued the whole step when the
    start event fires. A host time that includes waiting for the GPU
    (``sample_tokens`` reads the tokens back) only lengthens it."""
    if host_ms is None:
        return HIDE_HOST_DEFAULT_MS
    return min(HIDE_HOST_MAX_MS, host_ms * HIDE_HOST_FACTOR + HIDE_HOST_MARGIN_MS)


def _sleep_cycles_per_ms() -> float:
    """GPU clock cycles per millisecond of ``torch.cuda._sleep``, measured:
    the highest of three 10 M-cycle sleeps between CUDA events, after one
    not counted (a GPU still at a low clock would give a low rate, and the
    sleeps at full clock would be too short)."""
    import torch

    rates = []
    torch.cuda._sleep(10_000_000)
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        end.synchronize()
        rates.append(10_000_000 / max(start.elapsed_time(end), 1e-3))
    return max(rates)


def context_tokens(step: Any) -> int:
    """The longest sequence a planned step attends over (computed + scheduled
    tokens of its longest scheduled request); 0 for a step with none."""
    return max((r.num_computed_tokens + r.num_scheduled_tokens for r in step.scheduled), default=0)


def trace_step(worker: WorkerView, plan: Any, profile: Any, index: int, path: Any,
               *, cuda: bool | None = None) -> None:
    """One more repeat of ``plan`` (after the measured ones: its kernels are
    compiled) with the torch profiler on around step ``index`` only
    (``execute_model`` + ``sample_tokens``, CPU and, on CUDA, the device's
    kernels); its Chrome trace (Perfetto reads it) written to ``path``. The
    profiler is stopped whatever the step does; the runner is cleaned up as
    after any repeat.

    Raises:
        ValueError: ``index`` is not a step of the plan.
        stepwarm.driver.StepFailed: a step failed (the runner was cleaned up).
    """
    import torch

    from stepwarm.driver import drive
    from stepwarm.random_state import random_state_kept

    if not 0 <= index < len(plan.steps):
        raise ValueError(f"--trace {index}: the plan has steps 0 to {len(plan.steps) - 1}")
    if cuda is None:
        cuda = _on_cuda()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    prof = torch.profiler.profile(activities=activities, record_shapes=True)
    state = {"on": False}

    def started(step: Any, what: str) -> None:
        if step.index == index and not state["on"]:
            prof.start()
            state["on"] = True

    def done(result: Any) -> None:
        if result.index == index and state["on"]:
            if cuda:
                torch.cuda.synchronize()
            prof.stop()
            state["on"] = False
            prof.export_chrome_trace(str(path))

    try:
        with random_state_kept():
            drive(worker, plan, profile, on_step=done, on_step_start=started)
    finally:
        if state["on"]:  # the step raised: the profiler is not left running
            prof.stop()


def _on_cuda() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def attention_backends(vllm_config: Any) -> str:
    """The attention backends the model's layers run (their ``attn_backend``'s
    ``get_name()``, as vLLM chose them at model init: ``FLASH_ATTN``,
    ``TRITON_ATTN``, ``CPU_ATTN`` ...), comma-separated; "" when none is
    found. What ``-e attention_backend=...`` asked for is only a request."""
    layers = vllm_config.compilation_config.static_forward_context.values()
    names = {b.get_name() for b in (getattr(layer, "attn_backend", None) for layer in layers)
             if b is not None and hasattr(b, "get_name")}
    return ", ".join(sorted(names))


def setup(worker: WorkerView, profile: Any) -> dict[str, Any]:
    """What the numbers were measured on: device, vLLM, torch, attention backend."""
    import torch

    device = "cpu"
    if _on_cuda():
        device = torch.cuda.get_device_name()
    backend = ""
    try:
        cfg = worker.vllm_config
        backend = attention_backends(cfg) or (str(getattr(
            cfg.attention_config, "backend", "") or "") if hasattr(cfg, "attention_config") else "")
    except Exception:  # noqa: BLE001
        backend = ""
    return {"device": device, "vllm": profile.vllm_version, "torch": torch.__version__,
            "attention_backend": backend or "vLLM's default", "runner": profile.runner,
            "model": profile.model,
            "time": ("device: the GPU's work, the host's launch hidden behind a queued sleep"
                     if device != "cpu" else "host")}


# --- Two configurations, interleaved ---------------------------------------

def child_loop(worker: WorkerView, plan: Any, profile: Any, read: Callable[[], str],
               write: Callable[[str], None]) -> None:
    """A ``--child``'s protocol: ``warm K`` runs K repeats unkept; ``run N``
    runs N and writes one JSON line (a :class:`BenchReport`); ``quit`` ends.
    Every reply is one line; an error is ``{"error": ...}``."""
    host_seen: dict[int, float] = {}  # the warm-up's host times, for every round
    while True:
        line = read().strip()
        if not line or line == "quit":
            return
        cmd, _, n = line.partition(" ")
        try:
            if cmd == "warm":
                measure(worker, plan, profile, repeat=0, warmup=int(n), host_seen=host_seen)
                write(json.dumps({"warmed": int(n)}))
            elif cmd == "run":
                write(json.dumps(measure(worker, plan, profile, repeat=int(n), warmup=0,
                                         host_seen=host_seen).to_dict()))
            else:
                write(json.dumps({"error": f"unknown command {line!r}"}))
        except Exception as e:  # noqa: BLE001 - reported to the parent
            write(json.dumps({"error": f"{type(e).__name__}: {e}"}))


def round_sizes(repeat: int, rounds: int) -> list[int]:
    """``repeat`` measured repeats split into at most ``rounds`` rounds, the
    first ones a repeat longer where they do not divide evenly (10 in 4:
    3, 3, 2, 2); fewer rounds than asked where there are fewer repeats (one
    repeat each)."""
    n = max(1, min(rounds, repeat))
    return [repeat // n + (1 if i < repeat % n else 0) for i in range(n)]


def interleave(send: dict[str, Callable[[str], dict[str, Any]]], sizes: Sequence[int],
               warmup: int) -> dict[str, BenchReport]:
    """Warm each configuration, then run one round per entry of ``sizes``
    (that many repeats, :func:`round_sizes`), A then B then A ... (B first in
    odd rounds, so neither is always second). ``send[name](command)`` returns
    the child's reply."""
    names = list(send)
    for name in names:
        reply = send[name](f"warm {warmup}")
        if "error" in reply:
            raise RuntimeError(f"{name}: {reply['error']}")
    got: dict[str, list[BenchReport]] = {n: [] for n in names}
    for r, size in enumerate(sizes):
        for name in (names if r % 2 == 0 else names[::-1]):
            reply = send[name](f"run {size}")
            if "error" in reply:
                raise RuntimeError(f"{name}: {reply['error']}")
            got[name].append(BenchReport.from_dict(reply))
    # each round ran unwarmed (``run``): the report's warm-up is the ``warm`` above
    return {n: dataclasses.replace(merge(got[n]), warmup=warmup) for n in names}


