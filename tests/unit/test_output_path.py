"""Output paths (``--json``, ``--output``, ``--timeline``) that cannot be
written are refused before any engine starts, exit 2, one line on stderr
(issue 42 items 1 and 16)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.output_path import unwritable

runner = CliRunner()
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")


@linux
def test_why_a_path_cannot_be_written(tmp_path):
    assert unwritable(Path("/proc/stepwarm.json")) == (
        "cannot be written: no file can be made in /proc (No such file or directory)")
    assert unwritable(Path("/etc/passwd/x.json")) == "/etc/passwd is a file, not a directory"
    assert unwritable(Path("/etc/passwd/a/b/x.json")) == "/etc/passwd is a file, not a directory"
    assert unwritable(tmp_path / "no" / "x.json") == f"directory {tmp_path / 'no'} does not exist"
    assert unwritable(tmp_path) == "is a directory; allowed: a file path"
    assert unwritable(tmp_path / "new.json") is None
    existing = tmp_path / "old.json"
    existing.write_text("kept")
    assert unwritable(existing) is None
    assert existing.read_text() == "kept"  # opened to append, nothing written
    assert sorted(os.listdir(tmp_path)) == ["old.json"]  # the probe file is gone


@linux
@pytest.mark.parametrize("args, option, path, why", [
    (["run", "-s", "default", "--json"], "--json", "/proc/stepwarm.json",
     "cannot be written: no file can be made in /proc (No such file or directory)"),
    (["run", "-s", "default", "--json"], "--json", "/etc/passwd/x.json",
     "/etc/passwd is a file, not a directory"),
    (["profile", "-o"], "--output", "/proc/profile.json",
     "cannot be written: no file can be made in /proc (No such file or directory)"),
    (["coverage", "--timeline"], "--timeline", "/etc/passwd/t.svg",
     "/etc/passwd is a file, not a directory"),
])
def test_an_unwritable_output_is_refused_before_the_engine(args, option, path, why):
    r = runner.invoke(app, [*args, path], env={"COLUMNS": "300"})
    assert r.exit_code == 2, r.output
    assert r.stdout == ""  # no engine start line, nothing ran
    assert r.stderr == f"error: {option} {path}: {why}\n"
