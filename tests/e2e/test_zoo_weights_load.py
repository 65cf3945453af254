"""The zoo's seeded weights load in vLLM: tiny-gemma3's tied embeddings,
written once (safetensors refuses two names on one storage), are vLLM's
embedding and LM head after ``load_format="auto"``."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open

from stepwarm.engine import start_engine
from stepwarm.zoo import write_model

pytestmark = pytest.mark.e2e


def test_tiny_gemma3_seeded_weights_load_in_vllm(tmp_path):
    from vllm import SamplingParams

    d = write_model("tiny-gemma3", tmp_path, weights_seed=0)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
    engine = start_engine(d, load_format="auto", max_model_len=128, max_num_seqs=2,
                          max_num_batched_tokens=128)
    try:
        model = engine.worker.model_runner.model
        loaded = model.model.embed_tokens.weight
        assert torch.equal(loaded.to(torch.bfloat16).cpu(), embed)
        assert model.lm_head.weight.data_ptr() == loaded.data_ptr()  # tied again
        out = engine.llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}],
                                  SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        assert len(out[0].outputs[0].token_ids) == 3
    finally:
        engine.shutdown()
