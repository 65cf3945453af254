"""A new user's trial of main (issue 42, third round): what the CLI says,
its exit status and stream, for the paths the trial found wrong."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app

runner = CliRunner()
ENV = {"COLUMNS": "300"}


@pytest.mark.parametrize("command", [["run"], ["check", "default"], ["show", "default"],
                                     ["coverage"], ["bench", "default"],
                                     ["profile", "-o", "p.json"]])
def test_verbose_and_quiet_together_are_refused_before_anything_runs(command):
    r = runner.invoke(app, [*command, "-v", "-q"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: -v (--verbose) and -q (--quiet) contradict each other; "
                        "allowed: one of them, or neither\n")


def test_bench_names_every_bad_count_at_once():
    r = runner.invoke(app, ["bench", "default", "--repeat", "-1", "--warmup", "-3",
                            "--rounds", "0"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --repeat -1: allowed: a whole number from 1 to 100000\n"
                        "error: --warmup -3: allowed: a whole number from 0 to 100000\n"
                        "error: --rounds 0: allowed: a whole number from 1 to 1000\n")


def test_list_says_in_words_what_each_scenario_needs():
    """``default`` needs ``spec_top_k_top_p``: met by every runner without a
    speculator; with one, a sampler that takes top-k / top-p beside drafts."""
    import os
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "stepwarm", "list"], capture_output=True,
                       text=True, timeout=120, env={**os.environ, "COLUMNS": "300"})
    assert (r.returncode, r.stderr) == (0, "")
    rows = {cells[0]: cells[1:] for line in r.stdout.splitlines()
            if len(cells := [c.strip() for c in line.strip("│").split("│")]) == 3}
    assert rows["default"][0] == ("no speculator, or top-k / top-p sampling beside drafts "
                                  "(not on vLLM's CPU build)")
    assert rows["sampler-spec-matrix"][0] == (
        "a speculator (speculative_config); top-k / top-p sampling beside drafts "
        "(not on vLLM's CPU build)")
    assert rows["spec-decode"][0] == "a speculator (speculative_config)"
    assert rows["chunked-prefill"][0] == "-"
    assert "spec_top_k_top_p" not in r.stdout


@pytest.mark.parametrize("width", [60, 80, 160, 300])
def test_no_line_of_show_tables_ends_with_a_space(monkeypatch, width):
    """``show --tables`` of every built-in scenario at 60, 80, 160 (piped)
    and 300 columns: no line ends with a space (rich padded the tables'
    titles to the table's width)."""
    from rich.console import Console

    from stepwarm import cli
    from stepwarm import console as console_module
    from stepwarm.scenario import builtin_names, plans_for, tiny_profile

    out = Console(width=width, markup=False, highlight=False)
    monkeypatch.setattr(cli, "console", out)
    monkeypatch.setattr(console_module, "console", out)
    shown = 0
    for name in builtin_names():
        r = runner.invoke(app, ["show", name, "--tables"], env={"COLUMNS": str(width)})
        assert (r.exit_code, r.stderr) == (0, ""), (name, r.stderr)
        lines = r.stdout.splitlines()
        assert [ln for ln in lines if ln.endswith(" ")] == [], name
        assert max(map(len, lines)) <= width, name
        shown += "block ids per step" in r.stdout
    # every scenario the tiny Llama's profile runs printed its block tables (the rest: skipped)
    assert shown == sum(not p.skipped for p in plans_for(builtin_names(), tiny_profile())) == 8
