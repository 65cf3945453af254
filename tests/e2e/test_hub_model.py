"""``stepwarm run --model ORG/NAME@REVISION`` from a local Hugging Face cache, offline."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from stepwarm.zoo import write_model
from tests.hub_cache import hub_env, write_hub_cache

pytestmark = pytest.mark.e2e


def test_run_a_hub_id_from_the_offline_cache(tmp_path):
    home, out = tmp_path / "hf", tmp_path / "report.json"
    snapshot = write_hub_cache(home, "stepwarm-test/tiny-llama",
                               write_model("tiny-llama", tmp_path / "src"), refs=("main", "v1"))
    proc = subprocess.run(
        [sys.executable, "-m", "stepwarm", "run", "--model", "stepwarm-test/tiny-llama@v1",
         "-s", "default", "-e", "max_num_seqs=8", "-e", "max_num_batched_tokens=512",
         "-e", "max_model_len=512", "--json", str(out)],
        capture_output=True, text=True, timeout=600,
        env={**hub_env(home), "VLLM_CPU_KVCACHE_SPACE": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ok: 1 scenario(s), 8 steps" in proc.stdout
    report = json.loads(out.read_text())
    # vLLM resolved the id (revision v1) to the cached snapshot itself.
    assert report["profile"]["model"] == str(snapshot)
    assert report["profile"]["max_num_seqs"] == 8
    (default,) = report["scenarios"]
    assert default["ok"] and default["left_in_runner"] == []
    assert [s["num_scheduled_tokens"] for s in default["steps"]] == [16, 8, 2, 1, 0, 2, 16, 0]
    # block_tables: the first step's 8 new requests, one fresh block each
    first = default["block_tables"][0]
    assert [(r["request"], r["groups"][0]["table"], r["groups"][0]["allocated"])
            for r in first["requests"]] == [(f"req[{i}]", [i + 1], [i + 1]) for i in range(8)]
