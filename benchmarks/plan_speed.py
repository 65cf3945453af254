"""Benchmark: planning time, and the ratio to vLLM's own ``Scheduler.schedule()``.

Two figures on a 1,024-sequence profile (``max_num_seqs`` 1024,
``max_num_batched_tokens`` 16384, one full-attention group of 16-token blocks,
20,000 blocks):

* ``PlanBuilder`` planning 1,024 requests x 8 steps (one prefill of 16 prompt
  tokens each, then 7 decodes; the cleanup step is not counted);
* ``plans_for(["all"], profile)``: every built-in scenario expanded.

The first is also timed with Python's collector paused around the whole plan
(``stepwarm.plan.collector_paused``), as ``plans_for`` and the start-up hook
plan: then no collection pass falls between the steps.

Where vLLM is installed, its real ``Scheduler`` (built on CPU from a
``VllmConfig`` over the embedded tiny Llama's ``config.json`` and a
``KVCacheConfig`` of the same group and blocks) schedules the same 8 steps:
1,024 requests added, then ``schedule()`` + ``update_from_output`` with one
sampled token per request, 8 times. Only ``schedule()`` is timed for the
ratio; ``update_from_output`` is reported beside it.

    python benchmarks/plan_speed.py [--rounds 7] [--no-vllm]

Per figure, in ms over ``--rounds`` rounds: the best, the median and the
worst wall-clock time, and the best and median CPU time of the process
(``time.process_time``: on a shared machine the wall clock also counts the
time other processes held the cores), and the load average before and
after them. The ratio to vLLM compares best with best and median with median
(wall clock, both measured in this process).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

NUM_REQS = 1024
PROMPT_LEN = 16
NUM_STEPS = 8  # 1 prefill + 7 decodes
BLOCK_SIZE = 16
NUM_BLOCKS = 20000


def bench_profile() -> Any:
    from stepwarm.profile import CacheSpec, tiny_profile

    return tiny_profile().model_copy(update=dict(
        max_num_seqs=NUM_REQS, max_num_batched_tokens=NUM_REQS * PROMPT_LEN,
        num_blocks=NUM_BLOCKS, max_model_len=512,
        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=BLOCK_SIZE),),
    ))


def plan_steps(profile: Any) -> Any:
    """1,024 requests x 8 steps through ``PlanBuilder``."""
    from stepwarm.plan import PlanBuilder, PlannedRequest

    b = PlanBuilder(profile, name="bench")
    ids = [f"r{i}" for i in range(NUM_REQS)]
    for rid in ids:
        b.add_request(PlannedRequest(rid, PROMPT_LEN))
    b.step("prefill", "prefill", prefill={rid: PROMPT_LEN for rid in ids})
    for _ in range(NUM_STEPS - 1):
        b.step("decode", "decode", decode={rid: 0 for rid in ids})
    return b


def plan_all(profile: Any) -> Any:
    from stepwarm.scenario import plans_for

    return plans_for(["all"], profile)


def vllm_scheduler() -> tuple[list[float], list[float]] | None:
    """One round of vLLM's own scheduler on the same steps: per-step
    ``schedule()`` and ``update_from_output`` seconds."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    from stepwarm.zoo import write_model

    mc = ModelConfig(model=str(write_model("tiny-llama")), skip_tokenizer_init=True, max_model_len=512)
    sc = SchedulerConfig(max_num_seqs=NUM_REQS, max_num_batched_tokens=NUM_REQS * PROMPT_LEN,
                         max_model_len=512, is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
    cc.num_gpu_blocks = NUM_BLOCKS
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig("cpu"))
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
                             dtype=torch.float16)
    kvc = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    s = Scheduler(vc, kvc, StructuredOutputManager(vc), block_size=BLOCK_SIZE)
    sp = SamplingParams(max_tokens=NUM_STEPS + 1, ignore_eos=True)
    for i in range(NUM_REQS):
        s.add_request(Request(f"r{i}", list(range(PROMPT_LEN)), sp, None))
    sched, upd = [], []
    for _ in range(NUM_STEPS):
        t0 = time.perf_counter()
        out = s.schedule()
        t1 = time.perf_counter()
        ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[7] for _ in ids])
        s.update_from_output(out, mro)
        t2 = time.perf_counter()
        assert len(ids) == NUM_REQS, len(ids)
        sched.append(t1 - t0)
        upd.append(t2 - t1)
    return sched, upd


class Timing:
    """Wall-clock rounds (ms) and the best and median CPU time (ms) of one figure."""

    def __init__(self, wall: list[float], cpu: list[float]):
        self.wall = sorted(wall)
        self.cpu = min(cpu) if cpu else float("nan")
        self.cpu_median = statistics.median(cpu) if cpu else float("nan")

    @property
    def best(self) -> float:
        return self.wall[0]

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    def __str__(self) -> str:
        return (f"best {self.best:.1f} ms, median {self.median:.1f}, worst {self.wall[-1]:.1f} "
                f"(CPU best {self.cpu:.1f}, median {self.cpu_median:.1f}; {len(self.wall)} rounds)")


def _time(fn: Any, rounds: int) -> Timing:
    wall, cpu = [], []
    for _ in range(rounds):
        c0, t0 = time.process_time(), time.perf_counter()
        fn()
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return Timing(wall, cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's scheduler")
    args = ap.parse_args()
    load = os.getloadavg()
    profile = bench_profile()
    plan_all(profile)  # warm imports and scenario loading
    steps = _time(lambda: plan_steps(profile), args.rounds)
    from stepwarm.plan import collector_paused

    def paused() -> None:
        with collector_paused():
            plan_steps(profile)

    steps_paused = _time(paused, args.rounds)
    everything = _time(lambda: plan_all(profile), args.rounds)
    n_all = sum(len(p.steps) for p in plan_all(profile))
    print("load average (1, 5, 15 min) before: {:.2f} {:.2f} {:.2f}; after the stepwarm "
          "figures: {:.2f} {:.2f} {:.2f}".format(*load, *os.getloadavg()))
    print(f"stepwarm PlanBuilder, {NUM_REQS} requests x {NUM_STEPS} steps: {steps} "
          "(target <= 20 ms)")
    print(f"  the same, collector paused as plans_for plans: {steps_paused}")
    print(f"stepwarm plans_for(['all']), {n_all} steps: {everything} (target <= 100 ms)")
    if args.no_vllm:
        return
    rounds = [vllm_scheduler() for _ in range(args.rounds)]
    sched = Timing([sum(r[0]) * 1e3 for r in rounds], [])
    upd = statistics.median(sum(r[1]) for r in rounds) * 1e3
    print(f"vLLM Scheduler.schedule(), same {NUM_STEPS} steps: best {sched.best:.1f} ms, "
          f"median {sched.median:.1f}, worst {sched.wall[-1]:.1f} "
          f"(update_from_output beside it: median {upd:.1f} ms)")
    print(f"ratio stepwarm / vLLM schedule(): best {steps.best / sched.best:.3f}, "
          f"median {steps.median / sched.median:.3f} (collector paused: best "
          f"{steps_paused.best / sched.best:.3f})")


if __name__ == "__main__":
    main()
