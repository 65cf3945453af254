"""``stepwarm coverage --compare`` beyond the side by side: who else would have
compiled each start-up compile of stepwarm's (moved / vllm / extra), and the
warm restarts' figures, on recorded reports."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from stepwarm.coverage import compare
from stepwarm.coverage.attribution import attribute_moves, step_kernels
from stepwarm.coverage.detectors import CacheScan, CompileEvent, Detectors
from stepwarm.coverage.report import (
    CoverageReport,
    StartupCompile,
    print_comparison,
    startup_figures,
    startup_lines,
)

RESULTS = Path(__file__).parents[2] / "campaigns" / "results"


def _h200(tmp_path):
    """Baseline and stepwarm of the recorded H200 run (vllm 0.26, v2 runner, pow2)."""
    both = json.loads((RESULTS / "h200-coverage-llama-v2-pow2-compare.json").read_text())
    out = []
    for mode in ("baseline", "stepwarm"):
        (tmp_path / f"{mode}.json").write_text(json.dumps(both[mode]))
        out.append(CoverageReport.load(tmp_path / f"{mode}.json"))
    return out


def test_the_h200_runs_start_up_compiles_were_moved_from_the_baselines_traffic(tmp_path):
    base, sw = _h200(tmp_path)
    moves = attribute_moves(base, sw).to_dict()
    assert moves["totals"] == {"moved": 7, "vllm": 0, "extra": 1}
    # the baseline's first top-k/top-p and logprobs requests; 25 (logprobs 9)
    # compiled a _topk_log_softmax_kernel variant that no step compiled
    assert moves["moved_lines"] == [13, 14, 16, 18, 21, 24, 26]
    # what those lines cost the baseline beyond stepwarm's runs of them
    assert moves["moved_ms"] == 10749.7 and moves["scenario_s"] == 13.422
    assert moves["ratio"] == 1.249
    by_name = {s["scenario"]: s for s in moves["scenarios"]}
    matrix = by_name["sampler-matrix"]
    assert (matrix["steps"], matrix["seconds"], matrix["moved"], matrix["vllm"],
            matrix["extra"]) == (66, 13.165, 7, 0, 1)
    assert [k for k, label in matrix["kernels"] if label == "extra"] == [
        "_topk_log_softmax_kernel"]
    assert (by_name["default"]["steps"], by_name["default"]["moved"]) == (6, 0)
    assert len(moves["idle_steps"]) == 123
    assert sum(1 for s in moves["idle_steps"] if s["scenario"] == "sampler-matrix") == 58
    assert moves["idle_steps"][0] == {"scenario": "default", "step": 0,
                                      "label": sw.scenario_runs[0]["steps"][0][1]}


def _part(phase, step, kernels, variants=(), owner="stepwarm", at_s=1.0):
    return StartupCompile(where=f"{phase} {step}", owner=owner, phase=phase, step=step,
                          kernels=kernels, at_s=at_s, variants=[list(v) for v in variants])


def _run(plan, n_steps, wall_ms):
    return {"plan": plan, "ok": True, "skipped": "", "wall_ms": wall_ms, "start_s": 0.0,
            "end_s": 1.0, "steps": [[i, f"decode: d{i}", 0.0, 0.1] for i in range(n_steps)]}


def _req(line, first, second, events):
    return {"line": line, "name": f"r{line}", "first_ms": first, "second_ms": second,
            "excess_ms": max(0.0, first - second), "ratio": 1.0, "count": 1, "prompt_len": 1,
            "sampling": {}, "compiles_first": {e[1]: 1 for e in events},
            "compiles_second": {}, "events": events, "tokens": [1, 1], "error": None}


def _rep(mode, **kw):
    return CoverageReport(mode=mode, scenarios=["a"] if mode == "stepwarm" else [],
                          traffic="t.jsonl", vllm_version="0.26.0", runner="v2", model="m",
                          device="gpu", detectors=["cache", "triton-hook"], threshold=1.2,
                          min_excess_ms=10.0, **kw)


def test_a_kernel_is_its_name_and_where_both_runs_know_one_its_variant():
    base = _rep("baseline", startup_compiles=[
        _part("vLLM's own warmup", None, {"warm_k": 1}, [("warm_k", "A")], owner="vllm")])
    base.requests = [
        _req(1, 900.0, 100.0, [["cache", "topk", "triton"], ["triton-hook", "topk", "triton", "V1"]]),
        _req(2, 500.0, 100.0, [["triton-hook", "topk", "triton", "V2"]]),
        _req(3, 300.0, 100.0, [["cache", "cpp_fused_0", "inductor"]])]
    sw = _rep("stepwarm", stepwarm_s=2.0, startup_compiles=[
        _part("vLLM's own warmup", None, {"other": 1}, owner="vllm"),
        _part("a", 0, {"topk": 2, "warm_k": 1}, [("topk", "V1"), ("topk", "V9"), ("warm_k", "A")]),
        _part("a", 2, {"cpp_fused_0": 1, "new_k": 1}, at_s=2.0)])
    sw.scenario_runs = [_run("a", 3, 1500.0), _run("b", 0, 0.0)]
    assert step_kernels(sw.startup_compiles[1]) == [("topk", "V1"), ("topk", "V9"),
                                                    ("warm_k", "A")]
    moves = attribute_moves(base, sw)
    a, b = moves.scenarios
    assert a.kernels == [["topk", "moved"], ["topk", "extra"], ["warm_k", "vllm"],
                         ["cpp_fused_0", "moved"], ["new_k", "extra"]]
    assert a.compiles == {"moved": 2, "vllm": 1, "extra": 2} and a.idle_steps == [[1, "decode: d1"]]
    assert (b.steps, b.compiles, b.idle_steps) == (0, {"moved": 0, "vllm": 0, "extra": 0}, [])
    # V1 moved line 1's 800 ms, the inductor kernel line 3's 200; not line 2 (V2)
    assert (moves.moved_lines, moves.moved_ms, moves.scenario_s) == ([1, 3], 1000.0, 1.5)
    assert moves.ratio == 1.5
    buf = io.StringIO()
    from stepwarm.coverage.report import print_moves

    print_moves(moves, Console(file=buf, width=200, color_system=None))
    text = buf.getvalue()
    assert "  a: 3 step(s), 1.50 s; compiles moved 2 / vllm 1 / extra 2; 1 step(s) " \
           "compiled nothing" in text
    assert "  total: compiles moved 2 / vllm 1 / extra 2; 1 step(s) compiled nothing; " \
           "1 scenario(s) ran no step" in text
    assert "scenario time / compile time moved = 1.50 (1.50 s / 1000 ms the baseline's " \
           "traffic paid beyond stepwarm's on 2 request(s))" in text
    base.requests = []
    assert attribute_moves(base, sw).to_dict()["ratio"] is None


def test_the_ends_wait_for_compiles_in_threads_is_a_cost_of_its_own(tmp_path):
    """The plugin's compiles in threads outlive their scenario; what the end
    of the warmup waited for them is stepwarm's time too, its own line (and
    in the ratio), kept through the saved report."""
    from stepwarm.coverage.attribution import COMPILE_WAIT, GEMM_SIZES

    base = _rep("baseline")
    base.requests = [_req(1, 2600.0, 100.0, [["triton-hook", "topk", "triton", "V1"]])]
    sw = _rep("stepwarm", stepwarm_s=2.75, gemm_s=0.25, compile_wait_s=1.0,
              startup_compiles=[_part("a", 0, {"topk": 1}, [("topk", "V1")])])
    sw.scenario_runs = [_run("a", 2, 1500.0)]
    sw = CoverageReport.load(_saved(tmp_path, sw))
    assert sw.compile_wait_s == 1.0
    moves = attribute_moves(base, sw)
    assert [(c.scenario, c.seconds) for c in moves.scenarios] == [
        ("a", 1.5), (GEMM_SIZES, 0.25), (COMPILE_WAIT, 1.0)]
    assert (moves.scenario_s, moves.moved_ms, moves.ratio) == (2.75, 2500.0, 1.1)


def _restart(tmp_path, rep, startup_s, scenario_s):
    warm = CoverageReport.load(_saved(tmp_path, rep))
    warm.cache, warm.startup_s, warm.stepwarm_s = "warm", startup_s, scenario_s
    warm.startup_compiles = []
    back = CoverageReport.load(_saved(tmp_path, warm))
    assert back.cache == "warm" and back.run_name == f"{rep.mode} restart"
    return back


def _saved(tmp_path, rep):
    path = tmp_path / f"{rep.mode}-{rep.cache}.json"
    rep.save(path)
    return path


@pytest.mark.parametrize("width", [80, 119])
def test_the_restarts_figures_beside_the_fresh_runs(tmp_path, width):
    base, sw = _h200(tmp_path)
    base_r = _restart(tmp_path, base, 20.5, 0.0)
    sw_r = _restart(tmp_path, sw, 31.25, 1.5)
    assert startup_lines(base, sw, base_r, sw_r) == [
        "start-up: fresh 75.8 s (scenarios 13.42 s), restart 31.2 s (scenarios 1.50 s)",
        "baseline start-up: fresh 54.8 s, restart 20.5 s"]
    assert startup_lines(base, sw) == ["start-up: fresh 75.8 s (scenarios 13.42 s)",
                                       "baseline start-up: fresh 54.8 s"]
    figures = startup_figures(base, sw, {"baseline_restart": base_r, "stepwarm_restart": sw_r})
    assert figures["stepwarm"] == {"startup_s": 75.816, "scenario_s": 13.422,
                                   "startup_compiles": 56, "traffic_compiles": 1}
    assert figures["stepwarm_restart"] == {"startup_s": 31.25, "scenario_s": 1.5,
                                           "startup_compiles": 0, "traffic_compiles": 1}
    assert figures["baseline"]["traffic_compiles"] == 8 and list(figures) == [
        "baseline", "stepwarm", "baseline_restart", "stepwarm_restart"]
    buf = io.StringIO()
    print_comparison(base, sw, Console(file=buf, width=width, force_terminal=True,
                                       color_system=None), base_r, sw_r, attribute_moves(base, sw))
    lines = buf.getvalue().splitlines()
    assert max(map(len, lines)) <= width
    text = " ".join(" ".join(lines).split())
    assert "start-up: fresh 75.8 s (scenarios 13.42 s), restart 31.2 s (scenarios 1.50 s)" in text
    (row,) = [ln for ln in lines if "engine start-up (s)" in ln]
    assert [c.strip() for c in row.split("│")[2:6]] == ["54.8", "75.8", "20.5", "31.2"]
    assert any("restart" in ln for ln in lines if "baseline" in ln and "┃" in ln)
    assert "scenario time / compile time moved = 1.25" in text


def test_a_restart_counts_only_what_the_filled_caches_lack(tmp_path):
    fresh = CacheScan.use_fresh_dirs(tmp_path)
    old = tmp_path / "triton_cache_dir" / "AB" / "__grp___topk_topp_kernel.json"
    old.parent.mkdir(parents=True)
    old.write_text("{}")
    assert [e.name for e in fresh.poll()] == ["_topk_topp_kernel"]
    detectors = Detectors.restart(tmp_path)
    assert detectors.available == ["cache"] and detectors.poll() == []
    new = tmp_path / "torchinductor_cache_dir" / "x" / "__grp__k2.json"
    new.parent.mkdir(parents=True)
    new.write_text("{}")
    assert [(e.detector, e.name) for e in detectors.poll()] == [("cache", "k2")]
    assert isinstance(CompileEvent("cache", "k2", "triton", 0.0), CompileEvent)


def test_compare_runs_each_fresh_run_then_its_restart_on_its_own_caches(tmp_path, monkeypatch):
    assert compare.child_args(["t.jsonl", "--compare", "--no-restart", "--cache-dir", "/c",
                               "--json=o.json", "-s", "default"]) == ["t.jsonl", "-s", "default"]
    # a baseline child runs no scenario: -s / --scenario are not passed
    assert compare.child_args(["t.jsonl", "-s", "default", "--scenario=prefix-hit", "-sall",
                               "--scenario", "x.toml", "-e", "max_num_seqs=4"],
                              baseline=True) == ["t.jsonl", "-e", "max_num_seqs=4"]
    calls = []

    def child(args, baseline, json_out, cache_dir, warm=False):
        calls.append((baseline, cache_dir.relative_to(tmp_path).as_posix(), warm))
        if not (baseline and warm):  # the baseline's restart writes no report
            _rep("baseline" if baseline else "stepwarm").save(json_out)
        return 0

    monkeypatch.setattr(compare, "run_child", child)
    runs = compare.run_all(["t.jsonl"], cache_root=tmp_path)
    assert calls == [(True, "baseline", False), (True, "baseline", True),
                     (False, "stepwarm", False), (False, "stepwarm", True)]
    assert list(runs) == ["baseline", "baseline_restart", "stepwarm", "stepwarm_restart"]
    assert runs["baseline_restart"] == (0, None)
    calls.clear()
    assert list(compare.run_all(["t.jsonl"], restart=False, cache_root=tmp_path)) == [
        "baseline", "stepwarm"]
    assert calls == [(True, "baseline", False), (False, "stepwarm", False)]


@pytest.mark.parametrize("args, message", [
    (["--no-restart"], "--no-restart: only with --compare"),
    (["--warm-cache"], "--warm-cache: give --cache-dir DIR, a directory a coverage run filled"),
    (["--compare", "--warm-cache", "--cache-dir", "."], "--warm-cache: give --cache-dir DIR"),
    (["--warm-cache", "--cache-dir", "/nonexistent/cache"],
     "--warm-cache: --cache-dir /nonexistent/cache: no such directory; allowed: a directory a "
     "coverage run filled"),
])
def test_the_restart_options_are_refused_out_of_place_before_any_engine(args, message):
    from typer.testing import CliRunner

    from stepwarm.cli import app

    from tests.helpers import unwrapped

    r = CliRunner().invoke(app, ["coverage", "-s", "default", *args])
    assert r.exit_code == 2 and message in unwrapped(r.output)  # piped: wrapped at 80


def test_a_warm_restart_refuses_a_directory_with_no_filled_cache(tmp_path):
    """A --compare run's parent directory (its caches are one level down)
    would have run cold and been reported as warm."""
    from typer.testing import CliRunner

    from stepwarm.cli import app

    for run in ("baseline", "stepwarm"):
        (tmp_path / run / "triton_cache_dir").mkdir(parents=True)
        (tmp_path / run / "triton_cache_dir" / "k.json").write_text("{}")
    r = CliRunner().invoke(app, ["coverage", "-s", "default", "--warm-cache",
                                 "--cache-dir", str(tmp_path)])
    assert r.exit_code == 2, r.output
    out = " ".join(r.output.split())
    assert (f"--warm-cache --cache-dir {tmp_path}: holds no filled compile cache "
            "(triton_cache_dir, vllm_cache_root, torchinductor_cache_dir) (a --compare run "
            f"keeps one per run: {tmp_path / 'baseline'}, {tmp_path / 'stepwarm'})") in out
    # nothing was made beside the runs' directories
    assert sorted(tmp_path.iterdir()) == [tmp_path / "baseline", tmp_path / "stepwarm"]


def test_a_compile_on_the_second_run_counts_as_moved_time():
    """EAGLE on V2 (H200, 2026-12-01): the baseline's ``top-p + top-k, batch
    16`` compiled ``_topk_topp_kernel`` on its second run (48 ms, then
    6304 ms: other accepted-draft counts, another Triton class), so its
    first-call excess is 0; the time moved counts both runs against
    stepwarm's runs of the line."""
    import gzip

    both = json.loads(gzip.decompress(
        (RESULTS / "h200-coverage-1201-eagle-v2.json.gz").read_bytes()))
    base, sw = (CoverageReport(**{k: v for k, v in both[m].items() if k != "summary"})
                for m in ("baseline", "stepwarm"))
    base.startup_compiles = [StartupCompile(**c) for c in both["baseline"]["startup_compiles"]]
    sw.startup_compiles = [StartupCompile(**c) for c in both["stepwarm"]["startup_compiles"]]
    (line,) = [r for r in base.requests if r["name"] == "top-p + top-k, batch 16"]
    assert (line["first_ms"], line["second_ms"], line["excess_ms"]) == (48.08, 6304.28, 0.0)
    moves = attribute_moves(base, sw)
    assert line["line"] in moves.moved_lines
    assert round(moves.moved_ms) == 15224 and round(moves.ratio, 2) == 1.16
    assert sum(r["excess_ms"] for r in base.requests if r["line"] in moves.moved_lines) < 5100


def test_the_h200_run_with_one_pool_counts_the_ends_wait_in_the_ratio():
    """Run s14 (campaigns/results: 11 engines, 4 at a time on one H200, one
    pool of sampler compiles for every scenario): the end's wait is a line of
    its own, and the ratio made again from the stored reports is the stored one."""
    import gzip

    from stepwarm.coverage.attribution import COMPILE_WAIT, GEMM_SIZES

    path = RESULTS / "h200-coverage-1203s14-one-pool-granite-4.0-h-tiny.json.gz"
    both = json.loads(gzip.decompress(path.read_bytes()))
    base, sw = (CoverageReport.from_dict(both[k]) for k in ("baseline", "stepwarm"))
    moves = attribute_moves(base, sw)
    seconds = {c.scenario: c.seconds for c in moves.scenarios}
    assert (seconds["sampler-matrix"], seconds[GEMM_SIZES], seconds[COMPILE_WAIT]) == (
        2.923, 0.376, 2.13)
    assert round(moves.scenario_s, 3) == 14.09 and sw.stepwarm_s == 14.092  # per-line rounding
    assert round(moves.ratio, 3) == both["attribution"]["ratio"] == 0.561
    assert sw.traffic_compiles == 0 and base.traffic_compiles == 13
    # Restarts wait for nothing: every variant loads from Triton's disk cache in the steps.
    assert CoverageReport.from_dict(both["stepwarm_restart"]).compile_wait_s == 0.0


def test_a_compile_without_a_variant_is_vllms_only_where_vllm_left_that_variant(tmp_path):
    """Run s25 (H100, vLLM 0.34, the 8B shape, FlashInfer's sampler): at
    ``sampler-matrix`` step 61 the detectors counted two
    ``_topk_log_softmax_kernel`` compiles and the Triton hook told one
    variant. The other, by name alone, matched the baseline's start-up
    variants; but vLLM compiled both of those itself in the stepwarm run, so
    stepwarm cannot have: it is counted as moved (the baseline's traffic
    compiled the name), and vLLM's label stays 0."""
    both = json.loads(__import__("gzip").decompress(
        (RESULTS / "h100-coverage-1206s25-034-llama-3.1-8b-fi.json.gz").read_bytes()))
    reports = []
    for mode in ("baseline", "stepwarm"):
        (tmp_path / f"{mode}.json").write_text(json.dumps(both[mode]))
        reports.append(CoverageReport.load(tmp_path / f"{mode}.json"))
    base, sw = reports
    assert both["attribution"]["totals"] == {"moved": 5, "vllm": 1, "extra": 0}  # as reported then
    moves = attribute_moves(base, sw).to_dict()
    assert moves["totals"] == {"moved": 6, "vllm": 0, "extra": 0}
    matrix = next(s for s in moves["scenarios"] if s["scenario"] == "sampler-matrix")
    assert matrix["kernels"] == [["_gumbel_sample_kernel", "moved"]] + [
        ["_topk_log_softmax_kernel", "moved"]] * 5
    # Where the stepwarm run's vLLM did not compile the baseline's start-up
    # variant, a variant-less compile of that name is still vLLM's.
    for c in sw.startup_compiles:
        if c.owner == "vllm":
            c.variants = [v for v in c.variants if v[0] != "_topk_log_softmax_kernel"]
            c.kernels.pop("_topk_log_softmax_kernel", None)
    assert attribute_moves(base, sw).to_dict()["totals"] == {"moved": 5, "vllm": 1, "extra": 0}
