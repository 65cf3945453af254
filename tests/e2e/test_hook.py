"""The vLLM plugin runs scenarios inside the worker's own start-up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from stepwarm.engine import start_engine
    from stepwarm.runner import live_request_ids

    if __name__ == "__main__":
        engine = start_engine()
        worker = engine.worker
        reports = getattr(worker, "stepwarm_reports", None)
        print("RESULT " + json.dumps({
            "reports": None if reports is None else [r.to_dict() for r in reports],
            "live": sorted(live_request_ids(worker)),
        }))
    """
)


def _start(tmp_path, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    script = tmp_path / "start.py"
    script.write_text(SCRIPT)
    env = {**os.environ, **env_extra}
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600)


def _result(proc: subprocess.CompletedProcess) -> dict:
    lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert lines, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_plugin_runs_scenarios_during_worker_start_up(tmp_path):
    proc = _start(tmp_path, {"STEPWARM_SCENARIOS": "default"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = _result(proc)
    (report,) = result["reports"]
    assert report["plan"] == "default" and report["ok"] and report["cleanup_ran"]
    assert [s["kind"] for s in report["steps"]] == [
        "prefill", "decode", "decode", "decode", "cleanup",
        "prefill", "mixed_prefill_decode", "cleanup",
    ]
    assert report["steps"][0]["num_reqs"] == 8
    assert report["left_in_runner"] == [] and result["live"] == []


def test_plugin_bad_scenario_stops_start_up_with_its_name(tmp_path):
    proc = _start(tmp_path, {"STEPWARM_SCENARIOS": "no-such-scenario"})
    assert proc.returncode != 0
    assert "no-such-scenario" in proc.stderr
