"""Benchmark: the per-step cost of ``STEPWARM_RECORD`` on vLLM's real
``Scheduler`` (built on CPU over the embedded tiny Llama's ``config.json`` by
``benchmarks/plan_speed.py``'s ``cpu_scheduler``).

Each round adds ``--requests`` requests (16-token prompts, mixed sampler
classes: greedy, top-k, top-p with logprobs, seeded), then runs ``--steps``
steps of ``schedule()`` + ``update_from_output`` (one sampled token per
request): the prefill, then decodes. The same rounds run on a scheduler of
the plain class and on one of a class wrapped by :func:`stepwarm.record.wrap_scheduler`
writing to a file in a temporary directory; the figure is the CPU time of
the process per step (``time.process_time``: other processes on a shared
machine do not count), best and median round, and the ratio recorded /
plain. The recording's bytes per step are printed beside it.

    python benchmarks/record_cost.py [--requests 256] [--steps 16] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from plan_speed import cpu_scheduler  # benchmarks/, run as a script

PROMPT_LEN = 16


def one_round(cls: type, num_reqs: int, steps: int) -> float:
    """CPU seconds per step of ``steps`` schedule + update_from_output."""
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request

    from stepwarm.vllm_facts import model_runner_output

    s = cpu_scheduler(num_reqs, num_reqs * PROMPT_LEN, num_reqs * 4 + 16, cls)
    kinds = [dict(temperature=0.0), dict(top_k=5), dict(top_p=0.9, logprobs=2), dict(seed=1)]
    for i in range(num_reqs):
        s.add_request(Request(f"r{i}", list(range(PROMPT_LEN)),
                              SamplingParams(max_tokens=steps + 1, ignore_eos=True,
                                             **kinds[i % len(kinds)]), None))
    c0 = time.process_time()
    for _ in range(steps):
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        s.update_from_output(out, model_runner_output(ids, [[7] for _ in ids]))
    return (time.process_time() - c0) / steps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    from vllm.v1.core.sched.scheduler import Scheduler

    from stepwarm.record import wrap_scheduler

    class Recorded(Scheduler):
        schedule = Scheduler.schedule
        update_from_output = Scheduler.update_from_output

    wrap_scheduler(Recorded)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rec.jsonl")
        os.environ["STEPWARM_RECORD"] = path
        plain, recorded = [], []
        for _ in range(a.rounds):  # interleaved: the machine's load falls on both
            plain.append(one_round(Scheduler, a.requests, a.steps))
            recorded.append(one_round(Recorded, a.requests, a.steps))
        per_step = os.path.getsize(path) / (a.rounds * a.steps)
    ms = {k: (min(v) * 1e3, statistics.median(v) * 1e3)
          for k, v in (("plain", plain), ("recorded", recorded))}
    print(f"{a.requests} requests, {a.steps} steps, {a.rounds} rounds; CPU ms per step "
          "(schedule + update_from_output), best / median")
    for k, (best, med) in ms.items():
        print(f"  {k:9s} {best:8.3f} / {med:8.3f}")
    print(f"  ratio     {ms['recorded'][0] / ms['plain'][0]:8.3f} / "
          f"{ms['recorded'][1] / ms['plain'][1]:8.3f}   (recorded / plain)")
    print(f"  recording {per_step / 1024:8.1f} KiB per step")


if __name__ == "__main__":
    main()
