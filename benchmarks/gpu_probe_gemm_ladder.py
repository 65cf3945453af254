"""Probe (H200): which ladder of token counts, run once through a model's
linear layers, leaves no first-call cost for a GEMM at any other count?

cuBLAS picks its kernel by the GEMM's shape; the first launch of a kernel in
a process costs milliseconds (CUDA loads its module, cuBLAS sets it up), and
an eager prefill at a new token count can be that first launch
(docs/findings.md). This process runs Llama-3.1-8B's four projections the way
vLLM does (`F.linear(x, weight)`, weight `[out, in]`, bf16) at every count of
one LADDER, then times the first and second call at fixed random counts that
the ladder did not run. One process per ladder (module loading is per
process):

    for l in none pow2 half quarter eighth sixteenth m256; do
        python benchmarks/gpu_probe_gemm_ladder.py $l; done   # JSON lines
"""

from __future__ import annotations

import json
import math
import random
import sys
import time

import torch
import torch.nn.functional as F

# (out, in) of Llama-3.1-8B's qkv, o, gate_up and down projections
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]
LIMIT = 16384


def ladder(name: str, low: int = 1) -> list[int]:
    if name == "none":
        return []
    if name.startswith("m"):
        step = int(name[1:])
        return sorted({low, *range(step, LIMIT + 1, step)})
    per_octave = {"pow2": 1, "half": 2, "quarter": 4, "eighth": 8, "sixteenth": 16}[name]
    out = set()
    k = 0
    while True:
        m = math.ceil(2 ** (k / per_octave))
        if m > LIMIT:
            break
        out.add(m)
        k += 1
    out.add(LIMIT)
    return sorted(out)


def main() -> None:
    name = sys.argv[1]
    dev = "cuda"
    weights = [torch.randn(o, i, device=dev, dtype=torch.bfloat16) for o, i in SHAPES]
    x_full = [torch.randn(LIMIT, i, device=dev, dtype=torch.bfloat16) for _, i in SHAPES]
    torch.cuda.synchronize()

    def run(m: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, w in zip(x_full, weights):
            F.linear(x[:m], w)
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    run(1)  # cuBLAS handle, workspace
    counts = ladder(name)
    t0 = time.perf_counter()
    for m in counts:
        run(m)
    ladder_ms = (time.perf_counter() - t0) * 1e3
    rng = random.Random(7)
    probes = sorted(({rng.randint(2, LIMIT) for _ in range(80)} | {2400}) - set(counts))
    rows = []
    for m in probes:
        first, second, third = run(m), run(m), run(m)
        rows.append((m, round(first, 2), round(min(second, third), 2)))
    excess = [(m, round(f - s, 2)) for m, f, s in rows if f - s > 1.0]
    print(json.dumps({
        "ladder": name, "counts": len(counts), "ladder_ms": round(ladder_ms, 1),
        "probes": len(rows), "probes_over_1ms": len(excess),
        "excess_ms_total": round(sum(e for _, e in excess), 1),
        "worst": sorted(excess, key=lambda r: -r[1])[:8],
    }), flush=True)


if __name__ == "__main__":
    main()
