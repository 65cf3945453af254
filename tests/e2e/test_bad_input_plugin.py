"""A deeply nested scenario file through the plugin in a plain engine
start-up: under ``raise`` start-up fails naming the file (it was a
``RecursionError`` naming nothing, even under ``warn``); under ``warn`` it
is logged with the file and the engine serves with no scenario run."""

from __future__ import annotations

import os
import textwrap

import pytest

from stepwarm.scenario import MAX_NESTING
from tests.e2e.helpers import run_script

pytestmark = pytest.mark.e2e

SCRIPT = textwrap.dedent(
    """
    import json

    from stepwarm.engine import start_engine

    if __name__ == "__main__":
        engine = start_engine()
        out = engine.llm.generate([{"prompt_token_ids": [5, 6, 7]}], use_tqdm=False)
        print("RESULT " + json.dumps({
            "reports": getattr(engine.worker, "stepwarm_reports", None),
            "tokens": len(out[0].outputs[0].token_ids)}))
    """
)


@pytest.mark.parametrize("policy", ["raise", "warn"])
def test_a_deeply_nested_scenario_through_the_plugin(tmp_path, policy):
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000 + "]" * 100_000 + "\n")
    script = tmp_path / "start.py"
    script.write_text(SCRIPT)
    proc, result = run_script(script, env={**os.environ, "STEPWARM_SCENARIOS": str(deep),
                                           "STEPWARM_ON_ERROR": policy})
    why = (f"{deep}:1: nested deeper than {MAX_NESTING} levels (arrays, inline tables and "
           f"dotted keys); allowed: at most {MAX_NESTING} (MAX_NESTING, see scenarios/README.md)")
    assert "RecursionError" not in proc.stderr
    if policy == "raise":
        assert proc.returncode != 0 and result is None
        # One paragraph, no traceback (ScenarioExit, as SettingsExit for settings).
        assert proc.stderr.rstrip().endswith(f"stepwarm: {why}") and "Traceback" not in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert f"stepwarm: scenarios will not run (STEPWARM_ON_ERROR=warn): {why}" in proc.stderr
        assert result["tokens"] > 0 and not result["reports"]  # served, no scenario ran
