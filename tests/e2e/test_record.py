"""STEPWARM_RECORD under ``vllm.LLM`` and the loop back: a recorded session on
the embedded tiny Llama (tests/e2e/record_session.py, the plugin loaded by
vLLM as under ``vllm serve``) writes exactly the steps vLLM's scheduler sent;
``stepwarm scenario from-record`` reduces it, and ``stepwarm run --verify``
passes on the scenario. Two engine starts (the recording's, run's), about 50 s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from stepwarm.cli import app
from stepwarm.scenario.load import tomllib  # tomli before Python 3.11
from tests.unit.test_from_record import REQUESTS, SESSION, STEPS, session

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]


def test_record_then_scenario_then_verify(tmp_path: Path) -> None:
    rec = tmp_path / "rec.jsonl"
    env = {**os.environ, "STEPWARM_RECORD": str(rec), "PYTHONPATH": str(ROOT)}
    env.pop("STEPWARM_SCENARIOS", None)
    proc = subprocess.run([sys.executable, "-m", "tests.e2e.record_session"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = [json.loads(x) for x in rec.read_text().splitlines()]
    want = [json.loads(x) for x in session().splitlines()]
    got[0]["stepwarm"] = want[0]["stepwarm"]  # the package's version, not the format's
    assert got == want  # every step: scheduled tokens, computed, hits, sampler classes
    assert len(got) == len(SESSION)

    out = tmp_path / "recorded.toml"
    r = CliRunner().invoke(app, ["scenario", "from-record", str(rec), "-o", str(out),
                                 "--model", "tiny-llama"])
    assert r.exit_code == 0, r.output
    data = tomllib.loads(out.read_text())
    assert (data["steps"], data["requests"]) == (STEPS, REQUESTS)

    env.pop("STEPWARM_RECORD")
    run = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", str(out), "--verify"],
                         cwd=ROOT, env={**env, "COLUMNS": "200"}, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "recorded: equal (9 requests, 13 tokens)" in run.stdout
    assert "scenario recorded: 12 steps in" in run.stdout
