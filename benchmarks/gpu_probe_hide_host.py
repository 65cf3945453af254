"""GPU probe for ``stepwarm bench``'s device time (issue 45): does a sleep
queued before the start event (``stepwarm.bench.hide_host_ms``) leave the
GPU's work alone between the CUDA events, whatever the host spent before
launching it?

A synthetic step: the host "prepares inputs" for H ms (``time.sleep``, H drawn
from 0.5 to 6 ms, as a runner's input preparation varies), then launches
matmuls that keep the GPU busy for about G ms, then waits for them. Timed
three ways, 40 repeats each, interleaved:

* ``kernels``: events around the launches alone (the GPU's work: the truth);
* ``step``: events from the step's start (before the host's preparation) to
  its end, as ``bench`` measured before the change;
* ``hidden``: the same events with the sleep queued first (``bench`` now).

Prints p50 and spread ((p90 - p10) / p50) of each, and hidden / kernels.
Needs torch with CUDA only (the image's torch is enough).

    python benchmarks/gpu_probe_hide_host.py [--repeats 40] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from stepwarm.bench import _sleep_cycles_per_ms, hide_host_ms, percentile  # noqa: E402


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
    rng = random.Random(0)

    def launch(n: int) -> None:
        x = a
        for _ in range(n):
            x = x @ a
        x.sum().item()  # the step reads its result back (sample_tokens)

    cycles = _sleep_cycles_per_ms()
    launch(4)
    torch.cuda.synchronize()
    out: dict[str, list[float]] = {"kernels": [], "step": [], "hidden": []}
    host_last = 8.0  # the "warm-up" host time: preparation + the GPU's work
    for _ in range(args.repeats):
        for way in ("kernels", "step", "hidden"):
            prep = rng.uniform(0.5, 6.0)
            t0 = time.perf_counter()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if way == "hidden":
                torch.cuda._sleep(int(hide_host_ms(host_last) * cycles))
            if way != "kernels":
                start.record()
            time.sleep(prep / 1e3)
            if way == "kernels":
                start.record()
            x = a
            for _ in range(8):
                x = x @ a
            end.record()
            x.sum().item()
            end.synchronize()
            out[way].append(start.elapsed_time(end))
            if way == "step":
                host_last = (time.perf_counter() - t0) * 1e3
    rows = {}
    for way, ms in out.items():
        p50 = percentile(ms, 50)
        rows[way] = {"p50_ms": p50, "spread": (percentile(ms, 90) - percentile(ms, 10)) / p50}
        print(f"{way:8s} p50 {p50:7.3f} ms  spread {rows[way]['spread']:.3f}")
    ratio = rows["hidden"]["p50_ms"] / rows["kernels"]["p50_ms"]
    print(f"hidden / kernels at the median: {ratio:.3f}; device {torch.cuda.get_device_name()}, "
          f"torch {torch.__version__}, {cycles:.0f} sleep cycles a ms")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "ratio": ratio, "samples": out,
                                         "device": torch.cuda.get_device_name(),
                                         "torch": torch.__version__}, indent=1))


if __name__ == "__main__":
    main()
