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
