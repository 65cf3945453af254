"""The vLLM plugin runs scenarios inside the worker's own start-up."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.e2e.helpers import run_script

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


def _start(tmp_path, scenarios: str):
    script = tmp_path / "start.py"
    script.write_text(SCRIPT)
    return run_script(script, env={**os.environ, "STEPWARM_SCENARIOS": scenarios})


def test_plugin_runs_scenarios_during_worker_start_up(tmp_path):
    proc, result = _start(tmp_path, "default")
    assert proc.returncode == 0 and result is not None, proc.stderr[-4000:]
    (report,) = result["reports"]
    assert report["plan"] == "default" and report["ok"] and report["cleanup_ran"]
    assert [s["kind"] for s in report["steps"]] == [
        "prefill", "decode", "decode", "decode", "cleanup",
        "prefill", "mixed_prefill_decode", "cleanup",
    ]
    assert report["steps"][0]["num_reqs"] == 8
    assert report["left_in_runner"] == [] and result["live"] == []


def test_plugin_bad_scenario_stops_start_up_with_its_name(tmp_path):
    proc, _ = _start(tmp_path, "no-such-scenario")
    assert proc.returncode != 0
    assert "no-such-scenario" in proc.stderr
