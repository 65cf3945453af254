"""``stepwarm bench``: one configuration in this process, or two interleaved in children.

The statistics and the protocol are :mod:`stepwarm.bench`'s; this module starts
engines, prints and writes the report, and decides the exit status: 0 measured;
1 a step failed (the runner was cleaned up); 2 bad input, nothing ran; 4 a step
slower beyond the noise under ``--gate``.
"""

from __future__ import annotations

import csv
import io
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepwarm.bench import (
    PROCESS_DRIFT,
    WIDE_SPREAD,
    BenchReport,
    Ratio,
    child_loop,
    gate,
    interleave,
    plan_shapes,
    round_sizes,
    same_plans,
    stats,
    tokens_per_s,
)
from stepwarm.console import console, err_console, print_wrapped

if TYPE_CHECKING:
    from stepwarm.worker_view import WorkerView

#: Exit status of ``--gate``: a step slower beyond the noise.
GATE_FAILED = 4

#: ``--child-timeout``'s default, seconds: a child's engine start, and each of
#: its answers (a round of repeats), is bounded by it. s28 on an H100: a B
#: child's engine start never answered and the bench waited until killed.
CHILD_TIMEOUT_S = 1800.0

#: The signal on which a child prints every thread's Python stack (stderr).
STACKS_SIGNAL = getattr(signal, "SIGUSR1", None)
#: The prefix of the children's protocol lines on stdout (vLLM may print there too).
PREFIX = "STEPWARM-BENCH "


def plan_for(worker: WorkerView, scenario: Any) -> tuple[Any, Any]:
    """The worker's profile and ``scenario``'s plan for it."""
    from stepwarm.probe import read_profile
    from stepwarm.scenario import expand

    profile = read_profile(worker)
    return profile, expand(scenario, profile)


def print_report(rep: BenchReport) -> None:
    """Two lines a step within 80 columns: p50 / p90 / p99 ms, spread (a
    spread too wide to compare marked ``*``, said once below the table) and
    tokens/s, then the step's kind and whole label (wrapped); a summary."""
    s = rep.setup
    which = "device" if rep.steps and rep.steps[0].device_ms else "host"
    print_wrapped(f"{rep.scenario}: {rep.repeat} repeats after {rep.warmup} warm-up; "
                  f"{s.get('device')}, vLLM {s.get('vllm')}, torch {s.get('torch')}, "
                  f"{s.get('attention_backend')}, {s.get('runner')} runner; {which} time, ms")
    console.print(f"{'step':>4} {'reqs':>4} {'tokens':>6} {'p50':>9} {'p90':>9} {'p99':>9} "
                  f"{'spread':>6}  {'tok/s':>8}")
    total = 0.0
    wide = False
    for step in rep.steps:
        st = stats(step.times())
        total += st["p50"]
        mark = "*" if st["spread"] > WIDE_SPREAD else " "
        wide = wide or mark == "*"
        console.print(f"{step.index:>4} {step.num_reqs:>4} {step.num_tokens:>6} "
                      f"{st['p50']:>9.2f} {st['p90']:>9.2f} {st['p99']:>9.2f} "
                      f"{st['spread']:>6.2f}{mark} {tokens_per_s(step):>8.0f}")
        print_wrapped(f"     {step.kind}: {step.label}")
    if wide:
        print_wrapped(f"* spread (p90 - p10) / p50 above {WIDE_SPREAD}: too wide to compare")
    tokens = sum(s.num_tokens for s in rep.steps)
    print_wrapped(f"{rep.scenario}: {len(rep.steps)} steps, {total:.2f} ms at the medians, "
                  f"{tokens / (total / 1e3) if total else 0:.0f} tokens/s")


def print_ratios(ratios: Sequence[Ratio], a: str, b: str) -> None:
    """A line a step: the ratio and its interval, ``noisy`` where a side's
    spread is too wide, ``drift`` where pairs of processes disagree by more
    than :data:`~stepwarm.bench.PROCESS_DRIFT` (then each pair's ratio on
    the next line)."""
    pairs = max((len(r.per_process) for r in ratios), default=1)
    print_wrapped(f"B / A per step (A: {a}; B: {b}), median ratio [95% interval]"
                  + (f", {pairs} pairs of processes" if pairs > 1 else ""))
    drifted = False
    for r in ratios:
        if r.idle:
            console.print(f"{r.index:>4}  {r.label[:34]:<34}      -  at the timer's resolution "
                          "(no kernels)")
            continue
        drift = r.drift > PROCESS_DRIFT
        drifted = drifted or drift
        console.print(f"{r.index:>4}  {r.label[:34]:<34} {r.ratio:6.3f} [{r.low:.3f}, {r.high:.3f}]"
                      + ("  noisy" if r.noisy else "") + ("  drift" if drift else ""))
        if drift:
            print_wrapped("      per pair: " + ", ".join(f"{x:.3f}" for x in r.per_process))
    if drifted:
        print_wrapped(f"drift: the pairs' ratios lie more than {PROCESS_DRIFT:.0%} apart; the "
                      "interval holds it")
    elif pairs == 1 and any(not r.noisy and not r.idle for r in ratios):
        print_wrapped("one pair of processes: drift between processes is not measured "
                      "(--processes 3 measures it)")


def check_counts(counts: Sequence[tuple[str, int | str, int, int]]) -> list[str]:
    """Each ``(option, value, low, high)`` whose value is not a whole number
    from ``low`` to ``high``, said at once."""
    return [f"{option} {value}: allowed: a whole number from {low} to {high}"
            for option, value, low, high in counts
            if not (isinstance(value, int) and low <= value <= high)]


def check_gate(gate_pct: float | str | None, comparing: bool) -> list[str]:
    """``--gate`` is a percentage >= 0, and needs a B to compare A with."""
    if isinstance(gate_pct, str) or (gate_pct is not None and not gate_pct >= 0):
        return [f"--gate {gate_pct if isinstance(gate_pct, str) else f'{gate_pct:g}'}: "
                "allowed: a slowdown in percent, 0 or more"]
    if gate_pct is not None and not comparing:
        return [f"--gate {gate_pct:g}: the gate compares B with A; give B with --against-e, "
                "--against-env or --against-python"]
    return []


def check_plot_and_trace(plot_out: Path | None, trace: int | str | None, trace_out: Path | None,
                         comparing: bool) -> list[str]:
    """``--plot`` / ``--trace`` / ``--trace-file`` errors, before an engine starts."""
    from stepwarm import bench_plot

    errors = []
    if plot_out is not None:
        errors += [e for e in (bench_plot.path_error(plot_out), bench_plot.missing()) if e]
    if isinstance(trace, str) or (trace is not None and trace < 0):
        errors.append(f"--trace {trace}: allowed: a step's index, from 0")
    if trace is not None and comparing:
        errors.append("--trace traces one configuration: run it without --against-e, "
                      "--against-env or --against-python")
    if trace_out is not None and trace is None:
        errors.append("--trace-file needs --trace STEP")
    return errors


def write_outputs(reports: dict[str, BenchReport], ratios: Sequence[Ratio] | None,
                  json_out: Path | None, csv_out: Path | None,
                  plot_out: Path | None = None) -> None:
    """The report's files, each whole or not at all (``write_atomic``), and
    one line saying which were written.

    Raises:
        OSError: one could not be written.
    """
    from stepwarm.output_path import write_atomic

    if json_out is not None:
        write_atomic(json_out, json.dumps(
            {"configurations": {k: v.to_dict() for k, v in reports.items()},
             "ratios": [{**r.__dict__, "drift": r.drift} for r in ratios or []]}, indent=1))
    if csv_out is not None:
        f = io.StringIO(newline="")
        w = csv.writer(f)
        w.writerow(["configuration", "step", "kind", "label", "reqs", "tokens",
                    "context_tokens", "p50_ms", "p90_ms", "p99_ms", "spread", "tokens_per_s"])
        for name, rep in reports.items():
            for s in rep.steps:
                st = stats(s.times())
                w.writerow([name, s.index, s.kind, s.label, s.num_reqs, s.num_tokens,
                            s.context_tokens,
                            f"{st['p50']:.4f}", f"{st['p90']:.4f}", f"{st['p99']:.4f}",
                            f"{st['spread']:.4f}", f"{tokens_per_s(s):.1f}"])
        write_atomic(csv_out, f.getvalue())
    if plot_out is not None:
        from stepwarm.bench_plot import plot

        plot(reports, plot_out)
    written = [f"{opt} {path}" for opt, path in (("--json", json_out), ("--csv", csv_out),
                                                 ("--plot", plot_out)) if path is not None]
    if written:
        print_wrapped("written: " + ", ".join(written))


def stacks_on_signal() -> None:
    """In a ``--child``, as it starts (before its engine): print every
    thread's Python stack to stderr on :data:`STACKS_SIGNAL`, which the
    parent sends before it ends a child that did not answer in time."""
    import faulthandler

    if STACKS_SIGNAL is not None:
        faulthandler.register(STACKS_SIGNAL, file=sys.stderr, all_threads=True)


class ChildTimeout(RuntimeError):
    """A child did not answer within ``--child-timeout``; it was ended."""


class ScenarioSkipped(RuntimeError):
    """The scenario is skipped on a configuration's runner (its needs or
    requires): nothing to measure (exit :data:`SKIPPED`)."""


#: bench's exit status when the scenario is skipped on the runner (A's or B's), as ``run``'s.
SKIPPED = 3


def run_child(worker: WorkerView, plan: Any, profile: Any) -> None:
    """The ``--child`` side: announce the plan's shapes (or why the runner
    skips it, and end), then serve the parent's commands."""
    if plan.skipped:
        print(PREFIX + json.dumps({"skipped": plan.skipped}), flush=True)
        return
    print(PREFIX + json.dumps({"ready": len(plan.steps), "shapes": plan_shapes(plan)}),
          flush=True)
    child_loop(worker, plan, profile, sys.stdin.readline,
               lambda line: print(PREFIX + line, flush=True))


class Child:
    """A ``stepwarm bench --child`` process and its protocol. Every answer is
    awaited at most ``timeout`` seconds: a child that does not answer prints
    its Python stacks and is ended (:class:`ChildTimeout`)."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str],
                 timeout: float = CHILD_TIMEOUT_S):
        self.name, self.timeout = name, timeout
        # errors="replace": a stray byte on the child's stdout is no protocol line
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=sys.stderr, env=env, text=True, bufsize=1,
                                     errors="replace")
        self._answers: queue.Queue[str | None] = queue.Queue()
        self._read_error: BaseException | None = None
        threading.Thread(target=self._read, name=f"bench-child-{name}", daemon=True).start()
        # the plan's shapes, or the reason it is not ready
        self.ready = self.reply("its engine's start and plan")

    def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            for line in self.proc.stdout:
                if line.startswith(PREFIX):
                    self._answers.put(line[len(PREFIX):])
        except BaseException as e:  # noqa: BLE001 - said by reply(), not lost in a thread
            self._read_error = e
        finally:
            self._answers.put(None)  # the child closed its stdout (or it cannot be read)

    def reply(self, awaiting: str = "an answer") -> dict[str, Any]:
        try:
            line = self._answers.get(timeout=self.timeout)
        except queue.Empty:
            self._end_hung()
            raise ChildTimeout(
                f"{self.name}: no answer in {self.timeout:g} s ({awaiting}); its Python stacks "
                "are above (stderr); it was ended (--child-timeout)") from None
        if line is None:
            if self._read_error is not None:
                self._end_hung()
                raise RuntimeError(f"{self.name}: its output could not be read "
                                   f"({type(self._read_error).__name__}: {self._read_error}); "
                                   "it was ended")
            raise RuntimeError(f"{self.name}: the child exited ({self.proc.wait()}) before "
                               "answering")
        return dict(json.loads(line))

    def _end_hung(self) -> None:
        if STACKS_SIGNAL is not None and self.proc.poll() is None:
            try:
                self.proc.send_signal(STACKS_SIGNAL)
                time.sleep(2)  # faulthandler writes from its signal handler
            except OSError:
                pass
        self.proc.kill()
        self.proc.wait()

    def send(self, command: str) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.reply(f"{command!r}")

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=120)
        except Exception:  # noqa: BLE001
            self.proc.kill()


def run_compare(argv_a: list[str], argv_b: list[str], env_b: dict[str, str], python_b: str | None,
                rounds: int, repeat: int, warmup: int, processes: int = 1,
                on_pair: Callable[[int], None] | None = None,
                child_timeout: float = CHILD_TIMEOUT_S
                ) -> list[tuple[BenchReport, BenchReport]]:
    """``processes`` times, one after another: start A and B as children,
    interleave their rounds, end both. Returns each pair's (A, B) reports.

    A child's drift (its allocations, the core it runs on, clocks) stays
    for its life and rounds within one pair cannot cancel it; fresh pairs
    can (:func:`stepwarm.bench.compare_pairs`)."""
    env_a = dict(os.environ)
    sizes = round_sizes(repeat, rounds)
    pairs = []
    for p in range(processes):
        if on_pair is not None:
            on_pair(p)
        children = {"A": Child("A", [sys.executable, *argv_a], env_a, child_timeout)}
        try:
            _refuse_skipped("A", children["A"])  # before B's engine starts
            children["B"] = Child("B", [python_b or sys.executable, *argv_b], {**env_a, **env_b},
                                  child_timeout)
            _refuse_skipped("B", children["B"])
            same_plans(children["A"].ready.get("shapes"), children["B"].ready.get("shapes"))
            got = interleave({n: c.send for n, c in children.items()}, sizes, warmup)
        finally:
            for c in children.values():
                c.close()
        pairs.append((got["A"], got["B"]))
    return pairs


def _refuse_skipped(name: str, child: Child) -> None:
    """Raise :class:`ScenarioSkipped` where ``child``'s runner skips the scenario."""
    if child.ready.get("skipped"):
        raise ScenarioSkipped(f"{name}: skipped on its runner: {child.ready['skipped']}")


def gate_exit(ratios: Sequence[Ratio], pct: float | None) -> int:
    if pct is None:
        return 0
    slower = gate(ratios, pct)
    for r in slower:
        err_console.print(f"gate: step {r.index} ({r.label}) is {r.ratio:.3f}x A "
                          f"[{r.low:.3f}, {r.high:.3f}]: slower than {1 + pct / 100:.3f}x beyond "
                          "the noise", soft_wrap=True)
    return GATE_FAILED if slower else 0


def describe(engine_args: list[str], env: dict[str, str], python: str | None) -> str:
    parts = [*(f"-e {e}" for e in engine_args), *(f"{k}={v}" for k, v in env.items())]
    if python:
        parts.append(f"python {python}")
    return " ".join(parts) or "as given"


def parse_env(pairs: Sequence[str]) -> tuple[dict[str, str], list[str]]:
    env, errors = {}, []
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not k:
            errors.append(f"--against-env {p!r}: expected VAR=VALUE")
        else:
            env[k] = v
    return env, errors


def check_python(python: str | None, env: dict[str, str] | None = None) -> list[str]:
    """``--against-python``: an executable Python that imports stepwarm and
    vLLM (probed with B's environment, ``env`` on top of this one's)."""
    if python is None:
        return []
    path = Path(python)
    if not (path.is_file() and os.access(path, os.X_OK)):
        return [f"--against-python {python}: not an executable file"]
    # found now, not after A's engine start (the second fresh trial: "the
    # child exited (1) before answering" 12 s in)
    probe = ("import importlib.util as u; print('stepwarm' if u.find_spec('stepwarm') and "
             "u.find_spec('vllm') else 'missing')")
    try:
        said = subprocess.run([str(path), "-c", probe], capture_output=True, text=True,
                              timeout=60, env={**os.environ, **(env or {})}).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        said = type(e).__name__
    if said == "missing":
        return [f"--against-python {python}: has no stepwarm or no vLLM to import; allowed: a "
                "Python with both installed (B runs `python -m stepwarm bench` there)"]
    if said != "stepwarm":
        return [f"--against-python {python}: does not run as Python (`{python} -c ...` "
                "printed nothing a Python would); allowed: a Python with stepwarm and vLLM"]
    return []
