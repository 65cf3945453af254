"""Probe (H200): after stepwarm's GEMM ladders, which row counts still pay a
first call in the LM head's logits GEMM and in the linear layers?

Run s16 flagged the tiny Llama's first 440-token, 40-request prefill: +4-6 ms
in ``aten::mm``, cuBLAS kernels ``nvjet_..._64x40_...`` and ``..._64x24_...``
first launched in traffic, after the head's ladder (eight counts per octave:
39 and 42, not 40) had run. This process runs one model shape's GEMMs the
way vLLM does (``F.linear(x, weight)``, bf16) at every count of a head ladder
and of the linear ladder (as ``stepwarm.gemm_sizes`` runs them, largest
first), then times the first and second call at every other count:

    for s in tiny 8b; do for l in octave every; do
        python benchmarks/gpu_probe_head_ladder.py $s $l; done; done   # JSON lines
"""

from __future__ import annotations

import json
import math
import sys
import time

import torch
import torch.nn.functional as F

#: name -> (head (vocab, hidden), linear (out, in) shapes, logits rows, eager floor, tokens)
SHAPES = {
    # zoo tiny-llama under s16's engine args (64 sequences, 2048 tokens)
    "tiny": ((512, 256), [(512, 256), (256, 256), (1024, 256), (256, 512)], 64, 129, 2048),
    # Llama-3.1-8B under vLLM's defaults (1024 sequences, 16384 tokens)
    "8b": ((128256, 4096), [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)],
           1024, 513, 16384),
}


def octave(low: int, high: int, per_octave: int = 8) -> list[int]:
    """``stepwarm.gemm_sizes.token_counts``."""
    out = {low, high}
    k = max(0, math.floor(per_octave * math.log2(low)) - 1)
    while (m := math.ceil(2 ** (k / per_octave))) <= high:
        if m >= low:
            out.add(m)
        k += 1
    return sorted(out)


def main() -> None:
    shape, ladder = sys.argv[1], sys.argv[2]
    (vocab, hidden), linears, rows, floor, tokens = SHAPES[shape]
    dev, dt = "cuda", torch.bfloat16
    head = torch.randn(vocab, hidden, device=dev, dtype=dt)
    ws = [torch.randn(o, i, device=dev, dtype=dt) for o, i in linears]
    xh = torch.randn(rows, hidden, device=dev, dtype=dt)
    xs = [torch.randn(tokens, i, device=dev, dtype=dt) for _, i in linears]

    def timed(fn) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return (time.perf_counter() - t0) * 1e3

    def run_head(m: int) -> float:
        return timed(lambda: F.linear(xh[:m], head))

    def run_linear(m: int) -> float:
        return timed(lambda: [F.linear(x[:m], w) for x, w in zip(xs, ws)])

    timed(lambda: F.linear(xh[:1], head))  # cuBLAS handle, workspace
    head_counts = list(range(1, rows + 1)) if ladder == "every" else octave(1, rows)
    lin_counts = octave(floor, tokens)
    t0 = time.perf_counter()
    for m in reversed(head_counts):
        run_head(m)
    head_ms = (time.perf_counter() - t0) * 1e3
    t0 = time.perf_counter()
    for m in reversed(lin_counts):
        run_linear(m)
    lin_ms = (time.perf_counter() - t0) * 1e3
    out = {"shape": shape, "ladder": ladder, "head_counts": len(head_counts),
           "head_ladder_ms": round(head_ms, 1), "linear_counts": len(lin_counts),
           "linear_ladder_ms": round(lin_ms, 1)}
    for what, run, probes in (
            ("head", run_head, [m for m in range(1, rows + 1) if m not in head_counts]),
            ("linear", run_linear, [m for m in range(floor, min(tokens, floor + 1400))
                                    if m not in lin_counts])):
        excess = []
        for m in probes:
            first, second, third = run(m), run(m), run(m)
            if first - min(second, third) > 0.5:
                excess.append((m, round(first - min(second, third), 2)))
        out[what] = {"probes": len(probes), "over_0.5ms": len(excess),
                     "excess_ms_total": round(sum(e for _, e in excess), 1),
                     "worst": sorted(excess, key=lambda r: -r[1])[:12],
                     "counts": [m for m, _ in excess][:60]}
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
