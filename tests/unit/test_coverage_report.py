"""``stepwarm coverage`` without an engine: the cache-scan detector on real
files, merging detectors, start-up attribution to phases and scenario steps,
the verdict, JSON round trip and the SVG timeline."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from stepwarm.coverage.detectors import CacheScan, CompileEvent, JitMonitorLog, merge
from stepwarm.coverage.report import CoverageReport, group_startup
from stepwarm.coverage.startup import Where, attribute
from stepwarm.coverage.timeline import timeline_svg
from stepwarm.driver import RunReport, StepResult

INDUCTOR_PY = """
from torch._inductor.runtime import triton_heuristics
triton_per_fused_ge_sum_0 = async_compile.triton('triton_per_fused_ge_sum_0', '''
...''')
cpp_fused_ge_sum_1 = async_compile.cpp_pybinding(['const float*'], '''...''')
async_compile.wait(globals())
"""


def _touch(path, text="{}", mtime=None):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def test_cache_scan_sees_new_triton_and_inductor_kernels_once(tmp_path, monkeypatch):
    for var in ("TRITON_CACHE_DIR", "VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.delenv(var, raising=False)
    # a fixed idle-record directory a run before filled is not this run's
    monkeypatch.setenv("STEPWARM_CACHE_DIR", str(tmp_path / "old-record"))
    scan = CacheScan.use_fresh_dirs(tmp_path)
    assert "STEPWARM_CACHE_DIR" not in os.environ
    assert os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "triton_cache_dir")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "torchinductor_cache_dir")
    triton = tmp_path / "triton_cache_dir"
    _touch(triton / "AB12" / "__grp___topk_topp_kernel.json", mtime=100.0)
    _touch(triton / "AB12" / "_topk_topp_kernel.cubin")
    assert scan.poll() == [CompileEvent("cache", "_topk_topp_kernel", "triton", 100.0)]
    assert scan.poll() == []  # seen once
    inductor = tmp_path / "torchinductor_cache_dir"
    _touch(inductor / "ca" / "ca5fo.py", INDUCTOR_PY, mtime=200.0)
    # Inductor's Triton kernel also leaves a group file: one compile, not two.
    _touch(tmp_path / "vllm_cache_root" / "x" / "__grp__triton_per_fused_ge_sum_0.json",
           mtime=200.5)
    _touch(triton / "CD34" / "__grp___zero_kv_blocks_kernel.json", mtime=150.0)
    assert [(e.name, e.kind, e.at) for e in scan.poll()] == [
        ("_zero_kv_blocks_kernel", "triton", 150.0),
        ("cpp_fused_ge_sum_1", "inductor", 200.0),
        ("triton_per_fused_ge_sum_0", "inductor", 200.0),
    ]
    scan.remove()  # a directory the user gave is left alone
    assert (triton / "AB12" / "__grp___topk_topp_kernel.json").is_file()
    own = CacheScan.use_fresh_dirs()  # a temporary one is removed
    assert own.root.is_dir() and os.environ["VLLM_CACHE_ROOT"].startswith(str(own.root))
    own.remove()
    assert not own.root.exists()


def test_vllm_monitor_lines_become_events():
    import logging

    handler = JitMonitorLog()
    record = logging.LogRecord(
        "vllm.utils.jit_monitor", logging.WARNING, "jit_monitor.py", 1,
        "%s %s during inference: %s%s. This causes a latency spike; consider extending warmup "
        "to cover this shape/config.",
        ("Triton", "kernel JIT compilation", "_topk_log_softmax_kernel",
         " (constexprs={BLOCK=1024})"), None)
    handler.handle(record)
    handler.handle(logging.LogRecord("vllm.utils.jit_monitor", logging.WARNING, "x", 1,
                                     "Kernel JIT monitor activated", None, None))
    assert handler.poll() == [CompileEvent("jit-monitor", "_topk_log_softmax_kernel", "triton",
                                           record.created)]
    assert handler.poll() == []


def test_merge_counts_a_kernel_seen_by_several_detectors_once():
    events = [CompileEvent("cache", "k", "triton", 1.0), CompileEvent("triton-hook", "k", "triton", 1.0),
              CompileEvent("triton-hook", "k", "triton", 2.0),
              CompileEvent("cache", "cpp_fused_0", "inductor", 3.0)]
    assert merge(events) == {"cpp_fused_0": 1, "k": 2}


def _step(index, kind, start, end):
    return StepResult(index=index, kind=kind, label=f"{kind} [0]", num_reqs=1,
                      num_scheduled_tokens=1, num_spec_tokens=0, new_blocks=[0], held_blocks={},
                      wall_ms=(end - start) * 1e3, started_at=start, ended_at=end)


def _reports():
    return [RunReport(plan="default", runner="v2", model="m", wall_ms=600.0,
                      started_at=50.0, ended_at=50.6,
                      steps=[_step(0, "prefill", 50.0, 50.3), _step(1, "decode", 50.31, 50.5)])]


def test_startup_compiles_go_to_the_phase_or_step_that_ran_them():
    phases = [("loading the model", 10.0), ("vLLM's own warmup", 40.0), ("engine ready", 51.0)]
    ev = [CompileEvent("triton-hook", n, "triton", t) for n, t in [
        ("early", 5.0), ("load", 12.0), ("warm", 45.0), ("s0", 50.2), ("s1", 50.505),
        ("clean", 50.58), ("late", 52.0)]]
    got = [str(w) for _, w in attribute(ev, phases, _reports())]
    assert got == ["vLLM start-up", "loading the model", "vLLM's own warmup",
                   "default step 0 (prefill: prefill [0])", "default step 1 (decode: decode [0])",
                   "default cleanup", "engine ready"]
    grouped = group_startup(attribute(ev[3:5] + ev[3:4], phases, _reports()), t0=0.0)
    assert [(g.where, g.kernels, g.step) for g in grouped] == [
        ("default step 0 (prefill: prefill [0])", {"s0": 2}, 0),
        ("default step 1 (decode: decode [0])", {"s1": 1}, 1)]
    assert Where("vllm", "x") != Where("stepwarm", "x", 0)


def test_a_variant_compiled_in_a_thread_goes_to_the_step_whose_launch_it_skipped():
    from stepwarm.deferred_compile import DeferredCompile

    reports = _reports()
    reports[0].deferred_compiles = [DeferredCompile("_topk_topp_kernel", 0, key="KEY16"),
                                    DeferredCompile("_topk_topp_kernel", 1, key="KEY17")]
    ev = [CompileEvent("triton-hook", "_topk_topp_kernel", "triton", 50.58, "KEY17"),  # ended in cleanup
          CompileEvent("triton-hook", "_topk_topp_kernel", "triton", 50.505, "KEY16"),
          CompileEvent("triton-hook", "other", "triton", 50.58, "KEY9"),
          CompileEvent("cache", "_topk_topp_kernel", "triton", 50.504),  # no variant: the nearest
          CompileEvent("cache", "_topk_topp_kernel", "triton", 52.0),  # too far from both: by time
          CompileEvent("cache", "_zero_kv_blocks_kernel", "triton", 50.58)]
    got = [str(w) for _, w in attribute(ev, [("engine ready", 51.0)], reports)]
    assert got == ["default step 1 (decode: decode [0])", "default step 0 (prefill: prefill [0])",
                   "default cleanup", "default step 0 (prefill: prefill [0])", "engine ready",
                   "default cleanup"]
    grouped = group_startup(attribute(ev[:2] + ev[3:4], [], reports), t0=0.0)
    assert [(g.where, g.kernels) for g in grouped] == [  # hook + cache: one compile
        ("default step 0 (prefill: prefill [0])", {"_topk_topp_kernel": 1}),
        ("default step 1 (decode: decode [0])", {"_topk_topp_kernel": 1})]


def test_long_variant_keys_that_differ_past_the_cut_stay_apart():
    """fused_moe_kernel's key is over 400 characters of argument types before
    its block sizes: two of its variants, cut at 400, would be one, and a
    variant stepwarm compiled would pass for the one vLLM's warmup compiled."""
    from stepwarm.coverage.detectors import MAX_VARIANT, variant_text
    from stepwarm.deferred_compile import DeferredCompile

    args = "[" + ", ".join(["('i32', 'D')"] * 40) + "]"
    m64 = args + "{'BLOCK_SIZE_M': 64, 'num_warps': 4}"
    m16 = args + "{'BLOCK_SIZE_M': 16, 'num_warps': 4}"
    a, b = variant_text(m64), variant_text(m16)
    assert len(args) > MAX_VARIANT and a != b and len(a) == len(b) == MAX_VARIANT
    assert a[:MAX_VARIANT - 17] == b[:MAX_VARIANT - 17] == m64[:MAX_VARIANT - 17]
    assert a[MAX_VARIANT - 17] == "#" and a == variant_text(m64)
    assert variant_text("KEY16") == "KEY16"  # short keys as they are
    # A compile in a thread finds its step by the same text.
    reports = _reports()
    reports[0].deferred_compiles = [DeferredCompile("fused_moe_kernel", 1, key=m16)]
    ev = [CompileEvent("triton-hook", "fused_moe_kernel", "triton", 52.0, variant_text(m16)),
          CompileEvent("triton-hook", "fused_moe_kernel", "triton", 52.0, variant_text(m64))]
    assert [str(w) for _, w in attribute(ev, [("engine ready", 51.0)], reports)] == [
        "default step 1 (decode: decode [0])", "engine ready"]


def _request(name, first, second, compiles=None, error=None):
    return {"line": 1, "name": name, "at_s": 60.0, "count": 1, "prompt_len": 7,
            "sampling": {"temperature": 0.0}, "first_ms": first, "second_ms": second,
            "ratio": first / second if second else 1.0, "excess_ms": max(0.0, first - second),
            "compiles_first": compiles or {}, "compiles_second": {}, "events": [],
            "tokens": [4, 4], "error": error}


def _report(**kw):
    rep = CoverageReport(mode="stepwarm", scenarios=["default"], traffic="t.jsonl",
                         vllm_version="0.26.0", runner="v2", model="m", device="gpu",
                         detectors=["cache"], threshold=1.2, min_excess_ms=10.0,
                         phases=[["loading the model", 1.0]], **kw)
    rep.startup_compiles = group_startup(
        attribute([CompileEvent("cache", "s0", "triton", 50.2)], [], _reports()), t0=0.0)
    rep.scenario_runs = [{"plan": "default", "ok": True, "skipped": "", "wall_ms": 600.0,
                          "start_s": 50.0, "end_s": 50.6,
                          "steps": [[0, "prefill: prefill [0]", 50.0, 50.3]]}]
    return rep


def test_the_verdict_compiles_ratio_with_floor_and_errors(tmp_path):
    rep = _report()
    rep.requests = [_request("warm", 20.0, 19.0), _request("small", 15.0, 10.0),
                    _request("slow", 300.0, 20.0)]
    assert [rep.flagged(r) for r in rep.requests] == ["", "", "ratio > 1.2: unexplained"]
    assert rep.exit_code == 1 and rep.excess_ms == 286.0
    # what the first run did besides compiling names the cause; still flagged
    slow = _request("slow", 300.0, 20.0)
    slow["side_effects_first"] = {"imports": 3, "imported": ["a.b", "c", "d"], "reserved_mib": 64.0}
    slow["side_effects_second"] = {}
    assert rep.flagged(slow) == "ratio > 1.2: 3 module(s) imported (a.b, c); allocator +64 MiB"
    rep.requests = [_request("warm", 20.0, 19.0),
                    _request("compiled", 21.0, 20.0, {"_topk_log_softmax_kernel": 1})]
    assert [rep.flagged(r) for r in rep.requests] == ["", "compiled"]
    assert rep.traffic_compiles == 1 and rep.exit_code == 1
    rep.requests = [_request("warm", 20.0, 19.0)]
    assert rep.exit_code == 0
    rep.threshold = None  # the ratio reported, not gating (the CPU build's default)
    rep.requests = [_request("slow", 30000.0, 20.0)]
    assert rep.flagged(rep.requests[0]) == "" and rep.exit_code == 0
    rep.threshold = 1.2
    rep.requests = [_request("warm", 20.0, 19.0)]
    rep.requests.append(_request("broken", 0.0, 0.0, error="RuntimeError: boom"))
    assert rep.exit_code == 1
    path = tmp_path / "r.json"
    rep.save(path)
    back = CoverageReport.load(path)
    assert back.to_dict() == rep.to_dict()
    assert back.to_dict()["summary"] == {"traffic_compiles": 0, "excess_ms": 1.0,
                                         "startup_compiles": 1,
                                         "flagged": {"broken": "error"}, "exit_code": 1}


def test_timeline_is_svg_with_a_column_per_phase_step_and_request():
    rep = _report()
    rep.requests = [_request("compiled", 21.0, 20.0, {"_topk_log_softmax_kernel": 1})]
    svg = timeline_svg(rep)
    root = ET.fromstring(svg)
    titles = [t.text for t in root.iter("{http://www.w3.org/2000/svg}title")]
    assert titles == ["vLLM: loading the model at 1.00 s: 0 compile(s)",
                      "default: 0 prefill: prefill [0] at 50.00 s: 1 compile(s): s0",
                      "traffic: compiled at 60.00 s: 1 compile(s): _topk_log_softmax_kernel"]


def test_compare_children_get_every_argument_but_the_parents_outputs():
    from stepwarm.coverage.compare import child_args

    assert child_args(["t.jsonl", "--compare", "-s", "default", "--json", "o.json",
                       "--timeline=t.svg", "-e", "max_num_seqs=4", "--threshold", "2"]) == [
        "t.jsonl", "-s", "default", "-e", "max_num_seqs=4", "--threshold", "2"]


def _h200_reports(tmp_path):
    """The baseline and stepwarm reports of the H200 run in campaigns/results."""
    both = json.loads((Path(__file__).parents[2] / "campaigns" / "results"
                       / "h200-coverage-llama-v2-pow2-compare.json").read_text())
    out = []
    for mode in ("baseline", "stepwarm"):
        (tmp_path / f"{mode}.json").write_text(json.dumps(both[mode]))
        out.append(CoverageReport.load(tmp_path / f"{mode}.json"))
    return out


@pytest.mark.parametrize("width", [80, 100])
def test_coverage_in_a_narrow_terminal_is_lines_that_cut_no_number_or_kernel(tmp_path, width):
    import io

    from rich.console import Console

    from stepwarm.coverage.report import print_comparison, print_report

    base, sw = _h200_reports(tmp_path)
    buf = io.StringIO()
    out = Console(file=buf, width=width, force_terminal=True, color_system=None)
    print_report(base, out)
    print_comparison(base, sw, out)
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    words = " ".join(lines).split()
    # every request's numbers and every kernel name whole, on some line
    logprobs9 = next(r for r in base.requests if r["name"] == "logprobs 9")
    assert f"{logprobs9['first_ms']:.1f}" in words and "_topk_log_softmax_kernel;" in words
    assert sum(1 for w in words if w.startswith("_topk_topp_kernel")) >= 5
    assert "triton_per_fused__to_copy_embedding_rms_norm_0" in words and "…" not in "".join(lines)
    assert f"{sw.startup_s:.1f}" in " ".join(lines)
    assert not any(ln.lstrip().startswith("│") and "request" in ln for ln in lines[:5])


def test_coverage_at_80_columns_indents_continuations_and_labels_the_time(tmp_path):
    """At 80 columns a wrapped line goes on indented under its own start, not
    at column 0, and a start-up compile's time says what it is (issue 42
    item 6); a verdict keeps its colour across the wrap."""
    import io

    from rich.console import Console

    from stepwarm.coverage.report import print_comparison, print_report

    base, sw = _h200_reports(tmp_path)
    buf = io.StringIO()
    out = Console(file=buf, width=80, force_terminal=True, color_system=None)
    print_report(base, out)
    print_comparison(base, sw, out)
    lines = [ln for ln in buf.getvalue().splitlines() if ln[:1] not in "┏┃┡│└"]  # tables
    starts = ("baseline: ", "stepwarm: ", "baseline (vLLM's warmup) vs", "start-up: ",
              "baseline start-up: ", "stepwarm's start-up compiles", "totals")
    assert [ln for ln in lines if not ln.startswith(" ") and not ln.startswith(starts)] == []
    compiles = [ln for ln in lines if ln.startswith("  at ")]
    assert [ln.split(",")[0] for ln in compiles] == [
        f"  at {c.at_s:.1f} s" for c in base.startup_compiles]
    assert "(at: seconds since the engine started)" in " ".join(" ".join(lines).split())
    # a request's continuation lines are indented 4 (its own line starts at 2)
    i = next(i for i, ln in enumerate(lines) if ln.startswith("  13 top-p, batch 16:"))
    assert lines[i + 1].startswith("    ") and not lines[i + 1].startswith("     ")
    buf = io.StringIO()
    print_report(base, Console(file=buf, width=80, force_terminal=True, color_system="standard"))
    red = buf.getvalue().split("  1 greedy, prompt 1 ", 1)[1].split("\n  2 ", 1)[0]
    assert "\x1b[1;31mratio > 1.2: unexplained; outside the worker +15.6 ms of the\x1b[0m\n    " \
        "\x1b[1;31m17.2 ms excess\x1b[0m" in red


def test_coverage_in_a_wide_terminal_is_the_table(tmp_path):
    import io

    from rich.console import Console

    from stepwarm.coverage.report import print_report

    base, _ = _h200_reports(tmp_path)
    buf = io.StringIO()
    print_report(base, Console(file=buf, width=200, force_terminal=True, color_system=None))
    text = buf.getvalue()
    assert "┃ line ┃ request" in text and "verdict" in text


def test_each_request_carries_its_verdict_and_skips_are_printed_with_their_reason():
    import io

    from rich.console import Console

    from stepwarm.coverage.report import print_report

    rep = _report()
    rep.requests = [_request("warm", 20.0, 19.0), _request("slow", 300.0, 20.0)]
    rep.scenario_runs.append({"plan": "spec-decode", "ok": True, "wall_ms": 0.0,
                              "skipped": "needs speculator: runner has num_speculative_steps 0",
                              "start_s": None, "end_s": None, "steps": []})
    d = rep.to_dict()
    assert [r["verdict"] for r in d["requests"]] == ["", "ratio > 1.2: unexplained"]
    assert "verdict" not in rep.requests[0]  # the report's own data is left alone
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=80, color_system=None))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    assert " ".join(" ".join(lines[:2]).split()) == (
        "stepwarm: skipped spec-decode: needs speculator: runner has num_speculative_steps 0")


def test_notes_are_printed_before_the_tables_and_kept_in_the_json():
    import io

    from rich.console import Console

    from stepwarm.coverage.report import print_report

    rep = _report()
    rep.requests = [_request("warm", 20.0, 19.0)]
    rep.notes = ["t.jsonl:2: prefix: 8 tokens is less than one prefix-cache block of this "
                 "engine (16 tokens): no prefix hit"]
    buf = io.StringIO()
    print_report(rep, Console(file=buf, width=200, color_system=None))
    assert buf.getvalue().splitlines()[0] == "stepwarm: note: " + rep.notes[0]
    assert CoverageReport.from_dict(rep.to_dict()).notes == rep.notes


def test_a_slow_first_run_that_a_later_run_matched_is_noise_not_flagged():
    rep = _report()
    # 35 ms first, 19 ms second: the gate passes (> 1.2x and > 10 ms)...
    slow = _request("prefix hit, batch 5", 35.0, 19.0)
    slow["steady_ms"] = [20.0, 36.0, 21.0]  # ...but a later run took as long
    assert rep.flagged(slow) == "" and rep.noise(slow) == "noise: a later run took 36.0 ms"
    # later runs all fast: the first run's excess is real and stays flagged
    real = _request("prefix hit, batch 5", 35.0, 19.0)
    real["steady_ms"] = [20.0, 22.0, 21.0]
    assert rep.noise(real) == "" and rep.flagged(real) == "ratio > 1.2: unexplained"
    # a later run within the ratio (1.2 x 26 = 31.2 >= 30): noise
    near = _request("near", 30.0, 19.0)
    near["steady_ms"] = [26.0]
    assert rep.flagged(near) == "" and rep.noise(near) == "noise: a later run took 26.0 ms"
    # 30 - 22 = 8 ms is under the floor, but 30 > 1.2 x 22: still a first-call cost
    near["steady_ms"] = [22.0]
    assert rep.noise(near) == "" and rep.flagged(near) == "ratio > 1.2: unexplained"
    # a compile is never noise
    compiled = _request("c", 35.0, 19.0, {"_topk_topp_kernel": 1})
    compiled["steady_ms"] = [40.0]
    assert rep.noise(compiled) == "" and rep.flagged(compiled) == "compiled"
    # no outlier against the second run: nothing to call noise
    fine = _request("fine", 20.0, 19.0)
    fine["steady_ms"] = [40.0]
    assert rep.noise(fine) == "" and rep.flagged(fine) == ""
    real["line"] = 2
    rep.requests = [slow, real]
    d = rep.to_dict()
    assert d["summary"]["flagged"] == {"prefix hit, batch 5 (line 2)": "ratio > 1.2: unexplained"}
    assert [(r["verdict"], r["noise"]) for r in d["requests"]] == [
        ("", "noise: a later run took 36.0 ms"), ("ratio > 1.2: unexplained", "")]
    # the noise line's 16 ms are not first-call excess
    assert rep.excess_ms == 16.0 and d["summary"]["excess_ms"] == 16.0


def test_flagged_lines_that_share_a_name_are_each_in_the_summary():
    rep = _report()
    a, b, c = (_request("greedy", 35.0, 19.0), _request("greedy", 20.0, 19.0),
               _request("greedy", 300.0, 20.0))
    for line, r in enumerate((a, b, c), 1):
        r["line"] = line
    rep.requests = [a, b, c, _request("top-k", 50.0, 20.0)]
    assert rep.to_dict()["summary"]["flagged"] == {
        "greedy (line 1)": "ratio > 1.2: unexplained",
        "greedy (line 3)": "ratio > 1.2: unexplained",
        "top-k": "ratio > 1.2: unexplained"}


def test_a_first_run_as_slow_as_a_new_size_is_steady_cost_not_flagged():
    rep = _report()
    # 60 ms first, 30 second, later runs 31-32: a first-call cost (not noise)
    r = _request("prefix hit, batch 5", 60.0, 30.0)
    r["steady_ms"] = [31.0, 32.0, 31.0]
    r["new_size_delta"] = 1
    r["second_steps"] = [[1450, 5, 10.3, 0], [5, 5, 3.0, 0]]
    # the same requests one token longer each, after it: 58 then 31 ms, the
    # excess in their first step (1455 tokens, no step had that many)
    r["new_size_ms"] = [58.0, 31.0]
    r["new_size_steps"] = [[[1455, 5, 38.2, 1], [5, 5, 3.1, 0]],
                           [[1455, 5, 10.4, 0], [5, 5, 3.0, 0]]]
    assert rep.noise(r) == "" and rep.flagged(r) == ""
    assert rep.new_size(r) == (
        "new size: one more prompt token each, run after it, 58.0 then 31.0 ms (step 1 of 2 "
        "(1455 tokens, 5 requests, the first traffic step of that size) +27.8 ms (all the "
        "worker's steps +27.9 ms)): steady traffic pays this at every token count it has not had")
    rep.requests = [r]
    d = rep.to_dict()
    assert d["requests"][0]["verdict"] == "" and d["requests"][0]["new_size"].startswith("new size")
    assert rep.excess_ms == 0.0 and d["summary"]["flagged"] == {}
    # 1.2 x 49 = 58.8 < 60: the new size cost less than the line's first run; flagged
    r["new_size_ms"] = [49.0, 31.0]
    assert rep.new_size(r) == "" and rep.flagged(r) == (
        "ratio > 1.2: unexplained; one more prompt token each, run next: 49.0 then 31.0 ms")
    assert rep.excess_ms == 30.0
    # the new size's first run was no outlier: the line's cost is its own (a warmup gap)
    r["new_size_ms"] = [33.0, 31.0]
    assert rep.new_size(r) == "" and rep.flagged(r) == (
        "ratio > 1.2: unexplained; one more prompt token each, run next: 33.0 then 31.0 ms "
        "(a kernel class this line reached first, not a cost of every new size)")
    # one run of the control (the second raised): no verdict from it
    r["new_size_ms"] = [58.0]
    assert rep.new_size(r) == ""
    # a compile in any run is a compile, whatever the control says
    r["new_size_ms"] = [58.0, 31.0]
    r["compiles_second"] = {"_zero_kv_blocks_kernel": 1}
    assert rep.new_size(r) == "" and rep.flagged(r) == "compiled"
    # one token less where one more would not fit
    r["compiles_second"], r["new_size_delta"] = {}, -1
    assert rep.new_size(r).startswith("new size: one less prompt token each")


def test_an_unexplained_outlier_names_the_worker_step_that_paid_it():
    rep = _report()
    r = _request("prefix hit, batch 5", 35.0, 19.0)
    r["first_steps"] = [[1450, 5, 24.5, 0], [5, 5, 3.1, 0], [5, 5, 3.0, 0], [5, 5, 2.9, 0]]
    r["second_steps"] = [[1450, 5, 10.3, 0], [5, 5, 3.0, 0], [5, 5, 3.1, 0], [5, 5, 2.8, 0]]
    assert rep.flagged(r) == ("ratio > 1.2: unexplained; step 1 of 4 (1450 tokens, 5 requests) "
                              "+14.2 ms (all the worker's steps +14.3 ms)")
    r["first_steps"][0][1] = r["second_steps"][0][1] = 1
    assert "(1450 tokens, 1 request) +14.2 ms" in rep.flagged(r)
    r["first_steps"][0][1] = r["second_steps"][0][1] = 5
    r["first_steps"][0][3] = 1  # no traffic step before it had 1450 tokens
    assert rep.flagged(r) == ("ratio > 1.2: unexplained; step 1 of 4 (1450 tokens, 5 requests, "
                              "the first traffic step of that size) +14.2 ms (all the worker's "
                              "steps +14.3 ms)")
    # scheduled differently (a chunk split elsewhere): said so, with the time in the steps
    r["second_steps"] = [[1024, 5, 8.0, 1], [426, 5, 4.0, 1], [5, 5, 3.0, 0], [5, 5, 3.1, 0],
                         [5, 5, 2.8, 0]]
    assert rep.flagged(r) == ("ratio > 1.2: unexplained; scheduled differently: 4 vs 5 steps, "
                              "33.5 vs 20.9 ms in them")
    # more steps than the second (a drafter accepted fewer), none slower: the extra steps
    r["first_steps"] = [[12, 1, 8.3, 0], [1, 1, 6.2, 0], [1, 1, 5.4, 0], [3, 1, 7.5, 0],
                        [3, 1, 7.9, 0]]
    r["second_steps"] = [[12, 1, 8.5, 0], [1, 1, 6.5, 0], [3, 1, 7.6, 0], [3, 1, 7.5, 0]]
    assert rep.flagged(r) == ("ratio > 1.2: scheduled differently: 5 vs 4 steps, 7.1 vs 7.5 ms "
                              "a step: the extra steps' time, not a first-call cost")
    # more steps and slower ones (7.1 against 5.0 ms a step): unexplained still
    r["second_steps"] = [[12, 1, 6.0, 0], [1, 1, 4.5, 0], [3, 1, 5.0, 0], [3, 1, 4.5, 0]]
    assert rep.flagged(r).startswith("ratio > 1.2: unexplained; scheduled differently: 5 vs 4 steps")
    # a cause the side effects show comes first; no step is named then
    r["side_effects_first"] = {"device_allocs": 2}
    assert rep.flagged(r) == "ratio > 1.2: 2 cudaMalloc call(s)"


def test_skipped_lines_name_whole_and_partly_skipped_scenarios():
    from stepwarm.coverage.report import skipped_lines

    rep = _report()
    rep.scenario_runs += [
        {"plan": "prefix-hit", "ok": True, "skipped": "compiled nothing at the last start",
         "wall_ms": 0.0, "start_s": None, "end_s": None, "steps": []},
        {"plan": "sampler-matrix", "ok": True, "skipped": "", "wall_ms": 90.0,
         "idle_steps_skipped": 40, "start_s": 51.0, "end_s": 51.09,
         "steps": [[i, "decode: d", 51.0, 51.01] for i in range(31)]}]
    assert skipped_lines(rep) == [
        f"{rep.run_name}: skipped prefix-hit: compiled nothing at the last start",
        f"{rep.run_name}: sampler-matrix: skipped 40 of 71 steps: their segments compiled "
        "nothing at the last start with this configuration (STEPWARM_SKIP_IDLE=1)"]


def test_coverage_lines_say_which_time_is_which(tmp_path):
    """A request's line at 80 columns names its two runs and the worker's
    unit, and a line with no sampling field says SamplingParams defaults (a new
    user's trial: '71.4 / 11.8 ms (worker 69.1 / 10.4)', a bare '-')."""
    import io

    from rich.console import Console

    from stepwarm.coverage.report import print_report

    base, _ = _h200_reports(tmp_path)
    bare = base.requests[-1]
    bare["sampling"] = {"ignore_eos": True}  # a traffic line that sets none
    buf = io.StringIO()
    print_report(base, Console(file=buf, width=80, force_terminal=True, color_system=None))
    text = " ".join(line.strip() for line in buf.getvalue().splitlines())
    r = next(r for r in base.requests if r["name"] == "logprobs 9")
    assert (f"1st / 2nd run {r['first_ms']:.1f} / {r['second_ms']:.1f} ms (in worker "
            f"{r['first_worker_ms']:.1f} / {r['second_worker_ms']:.1f} ms), ratio "
            f"{r['ratio']:.2f}") in text
    assert (f"{bare['name']}: n {bare['count']}, prompt {bare['prompt_len']}, SamplingParams "
            "defaults;") in text


@pytest.mark.parametrize("width", [80, 200])
def test_a_request_that_failed_shows_its_error_in_one_line_and_no_times(width):
    """Second fresh trial (issue 42): a request vLLM refused (an invalid
    regex) showed 0.0 / 0.0 ms, ratio 1.00, and vLLM's multi-line message
    at column 0, a line reading like stepwarm's own ``error:``."""
    from io import StringIO

    from rich.console import Console

    from stepwarm.coverage.report import print_report, summary_line

    rep = _report()
    rep.requests = [_request("warm", 20.0, 19.0),
                    _request("regex", 0.0, 0.0, error="VLLMValidationError: Failed to transform "
                             "regex into a grammar: \nerror: unclosed character class")]
    buf = StringIO()
    print_report(rep, Console(file=buf, width=width, force_terminal=False))
    out = buf.getvalue()
    assert "error: unclosed character class" not in out
    assert " ".join(out.split()).count("error: VLLMValidationError: Failed to transform regex into "
                                       "a grammar: (more in --json)") == 1
    row = out.split("regex", 1)[1].split("\n")[0]
    assert "1.00" not in row and "1st / 2nd run" not in row and "0.0 / 0.0" not in row
    assert summary_line(rep).endswith("1 flagged, 1 of them failed (error: not timed) "
                                      "(detectors: cache)")
