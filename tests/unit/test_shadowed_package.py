"""A folder named ``stepwarm`` in the current directory (the folder above a
plain clone, where a user starts ``python -m vllm.entrypoints.openai.api_server``)
shadows the package as a namespace package: under an editable install its
finder still serves ``stepwarm.hook`` and the rest, but ``stepwarm/__init__.py``
never runs. What the plugin reads must not come from it (issue 42's trial:
``STEPWARM_SKIP_IDLE=1`` crashed start-up there on ``stepwarm.__version__``)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import stepwarm
assert not hasattr(stepwarm, "__version__"), "the folder did not shadow the package"
from vllm.config import ModelConfig, VllmConfig
from stepwarm.record import header
from stepwarm.version import __version__
from stepwarm.zoo import write_model
config = VllmConfig(model_config=ModelConfig(model=str(write_model("tiny-llama")),
                                             skip_tokenizer_init=True, max_model_len=256))
print(header(config)["stepwarm"], __version__)
"""


def test_the_recording_header_reads_the_version_under_a_shadowing_folder(tmp_path):
    (tmp_path / "stepwarm").mkdir()
    (tmp_path / "stepwarm" / "README.md").write_text("a clone\n")
    r = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, capture_output=True,
                       text=True, timeout=300)
    if "the folder did not shadow the package" in r.stderr:
        pytest.skip("stepwarm is installed as a regular package here (not editable)")
    if "Failed to infer device type" in r.stderr:  # a release's sources on PYTHONPATH
        pytest.skip("this vLLM's sources find no platform (the version matrix)")
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[-2:] == ["0.1.0", "0.1.0"]
