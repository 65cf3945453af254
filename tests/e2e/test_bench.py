"""``stepwarm bench`` on the CPU engine: the same planned shapes every repeat, nothing
left in the runner, the random state kept; and ``--gate``'s exit status when B is
made slower (a ``sitecustomize`` on B's path delays the worker's ``execute_model``)."""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import textwrap

from stepwarm.bench import measure
from stepwarm.scenario import expand, load
from tests.e2e.helpers import cpu_worker_patch, patched_pythonpath
from tests.helpers import unwrapped


def test_every_repeat_sends_the_planned_shapes_and_leaves_nothing(engine, profile):
    plan = expand(load("default"), profile)
    random.seed(5)
    before = random.random()
    random.seed(5)
    rep = measure(engine.view, plan, profile, repeat=3, warmup=1, cuda=False)
    assert random.random() == before
    assert [s.index for s in rep.steps] == [s.index for s in plan.steps]
    for got, planned in zip(rep.steps, plan.steps):
        assert (got.num_reqs, got.num_tokens) == (len(planned.req_ids),
                                                  planned.total_num_scheduled_tokens)
        assert len(got.host_ms) == 3 and all(t > 0 for t in got.host_ms) and got.device_ms is None
    assert engine.view.live_request_ids() == set()
    assert rep.setup["runner"] == profile.runner and rep.setup["device"] == "cpu"
    assert rep.setup["time"] == "host"
    # the backend the layers run, as vLLM chose it (not "vLLM's default")
    assert rep.setup["attention_backend"] == "CPU_ATTN"


#: B's CPU worker: 50 ms more a step.
SLOW = cpu_worker_patch("execute_model", """
    def wrapped(original, self, *args, **kwargs):
        time.sleep(0.05)
        return original(self, *args, **kwargs)
""")


def test_the_gate_fails_a_b_slower_beyond_the_noise(tmp_path):
    path = patched_pythonpath(tmp_path / "slow", SLOW)
    out = tmp_path / "ab.json"
    proc = subprocess.run(
        [sys.executable, "-m", "stepwarm", "bench", "default", "--repeat", "2", "--warmup", "1",
         "--rounds", "2", "--processes", "2", "--against-env", f"PYTHONPATH={path}", "--gate", "20",
         "--json", str(out)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "120"})
    assert proc.returncode == 4, proc.stdout[-3000:] + proc.stderr[-3000:]
    gated = [ln for ln in proc.stderr.splitlines() if ln.startswith("gate: step ")]
    assert gated and all("beyond the noise" in ln for ln in gated)
    assert "B / A per step" in proc.stdout
    import json

    data = json.loads(out.read_text())
    a, b = data["configurations"]["A"], data["configurations"]["B"]
    assert a["repeat"] == b["repeat"] == 4  # 2 pairs of processes x 2 repeats
    assert "B / A per step (A: as given; B: PYTHONPATH=" in unwrapped(proc.stdout)  # (wraps)
    assert proc.stderr.count("bench: pair ") == 2 and "pair 2 of 2: starting A and B" in proc.stderr
    assert all(len(r["per_process"]) == 2 and r["drift"] >= 0 for r in data["ratios"])
    assert [s["num_tokens"] for s in a["steps"]] == [s["num_tokens"] for s in b["steps"]]
    # the cleanup steps (0.2 ms under A) carry B's 50 ms delay whole
    cleanups = [r for r in data["ratios"] if r["label"] == "cleanup"]
    assert len(cleanups) == 2 and all(r["low"] > 10 for r in cleanups)


SWEEP = textwrap.dedent('''
    [requests.short]
    prompt = 16
    count = 4
    sampling = "greedy"
    [requests.long]
    prompt = 32
    count = 2
    sampling = "greedy"
    [[steps]]
    kind = "prefill"
    requests = ["short"]
    [[steps]]
    kind = "decode"
    requests = ["short"]
    batch = { values = [1, 2, 4] }
    [[steps]]
    kind = "prefill"
    requests = ["long"]
    [[steps]]
    kind = "decode"
    requests = ["long"]
    batch = { values = [1, 2] }
''')


def test_a_sweep_plotted_and_one_step_traced(tmp_path):
    """A batch x context sweep: the CSV's rows, the SVG's sweep lines, and a
    Chrome trace of one step (the prefill of the two long prompts) holding
    aten ops; the report's lines as with any bench."""
    import csv
    import json

    scenario = tmp_path / "sweep.toml"
    scenario.write_text(SWEEP)
    out = {k: tmp_path / f"out.{k}" for k in ("csv", "svg")}
    trace = tmp_path / "step4.json"
    proc = subprocess.run(
        [sys.executable, "-m", "stepwarm", "bench", str(scenario), "--repeat", "2", "--warmup",
         "1", "--csv", str(out["csv"]), "--plot", str(out["svg"]), "--trace", "4",
         "--trace-file", str(trace)],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "80"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = list(csv.DictReader(out["csv"].open()))
    assert [(r["kind"], r["reqs"], r["tokens"], r["context_tokens"]) for r in rows] == [
        ("prefill", "4", "64", "16"), ("decode", "1", "1", "17"), ("decode", "2", "2", "18"),
        ("decode", "4", "4", "19"), ("prefill", "2", "64", "32"), ("decode", "1", "1", "33"),
        ("decode", "2", "2", "34"), ("cleanup", "0", "0", "0")]
    svg = out["svg"].read_text()
    assert "A ctx 17" in svg and "A ctx 33" in svg and "batch sweeps" in svg
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(str(e.get("name", "")).startswith("aten::") for e in events)
    assert f"trace of step 4 (prefill long[0],long[1] x rest) written to {trace}" in " ".join(
        proc.stdout.split())


def test_trace_past_the_plan_is_refused_before_a_step_runs(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "stepwarm", "bench", "default", "--repeat", "1", "--trace", "999",
         "--trace-file", str(tmp_path / "t.json")],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2
    assert "--trace 999: default plans steps 0 to " in proc.stderr
    assert not (tmp_path / "t.json").exists()


def test_two_configurations_that_plan_apart_are_refused_before_measuring():
    """B with another max_num_seqs plans other steps: exit 2 once both
    children have planned, before a step is measured (no table printed)."""
    proc = subprocess.run(
        [sys.executable, "-m", "stepwarm", "bench", "default", "--repeat", "2", "--warmup", "1",
         "--rounds", "1", "--against-e", "max_num_seqs=4"],
        capture_output=True, text=True, timeout=900, env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 2, proc.stdout[-3000:] + proc.stderr[-3000:]
    err = " ".join(proc.stderr.split())
    assert "error: bench: the two configurations planned different steps: step 0 is (8, 16, 0) " \
           "in A, (4, 8, 0) in B (requests, tokens, drafts)" in err, err
    assert "repeats after" not in proc.stdout


def test_a_scenario_the_runner_skips_is_exit_3_with_the_reason_not_0_steps(tmp_path):
    """A first-contact trial: `bench spec-decode` (no speculator) measured 0
    steps and exited 0, so a --gate passed on nothing; B skipping gave
    "planned different steps: A 5 steps, B 0"."""
    def bench(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "stepwarm", "bench", *args, "--repeat", "1",
                               "--warmup", "0", "--json", str(tmp_path / "r.json")],
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "COLUMNS": "200"})

    alone = bench("spec-decode")
    assert alone.returncode == 3, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert "error: bench: spec-decode: skipped on this runner: needs speculator: runner has " \
           "num_speculative_steps 0: nothing to measure" in " ".join(alone.stderr.split())
    b_skips = bench("mixed-prefill-decode", "--rounds", "1", "--against-e", "max_num_seqs=1")
    assert b_skips.returncode == 3, b_skips.stdout[-3000:] + b_skips.stderr[-3000:]
    err = " ".join(b_skips.stderr.split())
    assert "error: bench: mixed-prefill-decode: B: skipped on its runner: requires " in err, err
    assert "nothing to measure" in err and "planned different steps" not in err
    assert not (tmp_path / "r.json").exists()


def test_ctrl_c_while_measuring_says_where_and_that_the_runner_was_cleaned(tmp_path):
    """Fresh trial (issue 42), defect 10: Ctrl-C in bench exited 130 with
    nothing said. Now one line: the scenario, the repeats done, the runner's
    state after the driver's cleanup, and that no report was written."""
    import signal
    import time

    out = tmp_path / "b.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepwarm", "bench", "default", "--repeat", "100000", "--warmup",
         "1", "--json", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        env={**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "300"})
    assert proc.stderr is not None
    for line in proc.stderr:  # until it measures
        if line.startswith("bench: default: 1 warm-up + 100000 measured repeats of "):
            break
    time.sleep(2)
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, rest + err[-3000:]
    last = err.strip().splitlines()[-1]
    m = re.fullmatch(r"interrupted: bench stopped in default after (\d+) of 100001 repeats "
                     r"\(1 warm-up\); cleanup ran, the runner holds no stepwarm request; no "
                     r"report was written \(--json " + re.escape(str(out)) + r"\)", last)
    assert m and int(m[1]) < 100001, last
    assert "Traceback" not in err and not out.exists()
