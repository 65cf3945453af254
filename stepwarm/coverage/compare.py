"""Baseline and stepwarm, each in its own process.

A kernel compiled once stays in the process's memory (Triton's in-memory
kernel cache, torch.compile's code cache) whatever the cache directories, so
the two engines of ``stepwarm coverage --compare`` never share a process:
each is ``python -m stepwarm coverage ... --json FILE`` with fresh caches.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from stepwarm.coverage.report import CoverageReport


#: Options of the parent's command line that the children do not get: the
#: parent compares, and writes the JSON / timeline of both runs itself.
PARENT_ONLY = ("--compare", "--json", "--timeline")


def child_args(args: list[str]) -> list[str]:
    """The ``coverage`` arguments a child run gets: ``args`` without
    :data:`PARENT_ONLY` options (and the values of those that take one, as
    ``--json OUT`` or ``--json=OUT``)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in PARENT_ONLY:
            skip = a != "--compare"
        elif not any(a.startswith(f"{opt}=") for opt in PARENT_ONLY):
            out.append(a)
    return out


def run_child(args: list[str], baseline: bool, json_out: Path) -> int:
    """``python -m stepwarm coverage ARGS [--baseline] --json JSON_OUT``;
    its output goes to this process's stdout/stderr. Returns its exit status."""
    cmd = [sys.executable, "-m", "stepwarm", "coverage", *args, "--json", str(json_out)]
    if baseline:
        cmd.append("--baseline")
    return subprocess.run(cmd, check=False).returncode


def run_both(args: list[str]) -> tuple[tuple[int, CoverageReport | None],
                                         tuple[int, CoverageReport | None]]:
    """Run the baseline, then stepwarm (:func:`run_child`).

    Returns:
        ``((status, report), (status, report))`` for baseline and stepwarm;
        a report is None when its run ended before writing one (status 2).
    """
    out = []
    with tempfile.TemporaryDirectory(prefix="stepwarm-compare-") as d:
        for baseline in (True, False):
            path = Path(d) / ("baseline.json" if baseline else "stepwarm.json")
            code = run_child(args, baseline, path)
            out.append((code, CoverageReport.load(path) if path.is_file() else None))
    return out[0], out[1]
