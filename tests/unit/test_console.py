"""What the CLI prints while scenarios run (no engine: step results as the
driver reports them)."""

from __future__ import annotations

import io
import re

from rich.console import Console

from stepwarm.console import ScenarioProgress, route_vllm_log
from stepwarm.driver import StepResult
from stepwarm.profile import tiny_profile
from stepwarm.scenario import expand, load


def _results(plan):
    for st in plan.steps:
        yield StepResult(index=st.index, kind=st.kind, label=st.label, num_reqs=len(st.scheduled),
                         num_scheduled_tokens=st.total_num_scheduled_tokens, num_spec_tokens=0,
                         new_blocks=list(st.new_block_counts), held_blocks={}, wall_ms=1.25,
                         sampled={r: 1 for r in st.req_ids} if st.sample else None)


def _console(terminal: bool) -> tuple[Console, io.StringIO]:
    buf = io.StringIO()
    return Console(file=buf, force_terminal=terminal, width=160, markup=False,
                   highlight=False, color_system=None), buf


def test_one_line_per_step_when_not_a_terminal():
    plan = expand(load("default"), tiny_profile())
    out, buf = _console(False)
    with ScenarioProgress(plan, "v1", 1, out) as progress:
        results = list(_results(plan))
        progress.step(results[0])
        first = buf.getvalue()  # printed before the next step runs
        for r in results[1:3]:
            progress.step(r)
        progress.failed(plan.steps[3])
    lines = buf.getvalue().splitlines()
    assert first.splitlines()[0] == "scenario default (v1 runner): 8 steps"
    assert re.fullmatch(
        r"  \[1/8\] prefill              prefill 8 x 2                            reqs   8  tokens"
        r"    16  spec   0  new blk     8  sampled   8  1\.2 ms  \(at \d+\.\d s\)",
        first.splitlines()[1])
    assert len(lines) == 5 and lines[3].startswith("  [3/8] decode ")
    assert lines[4].startswith("  [4/8] decode ") and "FAILED  (at " in lines[4]


def test_live_table_on_a_terminal_holds_every_row_and_the_count():
    plan = expand(load("default"), tiny_profile())
    out, buf = _console(True)
    with ScenarioProgress(plan, "v1", 1, out) as progress:
        for r in _results(plan):
            progress.step(r)
    text = buf.getvalue()
    assert "scenario default (v1 runner): 8/8 steps" in text
    assert text.count("1.2") >= 8 and "mixed_prefill_decode" in text


def test_vllm_log_goes_to_stderr_at_the_chosen_level(monkeypatch, tmp_path):
    import json
    import os

    for var in ("VLLM_LOGGING_LEVEL", "VLLM_LOGGING_CONFIG_PATH"):
        monkeypatch.delenv(var, raising=False)
    assert route_vllm_log(0, str(tmp_path)) == "WARNING"
    assert os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"
    config = json.loads((tmp_path / "vllm-logging.json").read_text())
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"] == str(tmp_path / "vllm-logging.json")
    assert config["handlers"]["vllm"]["level"] == "WARNING"
    assert config["handlers"]["vllm"]["stream"] == "ext://sys.stderr"
    # vLLM's loggers stay at INFO so that the phase handler sees start-up.
    assert config["loggers"]["vllm"] == {"handlers": ["vllm", "stepwarm_phases"],
                                         "level": "INFO", "propagate": False}
    for verbosity, level in ((1, "INFO"), (-1, "ERROR")):
        monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
        assert route_vllm_log(verbosity, str(tmp_path)) == level
        assert json.loads((tmp_path / "vllm-logging.json").read_text())["handlers"]["vllm"]["level"] == level
    # The user's level stays without -v/-q; the user's own config file is kept.
    monkeypatch.delenv("VLLM_LOGGING_CONFIG_PATH")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "debug")
    assert route_vllm_log(0, str(tmp_path)) == "DEBUG"
    assert json.loads((tmp_path / "vllm-logging.json").read_text())["loggers"]["vllm"]["level"] == "DEBUG"
    monkeypatch.setenv("VLLM_LOGGING_CONFIG_PATH", "/etc/my-logging.json")
    assert route_vllm_log(1, str(tmp_path)) == "INFO"
    assert os.environ["VLLM_LOGGING_CONFIG_PATH"] == "/etc/my-logging.json"


def test_engine_phases_follow_vllms_start_up_log():
    import logging

    from stepwarm.console import EnginePhases

    seen = []
    log = logging.getLogger("vllm.test_phases")
    handler = EnginePhases(seen.append)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        for msg in ("Starting to load model %s...", "Initializing model took 0.36 seconds",
                    "CPU KV cache size: 3,666,816 tokens", "unrelated",
                    "Starting to load model %s...",
                    "init engine (profile, create kv cache, warmup model) took 10.73 s"):
            log.info(msg, "/tmp/m") if "%s" in msg else log.info(msg)
    finally:
        log.removeHandler(handler)
    assert seen == ["loading the model", "profiling memory", "vLLM's own warmup", "engine ready"]


def test_verify_table_shows_each_scenario_and_the_first_differing_step():
    from stepwarm.console import verify_table
    from stepwarm.verify import Divergence, VerifyReport

    diff = Divergence(request="b", step=3, step_kind="resume", step_label="resume b",
                      position=4, stepwarm=(7,), reference=(9,))
    table = verify_table([
        ("default", VerifyReport(plan="default", checked={"a": 2, "b": 3})),
        ("preempt-resume", VerifyReport(plan="preempt-resume", checked={"b": 5},
                                        differences=(diff,))),
        ("mamba-align", VerifyReport(plan="mamba-align", skipped="vLLM's own scheduler failed")),
        ("pooling", VerifyReport(plan="pooling", embedding_error={"p": 0.0})),
        ("x", "StepFailed: step 2 failed"),
    ])
    buf = io.StringIO()
    Console(file=buf, width=200, markup=False).print(table)
    lines = buf.getvalue().splitlines()
    row = lambda *words: any(all(w in line for w in words) for line in lines)  # noqa: E731
    assert row("default", "equal", "2 requests, 5 tokens")
    assert row("preempt-resume", "DIFFER", "1 requests, 5 tokens")
    assert row("b", "3 (resume: resume b)", "4", "[7]", "[9]")
    assert row("mamba-align", "skipped", "vLLM's own scheduler failed")
    assert row("pooling", "equal", "1 embedded", "max |diff| 0.00e+00")
    assert row("x", "error", "StepFailed: step 2 failed")
