"""Probe (H200): which cuBLAS kernel runs a model's linear layer at every
token count from 1 to 16,384?

The GEMM ladder (`stepwarm.gemm_sizes`) runs each GEMM at a few token counts
an octave so that the kernels cuBLAS picks are loaded at start-up, not at the
first request of that size (docs/plugin.md). Traffic at a count between two
rungs can still pick a kernel no rung picked (s19: Qwen3-Next at 2,400
tokens, six `nvjet` kernels first launched). This probe maps the choice:
Llama-3.1-8B's four projections (`F.linear(x, weight)`, bf16), every count,
one profiler run; each call is followed by a one-element fill whose kernel
marks where the call's kernels end. It prints one JSON object: per shape,
the run-length encoding of the kernel set per count (`[first count, last
count, kernel-set id]`) and the kernel sets.

    python benchmarks/gpu_probe_gemm_choice.py > choice.json
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import tempfile

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

# (out, in) of Llama-3.1-8B's qkv, o, gate_up and down projections
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LIMIT = int(os.environ.get("PROBE_LIMIT", "16384"))


def kernels_per_count(out_f: int, in_f: int) -> list[tuple[str, ...]]:
    w = torch.randn(out_f, in_f, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(LIMIT, in_f, device="cuda", dtype=torch.bfloat16)
    marker = torch.zeros(1, device="cuda", dtype=torch.int64)
    F.linear(x[:1], w)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for m in range(1, LIMIT + 1):
            F.linear(x[:m], w)
            marker.fill_(m)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "t.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = json.load(f)
    events = sorted((e for e in trace["traceEvents"] if e.get("cat") == "kernel"),
                    key=lambda e: e["ts"])
    out: list[tuple[str, ...]] = []
    cur: list[str] = []
    for e in events:
        if "FillFunctor" in e["name"]:
            out.append(tuple(sorted(set(cur))))
            cur = []
        else:
            cur.append(e["name"])
    return out


def main() -> None:
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda, "limit": LIMIT, "shapes": []}
    for out_f, in_f in SHAPES:
        per = kernels_per_count(out_f, in_f)
        sets: dict[tuple[str, ...], int] = {}
        runs: list[list[int]] = []
        for m, ks in enumerate(per, start=1):
            i = sets.setdefault(ks, len(sets))
            if runs and runs[-1][2] == i and runs[-1][1] == m - 1:
                runs[-1][1] = m
            else:
                runs.append([m, m, i])
        result["shapes"].append({"out": out_f, "in": in_f, "counts": len(per),
                                 "sets": [list(k) for k in sets], "runs": runs})
        print(f"{out_f}x{in_f}: {len(sets)} kernel sets, {len(runs)} runs", file=sys.stderr)
    sys.stdout.buffer.write(gzip.compress(json.dumps(result).encode()))


if __name__ == "__main__":
    main()
