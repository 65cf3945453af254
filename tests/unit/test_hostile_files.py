"""Input and output files a hostile or careless user gives (issue 42's fourth
trial): a FIFO nobody writes to is refused at once, not waited on forever; a
report is written whole or not at all; a full standard output is one line,
not a traceback."""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.files import read_text_capped
from stepwarm.output_path import write_atomic

runner = CliRunner()
ENV = {"COLUMNS": "300"}
FIFO = "a FIFO that nobody writes to; allowed: a file, or a pipe being written"


@pytest.fixture
def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "f.toml"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize(("args", "what"), [
    (["check", "{}"], "cannot read scenario file"),
    (["show", "{}"], "cannot read scenario file"),
    (["check", "default", "--profile", "{}"], "cannot read profile"),
    (["scenario", "from-record", "{}", "-o", "out.toml"], "cannot read"),
])
def test_a_fifo_nobody_writes_to_is_refused_at_once(fifo, args, what):
    r = runner.invoke(app, [a.replace("{}", str(fifo)) for a in args], env=ENV)
    assert r.exit_code == 2
    assert f"error: {fifo}: {what}: {FIFO}\n" in r.stderr


def test_a_fifo_as_a_traffic_file_is_refused_at_once(fifo):
    from stepwarm.coverage.traffic import TrafficError, read_traffic

    with pytest.raises(TrafficError) as e:
        read_traffic(fifo)
    assert str(e.value) == f"{fifo}: cannot read: {FIFO}"


def test_a_pipe_being_written_is_read_to_its_end(tmp_path):
    """``stepwarm check <(generate)`` and ``cat x | ... /dev/stdin``: a pipe
    with a writer is read whole."""
    script = ("from pathlib import Path; from stepwarm.files import read_text_capped; "
              "print(len(read_text_capped(Path('/dev/stdin'), 1 << 20)))")
    r = subprocess.run([sys.executable, "-c", script], input="x" * 70000, text=True,
                       capture_output=True, timeout=60)
    assert (r.returncode, r.stdout) == (0, "70000\n")


def test_a_directory_or_socket_is_refused_by_its_type(tmp_path):
    import socket

    sock = tmp_path / "s"
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    try:
        with pytest.raises(OSError) as e:
            read_text_capped(sock, 100)
        assert e.value.errno in (errno.EINVAL, errno.ENXIO, errno.EOPNOTSUPP)
    finally:
        s.close()
    with pytest.raises(IsADirectoryError):
        read_text_capped(tmp_path, 100)


def _small_tmpfs(tmp_path: Path) -> Path:
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4k", "none", str(mnt)],
                       capture_output=True)
    if r.returncode:
        pytest.skip("cannot mount a small tmpfs here (not root)")
    return mnt


def test_a_report_that_does_not_fit_leaves_no_cut_file(tmp_path):
    mnt = _small_tmpfs(tmp_path)
    try:
        target = mnt / "r.json"
        with pytest.raises(OSError) as e:
            write_atomic(target, "x" * 20000)
        assert e.value.errno == errno.ENOSPC
        assert os.listdir(mnt) == []  # neither the report nor the temporary file
        write_atomic(target, '{"old": 1}\n')  # an earlier report stays whole
        with pytest.raises(OSError):
            write_atomic(target, "y" * 20000)
        assert (os.listdir(mnt), target.read_text()) == (["r.json"], '{"old": 1}\n')
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_report_keeps_the_mode_of_the_file_it_replaces(tmp_path):
    target = tmp_path / "r.json"
    target.write_text("old\n")
    target.chmod(0o640)
    write_atomic(target, "new\n")
    assert (target.read_text(), target.stat().st_mode & 0o777) == ("new\n", 0o640)
    assert sorted(os.listdir(tmp_path)) == ["r.json"]


@pytest.mark.parametrize("command", [["schema"], ["show", "default"], ["list"]])
def test_a_full_standard_output_is_one_line_not_a_traceback(command):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "stepwarm", *command], stdout=full,
                           stderr=subprocess.PIPE, text=True, timeout=120,
                           env={**os.environ, **ENV})
    assert (r.returncode, r.stderr) == (
        1, "error: cannot write to standard output: No space left on device\n")


def test_a_coverage_report_that_cannot_be_written_after_the_run_is_exit_1(tmp_path, capsys):
    """The paths are checked before the run; a disk that fills during it
    leaves the report unwritten: exit 1, as run's and bench's (2 says nothing
    ran), naming the option and saying the run finished (issue 42)."""
    import typer

    from stepwarm import cli
    from stepwarm.output_path import write_atomic

    class Report:  # what _write_outputs reads of a CoverageReport: save
        def save(self, path: Path) -> None:
            write_atomic(path, "x" * 20000)

    mnt = _small_tmpfs(tmp_path)
    try:
        with pytest.raises(typer.Exit) as e:
            cli._write_outputs(Report(), mnt / "cov.json", None)
        assert e.value.exit_code == 1 and os.listdir(mnt) == []
        err = " ".join(capsys.readouterr().err.split())
        assert err == (f"error: --json {mnt}/cov.json: cannot write the report: No space left on "
                       "device (the coverage run finished, as above; no report file was left)")
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_a_report_at_a_link_is_written_through_it_and_the_link_kept(tmp_path):
    """Fresh trial (issue 42), defect 1: a link's target was never made and
    the link became a file."""
    target = tmp_path / "target.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new\n"
    write_atomic(link, "newer\n")  # the target now exists: replaced, the link kept
    assert link.is_symlink() and target.read_text() == "newer\n"


def test_a_link_into_a_missing_directory_is_refused_naming_the_option(tmp_path):
    from stepwarm.output_path import typed_path, unwritable

    link = tmp_path / "dangling.toml"
    link.symlink_to(tmp_path / "no" / "x.toml")
    assert unwritable(typed_path(str(link))) == (
        f"is a symbolic link to {tmp_path / 'no' / 'x.toml'}, whose directory does not exist (or "
        "a loop); allowed: a file path, or a link to one in an existing directory")
    fine = tmp_path / "fine.json"
    fine.symlink_to(tmp_path / "target.json")  # a target not made yet, in a directory that is
    assert unwritable(typed_path(str(fine))) is None


def test_a_report_to_dev_stdout_redirected_to_a_file_is_appended_there(tmp_path):
    """Fresh trial, defect 1: ``--json /dev/stdout > file`` replaced the
    machine's /dev/stdout link with a file and the report never reached the
    redirect. Now /dev/stdout is written where it points, after what the
    process printed, and stays a link."""
    out = tmp_path / "out.txt"
    code = ("import sys; from pathlib import Path; from stepwarm.output_path import write_atomic;"
            "print('table', flush=True); write_atomic(Path('/dev/stdout'), '{\"a\": 1}\\n')")
    with open(out, "w") as f:
        subprocess.run([sys.executable, "-c", code], stdout=f, check=True, timeout=60)
    assert out.read_text() == 'table\n{"a": 1}\n'
    assert os.path.islink("/dev/stdout")


def test_a_named_pipe_or_a_dash_is_refused_before_any_work(tmp_path):
    """Fresh trial, defects 3 and 15: a FIFO hung the check (its open waits
    for a reader); ``--json -`` made a file named '-'."""
    from stepwarm.output_path import typed_path, unwritable

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    assert unwritable(typed_path(str(fifo))) == (
        f"is a named pipe (FIFO {fifo}), not a file; allowed: a regular file's path")
    assert unwritable(typed_path("-")) == (
        "would be a file named '-' (a report is not written to standard output this way); "
        "allowed: a file path, or /dev/stdout")
    r = subprocess.run([sys.executable, "-m", "stepwarm", "run", "--json", str(fifo)],
                       capture_output=True, text=True, timeout=60, env={**os.environ, **ENV})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == (f"error: --json {fifo}: is a named pipe (FIFO {fifo}), not a file; "
                        "allowed: a regular file's path\n")


def test_a_recording_to_a_fifo_with_no_reader_stops_with_one_line(tmp_path, caplog):
    """Fresh trial, defect 2: ``STEPWARM_RECORD`` at a FIFO blocked the
    engine core's first step forever (a blocking open waits for a reader).
    Opened without blocking: one warning, recording stops, the step goes on."""
    import logging

    from stepwarm.record import Recorder

    fifo = tmp_path / "rec.fifo"
    os.mkfifo(fifo)
    rec = Recorder(str(fifo), 1 << 20, {"stepwarm_record": 1}, 16)
    with caplog.at_level(logging.WARNING, logger="stepwarm"):
        rec.write({"step": 1})
    assert rec.stopped and rec.fd is None
    assert [r.getMessage() for r in caplog.records] == [
        f"stepwarm: STEPWARM_RECORD {fifo}: cannot write (OSError: [Errno 6] No such device or "
        f"address: '{fifo}'); recording stopped, serving goes on"]


def test_a_scenario_link_that_leads_nowhere_is_named_as_one(tmp_path):
    """Fresh trial (issue 42): a symlink loop was "no such file"."""
    from stepwarm.scenario import ScenarioError, load

    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.symlink_to(b)
    b.symlink_to(a)
    with pytest.raises(ScenarioError) as e:
        load(str(a))
    assert str(e.value).startswith(f"{a}: cannot read scenario file: a symbolic link that leads "
                                   "to no file (a loop, or its target is missing); allowed: ")


@pytest.mark.parametrize("command", [["run", "-s", "default"], ["run", "--model", "tiny-gemma3"],
                                     ["run", "--weights", "seeded:3"], ["coverage"], ["profile"]])
def test_a_report_into_the_zoo_models_directory_is_refused(tmp_path, monkeypatch, command):
    """Second fresh trial (issue 42): ``run --json .../tiny-llama/config.json``
    replaced the default model's config with the report (``--model DIR`` was
    refused, the default and zoo names were not)."""
    monkeypatch.setenv("STEPWARM_CACHE", str(tmp_path))
    name = (command[2] if command[1:2] == ["--model"] else
            "tiny-llama-seed3" if command[1:2] == ["--weights"] else "tiny-llama")
    target = tmp_path / name / "config.json"
    option = "-o" if command == ["profile"] else "--json"
    shown = "--output" if option == "-o" else "--json"
    r = CliRunner().invoke(app, [*command, option, str(target)], env={"COLUMNS": "400"})
    assert r.exit_code == 2, r.stderr
    assert (f"error: {shown} {target}: it is in the zoo model's directory {tmp_path / name}, "
            "whose files stepwarm writes for vLLM to load; ") in r.stderr
    # the model's own config, if written already (a model check writes it), never the report
    import json

    assert not target.exists() or "model_type" in json.loads(target.read_text())


def test_checking_a_stream_or_device_output_makes_no_file_beside_it(monkeypatch):
    """The third trial (issue 42): ``--json /dev/stdout`` made and removed a
    probe file in /dev."""
    import tempfile

    from stepwarm.output_path import typed_path, unwritable

    made = []
    real = tempfile.mkstemp
    monkeypatch.setattr(tempfile, "mkstemp", lambda *a, **k: made.append(k.get("dir"))
                        or real(*a, **k))
    for path in ("/dev/stdout", "/dev/null", "/proc/self/fd/1"):
        assert unwritable(typed_path(path)) is None
    assert unwritable(typed_path("/dev/full")).startswith("is a device (/dev/full)")
    assert made == []
