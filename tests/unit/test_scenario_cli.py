"""The scenario commands of the CLI: list, check, show, schema (no engine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.scenario import builtin_names
from tests.helpers import make_profile

runner = CliRunner()


def test_list():
    r = runner.invoke(app, ["list"], env={"COLUMNS": "200"})
    assert r.exit_code == 0
    for name in builtin_names():
        assert name in r.stdout


def test_check_builtins_ok():
    r = runner.invoke(app, ["check", *builtin_names()], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "skipped spec-decode: needs speculator" in r.stdout
    assert "ok default:" in r.stdout


def test_check_bad_file_exit_2(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "decode"\nrequests = ["a"]\n')
    r = runner.invoke(app, ["check", str(f), "default"], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert "bad.toml:5: step 0 (decode), field 'requests'" in r.stderr
    assert "never prefilled" in r.stderr and "Traceback" not in r.output
    assert "ok default" in r.stdout


def test_check_against_saved_profile(tmp_path):
    prof = make_profile(num_blocks=100, max_model_len=64, max_num_seqs=2,
                        max_num_batched_tokens=64, vocab_size=10, num_speculative_steps=1,
                        decode_query_len=2)
    p = tmp_path / "p.json"
    prof.save(p)
    r = runner.invoke(app, ["check", "spec-decode", "--profile", str(p)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert "ok spec-decode" in r.stdout


def test_check_bad_profile_exit_2(tmp_path):
    p = tmp_path / "p.json"
    p.write_text("{")
    r = runner.invoke(app, ["check", "default", "--profile", str(p)])
    # the line wraps at 80 columns where the temporary path is long: read it unwrapped
    assert r.exit_code == 2 and f"{p}:1: not JSON" in " ".join(r.stderr.split())


def test_show():
    r = runner.invoke(app, ["show", "preempt-resume"], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    assert "preempt: a" in r.stdout and "resume" in r.stdout


def test_show_unknown_exit_2():
    r = runner.invoke(app, ["show", "nope"])
    assert r.exit_code == 2 and "unknown scenario 'nope'" in r.stderr


def test_schema():
    r = runner.invoke(app, ["schema"])
    assert r.exit_code == 0
    assert json.loads(r.stdout)["title"] == "stepwarm scenario"


def test_profile_line_wraps_at_columns_when_not_a_terminal():
    """Piped, the ``profile:`` line wraps at ``COLUMNS`` (80 where unset) as
    run's own lines do, continuation lines indented two spaces."""
    r = runner.invoke(app, ["check", "default"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[:3] == [
        "profile: /tmp/stepwarm-models/tiny-llama (v1 runner): max_num_seqs 8,",
        "  max_num_batched_tokens 512, max_model_len 512, num_spec_steps 0, 15154 blocks,",
        "  groups: full_attention(block_size=128)"]


def test_show_refuses_a_set_exit_2():
    r = runner.invoke(app, ["show", "all"], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert f"show takes one scenario; 'all' is a set of {len(builtin_names())}" in r.stderr
    assert "stepwarm check all" in r.stderr and r.stdout == ""


def test_bench_refuses_a_set_exit_2_with_the_options_errors():
    """A first-contact trial: `bench all` said "unknown scenario 'all'; allowed:
    ... or a set: all"."""
    r = runner.invoke(app, ["bench", "all", "--repeat", "0"], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert f"bench takes one scenario; 'all' is a set of {len(builtin_names())}" in r.stderr
    assert "--repeat 0" in r.stderr and "unknown scenario" not in r.stderr


def test_check_reads_a_file_with_a_bom(tmp_path):
    f = tmp_path / "bom.toml"
    f.write_bytes("\ufeff".encode() + b'[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    r = runner.invoke(app, ["check", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert f"ok {f}: 2 steps, 1 request\n" in r.stdout


def test_model_errors_name_a_file_and_the_close_zoo_name(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = runner.invoke(app, ["show", "default", "--model", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and f"--model {f}: is a file; allowed: a model directory" in r.stderr
    r = runner.invoke(app, ["show", "default", "--model", "tiny-lama"], env={"COLUMNS": "300"})
    assert r.exit_code == 2
    assert "--model tiny-lama: no such directory, nor a zoo model (did you mean 'tiny-llama'?)" \
        in r.stderr


def test_coverage_options_are_checked_before_anything_starts(tmp_path):
    f = tmp_path / "afile"
    f.write_text("x")
    r = runner.invoke(app, ["coverage", "--cache-dir", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and f"--cache-dir {f}: is a file" in r.stderr
    r = runner.invoke(app, ["coverage", "--threshold", "-1"])
    assert r.exit_code == 2 and "--threshold -1: allowed: a number >= 0" in r.stderr
    r = runner.invoke(app, ["coverage", "--min-excess-ms", "-5"])
    assert r.exit_code == 2 and "--min-excess-ms -5: allowed: a number >= 0" in r.stderr
    assert "starting vLLM engine" not in r.stdout


def test_coverage_says_every_bad_option_at_once(tmp_path):
    """An unwritable --json, --baseline beside --compare, a bad threshold,
    a junk traffic file and a bad -e: every error in one message, exit 2,
    nothing started (issue 42, eighth trial)."""
    traffic = tmp_path / "t.jsonl"
    traffic.write_text('{"promt": 3}\n')
    r = runner.invoke(app, ["coverage", "--baseline", "--compare", "--json",
                            "/proc/stepwarm.json", "--threshold", "-1", str(traffic),
                            "-e", "max_num_seqs=0"],
                      env={"COLUMNS": "300"})
    assert (r.exit_code, r.stdout) == (2, "")
    lines = r.stderr.splitlines()
    assert lines[:3] == ["error: give --baseline or --compare, not both",
                         "error: --threshold -1: allowed: a number >= 0",
                         "error: --json /proc/stepwarm.json: cannot be written: no file can be "
                         "made in /proc (No such file or directory)"], lines
    assert lines[3].startswith(f"error: {traffic}:1: promt: unknown field"), lines
    assert lines[4:] == ["error: -e max_num_seqs=0: vLLM's SchedulerConfig.max_num_seqs takes "
                         "at least 1"], lines


def test_coverage_refuses_a_json_report_over_its_scenario_file(tmp_path):
    """The ninth trial: ``coverage -s FILE --json FILE`` replaced the user's
    scenario with the JSON report (run and bench refused it already)."""
    f = tmp_path / "copy.toml"
    text = (Path(__file__).parents[2] / "scenarios" / "prefix-hit.toml").read_text()
    f.write_text(text)
    r = runner.invoke(app, ["coverage", "-s", str(f), "--json", str(f)],
                      env={"COLUMNS": "300"})
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"error: --json {f}: it is the scenario file {f}, which the report "
                        "would replace; allowed: another file\n")
    assert f.read_text() == text


def test_run_a_named_scenario_the_engine_args_cannot_run_exits_3_before_the_engine():
    """spec-decode needs a speculator, and no speculative_config was given:
    said before any engine starts; exit 3, or 0 with --allow-skip."""
    r = runner.invoke(app, ["run", "-s", "spec-decode"], env={"COLUMNS": "300"})
    assert r.exit_code == 3, r.output
    why = ("needs speculator: no speculative_config in the engine arguments "
           "(give one with -e speculative_config=JSON)")
    assert r.stdout.splitlines() == [
        f"scenario spec-decode: skipped: {why}",
        "SKIPPED: 0 scenario(s), 0 steps in 0 ms, 1 skipped (by reason below); no engine started",
        f"  1 skipped: {why}"]
    assert r.stderr.strip() == (
        "error: 1 scenario(s) named with -s did not run (spec-decode: skipped, see above); "
        "pass --allow-skip to accept that (exit 0)")
    r = runner.invoke(app, ["run", "-s", "spec-decode", "-s", "sampler-spec-decode",
                            "--allow-skip"], env={"COLUMNS": "300"})
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[-2:] == [
        "ok: 0 scenario(s), 0 steps in 0 ms, 2 skipped (by reason below); no engine started",
        f"  2 skipped: {why}"]
    assert r.stderr == ""


def test_run_help_documents_the_exit_statuses():
    r = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    assert r.exit_code == 0
    text = " ".join(r.stdout.replace("│", " ").split())
    assert "3 a scenario named with -s was skipped." in text
    assert "--allow-skip" in text and "2 bad input, nothing ran;" in text


def test_help_shows_metavars_not_python_types():
    """No <bool>, <str>, <path> or <list[str]> in any command's help: flags
    show nothing, values a metavar (NAME|FILE, KEY=VALUE, DIR|NAME, FILE)."""
    import re

    for cmd in ([], ["run"], ["coverage"], ["check"], ["show"], ["list"], ["profile"]):
        r = runner.invoke(app, [*cmd, "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
        assert r.exit_code == 0, (cmd, r.output)
        assert not re.search(r"<(bool|str|int|float|path|list\[\w+\])>", r.stdout), (cmd, r.stdout)
    r = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
    rows = {ln.split()[1]: ln for ln in r.stdout.splitlines() if ln.startswith("│ --")}
    assert "NAME|FILE" in rows["--scenario"] and "KEY=VALUE" in rows["--engine-arg"]
    assert "DIR|NAME" in rows["--model"] and "FILE" in rows["--json"]
    assert rows["--verify"].split()[1:4] == ["--verify", "After", "warmup,"]  # no metavar


def test_list_help_says_models_lists_the_real_dimension_models_too():
    from stepwarm.zoo import TINY_ZOO, ZOO

    r = runner.invoke(app, ["list", "--help"], env={"COLUMNS": "120", "TERM": "dumb"})
    rows = {ln.split()[1]: ln for ln in r.stdout.splitlines() if ln.startswith("│ --")}
    assert " ".join(rows["--models"].strip("│ ").split()[1:]) == (
        "List the zoo's models (tiny and of real dimensions) instead.")
    listed = runner.invoke(app, ["list", "--models"]).stdout.splitlines()
    assert set(ZOO) - set(TINY_ZOO) <= set(listed) and set(TINY_ZOO) <= set(listed)


def test_show_in_an_80_column_terminal_fits_and_names_every_step():
    from stepwarm.scenario import plans_for, tiny_profile
    from tests.helpers import in_a_terminal

    code, text = in_a_terminal(["show", "mixed-prefill-decode"], 80, timeout=300)
    assert code == 0, text
    lines = text.replace("\r", "").splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    (plan,) = plans_for(["mixed-prefill-decode"], tiny_profile())
    for st in plan.steps:  # the line form: each step's label on its first line
        assert f"  [{st.index}/5] {st.kind}  {st.label}" in lines
    assert "        requests dec[0..2] long" in lines  # running rows first, as vLLM's
    assert "        tokens 512  spec 0  alloc blk 4  hit blk 0  null blk 0  held blk 7" in lines
    assert "  groups: full_attention(block_size=128)" in lines  # the profile line, wrapped


def test_list_models_in_an_80_column_terminal_keeps_every_engine_arg():
    import json

    from stepwarm.zoo import ZOO
    from tests.helpers import in_a_terminal

    code, text = in_a_terminal(["list", "--models"], 80, timeout=300)
    assert code == 0, text
    lines = text.replace("\r", "").splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    body = " ".join(line.strip() for line in lines)
    for m in ZOO.values():
        assert m.name in lines  # one block per model, its name alone on a line
        assert m.architecture in body
        for k, v in m.engine_args.items():
            assert f"{k}={json.dumps(v)}" in body, (m.name, k)


def test_list_models_piped_is_one_block_per_model():
    from stepwarm.zoo import ZOO

    r = runner.invoke(app, ["list", "--models"])
    assert r.exit_code == 0
    lines = r.stdout.splitlines()
    assert "┃" not in r.stdout
    i = lines.index("tiny-llama")
    assert lines[i + 1:i + 6] == [
        "    architecture: LlamaForCausalLM", "    kind: dense",
        "    vLLM runner / mode: generate", "    speculator: -",
        "    engine args: max_model_len=512 max_num_seqs=8 max_num_batched_tokens=512"]
    assert [ln for ln in lines if ln and not ln.startswith(" ")][1:] == list(ZOO)


def test_show_tables_in_an_80_column_terminal_is_not_cropped():
    from tests.helpers import in_a_terminal

    code, text = in_a_terminal(["show", "--tables", "prefix-hit"], 80, timeout=300)
    assert code == 0, text
    lines = text.replace("\r", "").splitlines()
    assert max(map(len, lines)) <= 80, max(lines, key=len)
    tables = [ln for ln in lines if ln.startswith("┏")]
    # the block table view's top border closes: its last column is there, folded, not cut
    assert len(tables) == 1 and tables[0].endswith("┓")
    view = lines[lines.index(tables[0]):]
    assert all(ln.endswith(("┓", "┃", "│", "┩", "┘")) for ln in view if ln.strip()), view
    assert sum(1 for ln in view if ln.startswith("│ 3 │")) == 1  # step 3's row


def test_a_skipped_scenario_has_its_own_status_in_the_json_report(tmp_path):
    """A skipped scenario is ``status: skipped`` with ``ok: null`` (it did not
    run), not ``ok: true`` (issue 42 item 18); a run that passed or failed
    keeps ``ok``."""
    from stepwarm.driver import RunReport

    out = tmp_path / "report.json"
    r = runner.invoke(app, ["run", "-s", "spec-decode", "--allow-skip", "--json", str(out)],
                      env={"COLUMNS": "300"})
    assert r.exit_code == 0 and r.stderr == "", r.output
    [sc] = json.loads(out.read_text())["scenarios"]
    assert (sc["plan"], sc["status"], sc["ok"], sc["steps"]) == ("spec-decode", "skipped", None, [])
    assert sc["skipped"] == ("needs speculator: no speculative_config in the engine arguments "
                             "(give one with -e speculative_config=JSON)")
    passed = RunReport(plan="a", runner="v1", model="m")
    failed = RunReport(plan="b", runner="v1", model="m", ok=False, error="step 2 raised")
    assert [(d["status"], d["ok"]) for d in (passed.to_dict(), failed.to_dict())] == [
        ("passed", True), ("failed", False)]


@pytest.mark.parametrize("command", [["coverage", "--threshold", "-3"],
                                     ["bench", "nosuch"]])
def test_a_bad_model_is_named_with_the_other_errors(tmp_path, command):
    """The tenth trial: coverage and bench left --model out of the errors
    they listed (coverage imported vLLM first)."""
    r = runner.invoke(app, [*command, "--model", str(tmp_path / "nonexist")],
                      env={"COLUMNS": "300"})
    assert (r.exit_code, r.stdout) == (2, "")
    heads = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(heads) == 2, r.stderr
    assert any(h.startswith(f"error: --model {tmp_path / 'nonexist'}: no such directory")
               for h in heads), r.stderr


@pytest.mark.parametrize("command", [["run", "-s", "default"], ["coverage"],
                                     ["bench", "default"]])
def test_no_report_is_written_over_the_models_files(tmp_path, command):
    """The tenth trial: run --json DIR/config.json replaced the model's
    config with the report; the model no longer loaded."""
    model = tmp_path / "m"
    (model / "drafter").mkdir(parents=True)
    (model / "config.json").write_text('{"model_type": "llama"}')
    (model / "drafter" / "config.json").write_text('{"model_type": "llama"}')
    for target in (model / "config.json", model / "drafter" / "config.json"):
        r = runner.invoke(app, [*command, "--model", str(model), "--json", str(target)],
                          env={"COLUMNS": "300"})
        assert (r.exit_code, r.stdout) == (2, "")
        assert (f"error: --json {target}: it is the model's file {target}, which the report "
                "would replace; allowed: another file") in r.stderr
        assert target.read_text() == '{"model_type": "llama"}'


@pytest.mark.parametrize("command", ["check", "show"])
def test_check_and_show_name_conflicting_runner_options_with_every_other_error(tmp_path,
                                                                               command):
    """The tenth trial: 'give --model or --profile, not both' hid the unknown
    scenario, the bad -e and the missing model (the eleventh: and the
    missing profile file)."""
    r = runner.invoke(app, [command, "nosuch", "--model", str(tmp_path / "nonexist"),
                            "--profile", str(tmp_path / "p.json"), "-e", "foo"],
                      env={"COLUMNS": "300"})
    assert (r.exit_code, r.stdout) == (2, "")
    heads = [ln.split(":")[1].strip() for ln in r.stderr.splitlines()
             if ln.startswith("error: ")]
    assert heads == ["give --model or --profile, not both",
                     "-e sets an engine argument, and --profile starts no engine",
                     str(tmp_path / "p.json"),
                     f"--model {tmp_path / 'nonexist'}", "unknown scenario 'nosuch'; allowed",
                     "-e 'foo'"], r.stderr
