"""`stepwarm coverage` as a user runs it, on the CPU build (embedded tiny Llama).

On vLLM's CPU build the logprobs path compiles an Inductor (C++) kernel on
its first call (``vllm/v1/sample/ops/logprobs.py``, ``torch.compile``);
vLLM's own warmup leaves it to the first request asking for logprobs, and
stepwarm's ``default`` compiles it at start-up (step 0 samples with logprobs).
So the baseline fails the gate and stepwarm passes it; the kernel stepwarm
compiled is one the baseline's traffic compiled (``moved``). Each run is then
restarted on the caches it filled (a restart on a cache volume).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import unwrapped

pytestmark = pytest.mark.e2e

TRAFFIC = "\n".join([
    '{"name": "greedy 7", "prompt": 7, "sampling": {"temperature": 0.0}}',
    '{"name": "logprobs 5", "prompt": 12, "sampling": {"temperature": 0.0, "logprobs": 5}}',
    '{"name": "top-p batch 5", "prompt": 9, "count": 5, "sampling": {"temperature": 0.8, "top_p": 0.9}}',
    '{"name": "prefix hit", "prompt": 300, "sampling": {"temperature": 0.0}, '
    '"prefix": {"group": "sys", "tokens": 272}}',
]) + "\n"


def _stepwarm(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepwarm", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_compare_baseline_fails_on_the_logprobs_compile_stepwarm_passes_and_restarts(tmp_path):
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text(TRAFFIC)
    out, svg = tmp_path / "both.json", tmp_path / "timeline.svg"
    proc = _stepwarm("coverage", str(traffic), "-s", "default", "--compare", "--json", str(out),
                     "--timeline", str(svg))
    print(proc.stdout)  # the report (pytest -s shows it)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    both = json.loads(out.read_text())
    base, sw = both["baseline"], both["stepwarm"]
    assert (base["mode"], base["scenarios"], sw["mode"], sw["scenarios"]) == (
        "baseline", [], "stepwarm", ["default"])
    # Baseline: the first logprobs request compiled the Inductor kernel; nothing else did.
    (logprobs,) = [r for r in base["requests"] if r["name"] == "logprobs 5"]
    assert list(logprobs["compiles_first"]) == ["cpp_fused_ge_sum_0"]
    assert logprobs["compiles_second"] == {} and logprobs["first_ms"] > logprobs["second_ms"]
    assert base["summary"]["flagged"] == {"logprobs 5": "compiled"}
    assert base["summary"]["exit_code"] == 1 and base["summary"]["traffic_compiles"] == 1
    assert base["startup_compiles"] == [] and base["scenario_runs"] == []
    # stepwarm: default's step 0 compiled it at start-up; traffic compiled nothing.
    assert sw["summary"]["exit_code"] == 0 and sw["summary"]["traffic_compiles"] == 0
    (startup,) = sw["startup_compiles"]
    assert (startup["owner"], startup["phase"], startup["step"], startup["kernels"]) == (
        "stepwarm", "default", 0, {"cpp_fused_ge_sum_0": 1})
    (run,) = sw["scenario_runs"]
    assert run["plan"] == "default" and run["ok"] and len(run["steps"]) == 8
    assert run["start_s"] <= startup["at_s"] <= run["steps"][0][3] + 0.01
    assert sw["stepwarm_s"] > 0 and sw["detectors"] == ["cache"] and sw["device"] == "cpu"
    assert [r["tokens"] for r in sw["requests"]] == [[4, 4], [4, 4], [20, 20], [4, 4]]
    for r in sw["requests"] + base["requests"]:  # the worker's share of each run
        assert 0 < r["first_worker_ms"] <= r["first_ms"] and 0 < r["second_worker_ms"] <= r["second_ms"]
        # step by step: the prompts' prefill, then a decode per further token (4 each)
        first, second = r["first_steps"], r["second_steps"]
        assert [s[:2] for s in first] == [s[:2] for s in second], r["name"]
        assert [s[:2] for s in first[1:]] == [[r["count"], r["count"]]] * 3, r["name"]
        prefill = r["prompt_len"] * r["count"]
        # the prefix line's 272 shared tokens are cached (the CPU build's
        # blocks are bigger: whole ones only), the others compute every token
        assert (first[0][0] < prefill) == (r["name"] == "prefix hit"), r["name"]
        assert first[0][1] == r["count"] and first[0][0] >= prefill - 272
        assert abs(sum(s[2] for s in first) - r["first_worker_ms"]) < 0.1 * len(first)
        assert all(s[3] == 0 for s in second)  # the first run had every count
        assert r["steady_ms"] == []  # no gate on the CPU build: every line runs twice
    # On the CPU build the ratio is reported, compiles gate (docs/cli.md: Thresholds).
    assert (sw["threshold"], base["threshold"]) == (None, None)
    # Printed side by side.
    assert "baseline (vLLM's warmup) vs stepwarm (default)" in proc.stdout
    assert "first-traffic compiles" in proc.stdout
    assert "default: 0 prefill: prefill 8 x 2 at " in svg.read_text()
    assert "1 compile(s): cpp_fused_ge_sum_0</title>" in svg.read_text()
    # The kernel default's step 0 compiled is the one the baseline's line 2 paid for.
    moves = both["attribution"]
    assert moves["totals"] == {"moved": 1, "vllm": 0, "extra": 0}
    # what line 2 cost the baseline beyond stepwarm's runs of it, both runs
    (ours,) = [r for r in sw["requests"] if r["line"] == 2]
    paid = (logprobs["first_ms"] + logprobs["second_ms"]) - (ours["first_ms"] + ours["second_ms"])
    assert moves["moved_lines"] == [2] and abs(moves["moved_ms"] - max(0.0, paid)) <= 0.06
    (cost,) = moves["scenarios"]
    assert (cost["scenario"], cost["steps"], cost["kernels"]) == (
        "default", 8, [["cpp_fused_ge_sum_0", "moved"]])
    assert [s["step"] for s in moves["idle_steps"]] == [1, 2, 3, 4, 5, 6, 7]
    # The restarts: the caches the fresh runs filled, the cache scan alone.
    for name, mode in (("baseline_restart", "baseline"), ("stepwarm_restart", "stepwarm")):
        rep = both[name]
        assert (rep["mode"], rep["cache"], rep["detectors"]) == (mode, "warm", ["cache"])
        assert rep["summary"]["traffic_compiles"] == 0, rep["requests"]
    assert both["stepwarm_restart"]["scenario_runs"][0]["ok"]
    assert set(both["startup"]) == {"baseline", "stepwarm", "baseline_restart",
                                    "stepwarm_restart"}
    assert both["startup"]["stepwarm"] == {
        "startup_s": sw["startup_s"], "scenario_s": sw["stepwarm_s"],
        "startup_compiles": 1, "traffic_compiles": 0}
    assert both["startup_lines"][0] in " ".join(proc.stdout.split())
    assert "start-up: fresh " in proc.stdout and "), restart " in proc.stdout


def test_a_bad_traffic_line_exits_2_before_the_engine_starts(tmp_path):
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text('{"prompt": 7}\n{"prompt": 7, "sampling": {"top_k": -5}}\n')
    proc = _stepwarm("coverage", str(traffic), "-s", "default")
    assert proc.returncode == 2
    assert f"{traffic}:2: sampling.top_k: vLLM's SamplingParams refused it: top_k must be " \
           in unwrapped(proc.stderr)
    assert "starting vLLM engine" not in proc.stdout


def test_server_defaults_lines_sample_as_the_models_generation_config_says(tmp_path):
    """A model with a ``generation_config.json`` (the embedded tiny Llama
    plus the file): a ``server_defaults`` line is sent with its temperature /
    top_k / top_p under the line's own keys, as vLLM's OpenAI server merges
    them; a plain line is not; the JSON records what was sent."""
    from stepwarm.zoo import write_model

    model = write_model("tiny-llama", tmp_path)
    (model / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text(
        '{"name": "server", "prompt": 7, "count": 3, "server_defaults": true}\n'
        '{"name": "server, own top_p", "prompt": 7, "server_defaults": true, '
        '"sampling": {"top_p": 0.5}}\n'
        '{"name": "plain", "prompt": 7}\n')
    out = tmp_path / "r.json"
    proc = _stepwarm("coverage", str(traffic), "--model", str(model), "--json", str(out),
                     "-e", "max_model_len=512", "-e", "max_num_seqs=8")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    sent = {r["name"]: r["sampling"] for r in rep["requests"]}
    short = {"max_tokens": 4, "ignore_eos": True}
    assert sent == {
        "server": {**short, "temperature": 0.6, "top_k": 20, "top_p": 0.95},
        "server, own top_p": {**short, "temperature": 0.6, "top_k": 20, "top_p": 0.5},
        "plain": short,
    }
    assert [r["tokens"] for r in rep["requests"]] == [[12, 12], [4, 4], [4, 4]]


def test_an_if_fits_line_too_long_for_the_engine_is_left_out_with_a_note(tmp_path):
    """The engine's ``max_model_len`` (512) is below an ``if_fits`` line's
    prompt: the line is not replayed, the report says why, the others run."""
    traffic = tmp_path / "traffic.jsonl"
    traffic.write_text('{"name": "long", "prompt": 1003, "if_fits": true}\n'
                       '{"name": "short", "prompt": 7, "sampling": {"temperature": 0.0}}\n')
    out = tmp_path / "r.json"
    proc = _stepwarm("coverage", str(traffic), "--json", str(out), "-e", "max_model_len=512")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    assert [r["name"] for r in rep["requests"]] == ["short"]
    note = (f"{traffic}:1: prompt: 1003 tokens + max_tokens 4 > the engine's max_model_len "
            "512: left out (if_fits)")
    assert note in rep["notes"]
    assert "replaying 1 request of traffic.jsonl" in unwrapped(proc.stdout)
