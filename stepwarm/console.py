"""What the CLI prints: step rows as they run, tables, vLLM's log routing.

stdout carries stepwarm's own progress, tables and summary; vLLM's log goes to
stderr at WARNING by default, INFO with ``-v``, ERROR with ``-q``, while
stepwarm follows vLLM's INFO records to show the engine's start-up phases. On a terminal a scenario's table grows row by row while
it runs (``rich.live``); otherwise each step prints one line as soon as it
ran, so CI logs show progress too.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from stepwarm.driver import StepResult
from stepwarm.plan import Plan, PlannedStep

#: Tables are ~115 columns wide; when output is not a terminal (CI logs, nox),
#: rich would wrap them at 80. Markup is off: labels, file names and messages
#: ("NAME[i]", "[requests.a]") are printed as they are.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False,
                      width=None if sys.stderr.isatty() else 160)

#: -q, default, -v -> the level of vLLM's log on stderr.
VLLM_LOG_LEVELS = {-1: "ERROR", 0: "WARNING", 1: "INFO"}
#: vLLM log messages that start an engine start-up phase (substring, phase);
#: vLLM 0.26-0.32, V1 and V2 runners, CPU and GPU.
ENGINE_PHASES = (
    ("Starting to load model", "loading the model"),
    ("Initializing model took", "profiling memory"),
    ("Model loading took", "profiling memory"),
    ("KV cache size", "vLLM's own warmup"),
    ("Capturing CUDA graphs", "capturing CUDA graphs"),
    ("init engine (profile, create kv cache, warmup model) took", "engine ready"),
)


def route_vllm_log(verbosity: int, config_dir: str | None = None) -> str:
    """Send vLLM's log to stderr at the level for ``verbosity``, and let
    :class:`EnginePhases` see its start-up phases. Must run before vLLM is
    imported (vLLM reads its logging variables once).

    Unless the user gave vLLM a logging config (``VLLM_LOGGING_CONFIG_PATH``),
    stepwarm writes one: vLLM's loggers at INFO (or the user's
    ``VLLM_LOGGING_LEVEL`` if lower), a stderr handler at the level returned,
    and the phase handler at INFO.

    Args:
        verbosity: -1 (``-q``), 0 or 1 (``-v``).
        config_dir: where to write the config (default: a temporary directory).

    Returns:
        The stderr level: ERROR / WARNING / INFO for -q / default / -v; the
        user's ``VLLM_LOGGING_LEVEL`` when set and neither flag is given.
    """
    user = os.environ.get("VLLM_LOGGING_LEVEL", "").upper()
    level = user if user and not verbosity else VLLM_LOG_LEVELS[verbosity]
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    os.environ["VLLM_LOGGING_LEVEL"] = level
    if os.environ.get("VLLM_LOGGING_CONFIG_PATH"):
        return level
    import json
    import tempfile

    logger_level = level if logging.getLevelName(level) == logging.DEBUG else "INFO"
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"vllm": {"format": "(%(processName)s pid=%(process)d) %(levelname)s "
                                          "%(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                                "datefmt": "%m-%d %H:%M:%S"}},
        "handlers": {
            "vllm": {"class": "logging.StreamHandler", "formatter": "vllm",
                     "level": level, "stream": "ext://sys.stderr"},
            "stepwarm_phases": {"class": "stepwarm.console.EnginePhases", "level": "INFO"},
        },
        "loggers": {"vllm": {"handlers": ["vllm", "stepwarm_phases"], "level": logger_level,
                             "propagate": False}},
    }
    path = os.path.join(config_dir or tempfile.mkdtemp(prefix="stepwarm-log-"), "vllm-logging.json")
    with open(path, "w") as f:
        json.dump(config, f)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    return level


#: Where :class:`EnginePhases` handlers report phases (set by the CLI while an
#: engine starts; None: phases are ignored).
phase_listener: Callable[[str], None] | None = None


class EnginePhases(logging.Handler):
    """Follows vLLM's start-up log (logger ``vllm``) and reports each phase
    of :data:`ENGINE_PHASES` once, as it starts, to ``on_phase`` (default:
    the module's :data:`phase_listener`)."""

    def __init__(self, on_phase: Callable[[str], None] | None = None, level: int = logging.INFO):
        super().__init__(level)
        self.on_phase, self.seen = on_phase, set()

    def emit(self, record: logging.LogRecord) -> None:
        listener = self.on_phase or phase_listener
        if listener is None:
            return
        try:
            msg = record.getMessage()
        except Exception:  # noqa: BLE001 - a bad record is vLLM's to report
            return
        for key, phase in ENGINE_PHASES:
            if key in msg and phase not in self.seen:
                self.seen.add(phase)
                listener(phase)


COLUMNS = ("#", "kind", "step", "reqs", "tokens", "spec", "new blk", "sampled", "ms")


def step_row(s: StepResult, num_groups: int) -> list[str]:
    """One table row of a step that ran."""
    blocks = s.new_blocks or [0] * num_groups
    sampled = "-" if s.sampled is None else str(sum(1 for n in s.sampled.values() if n))
    return [str(s.index), s.kind, s.label, str(s.num_reqs), str(s.num_scheduled_tokens),
            str(s.num_spec_tokens), "/".join(map(str, blocks)), sampled, f"{s.wall_ms:.1f}"]


def failed_row(step: PlannedStep) -> list[str]:
    """The row of a step that raised (its numbers as planned, ``FAILED`` as time)."""
    return [str(step.index), step.kind, step.label, str(len(step.scheduled)),
            str(step.total_num_scheduled_tokens),
            str(sum(len(r.spec_token_ids) for r in step.scheduled)), "-", "-", "FAILED"]


def _table(title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for col in COLUMNS:
        table.add_column(col, justify="left" if col in ("kind", "step") else "right",
                         no_wrap=col in ("kind", "step"),
                         max_width=44 if col == "step" else None, overflow="ellipsis")
    return table


class ScenarioProgress:
    """Shows one scenario's steps as they run.

    Use as a context manager around :func:`stepwarm.driver.drive` and pass
    :meth:`step` as its ``on_step``. On a terminal: a table that grows row by
    row, titled with steps done / planned and elapsed seconds. Otherwise: a
    header line, then one line per step, ending with the seconds since the
    scenario started.
    """

    def __init__(self, plan: Plan, runner: str, num_groups: int, out: Console = console):
        self.plan, self.runner, self.num_groups, self.out = plan, runner, num_groups, out
        self.done = 0
        self.live: Live | None = None
        self.t0 = time.perf_counter()
        self.table = _table(self._title())

    def _title(self) -> str:
        return (f"scenario {self.plan.name} ({self.runner} runner): {self.done}/"
                f"{len(self.plan.steps)} steps, {time.perf_counter() - self.t0:.1f} s")

    def __enter__(self) -> ScenarioProgress:
        self.t0 = time.perf_counter()
        if self.out.is_terminal:
            self.live = Live(self.table, console=self.out, refresh_per_second=8)
            self.live.__enter__()
        else:
            self.out.print(f"scenario {self.plan.name} ({self.runner} runner): "
                           f"{len(self.plan.steps)} steps")
        return self

    def _add(self, row: list[str]) -> None:
        self.table.add_row(*row)
        if self.live is not None:
            self.table.title = self._title()
            self.live.refresh()
            return
        n = len(self.plan.steps)
        (idx, kind, label, reqs, tokens, spec, blocks, sampled, ms) = row
        self.out.print(
            f"  [{int(idx) + 1}/{n}] {kind:<20} {label[:40]:<40} reqs {reqs:>3}  tokens "
            f"{tokens:>5}  spec {spec:>3}  new blk {blocks:>5}  sampled {sampled:>3}  "
            + (ms if ms == "FAILED" else f"{ms} ms")
            + f"  (at {time.perf_counter() - self.t0:.1f} s)", soft_wrap=True)

    def step(self, result: StepResult) -> None:
        """A step ran (``drive``'s ``on_step``)."""
        self.done += 1
        self._add(step_row(result, self.num_groups))

    def failed(self, step: PlannedStep) -> None:
        """The step raised: its row, marked FAILED."""
        self._add(failed_row(step))

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.table.title = self._title()
            self.live.__exit__(*exc)


def verify_table(results: list[tuple[str, Any]]) -> Table:
    """The ``run --verify`` summary: one row per scenario (a
    :class:`~stepwarm.verify.VerifyReport`, or the error text when the
    comparison could not run) and one row per request whose tokens differ
    from vLLM's scheduler, at the first step where they diverge."""
    table = Table(title="--verify: stepwarm's steps vs vLLM's own scheduler (greedy)",
                  title_justify="left")
    for col in ("scenario", "result", "request", "first differing step", "position",
                "stepwarm sampled", "vLLM sampled"):
        table.add_column(col)
    for name, rep in results:
        if isinstance(rep, str):
            table.add_row(name, "error", "", rep, "", "", "", style="red")
            continue
        if rep.skipped:
            table.add_row(name, "skipped", "", rep.skipped, "", "", "")
            continue
        if rep.embedding_error:
            worst = max(rep.embedding_error.values())
            table.add_row(name, "equal" if rep.ok else "DIFFER",
                          f"{len(rep.embedding_error)} embedded",
                          "" if rep.ok else ", ".join(rep.embedding_differs),
                          "", f"max |diff| {worst:.2e}", "LLM.embed",
                          style=None if rep.ok else "red")
            continue
        tokens = sum(rep.checked.values())
        table.add_row(name, "equal" if rep.ok else "DIFFER",
                      f"{len(rep.checked)} requests, {tokens} tokens", "", "", "", "",
                      style=None if rep.ok else "red")
        for d in rep.differences:
            table.add_row("", "", d.request, f"{d.step} ({d.step_kind}: {d.step_label})",
                          str(d.position), str(list(d.stepwarm)), str(list(d.reference)),
                          style="red")
        if getattr(rep, "not_compared", None):
            whys = sorted(set(rep.not_compared.values()))
            table.add_row("", "not compared", ", ".join(sorted(rep.not_compared)),
                          "; ".join(whys), "", "", "")
    return table


def block_tables_view(title: str, steps: list[Any]) -> Table:
    """``show --tables``: one row per step, scheduled request and KV cache
    group (:func:`stepwarm.tables.step_blocks`), block ids with runs
    shortened (``5-7``); a step that schedules nothing is one row."""
    from stepwarm.tables import id_ranges

    table = Table(title=title, title_justify="left")
    for col in ("#", "kind", "request", "row", "g", "block table (runner)", "hit (prefix cache)",
                "allocated (pool)", "null", "zeroed"):
        table.add_column(col, justify="right" if col in ("#", "g", "null") else "left",
                         overflow="fold")
    for st in steps:
        if not st.requests:
            table.add_row(str(st.index), st.kind, "-", "", "", "", "", "", "", "")
        for i, req in enumerate(st.requests):
            for g in req.groups:
                first = i == 0 and g.group == 0
                table.add_row(str(st.index) if first else "", st.kind if first else "",
                              req.request if g.group == 0 else "", req.row if g.group == 0 else "",
                              str(g.group), id_ranges(g.table), id_ranges(g.hit),
                              id_ranges(g.allocated), str(len(g.null)), id_ranges(g.zeroed))
    return table
