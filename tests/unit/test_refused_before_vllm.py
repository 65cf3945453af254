"""Simple input errors are refused before vLLM is imported (half a second,
not the 7-16 s of importing it): ``coverage -s nosuch`` and ``scenario
from-record`` of a missing, empty or binary recording; exit status 2, the
error on stderr, and ``vllm`` not in ``sys.modules`` at the error."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepwarm.scenario import builtin_names

#: Runs the CLI in-process, then says whether vLLM was imported by then.
PROBE = ("import sys\nfrom stepwarm.cli import main\nsys.argv = ['stepwarm', *sys.argv[1:]]\n"
         "try:\n    main()\nexcept SystemExit as e:\n    code = e.code\n"
         "print('vllm imported:', 'vllm' in sys.modules, 'exit:', code)\n")


def probe(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "400"}
    return subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          env=env, timeout=120)


def test_coverage_refuses_an_unknown_scenario_before_vllm():
    r = probe("coverage", "-s", "nosuch")
    assert r.stdout == "vllm imported: False exit: 2\n"
    assert r.stderr == (
        "error: unknown scenario 'nosuch'; allowed: a path to a .toml file, a built-in name: "
        f"{', '.join(builtin_names())}, or a set: all\n")


@pytest.mark.parametrize("content, why", [
    (None, "cannot read: No such file or directory"),
    (b"", "empty; a recording starts with a header line written by STEPWARM_RECORD (was the "
          "engine stopped before its first step?)"),
    (b'{"a":1}\n\x00\x01', ":2: not a recording: binary data (a NUL byte); a recording is JSON "
                           "Lines written by STEPWARM_RECORD"),
])
def test_from_record_refuses_a_bad_file_before_vllm(tmp_path: Path, content, why):
    rec = tmp_path / "rec.jsonl"
    if content is not None:
        rec.write_bytes(content)
    r = probe("scenario", "from-record", str(rec), "-o", str(tmp_path / "x.toml"))
    assert r.stdout == "vllm imported: False exit: 2\n"
    sep = "" if why.startswith(":") else ": "
    assert r.stderr == f"error: {rec}{sep}{why}\n"
    assert not (tmp_path / "x.toml").exists()
