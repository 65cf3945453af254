"""Failure policy, settings and vLLM's JIT monitor on one GPU."""

from __future__ import annotations

import pytest

from tests.gpu.lane import lane_env, needs_gpus, probe, record, stepwarm_lines

pytestmark = [pytest.mark.gpu, needs_gpus(1)]

SPEC = {"engine": {"gpu_memory_utilization": 0.3}}


def test_bad_scenario_fails_start_up_naming_it():
    proc, result = probe(SPEC, lane_env(STEPWARM_SCENARIOS="default,no-such-scenario"))
    assert result is not None and not result["started"]
    assert "no-such-scenario" in proc.stdout + proc.stderr


def test_bad_setting_fails_start_up_with_one_line():
    proc, result = probe(SPEC, lane_env(STEPWARM_SCENARIOS="default", STEPWARM_ON_ERROR="later"))
    assert result is not None and not result["started"]
    assert "STEPWARM_ON_ERROR='later': allowed: raise | warn" in result["error"]


def test_jit_monitor_error_mode_starts_with_stepwarm_and_still_catches_later_compiles():
    # stepwarm's compiles at start-up are warmup: with --jit-monitor-mode error
    # the engine starts. A prompt_logprobs request afterwards compiles a kernel
    # no warmup covers, and the monitor (switched on after stepwarm) catches it.
    # enforce_eager off: vLLM 0.34 turns its JIT warmup, and the monitor with
    # it, off under enforce_eager (the lane's default; VllmConfig.__post_init__).
    spec = {**SPEC, "engine": {**SPEC["engine"], "jit_monitor_mode": "error",
                               "enforce_eager": False},
            "then_prompt_logprobs": 3}
    proc, result = probe(spec, lane_env(STEPWARM_SCENARIOS="default,triton-buckets"))
    log = proc.stdout + proc.stderr
    assert result is not None and result["started"], log[-6000:]
    record("jit-monitor[error]", start_s=round(result["start_s"], 1), stepwarm=stepwarm_lines(log),
           then_error=result.get("then_error"))
    assert result["tokens"] == [4, 4, 4] and all(r["status"] == "passed" for r in result["reports"][0])
    assert log.index("stepwarm: triton-buckets:") < log.index("Kernel JIT monitor activated")
    assert "during inference" in log and result.get("then_error")
