"""Baseline and stepwarm, each in its own process, then each restarted.

A kernel compiled once stays in the process's memory (Triton's in-memory
kernel cache, torch.compile's code cache) whatever the cache directories, so
the engines of ``stepwarm coverage --compare`` never share a process: each is
``python -m stepwarm coverage ... --json FILE --cache-dir DIR`` with fresh
caches. The restarts (``--no-restart``: none) are the same command on the
directory its fresh run filled (``--warm-cache``): a restart on a cache volume.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from stepwarm.coverage.report import CoverageReport


#: Options of the parent's command line that the children do not get: the
#: parent compares, writes the JSON / timeline of every run itself, and gives
#: each child its own cache directory.
PARENT_FLAGS = ("--compare", "--no-restart")
PARENT_VALUED = ("--json", "--timeline", "--cache-dir")

#: The runs, in the order they run: name, baseline?, the cache directory
#: (under the parent's), warm (a restart on the caches the fresh run of the
#: same directory filled)?
RUNS = (("baseline", True, "baseline", False), ("baseline_restart", True, "baseline", True),
        ("stepwarm", False, "stepwarm", False), ("stepwarm_restart", False, "stepwarm", True))


#: The scenario options, which a baseline child does not get (it runs none).
SCENARIO_OPTIONS = ("--scenario", "-s")


def child_args(args: list[str], baseline: bool = False) -> list[str]:
    """The ``coverage`` arguments a child run gets: ``args`` without
    :data:`PARENT_FLAGS` and :data:`PARENT_VALUED` options (and the values of
    those, as ``--json OUT`` or ``--json=OUT``); for a ``baseline`` child,
    without :data:`SCENARIO_OPTIONS` either."""
    dropped = PARENT_VALUED + (SCENARIO_OPTIONS if baseline else ())
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in PARENT_FLAGS:
            pass
        elif a in dropped:
            skip = True
        elif baseline and a.startswith("-s") and not a.startswith("--"):
            pass  # -sNAME
        elif not any(a.startswith(f"{opt}=") for opt in dropped if opt.startswith("--")):
            out.append(a)
    return out


def run_child(args: list[str], baseline: bool, json_out: Path, cache_dir: Path,
              warm: bool = False) -> int:
    """``python -m stepwarm coverage ARGS [--baseline] --cache-dir DIR
    [--warm-cache] --json JSON_OUT``; its output goes to this process's
    stdout/stderr. Returns its exit status."""
    cmd = [sys.executable, "-m", "stepwarm", "coverage", *child_args(args, baseline),
           "--json", str(json_out), "--cache-dir", str(cache_dir)]
    if baseline:
        cmd.append("--baseline")
    if warm:
        cmd.append("--warm-cache")
    return subprocess.run(cmd, check=False).returncode


def run_all(args: list[str], restart: bool = True, cache_root: Path | None = None,
            ) -> dict[str, tuple[int, CoverageReport | None]]:
    """Run the baseline, its restart, stepwarm, its restart (:data:`RUNS`;
    the restarts only with ``restart``), each in its own process
    (:func:`run_child`). A restart runs only where its fresh run wrote a report.

    Args:
        args: :func:`child_args`.
        cache_root: where each run's cache directory goes (``baseline/``,
            ``stepwarm/``, kept); default: a temporary directory, removed.

    Returns:
        ``name -> (status, report)`` per run that ran; a report is None when
        its run ended before writing one (status 2).
    """
    out: dict[str, tuple[int, CoverageReport | None]] = {}
    with tempfile.TemporaryDirectory(prefix="stepwarm-compare-") as d:
        caches = Path(d) if cache_root is None else cache_root
        for name, baseline, cache, warm in RUNS:
            if warm and (not restart or out.get(cache, (0, None))[1] is None):
                continue
            path = Path(d) / f"{name}.json"
            code = run_child(args, baseline, path, caches / cache, warm)
            out[name] = (code, CoverageReport.load(path) if path.is_file() else None)
    return out
