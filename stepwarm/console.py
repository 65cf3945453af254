"""What the CLI prints: step rows as they run, tables, vLLM's log routing.

stdout carries stepwarm's own progress, tables and summary; vLLM's log goes to
stderr (``VLLM_LOGGING_STREAM``) at WARNING by default, INFO with ``-v``,
ERROR with ``-q``. On a terminal a scenario's table grows row by row while
it runs (``rich.live``); otherwise each step prints one line as soon as it
ran, so CI logs show progress too.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stepwarm.driver import RunReport, StepResult
from stepwarm.plan import Plan, PlannedStep

#: Tables are ~115 columns wide; when output is not a terminal (CI logs, nox),
#: rich would wrap them at 80. Markup is off: labels, file names and messages
#: ("NAME[i]", "[requests.a]") are printed as they are.
console = Console(width=None if sys.stdout.isatty() else 160, markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False,
                      width=None if sys.stderr.isatty() else 160)

#: -q, default, -v -> vLLM's log level.
VLLM_LOG_LEVELS = {-1: "ERROR", 0: "WARNING", 1: "INFO"}


def route_vllm_log(verbosity: int) -> None:
    """Send vLLM's log to stderr at the level for ``verbosity`` (-1 quiet,
    0 default, 1 verbose). Must run before vLLM is imported (vLLM reads
    ``VLLM_LOGGING_STREAM`` / ``VLLM_LOGGING_LEVEL`` once). A level the user
    set in the environment is kept unless ``-v``/``-q`` is given."""
    os.environ["VLLM_LOGGING_STREAM"] = "ext://sys.stderr"
    if verbosity:
        os.environ["VLLM_LOGGING_LEVEL"] = VLLM_LOG_LEVELS[verbosity]
    else:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", VLLM_LOG_LEVELS[0])


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


def step_table(report: RunReport, num_groups: int) -> Table:
    """A rich table of a finished run: one row per step."""
    table = _table(f"scenario {report.plan} ({report.runner} runner)")
    for s in report.steps:
        table.add_row(*step_row(s, num_groups))
    return table


class ScenarioProgress:
    """Shows one scenario's steps as they run.

    Use as a context manager around :func:`stepwarm.driver.drive` and pass
    :meth:`step` as its ``on_step``. On a terminal: a table that grows row by
    row, titled with steps done / planned and elapsed seconds. Otherwise: a
    header line, then one line per step.
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
            + (ms if ms == "FAILED" else f"{ms} ms"), soft_wrap=True)

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


def error(message: str) -> None:
    """``error: MESSAGE`` on stderr, as plain text."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
