"""Benchmark: planning time, its growth with the plan's size, and the ratio to
vLLM's own ``Scheduler.schedule()``.

Two figures on a 1,024-sequence profile (``max_num_seqs`` 1024,
``max_num_batched_tokens`` 16384, one full-attention group of 16-token blocks,
20,000 blocks):

* ``PlanBuilder`` planning 1,024 requests x 8 steps (one prefill of 16 prompt
  tokens each, then 7 decodes; the cleanup step is not counted);
* ``plans_for(["all"], profile)``: every built-in scenario expanded.

The first is also timed with Python's collector paused around the whole plan
(``stepwarm.plan.collector_paused``), as ``plans_for`` and the start-up hook
plan: then no collection pass falls between the steps.

The targets (<= 20 ms for 1,024 x 8, <= 100 ms for ``all``) are checked
against the CPU time of the process (``time.process_time``: on a shared
machine the wall clock also counts the time other processes held the cores),
best and median round.

The size sweep (``--sweep``, default 256, 512, 1024 and 2048 requests x 8
steps, each on a profile whose ``max_num_seqs`` and token budget fit it,
collector paused) prints the CPU time per request-step: constant when the
cost grows linearly in requests x steps (and as long as the plan's working
set stays in the core's cache; the instructions below do not depend on it).

``--instructions`` counts the instructions of one plan of each swept size
with valgrind's callgrind (deterministic, unlike time on a shared machine):
the process is run twice under callgrind, planning once and three times
after the same imports and warm-up round, and half the difference is one
round. It takes a minute or two per size.

Where vLLM is installed, its real ``Scheduler`` (built on CPU from a
``VllmConfig`` over the embedded tiny Llama's ``config.json`` and a
``KVCacheConfig`` of the same group and blocks) schedules the same 8 steps:
1,024 requests added, then ``schedule()`` + ``update_from_output`` with one
sampled token per request, 8 times. Only ``schedule()`` is timed for the
ratio; ``update_from_output`` is reported beside it.

    python benchmarks/plan_speed.py [--rounds 7] [--no-vllm] [--sweep 256,512,1024,2048]
                                    [--instructions]

Per figure, in ms over ``--rounds`` rounds: the best, the median and the
worst wall-clock time, and the best and median CPU time of the process, and
the load average before and after them. The ratio to vLLM compares best
with best and median with median (wall clock and CPU time, both measured in
this process).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from typing import Any

NUM_REQS = 1024
PROMPT_LEN = 16
NUM_STEPS = 8  # 1 prefill + 7 decodes
BLOCK_SIZE = 16
NUM_BLOCKS = 20000
#: The targets, in ms of CPU time.
TARGET_STEPS_MS = 20.0
TARGET_ALL_MS = 100.0
SWEEP = (256, 512, 1024, 2048)


def bench_profile(num_reqs: int = NUM_REQS) -> Any:
    """The benchmark's profile, its ``max_num_seqs`` and token budget fitting
    ``num_reqs`` requests."""
    from stepwarm.profile import CacheSpec, tiny_profile

    return tiny_profile().model_copy(update=dict(
        max_num_seqs=num_reqs, max_num_batched_tokens=num_reqs * PROMPT_LEN,
        num_blocks=NUM_BLOCKS, max_model_len=512,
        kv_cache_groups=(CacheSpec(kind="full_attention", block_size=BLOCK_SIZE),),
    ))


def plan_steps(profile: Any, num_reqs: int = NUM_REQS) -> Any:
    """``num_reqs`` requests x 8 steps through ``PlanBuilder``."""
    from stepwarm.plan import PlanBuilder, PlannedRequest

    b = PlanBuilder(profile, name="bench")
    ids = [f"r{i}" for i in range(num_reqs)]
    for rid in ids:
        b.add_request(PlannedRequest(rid, PROMPT_LEN))
    b.step("prefill", "prefill", prefill={rid: PROMPT_LEN for rid in ids})
    for _ in range(NUM_STEPS - 1):
        b.step("decode", "decode", decode={rid: 0 for rid in ids})
    return b


def plan_all(profile: Any) -> Any:
    from stepwarm.scenario import plans_for

    return plans_for(["all"], profile)


def cpu_scheduler(max_num_seqs: int, max_num_batched_tokens: int, num_blocks: int,
                  cls: Any = None) -> Any:
    """vLLM's ``Scheduler`` (or ``cls``, a subclass) built on CPU over the
    embedded tiny Llama's ``config.json``: one full-attention group of
    ``BLOCK_SIZE``-token blocks, no prefix caching."""
    import torch
    from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    from stepwarm.zoo import write_model

    mc = ModelConfig(model=str(write_model("tiny-llama")), skip_tokenizer_init=True, max_model_len=512)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=512, is_encoder_decoder=False)
    cc = CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False)
    cc.num_gpu_blocks = num_blocks
    vc = VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                    device_config=DeviceConfig("cpu"))
    spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=1, head_size=8,
                             dtype=torch.float16)
    kvc = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    return (cls or Scheduler)(vc, kvc, StructuredOutputManager(vc), block_size=BLOCK_SIZE)


def vllm_scheduler() -> tuple[list[float], list[float], list[float]]:
    """One round of vLLM's own scheduler on the same steps: per-step
    ``schedule()`` wall-clock and CPU seconds, and ``update_from_output``
    wall-clock seconds."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    s = cpu_scheduler(NUM_REQS, NUM_REQS * PROMPT_LEN, NUM_BLOCKS)
    sp = SamplingParams(max_tokens=NUM_STEPS + 1, ignore_eos=True)
    for i in range(NUM_REQS):
        s.add_request(Request(f"r{i}", list(range(PROMPT_LEN)), sp, None))
    sched, sched_cpu, upd = [], [], []
    for _ in range(NUM_STEPS):
        c0, t0 = time.process_time(), time.perf_counter()
        out = s.schedule()
        t1, c1 = time.perf_counter(), time.process_time()
        ids = list(out.num_scheduled_tokens)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[[7] for _ in ids])
        s.update_from_output(out, mro)
        t2 = time.perf_counter()
        assert len(ids) == NUM_REQS, len(ids)
        sched.append(t1 - t0)
        sched_cpu.append(c1 - c0)
        upd.append(t2 - t1)
    return sched, sched_cpu, upd


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


def _verdict(t: Timing, target: float) -> str:
    """Whether the best and the median CPU time meet ``target`` (ms)."""
    def one(ms: float) -> str:
        return f"{ms:.1f} ms {'meets' if ms <= target else 'MISSES'}"

    return f"target <= {target:g} ms of CPU: best {one(t.cpu)}, median {one(t.cpu_median)}"


def _paused_plan(num_reqs: int) -> Any:
    """A function planning ``num_reqs`` x 8 steps, collector paused."""
    from stepwarm.plan import collector_paused

    profile = bench_profile(num_reqs)

    def plan() -> None:
        with collector_paused():
            plan_steps(profile, num_reqs)

    return plan


def sweep(sizes: list[int], rounds: int) -> None:
    """CPU time per request-step over ``sizes`` requests x 8 steps
    (collector paused): constant when planning grows linearly."""
    per: list[float] = []
    for n in sizes:
        plan = _paused_plan(n)
        plan()  # warm
        t = _time(plan, rounds)
        per.append(t.cpu / (n * NUM_STEPS) * 1e3)
        print(f"  {n:5d} requests x {NUM_STEPS} steps: CPU best {t.cpu:.1f} ms, median "
              f"{t.cpu_median:.1f}; {per[-1]:.2f} us per request-step (best)")
    print(f"  per request-step, largest / smallest: {max(per) / min(per):.2f}")


def _instructions_run(num_reqs: int, plans: int) -> int:
    """Instructions callgrind counts for this script's ``--plan-only``."""
    out = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
         __file__, "--plan-only", str(plans), "--size", str(num_reqs)],
        capture_output=True, text=True, check=True, env=dict(os.environ, PYTHONHASHSEED="0"))
    m = re.search(r"Collected : (\d+)", out.stderr)
    assert m, out.stderr[-2000:]
    return int(m.group(1))


def instructions(sizes: list[int]) -> None:
    """Instructions of one plan of each size x 8 steps (collector paused):
    half the difference of three plans and one after the same start."""
    for n in sizes:
        one, three = _instructions_run(n, 1), _instructions_run(n, 3)
        per_round = (three - one) / 2
        print(f"  {n:5d} requests x {NUM_STEPS} steps: {per_round / 1e6:.2f} M instructions "
              f"({per_round / (n * NUM_STEPS):.0f} per request-step)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--no-vllm", action="store_true", help="skip vLLM's scheduler")
    ap.add_argument("--sweep", default=",".join(map(str, SWEEP)),
                    help="request counts of the size sweep, comma-separated ('' for none)")
    ap.add_argument("--instructions", action="store_true",
                    help="count the instructions of one plan per swept size (callgrind)")
    ap.add_argument("--plan-only", type=int, metavar="K", help=argparse.SUPPRESS)
    ap.add_argument("--size", type=int, default=NUM_REQS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [int(n) for n in args.sweep.split(",") if n]
    if args.plan_only is not None:  # under callgrind: a warm-up round, then K
        plan = _paused_plan(args.size)
        plan()
        for _ in range(args.plan_only):
            plan()
        return
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
    print(f"stepwarm PlanBuilder, {NUM_REQS} requests x {NUM_STEPS} steps: {steps}")
    print(f"  {_verdict(steps, TARGET_STEPS_MS)}")
    print(f"  the same, collector paused as plans_for plans: {steps_paused}")
    print(f"  {_verdict(steps_paused, TARGET_STEPS_MS)}")
    print(f"stepwarm plans_for(['all']), {n_all} steps: {everything}")
    print(f"  {_verdict(everything, TARGET_ALL_MS)}")
    if sizes:
        print("size sweep, collector paused:")
        sweep(sizes, args.rounds)
    if sizes and args.instructions:
        print("instructions (callgrind), collector paused:")
        instructions(sizes)
    if args.no_vllm:
        return
    rounds = [vllm_scheduler() for _ in range(args.rounds)]
    sched = Timing([sum(r[0]) * 1e3 for r in rounds], [sum(r[1]) * 1e3 for r in rounds])
    upd = statistics.median(sum(r[2]) for r in rounds) * 1e3
    print(f"vLLM Scheduler.schedule(), same {NUM_STEPS} steps: {sched} "
          f"(update_from_output beside it: median {upd:.1f} ms)")
    print(f"ratio stepwarm / vLLM schedule(): wall best {steps.best / sched.best:.3f}, "
          f"median {steps.median / sched.median:.3f}; CPU best {steps.cpu / sched.cpu:.3f}, "
          f"median {steps.cpu_median / sched.cpu_median:.3f} (collector paused: CPU best "
          f"{steps_paused.cpu / sched.cpu:.3f})")


if __name__ == "__main__":
    main()
