"""A recorded ``vllm.LLM`` session on the embedded tiny Llama (run as a
program, ``STEPWARM_RECORD`` set by the caller): three differently sampled
prompts in one batch, then a 200-token prompt twice (the second a one-block
prefix hit). Used by tests/e2e/test_record.py."""

from __future__ import annotations

import os


def main() -> None:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import SamplingParams

    from stepwarm.engine import start_engine

    engine = start_engine()
    llm = engine.llm
    short = dict(max_tokens=3, ignore_eos=True, detokenize=False)
    llm.generate([{"prompt_token_ids": list(range(3, 8))},
                  {"prompt_token_ids": list(range(3, 10))},
                  {"prompt_token_ids": list(range(3, 12))}],
                 [SamplingParams(temperature=0.0, **short),
                  SamplingParams(temperature=1.0, top_k=5, seed=3, **short),
                  SamplingParams(temperature=1.0, top_p=0.9, logprobs=2, **short)],
                 use_tqdm=False)
    long = {"prompt_token_ids": [3 + i % 400 for i in range(200)]}
    for _ in range(2):
        llm.generate([long], SamplingParams(temperature=0.0, max_tokens=2, ignore_eos=True,
                                            detokenize=False), use_tqdm=False)
    engine.shutdown()


if __name__ == "__main__":
    main()
