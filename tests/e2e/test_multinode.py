"""The plugin with vLLM's multiprocessing executor over two nodes (issue 23):
``nnodes=2``, ``master_addr=127.0.0.1``, TP=2 with one rank per node, both
"nodes" on this host (``tests/nodes_probe.py``): node 0 an unmodified
``vllm.LLM`` (``tests/engine_probe.py``), node 1 its workers only, as
``vllm serve --headless --node-rank 1`` runs them. Each node's workers are
processes of their own node's tree; the ranks meet over vLLM's
``torch.distributed`` world (``master_addr:master_port``), and stepwarm's
gloo groups are made over that world.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.nodes_probe import run_mp_nodes

pytestmark = pytest.mark.e2e

FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"
LABELS = ("rank 0 (tp 0/2, pp 0/1)", "rank 1 (tp 1/2, pp 0/1)")


def _node_envs(**stepwarm: str) -> list[dict[str, str]]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STEPWARM_") and k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    env.update(PYTHONPATH=os.pathsep.join(p for p in (str(FAULT_PLUGIN), env.get("PYTHONPATH"))
                                          if p),
               VLLM_CPU_KVCACHE_SPACE="1", **stepwarm)
    # One worker per node, each at local rank 0: its threads on its own core.
    return [{**env, "VLLM_CPU_OMP_THREADS_BIND": str(i % (os.cpu_count() or 1))}
            for i in range(2)]


def test_mp_two_nodes_tp2_both_ranks_warm_in_lockstep_then_serve():
    head, (other,) = run_mp_nodes({"tensor_parallel_size": 2},
                                  _node_envs(STEPWARM_SCENARIOS="default"))
    assert head.result is not None and head.result["started"], head.log[-6000:] + other.log[-3000:]
    # collective_rpc reaches node 1's worker too: one report list per rank.
    (first,), (second,) = head.result["reports"]
    assert [(r["rank"], r["tp_rank"], r["pp_rank"]) for r in (first, second)] == [(0, 0, 0),
                                                                                  (1, 1, 0)]
    for report in (first, second):
        assert report["plan"] == "default" and report["ok"] and len(report["steps"]) == 8
        assert report["cleanup_ran"] and report["left_in_runner"] == []
    assert ([(s["kind"], s["label"], s["num_scheduled_tokens"]) for s in first["steps"]]
            == [(s["kind"], s["label"], s["num_scheduled_tokens"]) for s in second["steps"]])
    assert head.result["tokens"] == [4, 4, 4] and head.result["live"] == [[], []]
    # Each rank logs in its own node's output.
    for run, label in zip((head, other), LABELS):
        assert f"stepwarm [{label}]: ranks agree within this engine's TP x PP (2 ranks)" in run.log
        assert f"stepwarm [{label}]: default: 8 steps in" in run.log
    assert "stepwarm [rank 1" not in head.log and "stepwarm [rank 0" not in other.log


def test_mp_two_nodes_tp2_ranks_whose_plans_differ_fail_start_up_on_both():
    head, (other,) = run_mp_nodes({"tensor_parallel_size": 2},
                                  _node_envs(STEPWARM_SCENARIOS="default",
                                             STEPWARM_TEST_PROFILE="1"), timeout_s=300)
    assert head.result is not None and not head.result["started"], head.log[-6000:]
    message = ("ranks would run different steps (TP x PP slots [1] differ from slot 0): their "
               "runner profiles differ; nothing was run")
    assert message in head.log and message in other.log, other.log[-4000:]
    assert "steps in" not in head.log + other.log
