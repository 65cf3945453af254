"""`stepwarm run`, the main job, as a user runs it (a fresh process)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def _stepwarm(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "stepwarm", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_run_prints_step_tables_and_writes_json(tmp_path):
    out = tmp_path / "report.json"
    proc = _stepwarm("run", "-s", "default", "-s", "mixed-prefill-decode", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "scenario default (v1 runner)" in proc.stdout
    assert "ok: 2 scenario(s)" in proc.stdout
    report = json.loads(out.read_text())
    assert report["profile"]["runner"] == "v1"
    default, mixed = report["scenarios"]
    assert default["plan"] == "default" and default["ok"] and default["left_in_runner"] == []
    assert [s["kind"] for s in default["steps"]] == [
        "prefill", "decode", "decode", "decode", "cleanup",
        "prefill", "mixed_prefill_decode", "cleanup",
    ]
    assert [s["num_scheduled_tokens"] for s in default["steps"]] == [16, 8, 2, 1, 0, 2, 16, 0]
    assert default["steps"][0]["new_blocks"] == [8]
    assert all(s["wall_ms"] > 0 for s in default["steps"])
    # The report's profile expands the scenario to the same steps, offline.
    from stepwarm.profile import RunnerProfile
    from stepwarm.scenario import plans_for

    (plan,) = plans_for(["mixed-prefill-decode"], RunnerProfile.model_validate(report["profile"]))
    assert mixed["ok"] and mixed["left_in_runner"] == []
    assert [s["num_scheduled_tokens"] for s in mixed["steps"]] == [
        st.total_num_scheduled_tokens for st in plan.steps
    ]


def test_run_rejects_a_model_dir_without_config(tmp_path):
    proc = _stepwarm("run", "--model", str(tmp_path), timeout=120)
    assert proc.returncode == 2
    assert f"--model {tmp_path}: not a model directory (no config.json)" in proc.stderr


def test_run_rejects_a_malformed_engine_arg():
    proc = _stepwarm("run", "-e", "max_num_seqs", timeout=120)
    assert proc.returncode == 2
    assert "expected KEY=VALUE" in proc.stderr


def test_run_rejects_a_bad_scenario_file_before_starting_vllm(tmp_path):
    bad = tmp_path / "typo.toml"
    bad.write_text('[requests.a]\nprompt = 8\n\n[[steps]]\nkind = "prefill"\nreqests = ["a"]\n')
    proc = _stepwarm("run", "-s", "default", "-s", str(bad), timeout=60)
    assert proc.returncode == 2
    assert str(bad) in proc.stderr and "reqests" in proc.stderr and "requests" in proc.stderr
    assert "engine up" not in proc.stdout  # nothing started, nothing ran
