"""TP=2 and PP=2 on two GPUs: every rank runs the same steps in lockstep and
reports which rank it is; a failure on one rank fails start-up on all ranks
(in bounded time), or with STEPWARM_ON_ERROR=warn is logged and served past."""

from __future__ import annotations

import os

import pytest

from tests.gpu.lane import (
    FAULT_PLUGIN,
    lane_env,
    needs_gpus,
    probe,
    record,
    scenario_ms,
    stepwarm_lines,
)

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

LAYOUTS = {"tp2": {"tensor_parallel_size": 2}, "pp2": {"pipeline_parallel_size": 2}}
#: (rank, tp_rank, pp_rank) of the two workers.
RANKS = {"tp2": [(0, 0, 0), (1, 1, 0)], "pp2": [(0, 0, 0), (1, 0, 1)]}


def _spec(layout: str) -> dict:
    return {"engine": {**LAYOUTS[layout], "gpu_memory_utilization": 0.3}}


def _steps(report):
    return [(s["kind"], s["num_reqs"], s["num_scheduled_tokens"]) for s in report["steps"]]


@pytest.mark.parametrize("scenarios", ["default,triton-buckets", ""], ids=["stepwarm", "baseline"])
@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_every_rank_runs_the_same_steps_then_serves(layout, scenarios):
    env = lane_env(**({"STEPWARM_SCENARIOS": scenarios} if scenarios else {}))
    proc, result = probe(_spec(layout), env)
    assert result is not None and result["started"], (proc.stdout + proc.stderr)[-6000:]
    log = proc.stdout + proc.stderr
    record(f"{layout}[{scenarios or 'baseline'}]", start_s=round(result["start_s"], 1),
           stepwarm_ms=scenario_ms(stepwarm_lines(log)), stepwarm=stepwarm_lines(log))
    assert result["tokens"] == [4, 4, 4] and result["live"] == [[], []]
    if not scenarios:
        assert result["reports"] == [[], []] and stepwarm_lines(log) == []
        return
    first, second = result["reports"]
    assert [(r["rank"], r["tp_rank"], r["pp_rank"]) for r in first + second] == (
        [RANKS[layout][0]] * 2 + [RANKS[layout][1]] * 2)
    for a, b in zip(first, second):
        assert a["plan"] == b["plan"] and a["ok"] and b["ok"] and a["left_in_runner"] == []
        assert _steps(a) == _steps(b) and len(a["steps"]) > 0
    for rank, tp, pp in RANKS[layout]:
        assert f"stepwarm [rank {rank} (tp {tp}/{2 if layout == 'tp2' else 1}, " in log


def _with_fault(**extra: str) -> dict[str, str]:
    env = lane_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAULT_PLUGIN), env.get("PYTHONPATH")) if p)
    return env


def test_tp2_failure_on_one_rank_fails_start_up_on_both():
    proc, result = probe(_spec("tp2"), _with_fault(STEPWARM_SCENARIOS="default",
                                                   STEPWARM_TEST_FAULT="1:2:after"))
    log = proc.stdout + proc.stderr
    assert result is not None and not result["started"], log[-6000:]
    record("tp2[fault after step 2, raise]", start_s=round(result["start_s"], 1),
           stepwarm=stepwarm_lines(log))
    assert "stepwarm [rank 1 (tp 1/2, pp 0/1)]: default: step 2" in log
    assert "injected fault after step 2 on rank 1" in log
    assert "stepwarm [rank 0 (tp 0/2, pp 0/1)]: default: step 2" in log and "TP x PP slots [1]" in log


def test_tp2_failure_with_warn_cleans_up_and_serves():
    proc, result = probe(_spec("tp2"), _with_fault(STEPWARM_SCENARIOS="default,triton-buckets",
                                                   STEPWARM_ON_ERROR="warn",
                                                   STEPWARM_TEST_FAULT="1:2:after"))
    log = proc.stdout + proc.stderr
    assert result is not None and result["started"], log[-6000:]
    record("tp2[fault after step 2, warn]", start_s=round(result["start_s"], 1),
           stepwarm=stepwarm_lines(log))
    for default, buckets in result["reports"]:
        assert not default["ok"] and len(default["steps"]) == 2 and buckets["ok"]
    assert result["live"] == [[], []] and result["tokens"] == [4, 4, 4]


def test_tp2_rank_failing_before_a_collective_fails_start_up_in_bounded_time():
    proc, result = probe(_spec("tp2"), _with_fault(STEPWARM_SCENARIOS="default",
                                                   STEPWARM_RANK_TIMEOUT_S="20",
                                                   STEPWARM_TEST_FAULT="1:1:before"))
    log = proc.stdout + proc.stderr
    assert result is not None and not result["started"], log[-6000:]
    record("tp2[fault before step 1, bounded]", start_s=round(result["start_s"], 1),
           stepwarm=stepwarm_lines(log))
    assert ("the other ranks did not reach the end of step 1 (this rank failed it: "
            "RuntimeError: injected fault before step 1 on rank 1) within 20 s") in log
    assert "died unexpectedly" in log
