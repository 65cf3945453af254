"""Which ``_resample_kernel`` variant a first seeded batch of 5 compiles after stepwarm (one call).

Run s22 (vLLM 0.34.0, EAGLE and ngram on the V2 runner): the speculators traffic's
``seeded, batch 5`` line compiled one ``_resample_kernel`` variant after stepwarm's
``all``; the report keeps the key cut, so which argument class differs is unknown.
This starts the engine in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) with
``STEPWARM_SCENARIOS`` (default ``all``), records every ``_resample_kernel`` key
Triton compiles (its post-compile hook, whole keys), replays the speculators
traffic's lines up to and including ``seeded, batch 5``, and writes
``$OUT/resample-probe.json``: the keys at start-up, the keys each line compiled, and,
for each new key, the arguments where it differs from the nearest start-up key.

    PYTHONPATH=/tmp/site34 python benchmarks/gpu_probe_resample.py [--model tiny-llama-eagle]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="tiny-llama-eagle")
    ap.add_argument("--kernel", default="_resample_kernel")
    ap.add_argument("--traffic", default=str(Path(__file__).parent / "traffic" / "speculators.jsonl"))
    ap.add_argument("--upto", default="seeded, batch 5")
    args = ap.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("STEPWARM_SCENARIOS", "all")
    out = Path(os.environ.get("OUT", "/tmp")) / "resample-probe.json"
    seen: list[tuple[str, str]] = []
    phase = ["start-up"]
    from triton import knobs

    previous = knobs.runtime.jit_post_compile_hook

    def hook(**kw):
        fn = kw.get("fn")
        name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or repr(fn)
        if args.kernel in str(name):
            seen.append((phase[0], str(kw.get("key"))))
        return previous(**kw) if previous is not None else None

    knobs.runtime.jit_post_compile_hook = hook
    from vllm import LLM, SamplingParams

    from stepwarm.zoo import ZOO, write_model

    model = write_model(args.model, tokenizer=False)
    llm = LLM(model=str(model), load_format="dummy", skip_tokenizer_init=True,
              gpu_memory_utilization=0.3, **ZOO[args.model].engine_args_for(model))
    for line in Path(args.traffic).read_text().splitlines():
        req = json.loads(line)
        phase[0] = req["name"]
        params = SamplingParams(ignore_eos=True, **req["sampling"])
        llm.generate([{"prompt_token_ids": [5 + i] * req["prompt"]} for i in range(req.get("count", 1))],
                     params, use_tqdm=False)
        if req["name"] == args.upto:
            break
    startup = [k for p, k in seen if p == "start-up"]
    later = [(p, k) for p, k in seen if p != "start-up"]

    def args_of(key: str) -> list[str]:
        return key.split("), (")

    diffs = []
    for p, k in later:
        best = min(startup, key=lambda s: sum(a != b for a, b in zip(args_of(s), args_of(k))),
                   default="")
        diffs.append({"line": p, "key": k, "differs_at": [
            (i, a, b) for i, (a, b) in enumerate(zip(args_of(best), args_of(k))) if a != b]})
    out.write_text(json.dumps({"startup": startup, "later": diffs}, indent=1))
    print(json.dumps(diffs, indent=1)[:4000])
    return 0


if __name__ == "__main__":
    sys.exit(main())
