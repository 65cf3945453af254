"""The zoo's seeded weights load in vLLM: tiny-gemma3's tied embeddings,
written once (safetensors refuses two names on one storage), are vLLM's
embedding and LM head after ``load_format="auto"``. The engine runs in a
fresh process (one engine per process)."""

from __future__ import annotations

import pytest

from tests.e2e.helpers import script_result

pytestmark = pytest.mark.e2e

SCRIPT = '''
import json, sys
from pathlib import Path
import torch
from safetensors import safe_open
from vllm import SamplingParams
from stepwarm.engine import start_engine
from stepwarm.zoo import write_model

if __name__ == "__main__":
    d = write_model("tiny-gemma3", Path(FOLDER), weights_seed=0)
    with safe_open(str(d / "model.safetensors"), "pt") as f:
        embed = f.get_tensor("model.embed_tokens.weight")
    engine = start_engine(d, load_format="auto", max_model_len=128, max_num_seqs=2,
                          max_num_batched_tokens=128)
    try:
        model = engine.worker.model_runner.model
        loaded = model.model.embed_tokens.weight
        out = engine.llm.generate([{"prompt_token_ids": [5, 6, 7, 8]}],
                                  SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
        res = {"equal": torch.equal(loaded.to(torch.bfloat16).cpu(), embed),
               "tied": model.lm_head.weight.data_ptr() == loaded.data_ptr(),
               "tokens": len(out[0].outputs[0].token_ids)}
    finally:
        engine.shutdown()
    print("RESULT " + json.dumps(res))
'''


def test_tiny_gemma3_seeded_weights_load_in_vllm(tmp_path):
    r = script_result(tmp_path, SCRIPT.replace("FOLDER", repr(str(tmp_path / "model"))))
    assert r == {"equal": True, "tied": True, "tokens": 3}
