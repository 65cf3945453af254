"""``stepwarm run --model tiny-llama --weights seeded --verify``: no Python needed."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_seeded_zoo_weights_verify_equal(tmp_path):
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "stepwarm", "run", "--model", "tiny-llama", "--weights",
         "seeded", "-s", "default", "--verify", "--json", str(out)],
        capture_output=True, text=True, timeout=900,
        env={**__import__("os").environ, "STEPWARM_CACHE": str(tmp_path / "models"),
             "VLLM_CPU_KVCACHE_SPACE": "1", "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # the seeded weights were written and loaded (not vLLM's dummy weights)
    assert (tmp_path / "models" / "tiny-llama-seed0" / "model.safetensors").is_file()
    report = json.loads(out.read_text())
    assert report["profile"]["model"] == str(tmp_path / "models" / "tiny-llama-seed0")
    assert "--verify: stepwarm's steps vs vLLM's own scheduler (greedy)" in proc.stdout
    assert re.search(r"^  default: equal \(\d+ requests, \d+ tokens\)$", proc.stdout, re.M), \
        proc.stdout
    (v,) = report["verify"]
    assert v["scenario"] == "default" and v["differences"] == [] and v["checked"]
