"""SIGTERM during the plugin's warmup (issue 42 item 23): the step running
finishes, the runner is cleaned up, one line names the step it stopped
before, and the signal then reaches the handler that was there (here one
that does what vLLM's engine core does: ``SystemExit``). One CPU engine in
a fresh process."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.e2e

CHILD = textwrap.dedent(
    """
    import json, signal, sys
    from stepwarm import hook
    from stepwarm.engine import start_engine
    from stepwarm.settings import HookSettings

    if __name__ == "__main__":
        engine = start_engine()

        def vllm_like(signum, frame):  # vLLM's run_engine_core: SIGTERM -> SystemExit
            raise SystemExit(143)

        signal.signal(signal.SIGTERM, vllm_like)
        try:
            reports = hook.warmup(engine.worker, [sys.argv[1], "prefix-hit"],
                                  settings=HookSettings(step_warn_s=0.002, gemm_sizes=False))
            out = {"ended": "returned", "reports": len(reports)}
        except SystemExit as e:
            out = {"ended": "SystemExit", "code": e.code}
        out["left"] = sorted(engine.view.live_request_ids())
        out["handler_back"] = signal.getsignal(signal.SIGTERM) is vllm_like
        print("RESULT " + json.dumps(out), flush=True)
        sys.exit(out.get("code") or 0)
    """
)

LONG = """description = "a prefill of 8 requests, then 200 decodes"
requests.r = { prompt = 60, count = 8, sampling = "greedy" }
steps = [{ kind = "prefill", requests = ["r"] },
         { kind = "decode", requests = ["r"], repeat = 200 }]
"""


def test_sigterm_mid_scenario_stops_at_the_next_step_with_the_runner_cleaned(tmp_path):
    (tmp_path / "child.py").write_text(CHILD)
    (tmp_path / "long.toml").write_text(LONG)
    child = subprocess.Popen([sys.executable, str(tmp_path / "child.py"),
                              str(tmp_path / "long.toml")], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        assert child.stdout is not None
        for line in child.stdout:  # vLLM's log (stepwarm's lines are its children's)
            lines.append(line)
            if "stepwarm: long step " in line and " running for " in line:
                break  # a step of the scenario is running
        t_kill = time.monotonic()
        child.send_signal(signal.SIGTERM)
        rest, err = child.communicate(timeout=120)
        stopped_s = time.monotonic() - t_kill
    finally:
        if child.poll() is None:
            child.kill()
    out = "".join(lines) + rest
    assert child.returncode == 143, out[-3000:] + err[-3000:]
    assert stopped_s < 60  # a step and the cleanup, not the 200 steps left
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result == {"ended": "SystemExit", "code": 143, "left": [], "handler_back": True}
    stops = re.findall(r"stepwarm: SIGTERM: stopped at the step boundary before (.*)$", out, re.M)
    assert len(stops) == 1, stops
    m = re.fullmatch(r"long step (\d+)/202 \((\w+), [^)]*\)+; the runner was cleaned up "
                     r"\(no stepwarm request left\); not run: prefix-hit", stops[0])
    assert m is not None, stops[0]
    assert 1 <= int(m[1]) < 202 and m[2] in ("prefill", "decode")
    assert "prefix-hit: starting" not in out and "Traceback" not in err


FAILS_ON_THE_SIGNAL = CHILD.replace(
    "    signal.signal(signal.SIGTERM, vllm_like)\n",
    "    signal.signal(signal.SIGTERM, vllm_like)\n"
    "    import os, pathlib\n"
    "    marker = pathlib.Path(sys.argv[2])\n"
    "    run = engine.worker.execute_model\n"
    "\n"
    "    def execute_model(scheduler_output):\n"
    "        # the group's SIGTERM also stops the compiler a step waits on\n"
    "        if marker.exists():\n"
    "            marker.unlink()\n"
    "            os.kill(os.getpid(), signal.SIGTERM)\n"
    "            raise RuntimeError('CppCompileError: C++ compile error')\n"
    "        return run(scheduler_output)\n"
    "\n"
    "    engine.worker.execute_model = execute_model\n")


def test_a_step_failing_once_sigterm_came_is_told_as_the_stop(tmp_path):
    """The eleventh trial: a group SIGTERM during a compiling step was told
    as the step's C++ compile failure (the compiler, in the process group,
    got the signal too); it is the stop, told as such, the runner cleaned."""
    assert "def execute_model" in FAILS_ON_THE_SIGNAL
    (tmp_path / "child.py").write_text(FAILS_ON_THE_SIGNAL)
    (tmp_path / "long.toml").write_text(LONG)
    marker = tmp_path / "fail-now"
    child = subprocess.Popen([sys.executable, str(tmp_path / "child.py"),
                              str(tmp_path / "long.toml"), str(marker)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            lines.append(line)
            if "stepwarm: long step " in line and " running for " in line:
                break
        marker.touch()
        rest, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
    out = "".join(lines) + rest
    assert child.returncode == 143, out[-3000:] + err[-3000:]
    result = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    assert result == {"ended": "SystemExit", "code": 143, "left": [], "handler_back": True}
    stops = re.findall(r"stepwarm: SIGTERM: stopped at the step boundary before (.*)$", out, re.M)
    assert stops == [
        "the rest of long: the step running failed once the signal came, as its compiler "
        "process got it too (" + stops[0].split(" process got it too (", 1)[1]], stops
    assert "CppCompileError" in stops[0] and stops[0].endswith(
        "; the runner was cleaned up (no stepwarm request left); not run: prefix-hit")
    assert "failed on the" not in out.replace(stops[0], "")
