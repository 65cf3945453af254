"""What the CLI prints while scenarios run (no engine: step results as the
driver reports them)."""

from __future__ import annotations

import io
import logging
import re

import pytest
from rich.console import Console

from stepwarm.console import ScenarioProgress, print_labelled, route_vllm_log
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


def test_two_lines_per_step_when_not_a_terminal():
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
    assert re.fullmatch(r"  \[0/8\] prefill  prefill 8 x 2 \(at \d+\.\d s\)",
                        first.splitlines()[1])
    # the blocks as show names them: allocated from the pool, prefix-cache hits
    assert first.splitlines()[2] == (
        "        reqs 8  tokens 16  spec 0  alloc blk 8  hit blk 0  sampled 8  1.2 ms")
    assert len(lines) == 9 and lines[5].startswith("  [2/8] decode ")
    assert lines[7].startswith("  [3/8] decode ")
    assert lines[8] == "        reqs 1  tokens 1  spec 0  alloc blk -  hit blk -  sampled -  FAILED"


def test_live_table_on_a_terminal_holds_every_row_and_the_count():
    plan = expand(load("default"), tiny_profile())
    out, buf = _console(True)
    with ScenarioProgress(plan, "v1", 1, out) as progress:
        for r in _results(plan):
            progress.step(r)
    text = buf.getvalue()
    assert "scenario default (v1 runner): 8/8 steps" in text
    assert text.count("1.2") >= 8 and "mixed_prefill_decode" in text


def _recorded() -> list[StepResult]:
    """Steps as the driver reports them: mixed-prefill-decode on the tiny
    Llama, then rows with the widest numbers a big engine gives (two KV cache
    groups, 8192-token prefills, slow steps)."""
    plan = expand(load("mixed-prefill-decode"), tiny_profile())
    rows = list(_results(plan))
    rows.append(StepResult(index=5, kind="spec_decode", label="decode all with 3 drafts each "
                           "and a long tail of request names r[0..255]", num_reqs=256,
                           num_scheduled_tokens=8192, num_spec_tokens=768,
                           new_blocks=[1024, 37], held_blocks={}, wall_ms=38123.44,
                           sampled={f"r{i}": 1 for i in range(256)}))
    return rows


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.split("│")[1:-1]]


@pytest.mark.parametrize("width", [100, 120, 200])
def test_the_live_table_fits_the_terminal_and_keeps_every_number(width):
    """At 100-200 columns every line fits and every cell is shown whole: the
    numbers on the row's first line, the label wrapped at spaces over its
    lines, no word split (the eleventh trial: ``mixed_prefill_de / code``)."""
    from rich.cells import cell_len

    from stepwarm.console import StepTable, step_row

    table = StepTable("scenario mixed-prefill-decode (v1 runner): 6/6 steps, 38.2 s")
    recorded = _recorded()
    for r in recorded:
        table.add_row(*step_row(r, 1))
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=True, color_system=None,
            markup=False).print(table)
    lines = buf.getvalue().splitlines()
    assert all(cell_len(line) <= width for line in lines), [cell_len(x) for x in lines]
    body = [line for line in lines if line.startswith("│")]
    starts = [i for i, line in enumerate(body) if _cells(line)[0]]
    assert len(starts) == len(recorded)
    merged = width < 120  # kind and step share a column below ~120 columns
    for r, i, j in zip(recorded, starts, starts[1:] + [len(body)]):
        cells = _cells(body[i])
        row = step_row(r, 1)
        assert cells[0] == row[0] and cells[-7:] == row[3:]
        # Labels wrap at spaces: joined by spaces, each is whole.
        labels = [_cells(line)[1:2 if merged else 3] for line in body[i:j]]
        text = [" ".join(w for w in col if w) for col in zip(*labels)]
        expected = [f"{r.kind}: {r.label}"] if merged else [r.kind, r.label]
        assert text == expected
    header = " ".join(lines)
    assert ("kind: step" in header) == merged and "1024/37" in header and "38123.4" in header


def _step_table_lines(width: int) -> list[str]:
    """The recorded steps' table (scenario x) drawn at ``width`` columns."""
    from stepwarm.console import StepTable, step_row

    table = StepTable("scenario x")
    for r in _recorded():
        table.add_row(*step_row(r, 1))
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=True, color_system=None,
            markup=False).print(table)
    return buf.getvalue().splitlines()


def test_where_a_label_word_would_be_split_the_rows_come_as_lines():
    """At 80 columns the merged label column would be 16 wide, narrower than
    ``mixed_prefill_decode:``: the line form, every word whole."""
    lines = _step_table_lines(80)
    assert max(map(len, lines)) <= 80 and not any("┃" in ln for ln in lines)
    assert "  [3/?] mixed_prefill_decode  decode dec[0],dec[1],dec[2] + prefill long x rest" \
        in lines


def test_too_narrow_for_a_table_the_rows_come_as_lines_that_fit():
    lines = _step_table_lines(50)
    assert max(map(len, lines)) <= 50 and not any("┃" in ln for ln in lines)
    assert "  [5/?] spec_decode  decode all with 3 drafts each" in lines
    assert "        reqs 256  tokens 8192  spec 768" in lines
    assert "        alloc blk 1024/37  hit blk 0  sampled 256" in lines
    assert "        38123.4 ms" in lines


def test_the_line_form_fits_80_columns_and_keeps_the_whole_label():
    from stepwarm.console import step_lines, step_row

    r = _recorded()[-1]
    lines = step_lines(step_row(r, 2), of=6, at_s=120.25)
    assert lines == [
        "  [5/6] spec_decode  decode all with 3 drafts each and a long tail of request",
        "        names r[0..255] (at 120.2 s)",
        "        reqs 256  tokens 8192  spec 768  alloc blk 1024/37  hit blk 0/0",
        "        sampled 256  38123.4 ms",
    ]
    assert max(map(len, lines)) <= 80


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


def _phases(messages: list[str]) -> list[str]:
    import logging

    from stepwarm.console import EnginePhases

    seen: list[str] = []
    log = logging.getLogger("vllm.test_phases")
    handler = EnginePhases(seen.append)
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        for msg in messages:
            log.info(msg, "/tmp/m") if "%s" in msg else log.info(msg)
    finally:
        log.removeHandler(handler)
    return seen


def test_engine_phases_follow_vllms_start_up_log():
    # A CPU worker with enforce_eager and VLLM_CPU_KVCACHE_SPACE: no warmup.
    assert _phases(["Starting to load model %s...", "Initializing model took 0.36 seconds",
                    "CPU KV cache size: 3,666,816 tokens", "unrelated",
                    "Starting to load model %s...",
                    "init engine (profile, create kv cache, warmup model) took 10.73 s"]) == [
        "loading the model", "profiling memory", "initializing the KV cache", "engine ready"]


@pytest.mark.parametrize("worker, lines, warmup_after", [
    ("CPU, compiling", ["Warming up model for the compilation...", "Warming up done.",
                        "CPU KV cache size: 1 tokens"], "profiling memory"),
    ("GPU V1 eager", ["GPU KV cache size: 1 tokens", "JIT kernel warmup starting."],
     "initializing the KV cache"),
    ("GPU compiled", ["GPU KV cache size: 1 tokens", "Compile and warming up model for size 512",
                      "JIT kernel warmup starting.", "Capturing CUDA graphs (mixed prefill-decode"],
     "initializing the KV cache"),
    ("GPU V2 eager", ["GPU KV cache size: 1 tokens"], None),
])
def test_vllms_own_warmup_is_a_phase_only_when_vllm_logged_one(worker, lines, warmup_after):
    seen = _phases(["Starting to load model %s...", "Model loading took 1 GiB", *lines,
                    "init engine (profile, create kv cache, warmup model) took 1 s"])
    assert ("vLLM's own warmup" in seen) == (warmup_after is not None)
    assert seen.count("vLLM's own warmup") <= 1 and seen[-1] == "engine ready"
    if warmup_after:
        assert seen[seen.index("vLLM's own warmup") - 1] == warmup_after
    assert "initializing the KV cache" in seen


def _verify_results(diff):
    """One --verify result of each kind: equal, a difference (``diff``),
    skipped, a pooling error, a failed run."""
    from stepwarm.verify import VerifyReport

    return [
        ("default", VerifyReport(plan="default", checked={"a": 2, "b": 3})),
        ("preempt-resume", VerifyReport(plan="preempt-resume", checked={"b": 5},
                                        differences=(diff,))),
        ("mamba-align", VerifyReport(plan="mamba-align", skipped="vLLM's own scheduler failed")),
        ("pooling", VerifyReport(plan="pooling", embedding_error={"p": 0.0})),
        ("x", "StepFailed: step 2 failed"),
    ]


def test_verify_table_shows_each_scenario_and_the_first_differing_step():
    from stepwarm.console import verify_table
    from stepwarm.verify import Divergence

    diff = Divergence(request="b", step=3, step_kind="resume", step_label="resume b",
                      position=4, stepwarm=(7,), reference=(9,))
    table = verify_table(_verify_results(diff))
    buf = io.StringIO()
    Console(file=buf, width=200, markup=False).print(table)
    lines = buf.getvalue().splitlines()
    row = lambda *words: any(all(w in line for w in words) for line in lines)  # noqa: E731
    assert row("default", "equal", "2 requests, 5 tokens")
    assert row("preempt-resume", "DIFFER", "1 request, 5 tokens")
    assert row("b", "3 (resume: resume b)", "4", "[7]", "[9]")
    assert row("mamba-align", "skipped", "vLLM's own scheduler failed")
    assert row("pooling", "equal", "1 embedded", "max |diff| 0.00e+00")
    assert row("x", "error", "StepFailed: step 2 failed")


def test_an_all_equal_verify_table_at_80_columns_keeps_scenario_names_whole():
    """The ninth trial: at 80 columns 'prefix-hit' was cut to 'prefix-hi' /
    't' beside four empty columns. An all-equal run shows the columns it
    fills, each name on one line."""
    from stepwarm.console import verify_table
    from stepwarm.verify import VerifyReport

    results = [(n, VerifyReport(plan=n, checked={"a": 2, "b": 3, "c": 1, "d": 4}))
               for n in ("good1", "prefix-hit", "mixed-prefill-decode")]
    buf = io.StringIO()
    Console(file=buf, width=80, markup=False).print(verify_table(results))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    assert [ln.split("│")[1].strip() for ln in lines if ln.startswith("│")] == [
        "good1", "prefix-hit", "mixed-prefill-decode"]
    assert "first differing step" not in buf.getvalue()
    assert any("prefix-hit" in ln and "equal" in ln and "4 requests, 10 tokens" in ln
               for ln in lines)
    # the title unpadded (the eleventh trial: padded to the table's width,
    # its continuation at column 0)
    assert lines[0] == "--verify: stepwarm's steps vs vLLM's own scheduler (greedy)"
    buf = io.StringIO()
    Console(file=buf, width=50, markup=False).print(verify_table(results))
    assert buf.getvalue().splitlines()[:2] == [
        "--verify: stepwarm's steps vs vLLM's own scheduler", "  (greedy)"]


def _step(index: int, kind: str, wall_ms: float, started_at: float) -> StepResult:
    return StepResult(index=index, kind=kind, label=f"{kind} a", num_reqs=1,
                      num_scheduled_tokens=8, num_spec_tokens=0, new_blocks=[1],
                      held_blocks={}, wall_ms=wall_ms, started_at=started_at,
                      ended_at=started_at + wall_ms / 1000)


def test_a_slow_step_says_what_compiled_in_it(tmp_path, monkeypatch):
    """A real cache scan over the Inductor cache in use: an output module
    written while step 0 ran names its kernels on the line after the step;
    a slow step with no compile says so; a fast one gets no line."""
    import os
    import time

    from stepwarm.console import SlowSteps
    from stepwarm.coverage.detectors import Detectors

    for var, d in (("TORCHINDUCTOR_CACHE_DIR", "inductor"), ("TRITON_CACHE_DIR", "triton"),
                   ("VLLM_CACHE_ROOT", "vllm")):
        monkeypatch.setenv(var, str(tmp_path / d))
    (tmp_path / "inductor" / "ab").mkdir(parents=True)
    old = tmp_path / "inductor" / "ab" / "old.py"  # there before: not this run's compile
    old.write_text("cpp_fused_old_0 = async_compile.cpp_pybinding(['float*'], '''...''')\n")
    detectors = Detectors.watch()
    t0 = time.time() - 100
    out_py = tmp_path / "inductor" / "ab" / "cab.py"
    out_py.write_text("cpp_fused_add_0 = async_compile.cpp_pybinding(['float*'], '''...''')\n"
                      "cpp_fused_mul_1 = async_compile.cpp_pybinding(['float*'], '''...''')\n")
    os.utime(out_py, (t0 + 5, t0 + 5))  # written while step 0 ran
    os.utime(old, (t0 + 5, t0 + 5))
    slow = SlowSteps(detectors, threshold_ms=1000)
    plan = expand(load("default"), tiny_profile())
    out, buf = _console(False)
    with ScenarioProgress(plan, "v1", 1, out, slow=slow) as progress:
        progress.step(_step(0, "prefill", 31234.5, t0))
        progress.step(_step(1, "decode", 12.0, t0 + 40))
        progress.step(_step(2, "decode", 2500.0, t0 + 41))
        progress.step(_step(3, "mixed_prefill_decode", 1800.0, t0 + 50))
    lines = buf.getvalue().splitlines()
    where = ", ".join(detectors.available)
    # piped: each note wrapped at 80 columns as the step rows are, continued 4 spaces in
    assert max(map(len, lines)) <= 80, lines
    assert lines[3:5] == ["  step 0 (prefill) took 31.2 s: compiled 2 inductor kernels (cpp_fused_add_0,",
                          "      cpp_fused_mul_1; seen by cache)"]
    assert lines[5].startswith("  [1/8] decode ") and lines[7].startswith("  [2/8] decode ")
    notes = [" ".join(x.strip() for x in lines[i:j]) for i, j in ((9, 10), (12, None))]
    assert notes == [f"step 2 (decode) took 2.5 s: no compile seen ({where})",
                     f"step 3 (mixed_prefill_decode) took 1.8 s: first call: no compile "
                     f"seen ({where})"], lines
    detectors.stop()
    assert out_py.exists()  # the user's cache is kept


def test_replay_progress_names_each_request_once_and_no_numbers():
    """`coverage` prints a request's numbers once, in the report's table: the
    progress is the name alone (a line each when not a terminal, a status
    line that goes away on one)."""
    from types import SimpleNamespace

    from stepwarm.console import ReplayProgress

    out, buf = _console(False)
    progress = ReplayProgress(2, out)
    progress.start()
    for name in ("greedy", "top_k"):
        progress.request(SimpleNamespace(name=name, first_ms=12.5, second_ms=3.25))
    progress.stop()
    assert buf.getvalue() == "  [1/2] greedy\n  [2/2] top_k\n"
    term, tbuf = _console(True)
    progress = ReplayProgress(2, term)
    progress.start()
    progress.request(SimpleNamespace(name="greedy", first_ms=12.5, second_ms=3.25))
    progress.stop()
    assert "12.5" not in tbuf.getvalue() and "[1/2]" not in tbuf.getvalue()


def _plan_table(name: str):
    from stepwarm.console import plan_table
    from stepwarm.scenario import plans_for
    from stepwarm.tables import step_blocks

    prof = tiny_profile()
    (plan,) = plans_for([name], prof)
    return plan, plan_table(plan, len(prof.kv_cache_groups), step_blocks(plan, prof))


@pytest.mark.parametrize("width", [80, 100, 120, 200])
@pytest.mark.parametrize("name", ["mixed-prefill-decode", "default", "preempt-resume"])
def test_show_fits_the_terminal_and_keeps_every_label_and_number(name, width):
    """``show``'s plan table at 80-200 columns: no line wider; every step's
    label, requests and numbers there whole (as a table, or as lines when
    the numbers and labels do not fit beside each other)."""
    from rich.cells import cell_len

    plan, table = _plan_table(name)
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=True, color_system=None,
            markup=False).print(table)
    text = buf.getvalue()
    lines = text.splitlines()
    assert all(cell_len(line) <= width for line in lines), [cell_len(x) for x in lines]
    squeezed = re.sub(r"[\s│┃]", "", text)  # wrapped cells read back in order, per column
    for row, st in zip(table.rows, plan.steps):
        assert row[2] == st.label and row[4] == str(st.total_num_scheduled_tokens)
        if "┏" not in text:  # the line form: each step's lines in full
            head = f"  [{st.index}/{len(plan.steps)}] {st.kind}  "
            assert any(line.startswith(head) for line in lines), head
            assert st.label.replace(" ", "") in squeezed
            assert f"tokens {row[4]}  spec {row[5]}" in text
    assert ("┏" in text) == (width >= 100)  # at 80 the table's numbers leave too little room


def test_show_rows_name_the_step_and_its_requests_as_runs():
    plan, table = _plan_table("mixed-prefill-decode")
    assert [row[:4] for row in table.rows] == [
        ["0", "prefill", "prefill dec[0],dec[1],dec[2] x rest", "dec[0..2]"],
        ["1", "mixed_prefill_decode", "decode dec[0] + prefill pre x rest", "dec[0] pre"],
        ["2", "finish", "finish pre", "finish: pre"],
        ["3", "mixed_prefill_decode", "decode dec[0],dec[1],dec[2] + prefill long x rest",
         "dec[0..2] long"],
        ["4", "cleanup", "cleanup (auto)", "finish: dec[0..2] long"]]
    # held blk: every live request's table after the step (docs/block-tables.md),
    # not only the step's rows: dec[0..2] still hold 3 beside pre (issue 42,
    # fifth trial)
    assert [row[4:] for row in table.rows] == [
        ["6", "0", "3", "0", "0", "3", "3"], ["16", "0", "1", "0", "0", "4", "2"],
        ["0", "0", "0", "0", "0", "3", "-"], ["512", "0", "4", "0", "0", "7", "4"],
        ["0", "0", "0", "0", "0", "0", "-"]]


def test_request_runs_come_from_the_requests_names_not_their_text():
    from stepwarm.console import request_runs
    from stepwarm.plan import Plan, PlannedRequest

    def req(rid, name="", index=None):
        return PlannedRequest(req_id=rid, prompt_len=1, name=name, index=index)

    plan = Plan(name="p", steps=(), requests=(
        req("r0", "a", 0), req("r1", "a", 1), req("r2", "a", 2), req("r3", "b"),
        req("r4", "a[3]"), req("r5", "a", 4), req("x")))
    # "a[3]" is a request named so (a table of one), no member of a: no run with a[4]
    assert request_runs(plan, ["r0", "r1", "r2", "r3", "r4", "r5", "x", "gone"]) == \
        "a[0..2] b a[3] a[4] x gone"
    assert request_runs(plan, ["r1", "r0"]) == "a[1] a[0]"


def test_verify_lines_fit_80_columns_and_keep_every_token():
    from stepwarm.console import verify_lines
    from stepwarm.verify import Divergence

    diff = Divergence(request="b", step=3, step_kind="resume", step_label="resume b",
                      position=4, stepwarm=tuple(range(1000, 1030)), reference=(9,))
    lines = verify_lines(_verify_results(diff))
    assert max(map(len, lines)) <= 80
    assert lines[:4] == [
        "--verify: stepwarm's steps vs vLLM's own scheduler (greedy; pooling: LLM.embed)",
        "  default: equal (2 requests, 5 tokens)",
        "  preempt-resume: DIFFER (1 request, 5 tokens)",
        "    b: first differs at step 3 (resume: resume b), position 4"]
    tokens = " ".join(lines[4:]).split("stepwarm sampled ")[1].split(" vLLM sampled")[0]
    assert [int(t) for t in re.findall(r"\d+", tokens)] == list(range(1000, 1030))
    assert "      vLLM sampled [9]" in lines
    assert lines[-3:] == ["  mamba-align: skipped: vLLM's own scheduler failed",
                          "  pooling: equal (1 embedded, LLM.embed, max |diff| 0.00e+00)",
                          "  x: error: StepFailed: step 2 failed"]


def test_piped_output_takes_columns_where_set():
    """Piped, tables are 160 columns wide, or as wide as ``COLUMNS`` says (a
    new user's `COLUMNS=80 stepwarm list | less`)."""
    import os
    import subprocess
    import sys

    def widest(env: dict[str, str]) -> int:
        out = subprocess.run([sys.executable, "-m", "stepwarm", "list"], capture_output=True,
                             text=True, timeout=120, env=env).stdout
        return max(len(line) for line in out.splitlines())

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    assert widest(env) == 160
    assert widest({**env, "COLUMNS": "80"}) == 80
    assert widest({**env, "COLUMNS": "wide"}) == 160  # not a width: ignored


MESSAGE = ("/tmp/a-rather-long-directory-name/scenario.toml: steps[2].requests: unknown request "
           "'b'; allowed: the [requests] tables a, c\nerror: /tmp/x.toml: prompt: not a number")


def test_error_lines_wrap_at_spaces_under_their_label_on_a_terminal():
    buf = io.StringIO()
    print_labelled("error:", MESSAGE, Console(file=buf, width=40, force_terminal=True,
                                              color_system=None, markup=False))
    assert buf.getvalue().splitlines() == [
        "error: /tmp/a-rather-long-directory-name/scenario.toml:",  # a path is left whole
        "       steps[2].requests: unknown",
        "       request 'b'; allowed: the",
        "       [requests] tables a, c",
        "error: /tmp/x.toml: prompt: not a number",  # 40 columns: fits
    ]


def test_error_lines_wrap_at_80_columns_when_piped(monkeypatch):
    """Piped with no COLUMNS, error lines wrap at 80 columns as run's own
    lines do, whatever the console's width (a new user's trial: they did not)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    print_labelled("error:", MESSAGE + "\n" + "x.toml: 3 more error(s) not shown " + "y" * 60,
                   Console(file=buf, width=160, force_terminal=False, markup=False))
    assert buf.getvalue().splitlines() == [
        "error: /tmp/a-rather-long-directory-name/scenario.toml: steps[2].requests:",
        "       unknown request 'b'; allowed: the [requests] tables a, c",
        "error: /tmp/x.toml: prompt: not a number",
        "x.toml: 3 more error(s) not shown",  # a line of its own: wrapped, not labelled
        "  " + "y" * 60,
    ]


def test_check_error_and_profile_lines_wrap_at_80_columns_when_piped(tmp_path):
    """``stepwarm check`` piped (COLUMNS unset): the ``profile:`` line on
    stdout and the ``error:`` line on stderr wrap at 80 columns, exit 2."""
    import os
    import subprocess
    import sys

    bad = tmp_path / "a-rather-long-directory-name-for-scenarios" / "negative.toml"
    bad.parent.mkdir()
    bad.write_text('description = "neg"\n[requests.a]\nprompt = -5\n'
                   '[[steps]]\nkind = "prefill"\nrequests = ["a"]\n')
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "check", str(bad)],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 2
    assert proc.stdout.splitlines() == [
        "profile: /tmp/stepwarm-models/tiny-llama (v1 runner): max_num_seqs 8,",
        "  max_num_batched_tokens 512, max_model_len 512, num_spec_steps 0, 15154 blocks,",
        "  groups: full_attention(block_size=128)"]
    assert proc.stderr == (f"error: {bad}:3:\n       request 'a', field 'prompt': prompt -5 is "
                           "out of range; allowed: >= 1\n"
                           f"{bad}:\n  the steps were checked only as far as they do not depend "
                           "on the requests above\n  that failed (a); not checked: step 0, "
                           "which selects them; fix the errors above\n  and check again\n")


def test_runs_own_lines_wrap_at_80_columns_when_piped():
    """Piped with no COLUMNS, the skip lines, the summary and its per-reason
    lines wrap at 80 columns as the step rows do, continuation lines
    indented (issue 42 item 4: they reached 145 columns)."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    proc = subprocess.run([sys.executable, "-m", "stepwarm", "run", "-s", "spec-decode", "-s",
                           "sampler-spec-decode", "--allow-skip"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert (proc.returncode, proc.stderr) == (0, ""), proc.stderr
    assert proc.stdout.splitlines() == [
        "scenario spec-decode: skipped: needs speculator: no speculative_config in the",
        "  engine arguments (give one with -e speculative_config=JSON)",
        "scenario sampler-spec-decode: skipped: needs speculator: no speculative_config",
        "  in the engine arguments (give one with -e speculative_config=JSON)",
        "ok: 0 scenario(s), 0 steps in 0 ms, 2 skipped (by reason below); no engine",
        "  started",
        "  2 skipped: needs speculator: no speculative_config in the engine arguments",
        "    (give one with -e speculative_config=JSON)"]


def test_print_wrapped_keeps_words_whole_and_styles_the_label(monkeypatch):
    from stepwarm.console import print_wrapped

    monkeypatch.delenv("COLUMNS", raising=False)
    out, buf = _console(False)  # piped: 80 columns, whatever the console's width
    print_wrapped("engine up in 41.3 s: v1 runner, vllm 0.32.0, 15154 blocks, groups: "
                  "full_attention(block_size=128), sliding_window(block_size=128)", out)
    print_wrapped("ok: " + "x" * 90, out, label_style="bold green")
    assert buf.getvalue().splitlines() == [
        "engine up in 41.3 s: v1 runner, vllm 0.32.0, 15154 blocks, groups:",
        "  full_attention(block_size=128), sliding_window(block_size=128)",
        "ok:", "  " + "x" * 90]  # a word longer than a line is left whole
    out, buf = _console(True)  # a terminal: its width (here 160)
    print_wrapped("a " * 70, out)
    assert len(buf.getvalue().splitlines()) == 1


def test_runs_block_columns_are_shows_by_name_and_value():
    """``run``'s step rows count blocks as ``show`` does, under its names:
    ``alloc blk`` (from the pool) and ``hit blk`` (prefix-cache hits), not a
    ``new blk`` that was their sum (issue 42 item 8)."""
    from stepwarm.console import COLUMNS, PLAN_COLUMNS, plan_table, step_row
    from stepwarm.tables import step_blocks

    profile = tiny_profile()
    plan = expand(load("prefix-hit"), profile)
    shown = plan_table(plan, 1, step_blocks(plan, profile))
    at = [c.header for c in PLAN_COLUMNS].index
    run = [c.header for c in COLUMNS]
    assert run[6:8] == ["alloc blk", "hit blk"] and "new blk" not in run
    rows = [step_row(r, 1, st) for r, st in zip(_results(plan), plan.steps)]
    assert [r[6:8] for r in rows] == [[row[at("alloc blk")], row[at("hit blk")]]
                                      for row in shown.rows]
    assert [r[6:8] for r in rows][:4] == [["2", "2"], ["0", "0"], ["0", "0"], ["1", "2"]]


def test_each_error_of_one_files_list_is_labelled_a_note_is_not(monkeypatch):
    """A file's errors, one a line (``FILE:LINE: ...``), each get the label
    and hang under it; a note naming the file without a line does not (the
    fifth new-user trial: only the first error was labelled)."""
    monkeypatch.delenv("COLUMNS", raising=False)
    buf = io.StringIO()
    message = ("x.toml:2: request 'a', field 'promt': unknown key 'promt' (did you mean "
               "'prompt'?); allowed keys: count, prompt\n"
               "x.toml:7: step 0 (prefill), field 'requests': unknown request 'c'\n"
               "x.toml: the steps were checked only as far as they do not depend on the "
               "requests above that failed (a)\n"
               "error: -e foo: not a vllm.LLM or EngineArgs keyword")
    print_labelled("error:", message, Console(file=buf, width=160, force_terminal=False,
                                              markup=False))
    assert buf.getvalue().splitlines() == [
        "error: x.toml:2: request 'a', field 'promt': unknown key 'promt' (did you mean",
        "       'prompt'?); allowed keys: count, prompt",
        "error: x.toml:7: step 0 (prefill), field 'requests': unknown request 'c'",
        "x.toml: the steps were checked only as far as they do not depend on the requests",
        "  above that failed (a)",
        "error: -e foo: not a vllm.LLM or EngineArgs keyword",
    ]


def test_a_repeated_vllm_warning_is_shown_once_errors_always():
    from stepwarm.console import OncePerMessage

    once = OncePerMessage()

    def rec(level, msg, *args, name="vllm.v1.worker.cpu_worker"):
        return logging.LogRecord(name, level, "cpu_worker.py", 140, msg, args, None)

    skip = "CPU backend doesn't allow to use `torch.set_num_threads` after the thread binding"
    assert [once.filter(rec(logging.WARNING, skip)) for _ in range(5)] == [True] + [False] * 4
    assert once.filter(rec(logging.WARNING, "libiomp is %s", "missing"))
    assert not once.filter(rec(logging.WARNING, "libiomp is %s", "missing"))
    assert once.filter(rec(logging.WARNING, "libiomp is %s", "found"))  # other text
    assert once.filter(rec(logging.WARNING, skip, name="vllm.other"))  # other logger
    assert [once.filter(rec(logging.ERROR, "boom")) for _ in range(2)] == [True, True]


def test_a_value_is_never_wrapped_apart_from_its_unit():
    """At 80 columns (and any other width) ``78.9 s``, ``1441 ms``, ``5 %``
    stay on one line (a new user's trial: coverage's summary split them)."""
    from stepwarm.console import wrapped_text

    text = ("stepwarm: start-up 78.9 s (stepwarm's scenarios 0.97 s), 52 kernel(s) compiled "
            "at start-up; traffic: 50 request(s), 1 compile(s), first-call excess 1441 ms, "
            "5 % of 2 MiB")
    for width in range(20, 100):
        rows = str(wrapped_text(text, width)).split("\n")
        assert " ".join(r.strip() for r in rows) == text
        for row in rows:
            assert not re.search(r"\d$", row) or row.endswith(("52", "50", "1", "of 2")), (width, row)
            assert not re.match(r"\s*(ms|s|MiB|%)\b", row), (width, row)
    buf = io.StringIO()
    print_labelled("error:", "took 46.8 s, " * 8, Console(file=buf, width=80, force_terminal=True,
                                                          color_system=None, markup=False))
    assert all(not row.rstrip().endswith("46.8") for row in buf.getvalue().splitlines())


def test_a_label_wider_than_a_line_breaks_after_its_commas():
    """A step label listing long request names (no space in it) wraps after
    its commas, indented, each line within 80 columns (a new user's trial:
    ``show`` folded it mid-name at column 80, the rest at column 0)."""
    from stepwarm.console import step_lines

    names = ",".join(f"very_long_request_name_number_one[{i}]" for i in range(3))
    row = ["0", "chunked_prefill", f"chunked prefill {names} x 128", "3", "384", "0", "3",
           "0", "0", "12.5"]
    lines = step_lines(row, of=6, width=80)
    assert lines[:3] == [
        "  [0/6] chunked_prefill  chunked prefill very_long_request_name_number_one[0],",
        "        very_long_request_name_number_one[1],",
        "        very_long_request_name_number_one[2] x 128"]
    assert all(len(line) <= 80 for line in lines)
    # short labels keep their commas' words whole, as before
    short = step_lines(["1", "decode", "decode dec[0],dec[1],dec[2]", "3", "3", "0", "0", "0",
                        "3", "1.0"], of=6, width=80)
    assert short[0] == "  [1/6] decode  decode dec[0],dec[1],dec[2]"


def test_each_invalid_json_line_of_a_traffic_file_is_labelled():
    """``FILE:LINE:COLUMN:`` places (a traffic file's JSON errors) are one
    file's list too: each line labelled (a new user's trial: the second was not)."""
    buf = io.StringIO()
    print_labelled("error:", "t.jsonl:1:1: invalid JSON: Expecting value\n"
                   "t.jsonl:2:1: invalid JSON: Expecting value",
                   Console(file=buf, width=80, force_terminal=False, markup=False))
    assert buf.getvalue().splitlines() == ["error: t.jsonl:1:1: invalid JSON: Expecting value",
                                           "error: t.jsonl:2:1: invalid JSON: Expecting value"]


def test_a_label_of_a_request_range_breaks_after_its_dots():
    """``a[0]..b[1]`` wider than a line breaks after ``..``, indented (the
    seventh trial: ``show`` folded it mid-name at column 80)."""
    from stepwarm.console import step_lines

    label = ("prefill very_long_request_name_number_one[0]..very_long_request_name_number_two[1] "
             "(5) x rest")
    lines = step_lines(["0", "prefill", label, "5", "500", "0", "5", "0", "0", "3.0"], of=4,
                       width=80)
    assert lines[:2] == ["  [0/4] prefill  prefill very_long_request_name_number_one[0]..",
                         "        very_long_request_name_number_two[1] (5) x rest"]
    assert all(len(line) <= 80 for line in lines)


def test_the_live_form_is_chosen_for_every_planned_label_from_the_first_row():
    """The twelfth trial: at 80 columns the live display was a table for
    the first steps and redrew itself as lines when a long label came."""
    from stepwarm.console import StepTable, step_row

    recorded = _recorded()
    planned = [(r.kind, r.label) for r in recorded]
    for given, form in (([], "table"), (planned, "lines")):
        table = StepTable("scenario x", planned=given)
        table.add_row(*step_row(recorded[2], 1))  # finish: short words
        buf = io.StringIO()
        Console(file=buf, width=80, force_terminal=True, color_system=None,
                markup=False).print(table)
        assert ("┃" in buf.getvalue()) == (form == "table"), buf.getvalue()


def test_wide_characters_are_wrapped_by_the_cells_they_take():
    """A CJK label takes two cells a character: wrapped by characters, its
    line ran past 80 columns and the terminal folded the rest to column 0
    (twelfth trial, item 2). Each line fits, the continuation is indented,
    spaces inside a line are kept."""
    from rich.cells import cell_len

    from stepwarm.console import step_lines, wrap_cells

    label = "预填充 两个 请求 每个 二十个 词元 这是 一个 很长 的 标签 用来 测试 换行 宽度"
    lines = step_lines(["0", "prefill", label, "2", "40"], of=3, width=80)
    assert [cell_len(x) for x in lines[:2]] == [78, 22]
    assert lines[1] == "        测试 换行 宽度"
    assert wrap_cells("  ab  cd 宽宽宽 e", 9, "    ") == ["  ab  cd", "    宽宽宽", "    e"]
    assert wrap_cells("x" * 12 + " y", 5, " ") == ["x" * 12, " y"]  # a long word whole
    assert wrap_cells("", 5) == [] and wrap_cells("   ", 5) == []
