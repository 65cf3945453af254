"""Benchmark: stepwarm's default scenario vs vLLM's own ``warmup_kernels``.

Both run on the same in-process worker (the embedded tiny Llama on CPU, or
``--model``): vLLM's real ``vllm.v1.worker.gpu.warmup.warmup_kernels`` (via
a read-only view that gives a V1 runner the attribute names of the V2 runner
it was written for; on a V2 runner the runner itself) and stepwarm's
``drive(worker, warmup_kernels_plan(profile))``, which sends the same steps.
The first round of each is reported separately (it pays one-off compiles);
then ``--rounds`` alternating rounds, and the ratio of medians.

    python benchmarks/vs_vllm_warmup.py [--model DIR] [--rounds 20]
"""

from __future__ import annotations

import argparse
import statistics
import time
from types import SimpleNamespace
from typing import Any


def vllm_view(worker: Any, profile: Any) -> Any:
    """The runner as vLLM's V2 ``warmup_kernels`` reads it."""
    runner = worker.model_runner
    if profile.runner == "v2":
        return runner
    return SimpleNamespace(
        vllm_config=runner.vllm_config,
        num_speculative_steps=profile.num_speculative_steps,
        decode_query_len=profile.decode_query_len,
        is_pooling_model=runner.is_pooling_model,
        is_encoder_decoder=profile.is_encoder_decoder,
        kv_cache_config=runner.kv_cache_config,
        model_state=SimpleNamespace(max_encoder_len=profile.max_encoder_len),
        scheduler_config=runner.vllm_config.scheduler_config,
        max_model_len=runner.max_model_len,
        max_num_reqs=runner.max_num_reqs,
        block_tables=None,
        kv_block_zeroer=None,
        model_config=runner.model_config,
        is_last_pp_rank=profile.is_last_pp_rank,
        kv_connector=SimpleNamespace(set_disabled=lambda disabled: None),
        adaptive_verification=None,
        rejection_sampler=None,
        get_supported_tasks=getattr(runner, "get_supported_tasks", None),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="model dir (default: embedded tiny Llama)")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()

    import torch

    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.probe import read_profile
    from stepwarm.sequences import warmup_kernels_plan
    from vllm.v1.worker.gpu.warmup import warmup_kernels

    engine = start_engine(args.model)
    worker = engine.worker
    profile = read_profile(engine.view)
    view = vllm_view(worker, profile)
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *a, **k: None  # CPU: nothing to wait for

    vllm_calls: list[int] = []

    def counted_execute(scheduler_output: Any) -> Any:
        vllm_calls.append(scheduler_output.total_num_scheduled_tokens)
        return worker.execute_model(scheduler_output)

    def run_vllm() -> float:
        vllm_calls.clear()
        t0 = time.perf_counter()
        warmup_kernels(view, counted_execute, worker.sample_tokens)
        return (time.perf_counter() - t0) * 1e3

    def run_stepwarm() -> float:
        t0 = time.perf_counter()
        drive(engine.view, warmup_kernels_plan(profile), profile)  # plans every round
        return (time.perf_counter() - t0) * 1e3

    def plan_only() -> float:
        t0 = time.perf_counter()
        warmup_kernels_plan(profile)
        return (time.perf_counter() - t0) * 1e3

    first_vllm = run_vllm()
    first_stepwarm = run_stepwarm()
    v, s, p = [], [], []
    for _ in range(args.rounds):
        v.append(run_vllm())
        s.append(run_stepwarm())
        p.append(plan_only())
    mv, ms, mp = statistics.median(v), statistics.median(s), statistics.median(p)
    print(f"runner {profile.runner}, vllm {profile.vllm_version}, model {profile.model}")
    print(f"first round (one-off compiles): vLLM warmup_kernels {first_vllm:.1f} ms, "
          f"stepwarm {first_stepwarm:.1f} ms")
    print(f"median of {args.rounds} rounds:  vLLM warmup_kernels {mv:.2f} ms, "
          f"stepwarm {ms:.2f} ms (planning {mp:.3f} ms of it)")
    plan = warmup_kernels_plan(profile)
    print(f"steps (scheduled tokens): vLLM {vllm_calls}, "
          f"stepwarm {[st.total_num_scheduled_tokens for st in plan.steps]}")
    print(f"ratio stepwarm / vLLM: {ms / mv:.3f}")
    engine.shutdown()


if __name__ == "__main__":
    main()
