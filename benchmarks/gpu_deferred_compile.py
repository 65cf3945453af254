"""The sampler's Triton kernel variants compiled one after another (as a
scenario step reaches each) against compiled in threads
(:mod:`stepwarm.deferred_compile`), on a GPU, each in a fresh process with a
fresh ``TRITON_CACHE_DIR``.

    python benchmarks/gpu_deferred_compile.py [--threads N] [--vocab V] [--out FILE.json]

Prints, per mode, the compile wall time of the same variants (what
sampler-matrix compiles: top-k / top-p / both at 16 and 17 requests, the
top-k log-softmax at 4 logprobs widths) and the ratio; then checks in the
deferred process that the skipped launch left the logits as they were, that
after the context no variant compiles again, and that the kernel then masks
as top-k should.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def _calls(vocab: int):
    import torch

    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p

    try:
        from vllm.v1.worker.gpu.sample.logprob import compute_token_logprobs
    except ImportError:
        compute_token_logprobs = None
    g = torch.Generator(device="cuda").manual_seed(0)
    out = []
    for batch in (16, 17):
        for k_on, p_on in ((True, False), (False, True), (True, True)):
            def topk(batch=batch, k_on=k_on, p_on=p_on):
                logits = torch.randn(batch, vocab, device="cuda", generator=g)
                k = torch.full((batch,), 5, dtype=torch.int32, device="cuda") if k_on else None
                p = torch.full((batch,), 0.9, dtype=torch.float32, device="cuda") if p_on else None
                before = logits.clone()
                res = apply_top_k_top_p(logits, k, p)
                return before, res, k_on and not p_on
            out.append((f"top_k_top_p B={batch} k={k_on} p={p_on}", topk))
    if compute_token_logprobs is not None:
        for width in (1, 2, 5, 16):
            def lp(width=width):
                logits = torch.randn(4, vocab, device="cuda", generator=g)
                ids = torch.randint(0, vocab, (4, width), device="cuda", generator=g)
                compute_token_logprobs(logits, ids)
                return None
            out.append((f"token_logprobs width={width}", lp))
    return out


def child(mode: str, threads: int, vocab: int) -> dict:
    import torch
    import triton

    from stepwarm.deferred_compile import deferred_compiles

    compiled: list[str] = []
    runtime = triton.knobs.runtime
    runtime.jit_post_compile_hook = lambda **kw: compiled.append(kw["fn"].name) or None
    calls = _calls(vocab)
    torch.cuda.synchronize()
    result: dict = {"mode": mode, "threads": threads, "triton": triton.__version__}
    t0 = time.perf_counter()
    skipped_left_logits = []
    if mode == "inline":
        per = {}
        for name, fn in calls:
            t = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            per[name] = round(time.perf_counter() - t, 3)
        result["per_call_s"] = per
    else:
        with deferred_compiles(threads) as d:
            for name, fn in calls:
                r = fn()
                if r is not None:
                    before, res, _ = r
                    skipped_left_logits.append(bool(torch.equal(before, res)))
        torch.cuda.synchronize()
        result["deferred"] = [{"kernel": c.kernel, "seconds": c.seconds, "error": c.error}
                              for c in d.result.compiles]
        result["waited_s"] = round(d.result.waited_s, 3)
    result["compile_wall_s"] = round(time.perf_counter() - t0, 3)
    result["compiled"] = len(compiled)
    if mode == "deferred":
        result["skipped_launch_left_logits"] = skipped_left_logits
        compiled.clear()
        kept = []
        for name, fn in calls:
            r = fn()
            if r is not None and r[2]:  # top-k only: 5 finite logits per row
                kept.append(int(torch.isfinite(r[1]).sum(dim=-1).max()))
        torch.cuda.synchronize()
        result["compiled_after"] = len(compiled)
        result["top_k_kept_per_row"] = kept
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        print(json.dumps(child(a.child, a.threads, a.vocab)))
        return
    results = {}
    for mode in ("inline", "deferred"):
        env = dict(os.environ, TRITON_CACHE_DIR=tempfile.mkdtemp(prefix=f"tri-{mode}-"))
        p = subprocess.run([sys.executable, __file__, "--child", mode, "--threads", str(a.threads),
                            "--vocab", str(a.vocab)], env=env, capture_output=True, text=True,
                           timeout=500)
        if p.returncode != 0:
            print(p.stderr[-4000:], file=sys.stderr)
            raise SystemExit(f"{mode}: exit {p.returncode}")
        results[mode] = json.loads(p.stdout.strip().splitlines()[-1])
        print(mode, json.dumps(results[mode]))
    ratio = results["deferred"]["compile_wall_s"] / results["inline"]["compile_wall_s"]
    print(f"deferred / inline compile wall time: {ratio:.2f} "
          f"({results['deferred']['compile_wall_s']:.1f} s / {results['inline']['compile_wall_s']:.1f} s, "
          f"{results['inline']['compiled']} / {results['deferred']['compiled']} compiles, "
          f"{a.threads} threads)")
    results["ratio"] = round(ratio, 3)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
