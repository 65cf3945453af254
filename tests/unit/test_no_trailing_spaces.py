"""No line of a command's piped output ends with a space (COLUMNS=80), and a
wrapped line goes on indented two spaces, as ``run``'s lines do."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stepwarm.line_ends import NoTrailingSpaces


def stepwarm(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "80"}
    return subprocess.run([sys.executable, "-m", "stepwarm", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def assert_no_trailing_space(text: str) -> None:
    assert [line for line in text.splitlines() if line.endswith(" ")] == []


def test_spaces_before_a_newline_are_dropped_across_writes():
    out = io.StringIO()
    s = NoTrailingSpaces(out)
    for part in ["a  ", "\n", "b ", "c   \n\n", "d ", " "]:
        assert s.write(part) == len(part)
    assert out.getvalue() == "a\nb c\n\nd"  # "d"'s spaces held: no newline or text yet
    s.write("e\n")
    assert out.getvalue() == "a\nb c\n\nd  e\n"


def test_check_all_wraps_a_skip_with_an_indent():
    r = stepwarm("check", "all")
    assert (r.returncode, r.stderr.count("Traceback")) == (0, 0), r.stderr
    assert_no_trailing_space(r.stdout)
    assert ("skipped sampler-spec-decode: needs speculator: runner has num_speculative_steps\n"
            "  0\n") in r.stdout
    assert ("skipped cross-attention: needs encoder_decoder: runner's model is not\n"
            "  encoder-decoder (is_encoder_decoder False, max_encoder_len 0)\n") in r.stdout
    assert "ok default: 8 steps, 10 requests\n" in r.stdout


def test_show_wraps_the_scenario_header_with_an_indent():
    r = stepwarm("show", "default")
    assert r.returncode == 0, r.stderr
    assert_no_trailing_space(r.stdout)
    assert r.stdout.splitlines()[3:6] == [
        "scenario default: 8 steps, 10 requests; blocks per KV cache group as g0/g1/...:",
        "  allocated from the pool, prefix-cache hits, null placeholders sent, held after",
        "  the step"]


def test_list_title_is_not_padded():
    r = stepwarm("list")
    assert r.returncode == 0, r.stderr
    assert_no_trailing_space(r.stdout)
    assert r.stdout.splitlines()[0] == "built-in scenarios"


@pytest.mark.parametrize("command, usage", [
    ([], "[OPTIONS] COMMAND [ARGS]..."),
    (["run"], "run [OPTIONS]"),
    (["check"], "check [OPTIONS] {FILE|NAME}..."),
    (["scenario", "from-record"], "scenario from-record [OPTIONS] {REC}"),
])
def test_help_lines_are_not_padded(command, usage):
    r = stepwarm(*command, "--help")
    assert (r.returncode, r.stderr) == (0, "")
    assert_no_trailing_space(r.stdout)
    assert r.stdout.splitlines()[:2] == ["", f" Usage: python -m stepwarm {usage}"]


def test_from_record_summary_wraps_with_an_indent(tmp_path: Path):
    from tests.unit.test_from_record import session

    rec, out = tmp_path / "rec.jsonl", tmp_path / "scenario-from-a-long-recording.toml"
    rec.write_text(session())
    r = stepwarm("scenario", "from-record", str(rec), "-o", str(out))
    assert (r.returncode, r.stderr) == (0, ""), r.stderr
    assert_no_trailing_space(r.stdout)
    lines = r.stdout.splitlines()
    assert len(lines) > 1 and all(line.startswith("  ") for line in lines[1:])
    assert " ".join(line.strip() for line in lines) == (
        f"wrote {out}: 7 recorded steps -> 12 scenario steps (12 kernel classes)")
