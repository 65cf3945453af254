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
from stepwarm.output_path import typed_path, unwritable

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


@linux
def test_a_device_and_an_empty_value_are_named(tmp_path):
    assert unwritable(Path("/dev/full")) == (
        "is a device (/dev/full), not a file; allowed: a file path")
    assert unwritable(Path("/dev/null")) is None
    assert unwritable(Path("")) == "is the current directory; allowed: a file path"
    assert unwritable(typed_path("")) == "is empty; allowed: a file path"
    assert unwritable(typed_path(f"{tmp_path}/r.json/")) == (
        "ends in '/', naming a directory; allowed: a file path")
    assert unwritable(typed_path(f"{tmp_path}/")) == "is a directory; allowed: a file path"
    assert unwritable(typed_path(f"{tmp_path}/r.json")) is None


def test_clashes_name_each_pair_once(tmp_path):
    from stepwarm.output_path import clashes

    scenario = tmp_path / "my.toml"
    scenario.write_text("")
    out = tmp_path / "out"
    assert clashes([("--json", out), ("--csv", tmp_path / "." / "out"), ("--plot", None)],
                   [("scenario file", "default")]) == [
        f"--csv {tmp_path}/out: the same file as --json {out}; the second would replace the "
        "first: allowed: another file"]
    assert clashes([("--json", scenario)], [("scenario file", str(scenario))]) == [
        f"--json {scenario}: it is the scenario file {scenario}, which the report would "
        "replace; allowed: another file"]
    assert clashes([("--json", Path("/dev/null")), ("--csv", Path("/dev/null"))]) == []


@pytest.mark.parametrize("args", [
    ["run", "-s", "{s}", "--json", "{s}"],
    ["bench", "{s}", "--json", "{o}", "--csv", "{o}"],
    ["scenario", "from-record", "{s}", "-o", "{s}"],
    ["coverage", "{s}", "--json", "{s}"],
])
def test_an_output_that_would_replace_an_input_or_another_output_is_refused(tmp_path, args):
    """Before any engine (CliRunner: in-process, no vLLM engine starts), exit
    2, the file untouched (a new user's scenario file was replaced by the
    report)."""
    scenario = tmp_path / "s.toml"
    scenario.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\n'
                        'requests = ["a"]\n')
    argv = [a.format(s=scenario, o=tmp_path / "same.out") for a in args]
    r = runner.invoke(app, argv, env={"COLUMNS": "200"})
    assert r.exit_code == 2, r.output
    assert "would replace" in " ".join(r.stderr.split()) and r.stdout == ""
    assert scenario.read_text().startswith("[requests.a]")
    assert not (tmp_path / "same.out").exists()
