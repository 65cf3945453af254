"""Who else would have compiled each kernel stepwarm compiled at start-up.

``stepwarm coverage --compare`` runs the baseline (vLLM's warmup alone) and
stepwarm, each with fresh caches. Every kernel a scenario step compiled in the
stepwarm run gets one label, by what the baseline did with the same kernel:

* ``vllm`` — the baseline compiled it during its own start-up: stepwarm paid
  for something vLLM does anyway (should be 0);
* ``moved`` — the baseline compiled it during its traffic replay: the first
  request that needs it would have paid it;
* ``extra`` — the baseline never compiled it in this run: pure start-up cost
  unless some traffic asks for it.

A kernel is its name plus, where a detector tells one (the Triton hook), its
specialization key (:attr:`~stepwarm.coverage.detectors.CompileEvent.variant`);
keys are compared only where both runs know one (the cache scan sees names
alone). The compile time moved is what the baseline's traffic paid beyond
stepwarm's on the same requests: over the traffic lines whose baseline runs
compiled a kernel stepwarm moved, each line once, the baseline's two runs
less stepwarm's two runs of that line (ms, at least 0). Both runs count: a
request whose second run lands in another kernel class (a different number
of accepted drafts, say) compiles then, and its first-call excess is 0. A
line stepwarm's run lacks (it failed there) counts its first-call excess.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any

from stepwarm.coverage.report import CoverageReport, StartupCompile

#: The labels, in the order they are reported.
LABELS = ("moved", "vllm", "extra")


def step_kernels(c: StartupCompile) -> list[tuple[str, str]]:
    """``(name, variant)`` per compile of one start-up part: the Triton hook's
    variants, then ``variant=''`` for the compiles of a name no variant covers
    (``kernels`` holds the most compiles any detector saw)."""
    out = []
    for name, count in c.kernels.items():
        variants = [v for n, v in c.variants if n == name]
        out += [(name, v) for v in variants] + [(name, "")] * max(0, count - len(variants))
    return out


class KernelIndex:
    """Kernels one run compiled: name -> variants seen ('' for a detector that
    tells none), and for traffic the request lines that compiled them."""

    def __init__(self) -> None:
        self.variants: dict[str, set[str]] = collections.defaultdict(set)
        self.lines: dict[tuple[str, str], set[int]] = collections.defaultdict(set)

    def add(self, name: str, variant: str, line: int | None = None) -> None:
        self.variants[name].add(variant)
        if line is not None:
            self.lines[(name, variant)].add(line)

    def matches(self, name: str, variant: str) -> list[tuple[str, str]]:
        """The entries that are the kernel ``(name, variant)``: the same name
        and, where both sides know a variant, the same variant."""
        seen = self.variants.get(name)
        if not seen:
            return []
        if not variant or seen <= {""}:
            return [(name, v) for v in sorted(seen)]
        return [(name, variant)] if variant in seen else []


def baseline_indexes(base: CoverageReport) -> tuple[KernelIndex, KernelIndex]:
    """The baseline's start-up kernels and traffic kernels (each request's
    events, both runs; its ``compiles_first`` names where it kept no events)."""
    startup, traffic = KernelIndex(), KernelIndex()
    for c in base.startup_compiles:
        for name, variant in step_kernels(c):
            startup.add(name, variant)
    for r in base.requests:
        events = r.get("events") or []
        for e in events:
            traffic.add(e[1], e[3] if len(e) > 3 else "", r["line"])
        if not events:
            for name in list(r["compiles_first"]) + list(r["compiles_second"]):
                traffic.add(name, "", r["line"])
    return startup, traffic


#: The name the linear GEMMs per token count (:mod:`stepwarm.gemm_sizes`) have
#: among the scenarios' costs.
GEMM_SIZES = "(linear GEMMs per token count)"
#: ... and the end's wait for sampler compiles still running in threads.
COMPILE_WAIT = "(sampler compiles in threads, waited for at the end)"


@dataclass
class ScenarioCost:
    """One scenario of the stepwarm run: what it cost and what it moved."""

    scenario: str
    steps: int
    seconds: float
    #: label -> compiles (:data:`LABELS`), its steps and cleanup together.
    compiles: dict[str, int] = field(default_factory=lambda: dict.fromkeys(LABELS, 0))
    #: ``[kernel, label]`` per compile, in the order the steps ran.
    kernels: list[list[str]] = field(default_factory=list)
    #: ``kind: label`` of each step that compiled nothing.
    idle_steps: list[list[Any]] = field(default_factory=list)


@dataclass
class Attribution:
    """Every start-up compile of the stepwarm run, labelled against the baseline."""

    scenarios: list[ScenarioCost]
    #: Seconds of every scenario together.
    scenario_s: float
    #: What the baseline's traffic paid beyond stepwarm's on the requests
    #: that compiled a kernel stepwarm moved (ms; :func:`moved_time_ms`).
    moved_ms: float
    #: Baseline request lines in ``moved_ms``.
    moved_lines: list[int]

    def total(self, label: str) -> int:
        """Compiles with ``label``, every scenario together."""
        return sum(s.compiles[label] for s in self.scenarios)

    @property
    def ratio(self) -> float | None:
        """Scenario time / compile time moved (None: nothing moved)."""
        return self.scenario_s * 1e3 / self.moved_ms if self.moved_ms > 0 else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: per scenario, totals, ratio, and the idle steps."""
        return {"scenarios": [{"scenario": s.scenario, "steps": s.steps, "seconds": s.seconds,
                               **s.compiles, "kernels": s.kernels} for s in self.scenarios],
                "totals": {label: self.total(label) for label in LABELS},
                "scenario_s": round(self.scenario_s, 3), "moved_ms": round(self.moved_ms, 1),
                "moved_lines": self.moved_lines,
                "ratio": None if self.ratio is None else round(self.ratio, 3),
                "idle_steps": [{"scenario": s.scenario, "step": i, "label": label}
                               for s in self.scenarios for i, label in s.idle_steps]}


def attribute_moves(base: CoverageReport, sw: CoverageReport) -> Attribution:
    """Label each kernel ``sw``'s scenarios compiled at start-up (see the module docstring)."""
    startup, traffic = baseline_indexes(base)
    parts: dict[str, list[StartupCompile]] = collections.defaultdict(list)
    vllm_own = KernelIndex()  # what vLLM's own start-up compiled in the stepwarm run
    for c in sw.startup_compiles:
        if c.owner == "stepwarm":
            parts[c.phase].append(c)
        else:
            for name, variant in step_kernels(c):
                vllm_own.add(name, variant)
    moved_lines: set[int] = set()
    out = []
    for run in sw.scenario_runs:
        cost = ScenarioCost(run["plan"], len(run["steps"]), round(run["wall_ms"] / 1e3, 3))
        compiled_steps = {c.step for c in parts.get(run["plan"], [])}
        cost.idle_steps = [[index, label] for index, label, *_ in run["steps"]
                           if index not in compiled_steps]
        for c in sorted(parts.get(run["plan"], []), key=lambda c: c.at_s):
            for name, variant in step_kernels(c):
                if _vllm_would(startup, vllm_own, name, variant):
                    label = "vllm"
                elif hits := traffic.matches(name, variant):
                    label = "moved"
                    for hit in hits:
                        moved_lines |= traffic.lines[hit]
                else:
                    label = "extra"
                cost.compiles[label] += 1
                cost.kernels.append([name, label])
        out.append(cost)
    if sw.gemm_s:  # stepwarm's cost too, though it compiles nothing (stepwarm.gemm_sizes)
        out.append(ScenarioCost(GEMM_SIZES, 0, sw.gemm_s))
    if sw.compile_wait_s:  # the scenarios' compiles are theirs; this is the time left over
        out.append(ScenarioCost(COMPILE_WAIT, 0, sw.compile_wait_s))
    return Attribution(out, sum(s.seconds for s in out), moved_time_ms(base, sw, moved_lines),
                       sorted(moved_lines))


def _vllm_would(startup: KernelIndex, vllm_own: KernelIndex, name: str, variant: str) -> bool:
    """Whether the baseline's start-up compiled the kernel ``(name, variant)``.
    A compile whose variant no detector told (a cache-scan count beside the
    Triton hook's variants) is vLLM's only where the baseline's start-up
    compiled a variant of the name that vLLM's own start-up in the stepwarm
    run did not: one vLLM compiled itself in this process stepwarm cannot
    have compiled again (run s25: a ``_topk_log_softmax_kernel`` counted
    twice at one ``sampler-matrix`` step, one variant told, was labelled
    ``vllm`` by name alone, though vLLM's own two variants were both compiled
    by vLLM in the stepwarm run)."""
    hits = startup.matches(name, variant)
    if variant or not hits:
        return bool(hits)
    own = vllm_own.variants.get(name, set())
    return any(not v or v not in own for _, v in hits)


def moved_time_ms(base: CoverageReport, sw: CoverageReport, lines: set[int]) -> float:
    """What the baseline's runs of traffic ``lines`` took beyond stepwarm's
    runs of the same lines (see the module docstring)."""
    ours = {r["line"]: r for r in sw.requests if not r.get("error")}
    total = 0.0
    for r in base.requests:
        if r["line"] not in lines:
            continue
        s = ours.get(r["line"])
        if s is None:
            total += r["excess_ms"]
        else:
            total += max(0.0, r["first_ms"] + r["second_ms"] - s["first_ms"] - s["second_ms"])
    return total
