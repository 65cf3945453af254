"""Probe (H200): does a GEMM at a token count no earlier step used cost more
on its first call, with no compile (cuBLAS picking a kernel whose module
CUDA loads lazily on first use)?

Llama-3.1-8B's four projection shapes (bf16), M = tokens in a step. Warm the
token counts stepwarm's scenarios use, then time first and second calls at
the counts the coverage traffic's outliers had; then the same after a sweep
of powers of two. Run once as is and once with CUDA_MODULE_LOADING=EAGER.

    python benchmarks/gpu_probe_gemm.py   # prints JSON lines
"""

from __future__ import annotations

import json
import os
import time

import torch

SHAPES = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]
STEPWARM_MS = [1, 2, 16, 17, 2048, 16368, 16383]
PROBES = [45, 300, 1450, 2400, 700, 3000, 5000, 9000]
POW2 = [2 ** i for i in range(15)]


def main() -> None:
    dev = "cuda"
    w = [torch.randn(k, n, device=dev, dtype=torch.bfloat16) for k, n in SHAPES]
    xs = {m: [torch.randn(m, k, device=dev, dtype=torch.bfloat16) for k, _ in SHAPES]
          for m in sorted(set(STEPWARM_MS + PROBES + POW2 + [p + 1 for p in PROBES]))}
    torch.cuda.synchronize()

    def run(m: int) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for x, wi in zip(xs[m], w):
            x @ wi
        torch.cuda.synchronize()
        return round((time.perf_counter() - t0) * 1e3, 3)

    mode = os.environ.get("CUDA_MODULE_LOADING", "default(LAZY)")
    for m in STEPWARM_MS:
        run(m)
    rows = {m: (run(m), run(m), run(m)) for m in PROBES}
    print(json.dumps({"mode": mode, "after": "stepwarm token counts", "first/second/third ms": rows}))
    for m in POW2:
        run(m)
    rows = {m + 1: (run(m + 1), run(m + 1), run(m + 1)) for m in PROBES}
    print(json.dumps({"mode": mode, "after": "+ powers of two", "first/second/third ms": rows}))


if __name__ == "__main__":
    main()
