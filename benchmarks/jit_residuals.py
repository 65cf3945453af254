"""Which Triton kernels still compile after warmup, with and without stepwarm.

Counts every Triton JIT compile (``triton.knobs.runtime.jit_post_compile_hook``,
installed before the engine starts) per phase: engine start-up (vLLM's own
warmup), each stepwarm scenario, then probe traffic (prompts of 1/7/16/33/300
tokens, a batch of 40 with top-p/top-k, logprobs, prompt_logprobs). Kernels
compiled during the traffic are what the first real requests pay for.

    python benchmarks/jit_residuals.py [--model DIR] [--scenario NAME ...] [--json OUT]

Needs a GPU (Triton); on CPU it reports that Triton has no CPU backend.
"""

from __future__ import annotations

import argparse
import collections
import json
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("-e", "--engine-arg", action="append", default=[],
                    help="vllm.LLM keyword as KEY=VALUE (VALUE as JSON)")
    ap.add_argument("-s", "--scenario", action="append", default=None,
                    help="stepwarm scenario(s) to run after start-up (default: none)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    events: list[tuple[str, str, float]] = []
    phase = ["start-up"]
    try:
        from triton import knobs

        prev = knobs.runtime.jit_post_compile_hook

        def hook(**kw):
            fn = kw.get("fn")
            events.append((phase[0], getattr(fn, "name", repr(fn)), time.perf_counter()))
            return prev(**kw) if prev is not None else None

        knobs.runtime.jit_post_compile_hook = hook
    except Exception as e:  # noqa: BLE001
        print(f"no Triton compile hook: {e}")

    from stepwarm.driver import drive
    from stepwarm.engine import start_engine
    from stepwarm.profile import read_profile
    from stepwarm.scenario import plans_for
    from vllm import SamplingParams

    t0 = time.perf_counter()
    overrides = {"enforce_eager": False}
    for pair in args.engine_arg:
        key, _, value = pair.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    engine = start_engine(args.model, **overrides)
    startup_s = time.perf_counter() - t0
    profile = read_profile(engine.worker)
    timings: dict[str, float] = {"start-up": startup_s * 1e3}
    for plan in plans_for(args.scenario or [], profile):
        phase[0] = f"stepwarm:{plan.name}"
        report = drive(engine.worker, plan, profile)
        timings[phase[0]] = report.wall_ms
    probes = [
        ("prompt 1", [[1]], SamplingParams(max_tokens=2, temperature=0.0)),
        ("prompt 7", [list(range(7))], SamplingParams(max_tokens=2, temperature=0.0)),
        ("prompt 16", [list(range(16))], SamplingParams(max_tokens=2, temperature=0.0)),
        ("prompt 33", [list(range(33))], SamplingParams(max_tokens=2, temperature=0.0)),
        ("prompt 300", [[i % 500 for i in range(300)]], SamplingParams(max_tokens=2, temperature=0.0)),
        ("batch 5 top-p", [list(range(9))] * 5, SamplingParams(max_tokens=3, top_p=0.9, top_k=20)),
        ("batch 40 top-p", [list(range(11))] * 40, SamplingParams(max_tokens=3, top_p=0.9, top_k=20)),
        ("logprobs 5", [list(range(12))], SamplingParams(max_tokens=3, logprobs=5)),
        ("prompt_logprobs 3", [list(range(13))], SamplingParams(max_tokens=2, prompt_logprobs=3)),
    ]
    for name, prompts, sp in probes:
        phase[0] = f"traffic:{name}"
        t = time.perf_counter()
        engine.llm.generate([{"prompt_token_ids": p} for p in prompts], sp, use_tqdm=False)
        timings[phase[0]] = (time.perf_counter() - t) * 1e3
    by_phase: dict[str, list[str]] = collections.defaultdict(list)
    for ph, name, _ in events:
        by_phase[ph].append(name)
    print(f"runner {profile.runner}, vllm {profile.vllm_version}, scenarios {args.scenario or []}")
    for ph, ms in timings.items():
        kernels = by_phase.get(ph, [])
        print(f"{ph:28s} {ms:9.1f} ms  {len(kernels):3d} compiles  {sorted(set(kernels))}")
    residual = [n for ph, n, _ in events if ph.startswith("traffic:")]
    print(f"RESIDUAL {len(residual)} compiles during traffic: {sorted(set(residual))}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"profile": profile.model_dump(), "timings_ms": timings,
                       "compiles": {k: v for k, v in by_phase.items()}}, f, indent=2)


if __name__ == "__main__":
    main()
