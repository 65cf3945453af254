"""`stepwarm run`, the main job, as a user runs it (a fresh process)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import pytest

from tests.e2e.helpers import (GREEDY_SPEC_SCENARIO, NGRAM_2, cpu_worker_patch,
                               patched_pythonpath)
from tests.helpers import in_a_terminal, unwrapped

pytestmark = pytest.mark.e2e


def _stepwarm(*args: str, timeout: int = 600,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-m", "stepwarm", *args], capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


def test_run_prints_step_tables_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    proc = _stepwarm("run", "-s", "default", "-s", "mixed-prefill-decode", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scenario default (v1 runner): 8 steps" in proc.stdout
    # One line per step as it runs (stdout is not a terminal here).
    assert "  [0/8] prefill " in proc.stdout and "  [7/8] cleanup " in proc.stdout
    # The engine's start-up phases, followed from vLLM's log.
    assert re.search(r"starting vLLM engine: loading the model \(\d+\.\d s\)\n"
                     r"starting vLLM engine: profiling memory .*\n"
                     r"(starting vLLM engine: vLLM's own warmup .*\n)?"
                     r"starting vLLM engine: initializing the KV cache .*\n", proc.stdout)
    assert " INFO " not in proc.stderr  # vLLM's INFO lines only with -v
    assert "ok: 2 scenario(s)" in proc.stdout
    # stdout holds stepwarm's lines only: vLLM logs to stderr, and the default
    # model's tokenizer lets vLLM's renderer warmup pass without a traceback.
    assert not re.search(r"(INFO|WARNING|ERROR) \d\d-\d\d |\[\w+\.py:\d+\]|pid=", proc.stdout)
    assert "Traceback" not in proc.stderr and "Chat template warmup failed" not in proc.stderr
    report = json.loads(out.read_text())
    assert report["profile"]["runner"] == "v1"
    default, mixed = report["scenarios"]
    assert default["plan"] == "default" and default["ok"] and default["left_in_runner"] == []
    assert [s["kind"] for s in default["steps"]] == [
        "prefill", "decode", "decode", "decode", "cleanup",
        "prefill", "mixed_prefill_decode", "cleanup",
    ]
    assert [s["num_scheduled_tokens"] for s in default["steps"]] == [16, 8, 2, 1, 0, 2, 16, 0]
    assert default["steps"][0]["new_blocks"] == [8]
    assert all(s["wall_ms"] > 0 for s in default["steps"])
    # The report's profile expands the scenario to the same steps, offline.
    from stepwarm.profile import RunnerProfile
    from stepwarm.scenario import plans_for

    (plan,) = plans_for(["mixed-prefill-decode"], RunnerProfile.model_validate(report["profile"]))
    assert mixed["ok"] and mixed["left_in_runner"] == []
    assert [s["num_scheduled_tokens"] for s in mixed["steps"]] == [
        st.total_num_scheduled_tokens for st in plan.steps
    ]


def test_the_live_table_fits_an_80_column_terminal(tmp_path):
    """In a real 80-column terminal the last frame of the live table shows
    every step's numbers, and no line is wider than the terminal. With
    enforce_eager and VLLM_CPU_KVCACHE_SPACE the CPU worker does not warm up,
    and the start-up phases do not say it did."""
    err = tmp_path / "stderr.txt"
    code, text = in_a_terminal(["run", "-s", "mixed-prefill-decode"], 80,
                                env={"VLLM_CPU_KVCACHE_SPACE": "1"}, stderr=err)
    assert code == 0, text[-3000:] + err.read_text()[-3000:]
    # vLLM's log goes to stderr on a terminal too, not through the start-up spinner
    # (before: rich's status redirected stderr into the terminal's stdout)
    log = re.compile(r"^\(\w+ pid=\d+\) (WARNING|INFO) ", re.M)
    assert log.search(err.read_text()) and not log.search(text.replace("\r", "\n")), text[-2000:]
    assert "starting vLLM engine: initializing the KV cache" in text
    assert "vLLM's own warmup" not in text
    final = text.rsplit("scenario mixed-prefill-decode (v1 runner): 5/5 steps", 1)[1]
    final = final.split("ok: 1 scenario(s)", 1)[0]
    final = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", final)  # the live display's cursor moves
    lines = [ln.rstrip() for ln in final.replace("\r\n", "\n").replace("\r", "\n").splitlines()]
    # At 80 columns the table's kind: step column would split
    # 'mixed_prefill_decode:' (the eleventh trial): the rows come as lines,
    # no word split: #, reqs, tokens, spec, alloc blk, hit blk, sampled
    # (the ms vary).
    assert not any(ln.startswith("│") for ln in lines), final
    rows = re.findall(r"^  \[(\d)/5\] (\w+)  .*\n +reqs (\d+)\s+tokens (\d+)\s+spec (\d+)\s+"
                      r"alloc blk (\S+)\s+hit blk (\S+)\s+sampled (\S+)\s+(\d+\.\d) ms$",
                      "\n".join(lines), re.M)
    assert [[r[0], *r[2:8]] for r in rows] == [
        ["0", "3", "6", "0", "3", "0", "3"], ["1", "2", "16", "0", "1", "0", "2"],
        ["2", "0", "0", "0", "0", "0", "-"], ["3", "4", "512", "0", "4", "0", "4"],
        ["4", "0", "0", "0", "0", "0", "-"]], final
    assert [r[1] for r in rows] == ["prefill", "mixed_prefill_decode", "finish",
                                    "mixed_prefill_decode", "cleanup"]
    assert max(len(ln) for ln in lines) <= 80
    assert "ok: 1 scenario(s)" in text


def test_run_rejects_a_model_dir_without_config(tmp_path):
    proc = _stepwarm("run", "--model", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert f"--model {tmp_path}: not a model directory (no config.json)" in unwrapped(proc.stderr)


def _model_dir(tmp_path, config: str):
    (tmp_path / "config.json").write_text(config)
    return tmp_path


@pytest.mark.parametrize("what, config, expected", [
    ("missing", None, "--model {d}: no such directory"),
    ("bad json", '{\n  "architectures": ["LlamaForCausalLM"],\n  "hidden_size": 256,,\n}',
     "{d}/config.json:3:22: invalid JSON: Expecting property name enclosed in double quotes"),
    ("architecture", '{"architectures": ["NoSuchForCausalLM"], "model_type": "llama"}',
     "{d}/config.json: field 'architectures': NoSuchForCausalLM is not supported by the "
     "installed vLLM (vllm 0.32.0); list the supported ones with: python -c"),
])
def test_bad_model_dirs_get_one_paragraph_and_exit_2(tmp_path, what, config, expected):
    d = tmp_path / "missing" if config is None else _model_dir(tmp_path, config)
    proc = _stepwarm("run", "--model", str(d), timeout=180)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "error: " + expected.format(d=d) in unwrapped(proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout.strip() == ""
    assert len(unwrapped(proc.stderr).split("error: ", 1)[1]) < 600


def test_a_config_vllm_rejects_names_the_field_trimmed(tmp_path):
    from stepwarm.zoo import TINY_LLAMA

    d = _model_dir(tmp_path, json.dumps(TINY_LLAMA))
    proc = _stepwarm("run", "--model", str(d), "-e", "max_model_len=99999", timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    msg = unwrapped(proc.stderr).split("error: ", 1)[1]
    assert msg.startswith("vLLM could not start the engine after ")
    assert f"(--model {d}): " in msg and "99999" in msg and len(msg) < 600
    assert "Traceback" not in proc.stderr
    verbose = _stepwarm("run", "-v", "--model", str(d), "-e", "max_model_len=99999", timeout=300)
    assert verbose.returncode == 2 and "Traceback" in verbose.stderr  # -v shows it
    assert " INFO " in verbose.stderr and " INFO " not in verbose.stdout


def test_run_rejects_a_malformed_engine_arg():
    proc = _stepwarm("run", "-e", "max_num_seqs", timeout=120)
    assert proc.returncode == 2
    assert "expected KEY=VALUE" in unwrapped(proc.stderr)


def test_run_rejects_a_bad_scenario_file_before_starting_vllm(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text('[requests.a]\nprompt = 8\n\n[[steps]]\nkind = "prefill"\nreqests = ["a"]\n')
    proc = _stepwarm("run", "-s", "default", "-s", str(bad), timeout=60)
    assert proc.returncode == 2
    assert str(bad) in unwrapped(proc.stderr) and "reqests" in unwrapped(proc.stderr) and "requests" in unwrapped(proc.stderr)
    assert "engine up" not in proc.stdout  # nothing started, nothing ran


def test_run_reports_every_bad_file_before_starting_vllm(tmp_path):
    zero = tmp_path / "typo.toml"
    zero.write_text('[requests.a]\npromt = 4\n\n[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    broken = tmp_path / "broken.toml"
    broken.write_text('[[steps]\nkind = "prefill"\n')
    proc = _stepwarm("run", "-s", str(zero), "-s", "default", "-s", str(broken), timeout=60)
    assert proc.returncode == 2 and "engine up" not in proc.stdout
    assert f"{zero}:2" in unwrapped(proc.stderr) and "unknown key 'promt' (did you mean 'prompt'?)" in unwrapped(proc.stderr)
    assert f"{broken}:1" in unwrapped(proc.stderr)


def test_run_rejects_a_json_path_that_is_a_directory(tmp_path):
    proc = _stepwarm("run", "--json", str(tmp_path), timeout=60)
    assert proc.returncode == 2 and "engine up" not in proc.stdout
    assert f"--json {tmp_path}: is a directory; allowed: a file path" in unwrapped(proc.stderr)
    assert "Traceback" not in proc.stderr


def test_run_rejects_a_json_path_in_a_missing_directory(tmp_path):
    proc = _stepwarm("run", "--json", str(tmp_path / "no" / "out.json"), timeout=60)
    assert proc.returncode == 2 and "engine up" not in proc.stdout
    assert f"directory {tmp_path / 'no'} does not exist" in unwrapped(proc.stderr)


#: A sitecustomize making the CPU worker's first ``sample_tokens`` of a
#: scenario named ``failing`` raise (a step that fails on the worker).
#: The CPU worker's first ``sample_tokens`` with a stepwarm request raises
#: (while FAIL_ONCE=1).
FAIL_FIRST_SAMPLE = cpu_worker_patch("sample_tokens", """
    def wrapped(original, self, *args, **kwargs):
        from stepwarm.plan import REQ_ID_PREFIX
        ids = list(getattr(self.model_runner.input_batch, "req_ids", []))
        if any(i.startswith(REQ_ID_PREFIX) for i in ids) and os.environ.get("FAIL_ONCE") == "1":
            os.environ["FAIL_ONCE"] = "0"
            raise RuntimeError("injected failure in sample_tokens")
        return original(self, *args, **kwargs)
""")


def test_a_failing_scenario_is_reported_and_the_next_one_runs(tmp_path):
    """A step that raises on the worker (here injected into the CPU
    worker's first ``sample_tokens``): exit 1 with the step and the error,
    the runner cleaned up, and the next scenario still runs. A top-k request
    beside drafts, which vLLM's CPU build fails on (``max(): ... numel() ==
    0``), is refused at check now (the fresh trial's defect 13), before any
    step: exit 2."""

    greedy = tmp_path / "greedy.toml"
    greedy.write_text(GREEDY_SPEC_SCENARIO)
    topk = tmp_path / "topk.toml"  # the file needs no spec_top_k_top_p
    topk.write_text(GREEDY_SPEC_SCENARIO.replace('sampling = "greedy"',
                                                 'sampling = { temperature = 1.0, top_k = 5 }'))
    spec = ("-e", f"speculative_config={json.dumps(NGRAM_2)}")
    proc = _stepwarm("run", "-s", str(topk), "-s", str(greedy), *spec)
    err = unwrapped(proc.stderr)
    assert proc.returncode == 2 and "[0/" not in proc.stdout, proc.stdout + err
    assert "field 'sampling.top_k': " in err and "top_k = 5 beside this runner's speculator" in err
    failing = tmp_path / "failing.toml"
    failing.write_text(GREEDY_SPEC_SCENARIO)
    path = patched_pythonpath(tmp_path / "site", FAIL_FIRST_SAMPLE)
    out = tmp_path / "report.json"
    proc = _stepwarm("run", "-s", str(failing), "-s", str(greedy), "--json", str(out), *spec,
                     env={"PYTHONPATH": path, "FAIL_ONCE": "1"})
    report = json.loads(out.read_text())
    failed, second = report["scenarios"]
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    err = unwrapped(proc.stderr)  # the failed: line wraps at 80 columns
    assert "1 of 2 scenario(s) failed on the worker (failing: see 'failed:' above)" in err
    # The failure prints once, and the failed step has its row.
    assert err.count("scenario failing: step 0 (prefill: prefill r[0]..r[3] (4) x rest) "
                     "failed on the v1 runner: RuntimeError: injected failure in "
                     "sample_tokens") == 1
    assert re.search(r"\[0/\d+\] prefill  .*\n +reqs .* FAILED", proc.stdout)
    # stdout ends with the outcome too, as a clean run's ends with "ok: ...".
    assert re.search(r"^FAILED: 2 scenario\(s\), \d+ steps in \d+ ms; 1 failed$", proc.stdout,
                     re.M)
    assert "cleanup ran, the runner holds no stepwarm request" in err
    assert failed["cleanup_ran"] and failed["left_in_runner"] == []
    assert failed["failed_step"] == {"index": 0, "kind": "prefill",
                                     "label": "prefill r[0]..r[3] (4) x rest"}
    # 4 requests: prefill, spec decode (2 drafts each), [0] spec + [1] non-spec,
    # [0] alone, cleanup.
    assert second["ok"] and [s["num_spec_tokens"] for s in second["steps"]] == [0, 8, 2, 0, 0]


def test_show_takes_engine_args():
    proc = _stepwarm("show", "default", "-e", "max_num_seqs=4", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("profile:")]
    assert "max_num_seqs 4," in line
    # the step's label, then its requests: 4, not 8
    assert re.search(r"│ 0 │ prefill +│ prefill [^│]+│ req\[0\.\.3\] ", proc.stdout)


def test_run_verify_compares_with_vllms_scheduler_and_reports_a_table(tmp_path):
    """`run --verify` on the tiny Llama with seeded random weights: after
    warmup, each scenario's sampling requests, through LLM.generate and
    through stepwarm's steps, give the same greedy tokens."""
    from stepwarm.zoo import write_model

    model = write_model("tiny-llama", tmp_path, tokenizer=True, weights_seed=0)
    out = tmp_path / "report.json"
    proc = _stepwarm("run", "--model", str(model), "-e", "load_format=auto",
                     "-e", "max_model_len=512", "-s", "prefix-hit", "-s", "preempt-resume",
                     "-e", "enable_prefix_caching=true", "--verify", "--json", str(out))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--verify: stepwarm's steps vs vLLM's own scheduler (greedy)" in proc.stdout
    assert "note: dummy weights" not in proc.stdout  # seeded weights, loaded
    # not a terminal: the comparison as lines of at most 80 columns
    lines = proc.stdout.splitlines()
    start = lines.index("--verify: stepwarm's steps vs vLLM's own scheduler (greedy)")
    verified = [lines[start]] + list(itertools.takewhile(lambda ln: ln.startswith("  "),
                                                         lines[start + 1:]))
    assert "  prefix-hit: equal (4 requests, 8 tokens)" in verified
    assert "  preempt-resume: equal (2 requests, 13 tokens)" in verified
    assert max(map(len, verified)) <= 80, verified
    verify = json.loads(out.read_text())["verify"]
    assert [(v["scenario"], v["differences"], v["skipped"]) for v in verify] == [
        ("prefix-hit", [], ""), ("preempt-resume", [], "")]
    assert verify[1]["checked"] == {"a": 6, "b": 7}


def test_named_scenarios_the_runner_cannot_run_exit_3_with_reasons_counted(tmp_path):
    """spec-decode is skipped before the engine starts (no speculative_config),
    mamba-align once the runner is read (no Mamba group); default still runs;
    the summary counts both reasons; exit 3. With a cold Inductor cache the
    first step compiles, and its line says so."""
    proc = _stepwarm("run", "-s", "spec-decode", "-s", "default", "-s", "mamba-align",
                     env={"TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
                          "COLUMNS": "300"})  # run's own lines unwrapped (80 when piped)
    assert proc.returncode == 3, proc.stderr[-3000:]
    out = proc.stdout
    early = out.index("scenario spec-decode: skipped: needs speculator: no speculative_config")
    assert early < out.index("starting vLLM engine")
    assert "scenario mamba-align: skipped: needs mamba_align: runner has no Mamba KV cache " \
           "group in align mode (mamba_cache_mode none)" in out
    assert re.search(r"^SKIPPED: 1 scenario\(s\), 8 steps in \d+ ms, 2 skipped \(by reason "
                     r"below\); runner left with no warmup request\n"
                     r"  1 skipped: needs speculator: no speculative_config .*\n"
                     r"  1 skipped: needs mamba_align: runner has no Mamba .*\n", out, re.M)
    assert "error: 2 scenario(s) named with -s did not run (spec-decode, mamba-align: skipped, " \
           "see above); pass --allow-skip to accept that (exit 0)" in unwrapped(proc.stderr)
    compiled = re.search(r"^  step (\d+) \((\w+)\) took \d+\.\d s: compiled (\d+) inductor "
                         r"kernels? \((cpp_\w+)", out, re.M)
    assert compiled, out
    assert any(p.suffix == ".py" for p in (tmp_path / "inductor").rglob("*"))


#: A scenario of some 400 steps (a few seconds on the CPU engine), for Ctrl-C to land in.
LONG_SCENARIO = ('description = "decode one request for a long time"\n'
                 'requests.a = { prompt = 8 }\n'
                 'steps = [{ kind = "prefill", requests = ["a"] },\n'
                 '         { kind = "decode", requests = ["a"], repeat = 400 }]\n')


def _sigint_default() -> None:
    """In the child: SIGINT back to its default, so Python turns it into
    KeyboardInterrupt even where the test runs with SIGINT ignored (a
    background job of a non-interactive shell, as CI's may be)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(("signame", "status", "label"), [
    ("SIGINT", 130, "interrupted:"), ("SIGTERM", 143, "terminated (SIGTERM):")])
def test_ctrl_c_names_the_step_says_the_runner_was_cleaned_and_what_did_not_run(
        tmp_path, signame, status, label):
    """SIGINT during a scenario's steps: exit 130, one line on stderr naming
    the scenario and the step, that cleanup left the runner with no stepwarm
    request, and the scenarios not run; --json holds those that finished
    (issue 42 item 10). SIGTERM (timeout, a CI cancel, docker stop) the same,
    exit 143 (the ninth trial: a silent 143, no report). One engine start each."""
    import os
    import signal

    long = tmp_path / "long.toml"
    long.write_text(LONG_SCENARIO)
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepwarm", "run", "-s", "default", "-s", str(long), "-s",
         "prefix-hit", "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=_sigint_default, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    seen = []
    assert proc.stdout is not None
    for line in proc.stdout:  # until the long scenario has run a few steps
        seen.append(line)
        if line.startswith("  [3/402] decode"):
            break
    proc.send_signal(getattr(signal, signame))
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == status, "".join(seen) + rest + err[-3000:]
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(re.escape(label) + r" scenario long step (\d+)/402 \(decode, [^)]*\); "
                     r"cleanup ran, the runner holds no stepwarm request; not run: prefix-hit\.",
                     last)
    assert m and 3 <= int(m[1]) <= 400, last
    assert "Traceback" not in err and "ok:" not in rest
    report = json.loads(out.read_text())
    [default] = report["scenarios"]  # what finished
    assert (default["plan"], default["status"], len(default["steps"])) == ("default", "passed", 8)
    assert report["interrupted"] == {"at": last.split("; ")[0].removeprefix(label + " "),
                                     "scenario": "long", "not_run": ["prefix-hit"]}


def test_ctrl_c_while_the_engine_starts_says_so_and_what_did_not_run(tmp_path):
    """SIGINT while vLLM starts (a new user's Ctrl-C at 'starting vLLM
    engine'): exit 130 with one line on stderr saying so and naming the
    scenarios not run (before: an empty line), --json says the same. The
    engine is interrupted seconds into its start: cheap."""
    import os
    import signal
    import time

    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepwarm", "run", "-s", "default", "-s", "prefix-hit",
         "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_sigint_default, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first == "starting vLLM engine: importing vLLM\n"
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, rest + err[-3000:]
    last = err.strip().splitlines()[-1]
    assert re.fullmatch(r"interrupted: while the vLLM engine started \(\d+ s in\), before any "
                        r"step; no scenario ran; not run: default, prefix-hit\.", last), last
    assert "Traceback" not in err and "scenario " not in rest and "ok:" not in rest
    assert json.loads(out.read_text()) == {
        "profile": None, "startup_s": None, "scenarios": [],
        "interrupted": {"at": "engine start", "scenario": "", "not_run": ["default", "prefix-hit"]}}


def test_ctrl_c_during_verify_keeps_the_warmup_report_and_says_what_was_not_compared(tmp_path):
    """SIGINT while --verify compares a scenario with vLLM's scheduler: exit
    130, one line naming the scenario being compared and those not compared;
    --json holds the warmup's report, the comparisons done (none) and
    "interrupted" (before: exit 130, nothing said, no --json)."""
    import os
    import signal

    long = tmp_path / "long.toml"
    long.write_text(LONG_SCENARIO)
    out = tmp_path / "report.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepwarm", "run", "-s", str(long), "-s", "prefix-hit",
         "--verify", "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, preexec_fn=_sigint_default, env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    assert proc.stdout is not None
    seen = []
    for line in proc.stdout:
        seen.append(line)
        if line.startswith("verifying long against vLLM's scheduler"):
            break
    proc.send_signal(signal.SIGINT)
    # the default weights are vLLM's dummy ones: said before the comparison
    assert seen[-2].startswith("note: dummy weights (load_format=dummy): the tokens hardly "
                               "depend on the context"), seen[-3:]
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, rest + err[-3000:]
    assert err.strip().splitlines()[-1] == (
        "interrupted: --verify, comparing long with vLLM's scheduler; the warmup had finished "
        "(2 scenarios ran); not compared: long, prefix-hit.")
    assert "Traceback" not in err and "ok:" not in rest
    report = json.loads(out.read_text())
    assert [(s["plan"], s["status"]) for s in report["scenarios"]] == [
        ("long", "passed"), ("prefix-hit", "passed")]
    assert report["verify"] == []
    assert report["interrupted"] == {"at": "--verify, comparing long", "scenario": "long",
                                     "not_run": [], "not_verified": ["long", "prefix-hit"]}


def test_a_report_to_dev_stdout_comes_whole_after_the_table(tmp_path):
    """Second fresh trial (issue 42): ``run --json /dev/stdout > file`` put
    the summary line inside the JSON, and ``profile -o /dev/stdout > file``
    its start-up lines; now the table comes first and the report whole
    after it (run), or the profile alone on stdout (profile)."""
    import os

    out = tmp_path / "run.out"
    with open(out, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", "default",
                               "--json", "/dev/stdout"], stdout=f, stderr=subprocess.PIPE,
                              text=True, timeout=600, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = out.read_text()
    table, _, report = text.partition("\n{")
    assert table.splitlines()[-1].startswith("ok: 1 scenario(s), 8 steps in ")
    assert json.loads("{" + report)["scenarios"][0]["plan"] == "default"
    prof = tmp_path / "profile.out"
    with open(prof, "w") as f:
        proc = subprocess.run([sys.executable, "-m", "stepwarm", "profile", "-o", "/dev/stdout"],
                              stdout=f, stderr=subprocess.PIPE, text=True, timeout=600,
                              env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(prof.read_text())["runner"] == "v1"
    assert proc.stderr.splitlines()[-1] == "saved /dev/stdout"
    assert os.path.islink("/dev/stdout")
